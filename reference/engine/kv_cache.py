"""The paged KV cache: the real tensors behind the block ids that sim's allocator hands out.

vLLM (Kwon et al., SOSP 2023, Section 4.1-4.3) pre-allocates all KV memory as `num_blocks` fixed-size
blocks. Per layer there is one key tensor and one value tensor::

    key_caches[layer]  [num_blocks, block_size, num_kv_heads, head_dim]     (value_caches alike)

and token slot `block_id * block_size + offset` is row `offset` of block `block_id`. Nothing here
knows which sequence owns a block: the allocator deals in integers and this class moves bytes.

Besides the device pool there is an optional CPU pool of `num_cpu_blocks` with the same layout, for
preemption by swapping (Section 4.5): `swap_out` copies device blocks to CPU blocks, `swap_in` copies
them back. `copy_blocks` performs the copy-on-write copies the block manager asks for (Section 4.4).

A second CPU pool of `num_offload_blocks`, the same layout again, is the prefix cache's offload tier (sim/kv/offload.py,
vLLM's CPU offloading connector): `apply_tier_copies` copies evicted cached blocks into it and reloads them on a hit,
in the order the manager decided. Pinned (page-locked) where CUDA runs, so that the copies are DMA; on a CPU-only
machine the "device" pool is host memory too and the tier is a plain CPU tensor (pinning needs CUDA).

`KVLayout` says which tensor (and which KV cache group's block tables) each model layer uses: tensor i for layer i
under every policy but `hybrid`. Under `hybrid` (sim/kv/hybrid.py) layers form groups of `size` layers over one pool
of pages, and, as vLLM lays out its hybrid allocator's memory, tensor t holds the t-th layer of EVERY group: page p
of the pool is page p of each of the `size` tensors, whichever group holds it. Gemma 3 270M: 6 groups of 3 layers,
3 tensors of `num_blocks` pages instead of 18 tensors, the same bytes.

`kv_dtype="int8"` (reference/attention/quant.py) stores K and V as int8 with one float32 scale per token and KV head,
`key_scales[layer]` / `value_scales[layer]` of shape [num_blocks, block_size, num_kv_heads] beside each pool; the
scales travel with their blocks (copy-on-write, swapping). A block then costs head_dim + 4 bytes per token, head and
K/V instead of head_dim * 4 (float32): more blocks in the same budget (`kv_bytes_per_block`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from reference.attention.quant import SCALE_DTYPE, cache_dtype, check_kv_dtype, dequantize_int8, scale_bytes

if TYPE_CHECKING:
    from reference.models.config import ModelConfig

BlockPair = tuple[int, int]  # (src_block, dst_block), as sim.kv.base.BlockCopy


def kv_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                       dtype: torch.dtype, kv_dtype: str = "auto") -> int:
    """Bytes one block id costs: K and V of `block_size` tokens in every layer (`dtype`: the model's; an int8
    `kv_dtype` stores head_dim bytes plus a float32 scale per token and head instead)."""
    element_size = torch.empty((), dtype=cache_dtype(kv_dtype, dtype)).element_size()
    return 2 * num_layers * block_size * num_kv_heads * (head_dim * element_size + scale_bytes(kv_dtype))


def free_device_memory_bytes(device: torch.device | str) -> int:
    """Free memory of `device` now: CUDA's own count, or the host's available RAM for "cpu".

    NOTE (approximation): on CPU this is the kernel's count of available physical pages, which
    ignores memory other processes may claim later.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def total_device_memory_bytes(device: torch.device | str) -> int:
    """All the memory of `device`, free or not: the most any KV pool there could ever take."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Per model layer: the KV cache group whose block tables it reads, and the cache tensor it lives in."""

    layer_group: tuple[int, ...]
    layer_tensor: tuple[int, ...]

    @property
    def num_groups(self) -> int:
        return max(self.layer_group) + 1

    @property
    def num_tensors(self) -> int:
        return max(self.layer_tensor) + 1

    @classmethod
    def one_group(cls, num_layers: int) -> KVLayout:
        return cls(tuple([0] * num_layers), tuple(range(num_layers)))

    @classmethod
    def grouped(cls, groups: Sequence[Sequence[int]]) -> KVLayout:
        """`groups[g]`: the model layers of KV cache group g; the i-th of them lives in tensor i."""
        where = {layer: (g, i) for g, layers in enumerate(groups) for i, layer in enumerate(layers)}
        if sorted(where) != list(range(len(where))) or len(where) != sum(len(layers) for layers in groups):
            raise ValueError(f"KV cache groups must hold each layer 0..N-1 once, got {[list(g) for g in groups]}")
        return cls(tuple(where[i][0] for i in range(len(where))), tuple(where[i][1] for i in range(len(where))))


