"""RadixKVManager caches a running sequence's pages as soon as the step computing them is scheduled (SGLang's
`cache_unfinished_req`): two requests running at once share what the first computes, decode runs taken at once
leave the same tree as stepping, a failed step's pages leave the tree, and broken variants are caught."""

from __future__ import annotations

import copy

import pytest
from hypothesis import Phase, settings

import sim
from sim.base.request import Request
from sim.fast.runs import kv_runs
from sim.kv import NewSequence
from sim.kv.paged import PagedKVManager
from sim.kv.radix import RadixKVManager, RadixPagePool
from sim.kv.radix_tree import RadixTree
from sim.testing import make_kv_manager_test

SHARED = list(range(1000, 1037))  # 37 tokens two prompts share


def admit(
    kv,
    seq_id: int,
    ids: list[int],
    prompt_len: int | None = None,
    final_len: int | None = None,
    chunk: int | None = None,
):
    """Admit one sequence as the scheduler does (look up, then allocate its first chunk after the hits). `ids` may
    run past the prompt (generated ids the workload knows). Returns the cached tokens."""
    prompt_len = prompt_len or len(ids)
    cached = kv.get_computed_tokens(ids, prompt_len)
    count = prompt_len - cached if chunk is None else chunk
    spec = NewSequence(prompt_len, final_len or len(ids) + 4, ids, cached)
    assert kv.allocate_slots([seq_id], [count], [spec]) is not None
    kv.check_invariants()
    return cached


def test_two_requests_running_at_once_share_the_prefix_the_first_computes():
    radix = RadixKVManager(128, 1)
    assert admit(radix, 0, SHARED + [1, 2, 3, 4, 5]) == 0  # still running: its prompt is cached, locked by it
    assert admit(radix, 1, SHARED + [7, 8, 9]) == 37  # every shared token, while seq 0 runs
    assert radix.block_table(1)[:37] == radix.block_table(0)[:37]
    (shared,) = radix.tree.root.children.values()
    assert shared.key == tuple(SHARED) and shared.lock_ref == 2 and radix.tree.evictable_pages == 0
    # the paged manager's hashed cache also registers at allocation: whole blocks of 16 only
    paged = PagedKVManager(8, 16, enable_prefix_caching=True)
    admit(paged, 0, SHARED + [1, 2, 3, 4, 5])
    assert admit(paged, 1, SHARED + [7, 8, 9]) == 32
    # generated tokens whose ids are known are cached step by step too: a request repeating seq 0's prompt and its
    # first three outputs (the next turn of a conversation) hits all of them while seq 0 still decodes
    reply = [500, 501, 502, 503]
    kv = RadixKVManager(128, 1)
    admit(kv, 0, SHARED + reply, prompt_len=37, final_len=41)
    for _ in range(3):
        assert kv.allocate_slots([0], [1]) is not None
    assert admit(kv, 1, SHARED + reply[:3] + [9, 9]) == 40
    kv.check_invariants()
    kv.free(0)
    kv.free(1)
    assert kv.get_computed_tokens(SHARED + reply[:3] + [9, 9, 0], 43) == 42
    kv.check_invariants()


def test_a_request_that_computed_the_same_page_first_keeps_its_copy_private():
    kv = RadixKVManager(32, 1)
    admit(kv, 0, [1, 2, 3, 4, 5, 6], chunk=3)  # [1 2 3] cached, locked by seq 0
    admit(kv, 1, [1, 2, 3, 4, 5, 6, 7])  # hits [1 2 3], caches its [4 5 6 7] under them
    assert kv.allocate_slots([0], [3]) is not None  # seq 0 computes 4 5 6 too: the tree has seq 1's copy
    assert kv.block_table(0)[3:] != kv.block_table(1)[3:6]
    assert kv.tree.pages() == kv.block_table(1)  # seq 0's pages for 4 5 6 are its own
    kv.check_invariants()
    free_before = kv.num_free_blocks
    kv.free(0)  # duplicates: returned to the pool
    assert kv.num_free_blocks == free_before + 3 and kv.tree.pages() == kv.block_table(1)
    kv.check_invariants()


