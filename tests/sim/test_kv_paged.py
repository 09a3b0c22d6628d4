"""PagedKVManager through the KV contract, narrated: admission in chunks, sharing and copy-on-write, prefix hits,
out of memory, the watermark, the breakdown, swapping, bulk decode runs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.fast.runs import kv_runs
from sim.kv import MemoryBreakdown, NewSequence, make_kv_manager
from sim.kv.paged import PagedKVManager


def admit(kv, seq_id: int, prompt_len: int, final_len: int, ids=None, chunk: int | None = None):
    """Admit one sequence the way the scheduler does: look up the prefix cache, then allocate its first chunk
    (default: the whole prompt) after the hits. Returns (cached tokens, the allocation or None)."""
    cached = kv.get_computed_tokens(ids, prompt_len)
    count = prompt_len - cached if chunk is None else chunk
    return cached, kv.allocate_slots([seq_id], [count], [NewSequence(prompt_len, final_len, ids, cached)])


def test_a_prompt_admitted_in_chunks_grows_its_table_chunk_by_chunk():
    kv = PagedKVManager(8, 4)
    # a 10-token prompt, first chunk of 3: one block [0], 3 slots used
    assert admit(kv, 0, 10, 14, chunk=3)[1].copies == []
    assert kv.block_table(0) == [0] and kv.num_tokens(0) == 3
    # next chunk of 6 tokens (3..8): fills block 0 and opens blocks 1 and 2
    assert kv.allocate_slots([0], [6]).copies == []
    assert kv.block_table(0) == [0, 1, 2] and kv.num_tokens(0) == 9
    # the last prompt token, then decodes: tokens 9..11 fit block 2
    kv.allocate_slots([0], [1])
    kv.allocate_slots([0], [2])
    assert kv.block_table(0) == [0, 1, 2] and kv.num_tokens(0) == 12
    kv.check_invariants()


def test_parallel_samples_share_the_prompt_then_copy_on_write():
    """Deliberate change: a group is no longer admitted as a whole; its leader is, and the siblings are forked."""
    kv = PagedKVManager(8, 4)
    # n=2 with a 6-token prompt: the leader (10) is admitted alone on blocks [0, 1] ...
    admit(kv, 10, 6, 9)
    # ... and once its prompt is computed, its sibling (11) is forked: both point at the same two blocks
    assert kv.fork(10, 11, final_len=9) == []
    assert kv.block_table(10) == kv.block_table(11) == [0, 1]
    assert [kv.allocator.ref_count(b) for b in (0, 1)] == [2, 2]
    # sample 10 writes token 7 into block 1, which is shared and partly filled: copy it to block 2 first
    assert kv.allocate_slots([10], [1]).copies == [(1, 2)]
    assert kv.block_table(10) == [0, 2] and kv.block_table(11) == [0, 1]
    assert [kv.allocator.ref_count(b) for b in (0, 1, 2)] == [2, 1, 1]
    # sample 11 is now block 1's only owner: it writes in place, no copy
    assert kv.allocate_slots([11], [1]).copies == []
    assert kv.block_table(11) == [0, 1]
    kv.check_invariants()


def test_a_group_grows_all_or_nothing_and_copies_once_per_extra_owner():
    kv = PagedKVManager(5, 4)
    admit(kv, 0, 6, 12)
    kv.fork(0, 1, 12)
    kv.fork(0, 2, 12)  # three owners of blocks [0, 1]; block 1 holds 2 tokens
    # all three write one token: two copy block 1 (to blocks 2 and 3), the last writes in place
    assert kv.allocate_slots([0, 1, 2], [1, 1, 1]).copies == [(1, 2), (1, 3)]
    assert [kv.block_table(i) for i in (0, 1, 2)] == [[0, 2], [0, 3], [0, 1]]
    # 3 more tokens each would open a block each: 3 blocks, only 1 free: refused, nothing changed
    before = [kv.block_table(i) for i in (0, 1, 2)], kv.num_free_blocks
    assert not kv.can_allocate_slots([0, 1, 2], [3, 3, 3])
    assert kv.allocate_slots([0, 1, 2], [3, 3, 3]) is None
    assert ([kv.block_table(i) for i in (0, 1, 2)], kv.num_free_blocks) == before
    kv.check_invariants()


def test_fork_shares_every_block_until_the_first_write():
    kv = PagedKVManager(8, 4)
    admit(kv, 0, 5, 8)  # blocks [0, 1]: 4 tokens + 1 token
    # fork: both sequences now point at blocks 0 and 1, nothing copied
    assert kv.fork(0, 1, final_len=8) == []
    assert kv.block_table(1) == [0, 1] and kv.num_tokens(1) == 5
    # the child writes first: block 1 is copied to block 2, the parent keeps block 1
    assert kv.allocate_slots([1], [1]).copies == [(1, 2)]
    assert (kv.block_table(0), kv.block_table(1)) == ([0, 1], [0, 2])
    # freeing the parent leaves block 0 to the child alone
    kv.free(0)
    assert kv.allocator.ref_count(0) == 1 and kv.num_free_blocks == 6
    kv.check_invariants()


def test_a_prefix_hit_after_free_and_lru_eviction():
    kv = PagedKVManager(6, 4, enable_prefix_caching=True)
    prompt = list(range(10))  # blocks: [0 1 2 3] [4 5 6 7] [8 9 . .]
    # first request: nothing cached; its two full blocks 0 and 1 are registered as they are allocated
    assert admit(kv, 0, 10, 12, prompt)[0] == 0
    assert kv.allocator.is_cached(0) and kv.allocator.is_cached(1) and not kv.allocator.is_cached(2)
    # it finishes: all 6 blocks count as free, though blocks 0 and 1 still hold the prefix
    kv.free(0)
    assert kv.num_free_blocks == 6 and kv.breakdown().free == 24
    # same prefix again: 8 tokens are found in the cache, and the very same blocks come back (its partial third
    # block is new: block 2 from the front of the free queue [2, 3, 4, 5, 1, 0]: freed tail first, uncached blocks
    # go to the front and cached ones to the back, as in vLLM v1)
    assert admit(kv, 1, 10, 12, prompt)[0] == 8
    assert kv.block_table(1) == [0, 1, 2]
    assert (kv.allocator.num_prefix_hits, kv.allocator.num_prefix_misses) == (2, 1)
    stats = kv.prefix_cache_stats()  # both admissions looked up 2 full blocks (the last token never hits)
    assert (stats.queried_blocks, stats.hit_blocks, stats.queried_tokens, stats.hit_tokens) == (4, 2, 20, 8)
    kv.free(1)
    # a different prompt needing 4 blocks: the free queue is [2, 3, 4, 5, 1, 0] again (request 1's uncached
    # block 2 at the front, its cached blocks 1 and 0 at the back, tail first). It takes 2, 3, 4, 5.
    assert kv.allocator.free_queue() == [2, 3, 4, 5, 1, 0]
    assert admit(kv, 2, 16, 16, [100 + t for t in range(16)])[0] == 0
    assert kv.block_table(2) == [2, 3, 4, 5]
    assert kv.allocator.is_cached(0) and kv.allocator.is_cached(1)
    # a 5-token prompt with the first block of the prefix: block 0 hits; its second block is new,
    # and the pool evicts the least recently freed cached block, 1, to provide it
    assert admit(kv, 3, 5, 5, prompt[:5])[0] == 4
    assert kv.block_table(3) == [0, 1] and not kv.allocator.is_cached(1)
    kv.check_invariants()


def test_a_chunked_prompt_registers_each_block_when_its_chunk_is_allocated():
    kv = PagedKVManager(8, 4, enable_prefix_caching=True)
    prompt = list(range(12))
    admit(kv, 0, 12, 14, prompt, chunk=6)  # tokens 0..5: block 0 is full, block 1 is not
    assert kv.allocator.is_cached(0) and not kv.allocator.is_cached(1)
    # a second request with the same prompt, admitted now, already hits block 0 (computed in this step)
    assert kv.get_computed_tokens(prompt, 12) == 4
    kv.allocate_slots([0], [6])  # tokens 6..11: blocks 1 and 2 are full now
    assert kv.allocator.is_cached(1) and kv.allocator.is_cached(2)
    assert kv.get_computed_tokens(prompt, 12) == 8  # never the block holding the last token
    kv.check_invariants()


def test_a_block_aligned_prompt_recomputes_its_last_token():
    kv = PagedKVManager(6, 4, enable_prefix_caching=True)
    prompt = list(range(8))  # exactly two full blocks
    admit(kv, 0, 8, 8, prompt)
    # both blocks are cached, but the step must still produce logits for token 7: only block 0 may hit,
    # so 4 tokens are cached and block 1 is recomputed into a new block
    assert admit(kv, 1, 8, 8, prompt)[0] == 4
    assert kv.block_table(1)[0] == kv.block_table(0)[0] and kv.block_table(1)[1] != kv.block_table(0)[1]
    kv.check_invariants()


def test_a_recompute_readmission_hits_the_whole_prompt():
    kv = PagedKVManager(6, 4, enable_prefix_caching=True)
    prompt = list(range(8))  # exactly two full blocks
    admit(kv, 0, 8, 12, prompt)
    kv.allocate_slots([0], [3])  # 3 generated tokens fed: 11 tokens in blocks [0, 1, 2]
    kv.free(0)  # preempted by recompute: blocks 0 and 1 stay cached while free
    # a fresh prompt of 8 must compute its last token, so only block 0 could hit; a re-admission holds 11 tokens,
    # the prompt is not its end, and both prompt blocks hit: only the 3 generated tokens are computed again
    assert kv.get_computed_tokens(prompt, 8) == 4 and kv.get_computed_tokens(prompt, 11) == 8
    assert kv.allocate_slots([1], [3], [NewSequence(8, 12, prompt, 8)]) is not None
    assert kv.block_table(1)[:2] == [0, 1] and kv.num_tokens(1) == 11
    kv.check_invariants()


def test_a_sequence_skipping_the_prefix_cache_reads_nothing_but_is_cached():
    """vLLM's skip_reading_prefix_cache (a request that wants prompt log-probs): no hit, no lookup counted, every
    token computed into new blocks, which are cached beside the first holders."""
    kv = PagedKVManager(8, 4, enable_prefix_caching=True)
    prompt = list(range(10))
    admit(kv, 0, 10, 12, prompt)  # blocks 0, 1 cached
    before = kv.prefix_cache_stats()
    skip = NewSequence(10, 12, prompt, 0, skip_reading_prefix_cache=True)
    assert kv.allocate_slots([1], [10], [skip]) is not None
    assert not set(kv.block_table(1)) & set(kv.block_table(0)) and kv.num_tokens(1) == 10
    assert all(kv.allocator.is_cached(b) for b in kv.block_table(1)[:2])  # its own full blocks, cached too
    assert kv.prefix_cache_stats() == before  # not a lookup: not counted
    with pytest.raises(ValueError, match="num_cached_tokens must be 0 when skipping the prefix cache, got 4"):
        NewSequence(10, 12, prompt, 4, skip_reading_prefix_cache=True)
    kv.check_invariants()


def test_out_of_memory_changes_nothing():
    kv = PagedKVManager(3, 4, enable_prefix_caching=True)
    admit(kv, 0, 7, 12, list(range(7)))
    kv.fork(0, 1, 12)  # blocks [0, 1], both shared by two samples
    before = (kv.block_table(0), kv.block_table(1), kv.num_free_blocks, kv.breakdown())
    # a prompt of 9 tokens needs 3 blocks; only 1 is free
    new = [NewSequence(9, 9, list(range(9)), kv.get_computed_tokens(list(range(9)), 9))]
    assert new[0].num_cached_tokens == 4  # block 0 would hit; the other two must still be allocated
    assert not kv.can_allocate_slots([2], [5], new)
    assert kv.allocate_slots([2], [5], new) is None
    # sample 0 wants 6 tokens: copy its shared block 1 and one new block = 2 blocks; only 1 is free
    assert not kv.can_allocate_slots([0], [6])
    assert kv.allocate_slots([0], [6]) is None
    assert (kv.block_table(0), kv.block_table(1), kv.num_free_blocks, kv.breakdown()) == before
    assert kv.allocator.num_prefix_hits == 0  # the refused admission counted no lookups
    kv.check_invariants()


def test_the_watermark_keeps_admissions_from_taking_the_last_blocks():
    kv = PagedKVManager(10, 4, watermark=0.2)  # 2 of 10 blocks must stay free after an admission
    assert admit(kv, 0, 32, 40)[1] is not None  # 8 blocks: 2 left, the watermark holds
    assert admit(kv, 1, 1, 4)[1] is None  # 1 more block would leave 1 < 2: refused
    assert kv.allocate_slots([0], [5]) is not None  # growth of a running sequence may use the watermark
    assert kv.check_request(4, 32, 1) is None and "allowed: <= 8 of 10" in kv.check_request(4, 32, 3)
    kv.check_invariants()


def test_breakdown_by_hand():
    kv = PagedKVManager(8, 4)
    # prompt 6, final length 9, block_size 4:   [t0 t1 t2 t3] [t4 t5 r r]
    # 6 token states; the two empty slots will hold tokens 6 and 7, so both are reservation, no waste;
    # 6 blocks of 4 are free: 24
    admit(kv, 0, 6, 9)
    assert kv.breakdown() == MemoryBreakdown(6, 2, 0, 0, 24)
    # 3 more tokens: [t0..t3] [t4..t7] [t8 i i i]: token 8 is the last one it will ever have,
    # so the 3 empty slots of block 2 are internal fragmentation
    kv.allocate_slots([0], [3])
    assert kv.breakdown() == MemoryBreakdown(9, 0, 3, 0, 20)
    # a second group, n=2, prompt 5, final lengths 6 and 7: the leader's blocks [t0..t3] [t4 r r i], shared with
    # the forked sibling, count once; the reservation reaches as far as the longer sample (7 tokens)
    admit(kv, 1, 5, 6)
    kv.fork(1, 2, 7)
    assert kv.breakdown() == MemoryBreakdown(9 + 5, 0 + 2, 3 + 1, 0, 12)
    # while a request waits, the free slots it cannot use are external fragmentation
    assert kv.breakdown(waiting=True) == MemoryBreakdown(14, 2, 4, 12, 0)
    # slot by slot: the same counts
    by_kind = [0] * 5
    for _, lo, hi, kind in kv.slot_segments():
        by_kind[kind] += hi - lo
    assert by_kind[:4] == [14, 2, 4, 0]
    kv.check_invariants()


def _history(kv: PagedKVManager, n: int, prompt_len: int, fork: bool) -> None:
    admit(kv, 0, prompt_len, 64)
    for child in range(1, n):
        kv.fork(0, child, 64)
    if fork:
        kv.fork(0, 99, 64)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(
    n=st.integers(1, 3),
    prompt_len=st.integers(1, 12),
    fork=st.booleans(),
    appends=st.lists(st.integers(0, 9), min_size=1, max_size=4),
)
def test_multi_token_append_equals_single_appends(n, prompt_len, fork, appends):
    one_by_one, chunked = PagedKVManager(40, 4), PagedKVManager(40, 4)
    _history(one_by_one, n, prompt_len, fork)
    _history(chunked, n, prompt_len, fork)
    for k in appends:
        copies = [c for _ in range(k) for c in one_by_one.allocate_slots([0], [1]).copies]
        # a chunk of k tokens does the same copies and ends in the same state as k single tokens
        assert chunked.allocate_slots([0], [k]).copies == copies
        assert chunked.block_table(0) == one_by_one.block_table(0)
        assert chunked.num_tokens(0) == one_by_one.num_tokens(0)
        assert chunked.breakdown() == one_by_one.breakdown()
        refs = [(chunked.allocator.ref_count(b), one_by_one.allocator.ref_count(b)) for b in range(40)]
        assert all(a == b for a, b in refs)
    chunked.check_invariants()


def test_swap_out_and_in_round_trip():
    kv = PagedKVManager(6, 4, num_cpu_blocks=4)
    admit(kv, 0, 6, 10)
    kv.fork(0, 1, 10)  # both samples on blocks [0, 1]
    kv.allocate_slots([1], [1])  # sample 1 copies block 1 -> 2: tables [0, 1] and [0, 2]
    admit(kv, 7, 3, 4)  # another request on block 3, stays on the GPU
    # swap the group out: 3 distinct blocks move once each; block 0 stays shared on the CPU
    copies = kv.swap_out([0, 1])
    assert sorted(src for src, _ in copies) == [0, 1, 2]
    assert kv.is_swapped(0) and kv.block_table(0)[0] == kv.block_table(1)[0]
    assert kv.num_free_blocks == 5 and kv.breakdown().token_states == 3  # only request 7 is on the GPU
    assert kv.cpu_allocator.ref_count(kv.block_table(0)[0]) == 2
    # and back, with room for one more token each: 3 blocks + growth into two partly filled blocks = 3
    assert kv.can_swap_in([0, 1], [1, 1])
    back = kv.swap_in([0, 1])
    assert sorted(src for src, _ in back) == sorted(dst for _, dst in copies)
    assert kv.block_table(0)[0] == kv.block_table(1)[0] and kv.allocator.ref_count(kv.block_table(0)[0]) == 2
    assert kv.cpu_allocator.num_free_blocks == 4 and kv.num_free_blocks == 2
    assert (kv.num_tokens(0), kv.num_tokens(1)) == (6, 7)
    kv.check_invariants()


def test_swap_in_asks_room_for_the_growth_that_follows():
    kv = PagedKVManager(3, 4, num_cpu_blocks=4)
    admit(kv, 0, 8, 12)  # two full blocks
    kv.swap_out([0])
    admit(kv, 1, 4, 4)  # one block taken: 2 free, exactly the blocks to bring back
    assert kv.can_swap_in([0], [0]) and not kv.can_swap_in([0], [1])  # the next token opens a third block
    kv.check_invariants()


def test_swap_is_all_or_nothing():
    kv = PagedKVManager(4, 4, num_cpu_blocks=1)
    admit(kv, 0, 6, 6)  # 2 blocks; the CPU holds only 1
    assert not kv.can_swap_out([0]) and kv.swap_out([0]) is None
    assert kv.block_table(0) == [0, 1] and not kv.is_swapped(0)
    assert PagedKVManager(4, 4).swap_out([]) is None  # no CPU swap space at all
    kv.check_invariants()


def test_swapped_sequences_cannot_grow_until_swapped_in():
    kv = PagedKVManager(4, 4, num_cpu_blocks=4)
    admit(kv, 0, 3, 8)
    kv.swap_out([0])
    with pytest.raises(RuntimeError, match="swapped out"):
        kv.allocate_slots([0], [1])
    kv.free(0)  # freeing a swapped sequence returns its CPU blocks
    assert kv.cpu_allocator.num_free_blocks == 4


def test_a_decode_run_stops_at_a_shared_last_block_and_where_memory_does():
    kv = PagedKVManager(6, 4)
    admit(kv, 0, 6, 40)
    admit(kv, 1, 3, 40)  # tables [0, 1] (2 empty slots) and [2] (1 empty slot): 3 free blocks
    # b opens a block at steps 2, 6, 10, ...; a at steps 3, 7, ...: the 4th new block is needed at step 7
    assert kv_runs(kv).max_decode_steps([[0, 1]], 100) == 6
    counts = kv_runs(kv).advance_decodes([[0, 1]], 2)
    assert [c[4] for c in counts] == [12, 8]  # free slots during each step: block 3 taken in step 2
    assert kv.block_table(1) == [2, 3] and kv.breakdown().counts() == counts[-1]
    kv.fork(1, 2, 40)  # now sequence 1's partly filled last block (1 token of 4) is shared: its next write copies
    assert kv_runs(kv).max_decode_steps([[0, 1]], 100) == 0
    with pytest.raises(RuntimeError, match="expected room"):
        kv_runs(kv).advance_decodes([[0, 1]], 1)
    kv.check_invariants()


def test_make_kv_manager_builds_paged():
    kv = make_kv_manager("paged", 64, block_size=16, enable_prefix_caching=True, num_cpu_blocks=2, watermark=0.5)
    assert isinstance(kv, PagedKVManager)
    assert (kv.policy, kv.num_blocks, kv.num_slots, kv.enable_prefix_caching) == ("paged", 4, 64, True)
    assert (kv.num_cpu_blocks, kv.watermark_blocks, kv.gather_block_size) == (2, 2, 16)


def test_bad_arguments_raise_one_clear_line():
    kv = PagedKVManager(4, 4)
    with pytest.raises(ValueError, match="one num_new_tokens"):
        kv.allocate_slots([0, 1], [1])
    with pytest.raises(ValueError, match=">= 0"):
        kv.allocate_slots([0], [-1], [NewSequence(4, 4)])
    with pytest.raises(KeyError, match="not live"):
        kv.allocate_slots([5], [1])
    with pytest.raises(ValueError, match="watermark must be in"):
        PagedKVManager(4, 4, watermark=1.0)


def test_check_invariants_catches_a_leaked_reference():
    kv = PagedKVManager(4, 4)
    admit(kv, 0, 4, 4)
    kv.allocator.share([0])  # a reference nobody's block table holds
    with pytest.raises(RuntimeError, match="expected ref count 1"):
        kv.check_invariants()