class KVCache:
    """Per-layer K and V block pools on one device, plus an optional CPU swap pool."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 *, num_cpu_blocks: int = 0, fill_nan: bool = False, layout: KVLayout | None = None,
                 kv_dtype: str = "auto", num_offload_blocks: int = 0) -> None:
        """num_layers: the number of K (and V) tensors; `layout` maps model layers onto them (default: layer i
        in tensor i, one group). dtype: the model's; kv_dtype "int8": int8 pools with scales (module docstring)."""
        for name, value in (("num_layers", num_layers), ("num_blocks", num_blocks), ("block_size", block_size),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_cpu_blocks}")
        if num_offload_blocks < 0:
            raise ValueError(f"num_offload_blocks must be >= 0, got {num_offload_blocks}")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.kv_dtype = check_kv_dtype(kv_dtype)
        self.dtype = dtype  # the model's (the queries'); the pools' own is cache_dtype
        self.cache_dtype = cache_dtype(kv_dtype, dtype)
        self.device = torch.device(device)
        self.num_cpu_blocks = num_cpu_blocks
        self.layout = layout or KVLayout.one_group(num_layers)
        if self.layout.num_tensors != num_layers:
            raise ValueError(f"the layout uses {self.layout.num_tensors} tensors, the cache has {num_layers}")
        # NOTE: fill_nan (for tests and debugging) makes a read of a never-written slot poison the
        # output; otherwise memory is zeroed, which hides such a bug behind plausible numbers.
        # An int8 pool cannot hold NaN: there the scales are NaN, so a never-written slot still reads as NaN.
        fill = float("nan") if fill_nan else 0.0
        cache_fill = 0 if self.quantized else fill
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        dtype = self.cache_dtype
        self.key_caches = [torch.full(shape, cache_fill, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.value_caches = [torch.full(shape, cache_fill, dtype=dtype, device=self.device)
                             for _ in range(num_layers)]
        # Pinned host memory lets CUDA copy to and from it with DMA; it only exists with CUDA.
        pin = self.device.type == "cuda"
        cpu_shape = (num_cpu_blocks, block_size, num_kv_heads, head_dim)
        self.cpu_key_caches = [torch.full(cpu_shape, cache_fill, dtype=dtype, pin_memory=pin)
                               for _ in range(num_layers)]
        self.cpu_value_caches = [torch.full(cpu_shape, cache_fill, dtype=dtype, pin_memory=pin)
                                 for _ in range(num_layers)]
        # int8: one float32 scale per token and KV head beside each pool (none for a float cache)
        layers = range(num_layers if self.quantized else 0)
        self.key_scales = [torch.full(shape[:3], fill, dtype=SCALE_DTYPE, device=self.device) for _ in layers]
        self.value_scales = [torch.full(shape[:3], fill, dtype=SCALE_DTYPE, device=self.device) for _ in layers]
        self.cpu_key_scales = [torch.full(cpu_shape[:3], fill, dtype=SCALE_DTYPE, pin_memory=pin) for _ in layers]
        self.cpu_value_scales = [torch.full(cpu_shape[:3], fill, dtype=SCALE_DTYPE, pin_memory=pin) for _ in layers]
        # the offload tier: every pool above (K, V, and an int8 cache's scales) once more, num_offload_blocks deep
        self.num_offload_blocks = num_offload_blocks
        tier_shape = (num_offload_blocks, block_size, num_kv_heads, head_dim)
        self.offload_pools = [torch.full(tier_shape if i < 2 * num_layers else tier_shape[:3],
                                         cache_fill if i < 2 * num_layers else fill,
                                         dtype=dtype if i < 2 * num_layers else SCALE_DTYPE, pin_memory=pin)
                              for i in range((4 if self.quantized else 2) * num_layers if num_offload_blocks else 0)]

    @property
    def quantized(self) -> bool:
        """Whether the pools hold int8 K/V with scales (kv_dtype "int8")."""
        return self.kv_dtype == "int8"

    def scales(self, tensor: int) -> dict[str, torch.Tensor]:
        """The attention operations' scale keywords for cache tensor `tensor`: {} for a float cache, else
        {"k_scale": ..., "v_scale": ...}."""
        if not self.quantized:
            return {}
        return {"k_scale": self.key_scales[tensor], "v_scale": self.value_scales[tensor]}

    @classmethod
    def for_model(cls, config: ModelConfig, num_blocks: int, block_size: int,
                  dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", **kwargs) -> KVCache:
        """A cache shaped for a `reference.models.ModelConfig` (num_layers, num_kv_heads, head_dim)."""
        return cls(config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim,
                   dtype, device, **kwargs)

    @property
    def bytes_per_block(self) -> int:
        return kv_bytes_per_block(self.num_layers, self.block_size, self.num_kv_heads, self.head_dim,
                                  self.dtype, self.kv_dtype)

    @staticmethod
    def num_blocks_for_budget(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                              dtype: torch.dtype, *, budget_bytes: int | None = None,
                              fraction_of_free_memory: float | None = None,
                              device: torch.device | str = "cpu", kv_dtype: str = "auto") -> int:
        """How many blocks fit in a byte budget, given directly or as a fraction of free device memory.

        Raises ValueError when the budget cannot hold a single block (a cache of 0 blocks serves nothing).
        """
        if (budget_bytes is None) == (fraction_of_free_memory is None):
            raise ValueError("give exactly one of budget_bytes and fraction_of_free_memory")
        if fraction_of_free_memory is not None:
            if not 0.0 < fraction_of_free_memory <= 1.0:
                raise ValueError(f"fraction_of_free_memory must be in (0, 1], got {fraction_of_free_memory}")
            budget_bytes = int(fraction_of_free_memory * free_device_memory_bytes(device))
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        per_block = kv_bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype, kv_dtype)
        if budget_bytes < per_block:
            raise ValueError(
                f"a KV budget of {budget_bytes} bytes holds no block: one block of {block_size} tokens "
                f"needs {per_block} bytes across {num_layers} layers"
            )
        return budget_bytes // per_block

    # --- block copies ----------------------------------------------------------------------------
    def copy_blocks(self, pairs: Sequence[BlockPair]) -> None:
        """Copy-on-write: for every (src, dst), block dst becomes a copy of block src, in every layer."""
        src, dst = self._indices(pairs, self.num_blocks, self.num_blocks, "copy_blocks")
        if src is None:
            return
        for cache in (*self.key_caches, *self.value_caches, *self.key_scales, *self.value_scales):
            # The right-hand side gathers all sources before any write, so a dst that is also
            # another pair's src still yields that src's *old* contents.
            cache[dst] = cache[src]

    def swap_out(self, pairs: Sequence[BlockPair]) -> None:
        """Preemption by swapping: (device_block, cpu_block) pairs, device -> CPU, every layer."""
        src, dst = self._indices(pairs, self.num_blocks, self.num_cpu_blocks, "swap_out")
        if src is None:
            return
        for gpu, cpu in self._device_and_cpu_pools():
            cpu[dst.cpu()] = gpu[src].cpu()

    def swap_in(self, pairs: Sequence[BlockPair]) -> None:
        """Resuming a swapped sequence: (cpu_block, device_block) pairs, CPU -> device, every layer."""
        src, dst = self._indices(pairs, self.num_cpu_blocks, self.num_blocks, "swap_in")
        if src is None:
            return
        for gpu, cpu in self._device_and_cpu_pools():
            gpu[dst] = cpu[src.cpu()].to(self.device)

    def apply_tier_copies(self, copies) -> None:
        """The offload tier's copies (sim.kv.offload.TierCopy: to_cpu, src, dst), one block at a time in the order
        given: an offload copies device block src into tier block dst, a reload tier block src into device block dst.
        NOTE: the order matters (a block is offloaded before a reload overwrites it), so copies are not batched."""
        if not copies:
            return
        if not self.num_offload_blocks:
            raise ValueError(f"apply_tier_copies: {len(copies)} copies for a cache without an offload tier")
        device_pools = (*self.key_caches, *self.value_caches, *self.key_scales, *self.value_scales)
        for copy in copies:
            gpu, tier = (copy.src, copy.dst) if copy.to_cpu else (copy.dst, copy.src)
            if not (0 <= gpu < self.num_blocks and 0 <= tier < self.num_offload_blocks):
                raise ValueError(f"apply_tier_copies: {copy} outside the pools (device blocks "
                                 f"0..{self.num_blocks - 1}, tier blocks 0..{self.num_offload_blocks - 1})")
            for pool, tier_pool in zip(device_pools, self.offload_pools):
                if copy.to_cpu:
                    tier_pool[tier].copy_(pool[gpu], non_blocking=False)
                else:
                    pool[gpu].copy_(tier_pool[tier], non_blocking=False)

    def _device_and_cpu_pools(self):
        """(device tensor, CPU tensor) for the K and the V pool of every layer (and their scales, int8)."""
        return zip((*self.key_caches, *self.value_caches, *self.key_scales, *self.value_scales),
                   (*self.cpu_key_caches, *self.cpu_value_caches, *self.cpu_key_scales, *self.cpu_value_scales))

    def _indices(self, pairs: Sequence[BlockPair], num_src: int, num_dst: int, what: str
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Check (src, dst) pairs against the pools' sizes; return them as int64 index tensors."""
        if not pairs:
            return None, None
        src = [s for s, _ in pairs]
        dst = [d for _, d in pairs]
        if any(s is None or not 0 <= s < num_src for s in src):
            raise ValueError(f"{what}: source blocks must be in 0..{num_src - 1}, got {src}")
        if any(d is None or not 0 <= d < num_dst for d in dst):
            raise ValueError(f"{what}: destination blocks must be in 0..{num_dst - 1}, got {dst}")
        if len(set(dst)) != len(dst):
            raise ValueError(f"{what}: each destination block may be written once, got {dst}")
        return (torch.tensor(src, dtype=torch.int64, device=self.device),
                torch.tensor(dst, dtype=torch.int64, device=self.device))

    def read_tokens(self, layer: int, block_table: Sequence[int], num_tokens: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of a sequence's first `num_tokens` tokens, gathered through its block table:
        each [num_tokens, num_kv_heads, head_dim] (an int8 cache's dequantized, float32). For tests and notebooks
        (slow, copies)."""
        needed = -(-num_tokens // self.block_size)
        if len(block_table) < needed:
            raise ValueError(f"{num_tokens} tokens need {needed} blocks, the block table has {len(block_table)}")
        blocks = torch.tensor(list(block_table[:needed]), dtype=torch.int64, device=self.device)
        keys = self.key_caches[layer][blocks].reshape(-1, self.num_kv_heads, self.head_dim)[:num_tokens]
        values = self.value_caches[layer][blocks].reshape(-1, self.num_kv_heads, self.head_dim)[:num_tokens]
        if self.quantized:
            keys = dequantize_int8(keys, self.key_scales[layer][blocks].reshape(-1, self.num_kv_heads)[:num_tokens])
            values = dequantize_int8(values,
                                     self.value_scales[layer][blocks].reshape(-1, self.num_kv_heads)[:num_tokens])
        return keys, values
