"""KV-cache managers: one contract (`base.KVManager`), one small class per policy, registered here.

    paged                      vLLM: blocks on demand, shared with reference counts, copy-on-write
    max / pow2 / oracle        the paper's Orca baselines: one contiguous reservation per sequence
    vattention                 vAttention: a contiguous virtual range per sequence, physical pages mapped on demand
    radix                      SGLang's RadixAttention: pages (1 token by default) and a radix tree of cached prefixes
    hybrid                     vLLM's hybrid allocator: a table per layer group; sliding-window groups free blocks

`make_kv_manager` builds any of them over a pool of `num_slots` token slots. A new policy is one file in this
folder plus one entry in `_REGISTRY`, which states what it can do (`allocates_blocks_on_demand`, `has_swap_space`,
`has_prefix_cache`, `always_caches_prefixes`, `takes_block_allocator`, each reading one flag): nothing outside
`sim/kv/` knows which policy it is talking to, and nothing asks a built manager what it can do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .base import SHARE_NAMES, Allocation, BlockCopy, KVManager, MemoryBreakdown, NewSequence, PrefixCacheStats, as_seen
from .groups import layer_groups

PREFIX_CACHE = ("none", "optional", "always")  # what `_Policy.prefix_cache` may say


@dataclass(frozen=True, slots=True)
class _Policy:
    """What the registry knows of a policy: how to build it, and what it can do (each flag means one thing)."""

    build: Callable[..., KVManager]  # (num_blocks, block_size, options) -> manager
    # Hands out blocks as sequences grow (paged, vattention, radix, hybrid), rather than reserving a run per sequence
    # up front (the contiguous baselines): only such a pool has an admission watermark and preempts.
    blocks_on_demand: bool
    # NOTE: the paper's Orca reimplementation reserved token-granular runs, so the simulator runs the contiguous
    # baselines at block size 1; the engine keeps its cache's block size for every policy. Decides nothing else.
    token_granular_in_simulator: bool
    can_swap: bool = False  # can swap a preempted group to CPU memory (num_cpu_blocks); False: recompute only
    prefix_cache: str = "none"  # "none": shares nothing between requests; "optional": enable_prefix_caching turns it
    # on (paged); "always": the prefix cache is the policy and cannot be turned off (radix)
    # A policy whose block is a page given in KiB per layer per K/V buffer (vattention's `page_kib`): (model spec,
    # num_gpus, page_kib or None for its default) -> tokens per page. None: the block size is given in tokens.
    page_tokens: Callable[..., int] | None = None
    # A policy that needs the model's layers (hybrid: its sliding-window ones): (model spec) -> None, raising one line
    # for a model it cannot serve. None: any model.
    check_model: Callable[..., None] | None = None
    # The blocks its pool has in the bytes of `num_slots` all-layer token slots: (model spec, num_slots, block_size) ->
    # int. None: num_slots // block_size (hybrid: a page holds one group's layers, so the same bytes hold more pages).
    pool_blocks: Callable[..., int] | None = None
    # Runs over a block allocator given from outside (`block_allocator`: a class or function (num_blocks, block_size)
    # -> an allocator with BlockAllocator's methods, a student's from lab 03): paged, whose pool is one such allocator.
    plugs_block_allocator: bool = False
    # Keeps evicted prefix-cache blocks in a CPU offload tier when asked (num_offload_blocks; sim/kv/offload.py):
    # paged. Else the one line saying why not.
    offload_tier: bool = False
    no_offload_tier: str = "it has no prefix cache to offload"

    def __post_init__(self) -> None:
        if self.prefix_cache not in PREFIX_CACHE:
            raise ValueError(f"prefix_cache must be one of {', '.join(PREFIX_CACHE)}, got {self.prefix_cache!r}")


def _paged(num_blocks: int, block_size: int, options: dict) -> KVManager:
    from .paged import PagedKVManager

    return PagedKVManager(num_blocks, block_size, options["enable_prefix_caching"], options["num_cpu_blocks"],
                          options["watermark"], block_allocator=options["block_allocator"],
                          num_offload_blocks=options["num_offload_blocks"])


def _contiguous(rule: str) -> Callable[..., KVManager]:
    def build(num_blocks: int, block_size: int, options: dict) -> KVManager:
        from .contiguous import ContiguousKVManager

        return ContiguousKVManager(num_blocks, block_size, reserve=rule, allocator=options["allocator"],
                                   max_seq_len=options["max_seq_len"])

    return build


def _vattention(num_blocks: int, block_size: int, options: dict) -> KVManager:
    from .vattention import VAttentionKVManager

    return VAttentionKVManager(num_blocks, block_size, watermark=options["watermark"],
                               max_seq_len=options["max_seq_len"])


def _vattention_page_tokens(model, num_gpus: int, page_kib: float | None) -> int:
    from .vattention import page_tokens

    return page_tokens(model, num_gpus, page_kib)


def _hybrid(num_blocks: int, block_size: int, options: dict) -> KVManager:
    from .hybrid import HybridKVManager, kv_cache_groups, pool_blocks

    if options["model"] is None:
        raise ValueError("policy 'hybrid' needs the model whose sliding-window layers it serves (make_kv_manager(..., "
                         "model=a sim.base.specs.ModelSpec))")
    _, windows = kv_cache_groups(options["model"])
    # num_slots counts all-layer token slots (a paged pool's): the same bytes hold more pages of one group each
    return HybridKVManager(pool_blocks(options["model"], options["num_slots"], block_size), block_size, windows,
                           watermark=options["watermark"], max_seq_len=options["max_seq_len"])


def _hybrid_pool_blocks(model, num_slots: int, block_size: int) -> int:
    from .hybrid import pool_blocks

    return pool_blocks(model, num_slots, block_size)


def _hybrid_check_model(model) -> None:
    from .hybrid import kv_cache_groups

    kv_cache_groups(model)


def _radix(num_blocks: int, block_size: int, options: dict) -> KVManager:
    from .radix import RadixKVManager

    return RadixKVManager(num_blocks, block_size, watermark=options["watermark"])


_REGISTRY = {
    "paged": _Policy(_paged, blocks_on_demand=True, token_granular_in_simulator=False, can_swap=True,
                     prefix_cache="optional", plugs_block_allocator=True, offload_tier=True),
    "max": _Policy(_contiguous("max"), blocks_on_demand=False, token_granular_in_simulator=True),
    "pow2": _Policy(_contiguous("pow2"), blocks_on_demand=False, token_granular_in_simulator=True),
    "oracle": _Policy(_contiguous("oracle"), blocks_on_demand=False, token_granular_in_simulator=True),
    "vattention": _Policy(_vattention, blocks_on_demand=True, token_granular_in_simulator=False,
                          page_tokens=_vattention_page_tokens),
    "radix": _Policy(_radix, blocks_on_demand=True, token_granular_in_simulator=False, prefix_cache="always",
                     no_offload_tier="it evicts pages from its own radix tree (a host tier for that tree, as SGLang's "
                     "hierarchical cache, is not built here)"),
    "hybrid": _Policy(_hybrid, blocks_on_demand=True, token_granular_in_simulator=False,
                      check_model=_hybrid_check_model, pool_blocks=_hybrid_pool_blocks),
}
POLICIES = tuple(_REGISTRY)


def _policy(policy: str) -> _Policy:
    if policy not in _REGISTRY:
        raise ValueError(f"unknown KV policy {policy!r} (allowed: {', '.join(POLICIES)})")
    return _REGISTRY[policy]


def allocates_blocks_on_demand(policy: str) -> bool:
    """Whether `policy` hands out blocks as sequences grow (paged, vattention, radix, hybrid) rather than reserving a
    run per sequence up front (the contiguous baselines): only such a pool has an admission watermark and preempts."""
    return _policy(policy).blocks_on_demand


def has_swap_space(policy: str) -> bool:
    """Whether `policy` can swap a preempted group to CPU memory (else it preempts by recompute only)."""
    return _policy(policy).can_swap


def offload_tier_refusal(policy: str) -> str | None:
    """None if `policy` can keep evicted prefix-cache blocks in a CPU offload tier (sim/kv/offload.py), else why not
    (one line)."""
    spec = _policy(policy)
    if spec.offload_tier:
        return None
    return f"policy {policy!r} has no CPU offload tier: {spec.no_offload_tier} (allowed: paged)"


def always_caches_prefixes(policy: str) -> bool:
    """Whether `policy`'s prefix cache is always on (`enable_prefix_caching` means nothing to it)."""
    return _policy(policy).prefix_cache == "always"


