"""KV-cache managers: one protocol (`base.KVManager`), one small class per policy.

    paged                      vLLM: blocks on demand, shared with reference counts, copy-on-write
    max / pow2 / oracle        the paper's Orca baselines: one contiguous reservation per sequence

`make_kv_manager` builds any of them over a pool of `num_slots` token slots.
"""
from __future__ import annotations

from .base import SHARE_NAMES, BlockCopy, KVManager, MemoryBreakdown

POLICIES = ("paged", "max", "pow2", "oracle")


def make_kv_manager(
    policy: str,
    num_slots: int,
    *,
    block_size: int = 16,
    max_seq_len: int = 2048,
    allocator: str = "buddy",
    enable_prefix_caching: bool = False,
    num_cpu_blocks: int = 0,
) -> KVManager:
    """A KV manager for `policy` over `num_slots` token slots (the pool holds num_slots // block_size blocks).

    `allocator` ("buddy" or "first_fit") and `max_seq_len` matter only to the contiguous policies;
    prefix caching and CPU swap space only to paged.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown KV policy {policy!r} (allowed: {', '.join(POLICIES)})")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    num_blocks = num_slots // block_size
    if num_blocks < 1:
        raise ValueError(f"a pool of {num_slots} slots holds no block of {block_size} tokens")
    if policy == "paged":
        from .paged import PagedKVManager

        return PagedKVManager(num_blocks, block_size, enable_prefix_caching, num_cpu_blocks)
    from .contiguous import ContiguousKVManager

    return ContiguousKVManager(num_blocks, block_size, reserve=policy, allocator=allocator, max_seq_len=max_seq_len)


__all__ = ["SHARE_NAMES", "BlockCopy", "KVManager", "MemoryBreakdown", "POLICIES", "make_kv_manager"]
