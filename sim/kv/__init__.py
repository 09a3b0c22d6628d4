"""KV-cache managers: one contract (`base.KVManager`), one small class per policy, registered here.

    paged                      vLLM: blocks on demand, shared with reference counts, copy-on-write
    max / pow2 / oracle        the paper's Orca baselines: one contiguous reservation per sequence

`make_kv_manager` builds any of them over a pool of `num_slots` token slots. A new policy is one file in this
folder plus one entry in `_REGISTRY`: nothing outside `sim/kv/` knows which policy it is talking to.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .base import (SHARE_NAMES, Allocation, BlockCopy, KVManager, MemoryBreakdown, NewSequence, PrefixCacheStats,
                   as_seen)  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Policy:
    build: Callable[..., KVManager]  # (num_blocks, block_size, options) -> manager
    # NOTE: the paper's Orca reimplementation reserved token-granular runs, so the simulator runs the contiguous
    # baselines at block size 1; the engine keeps its cache's block size for every policy.
    token_granular_in_simulator: bool


def _paged(num_blocks: int, block_size: int, o: dict) -> KVManager:
    from .paged import PagedKVManager

    return PagedKVManager(num_blocks, block_size, o["enable_prefix_caching"], o["num_cpu_blocks"], o["watermark"])


def _contiguous(rule: str) -> Callable[..., KVManager]:
    def build(num_blocks: int, block_size: int, o: dict) -> KVManager:
        from .contiguous import ContiguousKVManager

        return ContiguousKVManager(num_blocks, block_size, reserve=rule, allocator=o["allocator"],
                                   max_seq_len=o["max_seq_len"])  # fmt: skip

    return build


_REGISTRY = {
    "paged": _Policy(_paged, token_granular_in_simulator=False),
    "max": _Policy(_contiguous("max"), token_granular_in_simulator=True),
    "pow2": _Policy(_contiguous("pow2"), token_granular_in_simulator=True),
    "oracle": _Policy(_contiguous("oracle"), token_granular_in_simulator=True),
}
POLICIES = tuple(_REGISTRY)


def _policy(policy: str) -> _Policy:
    if policy not in _REGISTRY:
        raise ValueError(f"unknown KV policy {policy!r} (allowed: {', '.join(POLICIES)})")
    return _REGISTRY[policy]


def allocates_blocks_on_demand(policy: str) -> bool:
    """Whether `policy` hands out blocks as sequences grow (paged) rather than reserving runs up front: only such a
    pool has a block size of its own, a prefix cache, swap space, an admission watermark and preemption."""
    return not _policy(policy).token_granular_in_simulator


def simulator_block_size(policy: str, block_size: int) -> int:
    """The block size `policy` runs at in the simulator: `block_size`, or 1 for token-granular baselines."""
    return 1 if _policy(policy).token_granular_in_simulator else block_size


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
) -> KVManager:
    """A KV manager for `policy` over `num_slots` token slots (the pool holds num_slots // block_size blocks).

    Options a policy has no use for are ignored, and the manager says what it does: `allocator` and
    `max_seq_len` shape the contiguous reservations; prefix caching (`kv.enable_prefix_caching`), CPU swap
    space (`kv.num_cpu_blocks`) and the admission `watermark` (a share of the blocks) exist only where blocks
    are shared and allocated on demand.
    """
    spec = _policy(policy)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    num_blocks = num_slots // block_size
    if num_blocks < 1:
        raise ValueError(f"a pool of {num_slots} slots holds no block of {block_size} tokens")
    options = dict(max_seq_len=max_seq_len, allocator=allocator, enable_prefix_caching=enable_prefix_caching,
                   num_cpu_blocks=num_cpu_blocks, watermark=watermark)  # fmt: skip
    return spec.build(num_blocks, block_size, options)


def pool_blocks_for(policy: str, prompt_len: int, final_len: int, num_seqs: int = 1, *, block_size: int = 16,
                    max_seq_len: int = 2048) -> int:
    """The smallest pool, in a power of two of blocks, in which `policy` can serve one request of `num_seqs`
    sequences of this final length (its `check_request` passes): a pool sized for one request, found through the
    KV contract alone (a buddy allocator hands out powers of two)."""
    blocks = 1
    while True:
        kv = make_kv_manager(policy, blocks * block_size, block_size=block_size, max_seq_len=max_seq_len)
        if kv.check_request(prompt_len, final_len, num_seqs) is None:
            return blocks
        if blocks * block_size > 2 * num_seqs * max(final_len, max_seq_len):
            raise ValueError(f"no pool serves {num_seqs} sequence(s) of final length {final_len} under {policy!r}: "
                             f"{kv.check_request(prompt_len, final_len, num_seqs)}")  # fmt: skip
        blocks *= 2


__all__ = ["SHARE_NAMES", "Allocation", "BlockCopy", "KVManager", "MemoryBreakdown", "NewSequence", "POLICIES",
           "PrefixCacheStats", "as_seen", "make_kv_manager", "pool_blocks_for", "simulator_block_size"]  # fmt: skip
