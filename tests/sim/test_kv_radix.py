"""RadixKVManager (SGLang's RadixAttention) through the KV contract: the reusable state machine on small pools, and
broken variants it must catch; narrated examples of unaligned hits, splits, LRU eviction, copy-on-write, the
breakdown and decode runs; whole runs through sim.run, against the paged manager's hashed prefix cache."""

from __future__ import annotations

import copy

import pytest
from hypothesis import Phase, settings

import sim
from sim.base.request import Request
from sim.fast.runs import kv_runs
from sim.kv import NewSequence, make_kv_manager
from sim.kv.paged import PagedKVManager
from sim.kv.radix import RadixKVManager
from sim.kv.radix_tree import RadixTree
from sim.testing import make_kv_manager_test

# Small pools so memory runs out often (and eviction with it); page size 1 (SGLang's) and 4.
TestRadixPageSize1 = make_kv_manager_test(lambda: RadixKVManager(16, 1))
TestRadixPageSize1 = pytest.mark.slow(TestRadixPageSize1)  # hundreds of programs: `make test` only (tests/conftest.py)
TestRadixPageSize4 = make_kv_manager_test(lambda: RadixKVManager(8, 4))
TestRadixPageSize4 = pytest.mark.slow(TestRadixPageSize4)  # hundreds of programs: `make test` only (tests/conftest.py)
TestRadixWatermark = make_kv_manager_test(lambda: RadixKVManager(10, 2, watermark=0.2), max_examples=200)
TestRadixWatermark = pytest.mark.slow(TestRadixWatermark)  # hundreds of programs: `make test` only (tests/conftest.py)


def admit(kv, seq_id: int, ids: list[int], final_len: int | None = None, chunk: int | None = None):
    """Admit one sequence as the scheduler does: look up the cache, then allocate its first chunk (default: the
    whole prompt) after the hits. Returns (cached tokens, the allocation or None)."""
    cached = kv.get_computed_tokens(ids, len(ids))
    count = len(ids) - cached if chunk is None else chunk
    spec = NewSequence(len(ids), final_len or len(ids) + 4, ids, cached)
    return cached, kv.allocate_slots([seq_id], [count], [spec])


def run_to_end(kv, seq_id: int, ids: list[int]) -> int:
    """Admit, compute the whole prompt, free (the sequence's pages go into the tree). Returns the hits."""
    cached, allocation = admit(kv, seq_id, ids)
    assert allocation is not None
    kv.free(seq_id)
    kv.check_invariants()
    return cached


SHARED = list(range(1000, 1037))  # 37 tokens two prompts share (a system prompt)


# --- lookups ------------------------------------------------------------------------------------------------
def test_page_size_1_hits_an_unaligned_prefix_where_blocks_of_16_hit_32():
    first, second = SHARED + [1, 2, 3, 4, 5], SHARED + [7, 8, 9]
    radix = RadixKVManager(128, 1)
    run_to_end(radix, 0, first)
    assert run_to_end(radix, 1, second) == 37  # every shared token, not a multiple of any block
    paged = PagedKVManager(8, 16, enable_prefix_caching=True)
    run_to_end(paged, 0, first)
    assert run_to_end(paged, 1, second) == 32  # two whole blocks of 16
    stats = radix.prefix_cache_stats()
    assert (stats.queried_tokens, stats.hit_tokens, stats.hit_blocks) == (42 + 40, 37, 37)


def test_the_last_token_is_always_computed_and_pages_align_hits():
    radix = RadixKVManager(128, 1)
    run_to_end(radix, 0, SHARED)
    assert radix.get_computed_tokens(SHARED, 37) == 36  # the same prompt again: its last token is computed
    assert radix.get_computed_tokens(SHARED[:20], 20) == 19
    assert radix.get_computed_tokens(SHARED + [5], 38) == 37
    paged4 = RadixKVManager(32, 4)
    run_to_end(paged4, 0, SHARED + [1, 2, 3])
    assert paged4.get_computed_tokens(SHARED + [7, 8], 39) == 36  # 9 whole pages of 4
    assert paged4.get_computed_tokens(SHARED[:35] + [0] * 4, 39) == 32  # page 9 differs at its 4th token
    assert paged4.get_computed_tokens(None, 39) == 0


