"""The halves of the KV contract (sim/kv/base.py) that a manager without swap space or a prefix cache answers with
"no": the contiguous, vAttention and hybrid managers inherit them, so their own files hold only their policy.
"""
from __future__ import annotations

from typing import Sequence

from .base import BlockCopy, PrefixCacheStats


class NoSwapSpace:
    """The swap half of the contract for a manager with no CPU swap space (num_cpu_blocks = 0): every question is
    answered no, so the scheduler preempts its groups by recompute. Mixed into such managers (contiguous,
    vattention, hybrid)."""

    num_cpu_blocks = 0

    def can_swap_out(self, seq_ids: Sequence[int]) -> bool:
        return False

    def swap_out(self, seq_ids: Sequence[int]) -> list[BlockCopy] | None:
        return None

    def can_swap_in(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int]) -> bool:
        return False

    def swap_in(self, seq_ids: Sequence[int]) -> list[BlockCopy] | None:
        return None

    def is_swapped(self, seq_id: int) -> bool:
        return False


class NoPrefixCache:
    """The prefix-cache half of the contract for a manager that shares nothing between requests: no lookup finds
    anything, nothing is registered, the stats stay zero. Mixed into such managers (contiguous, vattention, hybrid)."""

    enable_prefix_caching = False

    def get_computed_tokens(self, token_ids: Sequence[int] | None, num_tokens: int) -> int:
        return 0

    def uncache(self, block_ids: Sequence[int]) -> None:
        pass  # nothing registered

    def prefix_cache_stats(self) -> PrefixCacheStats:
        return PrefixCacheStats()

    def take_tier_copies(self) -> list:
        return []  # no prefix cache: nothing to offload
