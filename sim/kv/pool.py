"""A run's pool step: the KV pool a simulated run gets, in numbers, each checked against the simulator's limits.

    GPU token slots      `kv_slots`, or what vLLM would allocate for the model on num_gpus x gpu (sim.base.specs, paper
                         Table 1)
    block size           the policy's (sim.kv.simulator_block_size: 1 for the contiguous baselines, a page of
                         `page_kib` KiB for vattention)
    CPU swap blocks      `swap_space_gib` per GPU, in blocks of that size
    CPU offload blocks   `cpu_offload_gib` per GPU for the prefix cache's offload tier (sim/kv/offload.py)
    prefix caching       as asked, or (None) on for a shared prefix or an offload tier where the policy has a cache

`make_kv_manager` (sim/kv/__init__.py) then builds the manager over these numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..base.limits import MAX_KV_SLOTS, MAX_POOL_BLOCKS
from ..base.specs import GiB, kv_capacity_tokens
from . import allocates_blocks_on_demand, gpu_pool_blocks, has_prefix_cache, simulator_block_size


@dataclass(frozen=True, slots=True)
class KVPool:
    """The sizes of a run's KV pools (module docstring)."""

    num_slots: int  # GPU token slots
    block_size: int  # tokens per block, as the policy runs in the simulator
    block_bytes: int  # bytes of one block over all layers and GPUs (what a swap or a reload moves)
    num_cpu_blocks: int  # swap space
    num_offload_blocks: int  # the prefix cache's CPU offload tier; 0: none
    enable_prefix_caching: bool


def kv_pool(policy: str, model, gpu, *, num_gpus: int, kv_slots: int | None, block_size: int,
            page_kib: float | None, swap_space_gib: float, cpu_offload_gib: float,
            enable_prefix_caching: bool | None, prefix_len: int) -> KVPool:
    """The pools of a run under `policy` for `model` on `num_gpus` x `gpu` (sim.base.specs), checked (`check_pool`,
    `offload_blocks`): ValueError names the setting and what is allowed."""
    num_slots = kv_slots if kv_slots is not None else kv_capacity_tokens(model, gpu, num_gpus)
    caching = enable_prefix_caching
    if caching is None:  # on for a shared prefix in a pool with a prefix cache (a CPU offload tier keeps evicted
        caching = (prefix_len > 0 or cpu_offload_gib > 0) and has_prefix_cache(policy)  # prefix-cache blocks)
    size = simulator_block_size(policy, block_size, model=model, num_gpus=num_gpus, page_kib=page_kib)
    block_bytes = size * model.kv_bytes_per_token
    num_cpu_blocks = int(num_gpus * swap_space_gib * GiB // block_bytes)
    check_pool(policy, num_slots, size, num_cpu_blocks, kv_slots, model)
    return KVPool(num_slots, size, block_bytes, num_cpu_blocks, offload_blocks(cpu_offload_gib, num_gpus, block_bytes),
                  caching)


def check_pool(policy: str, num_slots: int, block_size: int, num_cpu_blocks: int, kv_slots, model=None) -> None:
    """The KV pools fit the simulator's limits (sim.base.limits): slots, and blocks of a paged GPU or CPU pool (the blocks
    the policy makes of those slots: `model`'s layer groups for hybrid)."""
    name = "kv_slots" if kv_slots is not None else "the KV pool (what model, gpu and num_gpus leave)"
    if num_slots > MAX_KV_SLOTS:
        raise ValueError(f"{name}: {num_slots:,} token slots (allowed: at most {MAX_KV_SLOTS:,})")
    paged = allocates_blocks_on_demand(policy)
    blocks = gpu_pool_blocks(policy, model, num_slots, block_size) if paged else 0
    if blocks > MAX_POOL_BLOCKS:
        under = "" if blocks == num_slots // block_size else f" under {policy!r}"  # (hybrid: a page per layer group)
        raise ValueError(f"{name}: {num_slots:,} token slots = {blocks:,} blocks of {block_size}{under} "
                         f"(allowed: at most {MAX_POOL_BLOCKS:,} blocks: a larger block_size, or kv_slots)")
    if paged and num_cpu_blocks > MAX_POOL_BLOCKS:
        raise ValueError(f"swap_space_gib: {num_cpu_blocks:,} CPU blocks of {block_size} tokens (allowed: at most "
                         f"{MAX_POOL_BLOCKS:,} blocks of swap space)")


def offload_blocks(gib: float, num_gpus: int, block_bytes: int) -> int:
    """Blocks of `block_bytes` that a CPU offload tier of `gib` GiB per GPU holds; a tier holding none is refused."""
    blocks = int(num_gpus * gib * GiB // block_bytes)
    if gib > 0 and blocks < 1:
        raise ValueError(f"cpu_offload_gib: {gib:g} GiB per GPU holds no KV block of {block_bytes:,} bytes (allowed: "
                         f"0 for none, or at least {block_bytes / GiB / num_gpus:.3g})")
    if blocks > MAX_POOL_BLOCKS:
        raise ValueError(f"cpu_offload_gib: {blocks:,} CPU blocks (allowed: at most {MAX_POOL_BLOCKS:,} blocks)")
    return blocks