def test_a_hit_that_ends_mid_edge_splits_the_node_and_locks_only_the_match():
    kv = RadixKVManager(32, 1)
    run_to_end(kv, 0, [1, 2, 3, 4, 5, 6, 7, 8])  # root --[1..8]--> one leaf of 8 pages, unlocked
    (leaf,) = kv.tree.root.children.values()
    assert kv.tree.evictable_pages == 8 and kv.num_free_blocks == 32
    # [1 2 3 4 5 9 9] hits 5 tokens: the leaf splits into [1..5] and [6 7 8] (still evictable); the step computing
    # [9 9] is scheduled at once, so they hang under the split point as a node locked by seq 1, beside [6 7 8]
    assert admit(kv, 1, [1, 2, 3, 4, 5, 9, 9])[0] == 5
    (top,) = kv.tree.root.children.values()
    assert top.key == (1, 2, 3, 4, 5) and leaf.key == (6, 7, 8)
    assert sorted(c.key for c in top.children.values()) == [(6, 7, 8), (9, 9)]
    own = top.children[(9,)]
    assert (top.lock_ref, own.lock_ref, leaf.lock_ref, kv.tree.evictable_pages) == (1, 1, 0, 3)
    assert kv.block_table(1) == top.pages + own.pages
    kv.check_invariants()
    # when it ends, it unlocks: [9 9] stays cached, evictable
    kv.free(1)
    assert sorted(c.key for c in top.children.values()) == [(6, 7, 8), (9, 9)]
    assert top.lock_ref == 0 and kv.tree.evictable_pages == 10
    kv.check_invariants()


# --- eviction -----------------------------------------------------------------------------------------------
def test_eviction_takes_unlocked_leaves_least_recently_used_first():
    kv = RadixKVManager(12, 1)
    for seq_id, doc in enumerate((10, 20, 30)):  # three cached prompts of 4 tokens: leaves A, B, C
        run_to_end(kv, seq_id, [doc, doc + 1, doc + 2, doc + 3])
    assert kv.allocator.num_free_blocks == 12 and len(kv.allocator._free) == 0  # all 12 pages cached
    assert admit(kv, 3, [10, 11, 12, 13, 99])[0] == 4  # A is used again (and stays locked while seq 3 runs)
    # seq 3 took one fresh page: the last page of the least recently used leaf, B; B's first 3 tokens stay cached
    assert kv.get_computed_tokens([20, 21, 22, 23, 0], 5) == 3
    assert kv.get_computed_tokens([30, 31, 32, 33, 0], 5) == 4
    # 4 more pages: the rest of B, then C's last page (A is locked)
    assert kv.allocate_slots([3], [4]) is not None
    assert kv.get_computed_tokens([20, 21, 22, 23, 0], 5) == 0 and kv.get_computed_tokens([30, 31, 32, 33, 0], 5) == 3
    assert kv.get_computed_tokens([10, 11, 12, 13, 0], 5) == 4
    # asking for more than can be found changes nothing
    before = (kv.block_table(3), kv.num_free_blocks, kv.breakdown(), kv.tree.evictable_pages)
    assert kv.allocate_slots([3], [4]) is None  # 3 evictable pages (C's), A's 4 are locked
    assert (kv.block_table(3), kv.num_free_blocks, kv.breakdown(), kv.tree.evictable_pages) == before
    kv.check_invariants()


def test_a_tree_evicts_a_parent_once_its_children_are_gone():
    tree = RadixTree(1)
    tree.insert([9], [4])
    tree.insert([1, 2, 3], [0, 1, 2])
    tree.insert([1, 2, 3, 4], [0, 1, 2, 3])  # a child [4] under [1 2 3]; the insertion uses [1 2 3] too
    assert tree.evict(1) == [4]  # [9] is the least recently used leaf
    assert tree.evict(2) == [3, 2]  # then [4]; then its parent, now a leaf, from its last page
    (node,) = tree.root.children.values()
    assert node.key == (1, 2) and node.pages == [0, 1] and tree.evictable_pages == 2
    assert tree.evict(5) == [1, 0]  # all there is
    assert tree.evictable_pages == 0 and tree.root.children == {}


# --- sharing ------------------------------------------------------------------------------------------------
def test_parallel_samples_share_pages_then_copy_on_write():
    kv = RadixKVManager(8, 4)
    admit(kv, 10, [1, 2, 3, 4, 5, 6], final_len=9)  # pages [0, 1]; page 1 holds 2 tokens
    assert kv.fork(10, 11, final_len=9) == []
    assert kv.block_table(10) == kv.block_table(11) == [0, 1]
    # sample 10 writes into page 1, shared and partly filled: copy it first; sample 11 then writes in place
    assert kv.allocate_slots([10], [1]).copies == [(1, 2)]
    assert kv.allocate_slots([11], [1]).copies == []
    assert kv.block_table(10) == [0, 2] and kv.block_table(11) == [0, 1]
    kv.check_invariants()
    # page 0, a whole page of known ids, was cached when the prompt's step was scheduled (before the fork): both
    # samples lock it, so it stays cached and locked until the last of them ends; page 1 was never whole
    assert kv.tree.pages() == [0] and kv.tree.root.children[(1, 2, 3, 4)].lock_ref == 2
    kv.free(10)
    assert kv.tree.pages() == [0] and kv.tree.evictable_pages == 0
    kv.free(11)
    assert kv.tree.pages() == [0] and kv.tree.evictable_pages == 1
    assert kv.get_computed_tokens([1, 2, 3, 4, 5, 6], 6) == 4
    kv.check_invariants()