def test_a_decode_run_that_caches_known_outputs_equals_stepping():
    kv = RadixKVManager(48, 1)
    admit(kv, 0, [1, 2, 3] + list(range(100, 120)), prompt_len=3, final_len=23)
    admit(kv, 1, [1, 2, 3, 4] + list(range(200, 220)), prompt_len=4, final_len=24)  # hits [1 2 3], locks it too
    admit(kv, 2, [7, 7, 7], final_len=30)  # ids of its outputs unknown: they are never cached
    ids = [0, 1, 2]
    steps = kv_runs(kv).max_decode_steps([ids], 12)
    assert steps == 12
    stepped = copy.deepcopy(kv)
    expected = [stepped.allocate_slots(ids, [1, 1, 1]) and stepped.breakdown().counts() for _ in range(steps)]
    assert kv_runs(kv).advance_decodes([ids], steps) == expected
    shape = [[(n.key, n.pages, n.lock_ref) for n in t.tree._nodes()] for t in (kv, stepped)]
    assert shape[0] == shape[1]  # the same nodes: seq 0 grew a child of [1 2 3] once, then in place
    assert [kv.block_table(s) for s in ids] == [stepped.block_table(s) for s in ids]
    assert kv.get_computed_tokens([1, 2, 3] + list(range(100, 112)) + [0], 16) == 15
    # and the same eviction order afterwards: free all, then take every page
    for manager in (kv, stepped):
        for s in ids:
            manager.free(s)
        manager.check_invariants()
    assert kv.allocator.allocate(48) == stepped.allocator.allocate(48)


def test_a_failed_step_takes_its_pages_and_all_below_them_out_of_the_tree():
    kv = RadixKVManager(32, 1)
    admit(kv, 0, [1, 2, 3, 4, 5, 6], chunk=3)  # step 1 computed [1 2 3]
    assert kv.allocate_slots([0], [3]) is not None  # step 2: [4 5 6], cached now ...
    assert admit(kv, 1, [1, 2, 3, 4, 5, 6, 7, 8]) == 6  # ... and hit by seq 1 admitted in the same step
    # step 2 fails: the scheduler unregisters what each sequence was to write, then aborts both
    kv.uncache(kv.block_table(0)[3:])
    kv.uncache(kv.block_table(1)[6:])
    assert kv.tree.pages() == kv.block_table(0)[:3]  # [4 5 6] and seq 1's [7 8] below them are gone
    kv.check_invariants()  # both locks moved up to [1 2 3]
    kv.free(0)
    kv.free(1)
    assert kv.get_computed_tokens([1, 2, 3, 4, 5, 6, 9], 7) == 3
    kv.check_invariants()


def test_requests_arriving_together_share_a_prefix_in_a_whole_run():
    """Eight requests with one 200-token system prompt arrive at once: the first admitted computes it, the seven
    admitted with it (after it, in the same step) hit it. Caching only at free time hit nothing here."""
    system = list(range(1, 201))
    requests = [
        Request(i, 0.0, 210, 20, prompt_token_ids=system + [10_000 * (i + 1) + j for j in range(10)]) for i in range(8)
    ]
    hits = {}
    for policy, block_size in (("radix", 1), ("paged", 16)):
        result = sim.run(
            policy=policy,
            block_size=block_size,
            requests=copy.deepcopy(requests),
            kv_slots=8192,
            enable_prefix_caching=True,
            validate=True,
        )
        hits[policy] = result.summary["prefix_cache_hit_rate_tokens"]
    assert hits["radix"] == pytest.approx(7 * 200 / (8 * 210))
    assert hits["paged"] == pytest.approx(7 * 192 / (8 * 210))  # 12 whole blocks of 16


# --- broken variants: the state machine must catch them -----------------------------------------------------
class _PoolThatCanForget(RadixPagePool):
    """A page pool whose `share` does nothing while `forgetting` (a subclass, not a patched instance: the compiled
    build's instances take no new attributes)."""

    forgetting = False

    def share(self, pages):
        if not self.forgetting:
            super().share(pages)


class _GrowsWithoutTheTreesReference(RadixKVManager):
    """Broken on purpose: a running sequence's pages go into the tree, but the tree holds no reference to them."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.allocator = _PoolThatCanForget(num_blocks, self.tree)

    def _register(self, seq):
        self.allocator.forgetting = True
        try:
            super()._register(seq)
        finally:
            self.allocator.forgetting = False


class _GrowsOverOtherLocks(RadixTree):
    """Broken on purpose: an edge grows in place even when another sequence locks it (its prefix changes under it)."""

    def grow(self, node, token_ids, pages):
        if node is not self.root and not node.children:
            node.key += tuple(token_ids)
            node.pages += pages
            return node
        return super().grow(node, token_ids, pages)


def _with_tree(tree_class, num_blocks: int, block_size: int) -> RadixKVManager:
    kv = RadixKVManager(num_blocks, block_size)
    kv.tree = kv.allocator.tree = tree_class(block_size)
    return kv


@pytest.mark.parametrize(
    "factory",
    [lambda: _GrowsWithoutTheTreesReference(16, 1), lambda: _with_tree(_GrowsOverOtherLocks, 16, 1)],
    ids=["no-tree-reference", "grows-over-other-locks"],
)
def test_the_machine_catches_broken_running_caches(factory):
    test_case = make_kv_manager_test(factory, max_examples=300)
    test_case.settings = settings(test_case.settings, phases=[Phase.generate], report_multiple_bugs=False)
    with pytest.raises((AssertionError, RuntimeError)):
        test_case("runTest").runTest()
