"""PagedKVManager, narrated: sharing and copy-on-write, prefix hits, out of memory, the breakdown, swapping."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv import MemoryBreakdown, make_kv_manager
from sim.kv.paged import PagedKVManager


def test_parallel_samples_share_the_prompt_then_copy_on_write():
    kv = PagedKVManager(8, 4)
    # admit n=2 with a 6-token prompt: both samples point at the same two blocks [0, 1]
    assert kv.admit([10, 11], 6, [9, 9]) == 0
    assert kv.block_table(10) == kv.block_table(11) == [0, 1]
    assert [kv.allocator.ref_count(b) for b in (0, 1)] == [2, 2]
    # sample 10 writes token 7 into block 1, which is shared and partly filled: copy it to block 2 first
    assert kv.append_slots(10) == [(1, 2)]
    assert kv.block_table(10) == [0, 2] and kv.block_table(11) == [0, 1]
    assert [kv.allocator.ref_count(b) for b in (0, 1, 2)] == [2, 1, 1]
    # sample 11 is now block 1's only owner: it writes in place, no copy
    assert kv.append_slots(11) == []
    assert kv.block_table(11) == [0, 1]
    kv.check_invariants()


def test_fork_shares_every_block_until_the_first_write():
    kv = PagedKVManager(8, 4)
    kv.admit([0], 5, [8])  # blocks [0, 1]: 4 tokens + 1 token
    # fork: both sequences now point at blocks 0 and 1, nothing copied
    assert kv.fork(0, 1, final_len=8) == []
    assert kv.block_table(1) == [0, 1] and kv.num_tokens(1) == 5
    # the child writes first: block 1 is copied to block 2, the parent keeps block 1
    assert kv.append_slots(1) == [(1, 2)]
    assert (kv.block_table(0), kv.block_table(1)) == ([0, 1], [0, 2])
    # freeing the parent leaves block 0 to the child alone
    kv.free(0)
    assert kv.allocator.ref_count(0) == 1 and kv.num_free_blocks == 6
    kv.check_invariants()


def test_a_prefix_hit_after_free_and_lru_eviction():
    kv = PagedKVManager(6, 4, enable_prefix_caching=True)
    prompt = list(range(10))  # blocks: [0 1 2 3] [4 5 6 7] [8 9 . .]
    # first request: nothing cached; its two full blocks 0 and 1 are registered at admission
    assert kv.admit([0], 10, [12], prompt) == 0
    assert kv.allocator.is_cached(0) and kv.allocator.is_cached(1) and not kv.allocator.is_cached(2)
    # it finishes: all 6 blocks count as free, though blocks 0 and 1 still hold the prefix
    kv.free(0)
    assert kv.num_free_blocks == 6 and kv.breakdown().free == 24
    # same prefix again: 8 tokens are found in the cache, and the very same blocks come back
    # (its partial third block is new: never-used block 3 from the front of the free queue [3, 4, 5, 2, 1, 0])
    assert kv.admit([1], 10, [12], prompt) == 8
    assert kv.block_table(1) == [0, 1, 3]
    assert (kv.allocator.num_prefix_hits, kv.allocator.num_prefix_misses) == (2, 1)
    kv.free(1)
    # a different prompt needing 4 blocks: the free queue (least recently freed first) is now
    # [4, 5, 2, 3, 1, 0]: request 1's blocks went to the back tail first. It takes 4, 5, 2, 3.
    assert kv.admit([2], 16, [16], [100 + t for t in range(16)]) == 0
    assert kv.block_table(2) == [4, 5, 2, 3]
    assert kv.allocator.is_cached(0) and kv.allocator.is_cached(1)
    # a 5-token prompt with the first block of the prefix: block 0 hits; its second block is new,
    # and the pool evicts the least recently freed cached block, 1, to provide it
    assert kv.admit([3], 5, [5], prompt[:5]) == 4
    assert kv.block_table(3) == [0, 1] and not kv.allocator.is_cached(1)
    kv.check_invariants()


def test_a_block_aligned_prompt_recomputes_its_last_token():
    kv = PagedKVManager(6, 4, enable_prefix_caching=True)
    prompt = list(range(8))  # exactly two full blocks
    kv.admit([0], 8, [8], prompt)
    # both blocks are cached, but the step must still produce logits for token 7: only block 0 may hit,
    # so 4 tokens are cached and block 1 is recomputed into a new block
    assert kv.admit([1], 8, [8], prompt) == 4
    assert kv.block_table(1)[0] == kv.block_table(0)[0] and kv.block_table(1)[1] != kv.block_table(0)[1]
    kv.check_invariants()


def test_out_of_memory_changes_nothing():
    kv = PagedKVManager(3, 4, enable_prefix_caching=True)
    kv.admit([0, 1], 7, [12, 12], list(range(7)))  # blocks [0, 1], both shared by two samples
    before = (kv.block_table(0), kv.block_table(1), kv.num_free_blocks, kv.breakdown())
    # a prompt of 9 tokens needs 3 blocks; only 1 is free
    assert not kv.can_admit(9, [9], list(range(9)))
    assert kv.admit([2], 9, [9], list(range(9))) is None
    # sample 0 wants 6 tokens: copy its shared block 1 and one new block = 2 blocks; only 1 is free
    assert not kv.can_append(0, 6)
    assert kv.append_slots(0, 6) is None
    assert (kv.block_table(0), kv.block_table(1), kv.num_free_blocks, kv.breakdown()) == before
    assert kv.allocator.num_prefix_hits == 0  # the refused admission counted no lookups
    kv.check_invariants()


def test_breakdown_by_hand():
    kv = PagedKVManager(8, 4)
    # prompt 6, final length 9, block_size 4:   [t0 t1 t2 t3] [t4 t5 r r]
    # 6 token states; the two empty slots will hold tokens 6 and 7, so both are reservation, no waste;
    # 6 blocks of 4 are free: 24
    kv.admit([0], 6, [9])
    assert kv.breakdown() == MemoryBreakdown(6, 2, 0, 0, 24)
    # 3 more tokens: [t0..t3] [t4..t7] [t8 i i i]: token 8 is the last one it will ever have,
    # so the 3 empty slots of block 2 are internal fragmentation
    kv.append_slots(0, 3)
    assert kv.breakdown() == MemoryBreakdown(9, 0, 3, 0, 20)
    # a second group, n=2, prompt 5, final lengths 6 and 7: shared blocks [t0..t3] [t4 r r i]
    # count once; the reservation reaches as far as the longer sample (7 tokens)
    kv.admit([1, 2], 5, [6, 7])
    assert kv.breakdown() == MemoryBreakdown(9 + 5, 0 + 2, 3 + 1, 0, 12)
    # while a request waits, the free slots it cannot use are external fragmentation
    assert kv.breakdown(waiting=True) == MemoryBreakdown(14, 2, 4, 12, 0)
    kv.check_invariants()


def _history(kv: PagedKVManager, n: int, prompt_len: int, fork: bool) -> None:
    kv.admit(list(range(n)), prompt_len, [64] * n)
    if fork:
        kv.fork(0, 99, 64)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(
    n=st.integers(1, 3), prompt_len=st.integers(1, 12), fork=st.booleans(),
    appends=st.lists(st.integers(0, 9), min_size=1, max_size=4),
)
def test_multi_token_append_equals_single_appends(n, prompt_len, fork, appends):
    one_by_one, jump = PagedKVManager(40, 4), PagedKVManager(40, 4)
    _history(one_by_one, n, prompt_len, fork)
    _history(jump, n, prompt_len, fork)
    for k in appends:
        copies = [c for _ in range(k) for c in one_by_one.append_slots(0, 1)]
        # jumping k decode steps at once does the same copies and ends in the same state
        assert jump.append_slots(0, k) == copies
        assert jump.block_table(0) == one_by_one.block_table(0)
        assert jump.num_tokens(0) == one_by_one.num_tokens(0)
        assert jump.breakdown() == one_by_one.breakdown()
        refs = [(jump.allocator.ref_count(b), one_by_one.allocator.ref_count(b)) for b in range(40)]
        assert all(a == b for a, b in refs)
    jump.check_invariants()


def test_swap_out_and_in_round_trip():
    kv = PagedKVManager(6, 4, num_cpu_blocks=4)
    kv.admit([0, 1], 6, [10, 10])  # both samples on blocks [0, 1]
    kv.append_slots(1)  # sample 1 copies block 1 -> 2: tables [0, 1] and [0, 2]
    kv.admit([7], 3, [4])  # another request on block 3, stays on the GPU
    # swap the group out: 3 distinct blocks move once each; block 0 stays shared on the CPU
    copies = kv.swap_out([0, 1])
    assert sorted(src for src, _ in copies) == [0, 1, 2]
    assert kv.is_swapped(0) and kv.block_table(0)[0] == kv.block_table(1)[0]
    assert kv.num_free_blocks == 5 and kv.breakdown().token_states == 3  # only request 7 is on the GPU
    assert kv.cpu_allocator.ref_count(kv.block_table(0)[0]) == 2
    # and back: 3 CPU -> GPU copies, sharing restored, every CPU block returned
    back = kv.swap_in([0, 1])
    assert sorted(src for src, _ in back) == sorted(dst for _, dst in copies)
    assert kv.block_table(0)[0] == kv.block_table(1)[0] and kv.allocator.ref_count(kv.block_table(0)[0]) == 2
    assert kv.cpu_allocator.num_free_blocks == 4 and kv.num_free_blocks == 2
    assert (kv.num_tokens(0), kv.num_tokens(1)) == (6, 7)
    kv.check_invariants()


def test_swap_is_all_or_nothing():
    kv = PagedKVManager(4, 4, num_cpu_blocks=1)
    kv.admit([0], 6, [6])  # 2 blocks; the CPU holds only 1
    assert not kv.can_swap_out([0]) and kv.swap_out([0]) is None
    assert kv.block_table(0) == [0, 1] and not kv.is_swapped(0)
    assert PagedKVManager(4, 4).swap_out([]) is None  # no CPU swap space at all
    kv.check_invariants()


def test_swapped_sequences_cannot_grow_until_swapped_in():
    kv = PagedKVManager(4, 4, num_cpu_blocks=4)
    kv.admit([0], 3, [8])
    kv.swap_out([0])
    with pytest.raises(RuntimeError, match="swapped out"):
        kv.append_slots(0)
    kv.free(0)  # freeing a swapped sequence returns its CPU blocks
    assert kv.cpu_allocator.num_free_blocks == 4


def test_make_kv_manager_builds_paged():
    kv = make_kv_manager("paged", 64, block_size=16, enable_prefix_caching=True, num_cpu_blocks=2)
    assert isinstance(kv, PagedKVManager)
    assert (kv.policy, kv.num_blocks, kv.num_slots, kv.enable_prefix_caching) == ("paged", 4, 64, True)


def test_check_invariants_catches_a_leaked_reference():
    kv = PagedKVManager(4, 4)
    kv.admit([0], 4, [4])
    kv.allocator.share([0])  # a reference nobody's block table holds
    with pytest.raises(RuntimeError, match="expected ref count 1"):
        kv.check_invariants()