def test_a_fork_holds_its_own_lock_on_the_cached_prefix():
    kv = RadixKVManager(16, 1)
    run_to_end(kv, 0, [1, 2, 3, 4])
    admit(kv, 1, [1, 2, 3, 4, 5])  # hits 4 tokens: locks the leaf [1 2 3 4]
    kv.fork(1, 2, final_len=8)
    (node,) = kv.tree.root.children.values()
    assert node.lock_ref == 2
    kv.free(1)
    assert node.lock_ref == 1 and kv.tree.evictable_pages == 0  # seq 2 still reads those pages
    kv.free(2)
    assert node.lock_ref == 0
    kv.check_invariants()


def test_a_failed_step_caches_nothing_it_was_to_write():
    kv = RadixKVManager(16, 1)
    admit(kv, 0, [1, 2, 3, 4, 5, 6], chunk=3)
    kv.allocate_slots([0], [3])  # a step computing tokens 3..5 ... fails
    kv.uncache(kv.block_table(0)[3:])
    kv.free(0)
    assert kv.get_computed_tokens([1, 2, 3, 4, 5, 6, 7], 7) == 3  # only the tokens an earlier step wrote
    kv.check_invariants()


# --- accounting ---------------------------------------------------------------------------------------------
def test_the_breakdown_counts_cached_unlocked_pages_as_free():
    kv = RadixKVManager(8, 4)  # 32 slots
    run_to_end(kv, 0, [1, 2, 3, 4, 5, 6, 7, 8, 9])  # 2 whole pages cached, unlocked: free, as paged's cached blocks
    b = kv.breakdown()
    assert (b.token_states, b.free, kv.tree.evictable_pages) == (0, 32, 2)
    # a sequence hitting one cached page (4 tokens), 6 tokens in all, final length 7
    admit(kv, 1, [1, 2, 3, 4, 0, 0], final_len=7)
    b = kv.breakdown()
    # pages: [cached 1 2 3 4][0 0 r i]; the other cached page stays free
    assert (b.token_states, b.reservation, b.internal_fragmentation, b.free) == (6, 1, 1, 24)
    assert b.total == kv.num_slots and kv.breakdown(waiting=True).external_fragmentation == 24
    kv.check_invariants()


def test_a_decode_run_that_evicts_equals_stepping():
    kv = RadixKVManager(16, 1)
    for seq_id, doc in enumerate((10, 20, 30)):
        run_to_end(kv, seq_id, [doc + i for i in range(4)])  # 12 pages cached
    admit(kv, 3, [40, 41], final_len=20)
    admit(kv, 4, [50, 51, 52], final_len=20)  # it evicted one cached page: the free queue is empty
    assert (len(kv.allocator._free), kv.tree.evictable_pages) == (0, 11)
    steps = kv_runs(kv).max_decode_steps([[3, 4]], 20)
    assert steps == 5  # 11 evictable pages, 2 per step: every page of the run is evicted on its way
    stepped = copy.deepcopy(kv)
    expected = []
    for _ in range(steps):
        assert stepped.allocate_slots([3, 4], [1, 1]).copies == []
        expected.append(stepped.breakdown().counts())
    assert kv_runs(kv).advance_decodes([[3, 4]], steps) == expected
    assert [kv.block_table(s) for s in (3, 4)] == [stepped.block_table(s) for s in (3, 4)]
    assert kv.tree.pages() == stepped.tree.pages()
    kv.check_invariants()


# --- configuration ------------------------------------------------------------------------------------------
def test_make_kv_manager_builds_radix_and_bad_arguments_get_one_line():
    kv = make_kv_manager("radix", 64, block_size=1, enable_prefix_caching=False, num_cpu_blocks=8)
    assert isinstance(kv, RadixKVManager) and kv.enable_prefix_caching and kv.num_cpu_blocks == 0
    assert kv.gather_block_size == 1 and not kv.can_swap_out([])
    with pytest.raises(ValueError, match=r"watermark must be in \[0, 1\), got 1.5"):
        RadixKVManager(8, 1, watermark=1.5)
    with pytest.raises(ValueError, match="preemption='swap': needs CPU swap space, and policy='radix' has none"):
        sim.run(policy="radix", block_size=1, preemption="swap", num_requests=2)
    with pytest.raises(ValueError, match="enable_prefix_caching=False: policy='radix' always caches prefixes"):
        sim.run(policy="radix", block_size=1, enable_prefix_caching=False, num_requests=2)