def takes_block_allocator(policy: str) -> bool:
    """Whether `policy` runs over a block allocator given from outside (make_kv_manager's `block_allocator`)."""
    return _policy(policy).plugs_block_allocator


def has_prefix_cache(policy: str) -> bool:
    """Whether `policy` can cache prefixes (`enable_prefix_caching`, or always); the contiguous baselines, vattention
    and hybrid cannot."""
    return _policy(policy).prefix_cache != "none"


def pages_in_kib(policy: str) -> bool:
    """Whether `policy` sizes its blocks as pages of `page_kib` KiB per layer per K/V buffer, not in tokens."""
    return _policy(policy).page_tokens is not None


def gpu_pool_blocks(policy: str, model, num_slots: int, block_size: int) -> int:
    """The blocks (pages) of the policy's GPU pool in the bytes of `num_slots` all-layer token slots."""
    count = _policy(policy).pool_blocks
    return num_slots // block_size if count is None or model is None else count(model, num_slots, block_size)


def check_model(policy: str, model) -> None:
    """One line of ValueError if `policy` cannot serve `model` (a sim.base.specs.ModelSpec): hybrid needs sliding windows."""
    spec = _policy(policy)
    if spec.check_model is not None:
        spec.check_model(model)


def simulator_block_size(policy: str, block_size: int, *, model=None, num_gpus: int = 1,
                         page_kib: float | None = None) -> int:
    """The block size `policy` runs at in the simulator: `block_size`, or 1 for token-granular baselines, or the
    tokens of one `page_kib` page of `model` (a sim.base.specs.ModelSpec) for a policy that maps pages (vattention)."""
    spec = _policy(policy)
    if spec.page_tokens is not None:
        return spec.page_tokens(model, num_gpus, page_kib)
    return 1 if spec.token_granular_in_simulator else block_size