# --- broken variants: the state machine must catch them -----------------------------------------------------
class _SplitForgetsTheLock(RadixTree):
    """Broken on purpose: the upper half of a split node starts unlocked, so a locked prefix can be evicted."""

    def _split(self, node, num_pages):
        top = super()._split(node, num_pages)
        top.lock_ref = 0
        return top


class _EvictsLockedLeaves(RadixTree):
    """Broken on purpose: eviction ignores locks."""

    def evict(self, num_pages):
        locks = {n: n.lock_ref for n in self._nodes()}
        for n in locks:
            n.lock_ref = 0
        try:
            return super().evict(num_pages)
        finally:
            for n, r in locks.items():
                n.lock_ref = r


class _HitsTheLastToken(RadixKVManager):
    """Broken on purpose: a lookup may cover the whole prompt, leaving no token to sample from."""

    def get_computed_tokens(self, token_ids, num_tokens):
        return super().get_computed_tokens(token_ids, num_tokens + 1)


def _with_tree(tree_class, num_blocks: int, block_size: int) -> RadixKVManager:
    kv = RadixKVManager(num_blocks, block_size)
    kv.tree = kv.allocator.tree = tree_class(block_size)
    return kv


@pytest.mark.parametrize(
    "factory",
    [
        lambda: _with_tree(_SplitForgetsTheLock, 16, 1),
        lambda: _with_tree(_EvictsLockedLeaves, 6, 1),
        lambda: _HitsTheLastToken(12, 1),
    ],
    ids=["split-forgets-lock", "evicts-locked", "hits-last-token"],
)
def test_the_machine_catches_broken_radix_managers(factory):
    """The first two are caught by the manager's check_invariants (lock counts, reference counts), which the machine
    runs after every step; the third by the machine's own contract check on lookups."""
    test_case = make_kv_manager_test(factory, max_examples=1500)
    test_case.settings = settings(test_case.settings, phases=[Phase.generate], report_multiple_bugs=False)
    with pytest.raises((AssertionError, RuntimeError)):
        test_case("runTest").runTest()


# --- whole runs ---------------------------------------------------------------------------------------------
def conversations(session_gap: float, output_len: int, num_sessions: int = 8, turns: int = 3) -> list[Request]:
    """Hand-built multi-turn chats: every prompt opens with a 45-token system prompt; turn t + 1 repeats turn t's
    prompt, then the reply (ids not given here: not cached) and a new question of 7 tokens. Sessions start
    `session_gap` seconds apart; a turn arrives 20 s after the previous one (which has finished by then)."""
    system = list(range(1, 46))
    requests = []
    for s in range(num_sessions):
        prompt = system + [10_000 * (s + 1) + i for i in range(11 + 3 * s)]
        for t in range(turns):
            requests.append(
                Request(
                    len(requests), session_gap * s + 20.0 * t, len(prompt), output_len, prompt_token_ids=list(prompt)
                )
            )
            prompt = prompt + [10_000 * (s + 1) + 1000 * (t + 1) + i for i in range(output_len + 7)]
    return requests


def test_a_run_with_preemptions_finishes_every_request_and_hits_the_cache():
    requests = conversations(session_gap=0.05, output_len=60)  # sessions overlap in a pool of 400 token slots
    result = sim.run(policy="radix", block_size=1, requests=requests, kv_slots=400, validate=True)
    s = result.summary
    assert s["num_finished"] == len(requests) and s["num_preemptions"] > 0
    assert s["prefix_cache_hit_rate_tokens"] > 0.25  # the system prompt, and each session's earlier turns


def test_radix_at_page_size_1_hits_at_least_as_much_as_paged_blocks_of_16():
    """Sessions 1 s apart: every request has finished before the next arrives, so both caches saw the same
    history. (When requests sharing a new prefix run at once, the paged cache can hit more: see radix.py.)"""

    def hit_tokens(policy: str, block_size: int) -> int:
        probe = {}
        sim.run(
            policy=policy,
            block_size=block_size,
            requests=conversations(1.0, 30),
            kv_slots=4096,
            enable_prefix_caching=True,
            on_step=lambda simulator, plan: probe.update(kv=simulator.kv),
        )
        return probe["kv"].prefix_cache_stats().hit_tokens

    radix, paged = hit_tokens("radix", 1), hit_tokens("paged", 16)
    assert radix > paged > 0  # unaligned prefixes: no prompt here ends on a block boundary
    # NOTE: with no two requests running at once, caching at free time loses nothing: at page size 16 the tree
    # hits exactly the blocks the hashed cache hits
    assert hit_tokens("radix", 16) == paged