def make_kv_manager(
    policy: str,
    num_slots: int,
    *,
    block_size: int = 16,
    max_seq_len: int = 2048,
    allocator: str = "buddy",
    enable_prefix_caching: bool = False,
    num_cpu_blocks: int = 0,
    watermark: float = 0.0,
    model=None,
    block_allocator: Callable | None = None,
    num_offload_blocks: int = 0,
) -> KVManager:
    """A KV manager for `policy` over `num_slots` token slots (the pool holds num_slots // block_size blocks).

    Options a policy has no use for are ignored, and the manager says what it does: `allocator` and
    `max_seq_len` shape the contiguous reservations; prefix caching (`kv.enable_prefix_caching`) exists only where
    `has_prefix_cache(policy)`, CPU swap space (`kv.num_cpu_blocks`) only where `has_swap_space(policy)`, and the
    admission `watermark` (a share of the blocks) only where `allocates_blocks_on_demand(policy)`. `model` (a
    sim.base.specs.ModelSpec) is for a policy that needs the model's layers: hybrid groups them (sim.kv.hybrid), and turns
    the `num_slots` all-layer token slots into pages of the same bytes. `block_allocator`: a class or function
    (num_blocks, block_size) -> the GPU pool's allocator, with sim.kv.blocks.BlockAllocator's methods (a student's own,
    lab 03), only where `takes_block_allocator(policy)` (else ValueError). `num_offload_blocks`: a CPU offload tier of
    that many blocks for evicted prefix-cache blocks (sim/kv/offload.py), only where `offload_tier_refusal(policy)` is
    None (else ValueError).
    """
    spec = _policy(policy)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    num_blocks = num_slots // block_size
    if num_blocks < 1:
        raise ValueError(f"a pool of {num_slots} slots holds no block of {block_size} tokens")
    if block_allocator is not None and not spec.plugs_block_allocator:
        takes = ", ".join(p for p, s in _REGISTRY.items() if s.plugs_block_allocator)
        raise ValueError(f"policy {policy!r} runs its own allocator (allowed with block_allocator: {takes})")
    if num_offload_blocks and offload_tier_refusal(policy) is not None:
        raise ValueError(offload_tier_refusal(policy))
    options = dict(max_seq_len=max_seq_len, allocator=allocator, enable_prefix_caching=enable_prefix_caching,
                   num_cpu_blocks=num_cpu_blocks, watermark=watermark, num_slots=num_slots, model=model,
                   block_allocator=block_allocator, num_offload_blocks=num_offload_blocks)
    return spec.build(num_blocks, block_size, options)


def pool_blocks_for(policy: str, prompt_len: int, final_len: int, num_seqs: int = 1, *, block_size: int = 16,
                    max_seq_len: int = 2048, model=None) -> int:
    """The smallest pool, in a power of two of blocks, in which `policy` can serve one request of `num_seqs`
    sequences of this final length (its `check_request` passes): a pool sized for one request, found through the
    KV contract alone (a buddy allocator hands out powers of two). `model`: as for make_kv_manager (hybrid)."""
    blocks = 1
    while True:
        kv = make_kv_manager(policy, blocks * block_size, block_size=block_size, max_seq_len=max_seq_len,
                             model=model)
        if kv.check_request(prompt_len, final_len, num_seqs) is None:
            return blocks
        if blocks * block_size > 2 * num_seqs * max(final_len, max_seq_len):
            raise ValueError(f"no pool serves {num_seqs} sequence(s) of final length {final_len} under {policy!r}: "
                             f"{kv.check_request(prompt_len, final_len, num_seqs)}")
        blocks *= 2


__all__ = ["SHARE_NAMES", "Allocation", "BlockCopy", "KVManager", "MemoryBreakdown", "NewSequence", "POLICIES",
           "PrefixCacheStats", "as_seen", "check_model", "gpu_pool_blocks", "layer_groups", "make_kv_manager", "offload_tier_refusal",
           "pool_blocks_for",
           "simulator_block_size", "takes_block_allocator"]
