"""The reusable state machines (sim.testing) run on the reference allocator and paged manager, and they
must catch deliberately broken implementations: a grader that cannot fail grades nothing.

Each machine runs 500 short examples (30 steps), derandomized so CI sees the same programs every run.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings

from sim.fast.paged import PagedRuns, run_capacity
from sim.kv.blocks import BlockAllocator
from sim.kv.paged import PagedKVManager
from sim.testing import make_block_allocator_test, make_kv_manager_test

# Small pools so memory runs out often.
TestBlockAllocator = make_block_allocator_test(lambda: BlockAllocator(6, 4), num_blocks=6, block_size=4)
TestBlockAllocator = pytest.mark.slow(TestBlockAllocator)  # hundreds of programs: `make test` only (tests/conftest.py)
TestBlockAllocatorPrefixCaching = make_block_allocator_test(lambda: BlockAllocator(8, 4, enable_prefix_caching=True))
TestBlockAllocatorPrefixCaching = pytest.mark.slow(
    TestBlockAllocatorPrefixCaching
)  # hundreds of programs: `make test` only (tests/conftest.py)
TestPagedKVManager = make_kv_manager_test(lambda: PagedKVManager(8, 4))
TestPagedKVManager = pytest.mark.slow(TestPagedKVManager)  # hundreds of programs: `make test` only (tests/conftest.py)
TestPagedKVManagerPrefixCaching = make_kv_manager_test(lambda: PagedKVManager(10, 2, enable_prefix_caching=True))
TestPagedKVManagerPrefixCaching = pytest.mark.slow(
    TestPagedKVManagerPrefixCaching
)  # hundreds of programs: `make test` only (tests/conftest.py)
TestPagedKVManagerSwap = make_kv_manager_test(lambda: PagedKVManager(8, 4, True, num_cpu_blocks=6))
TestPagedKVManagerSwap = pytest.mark.slow(
    TestPagedKVManagerSwap
)  # hundreds of programs: `make test` only (tests/conftest.py)
# a CPU offload tier of 3 blocks under the prefix cache (sim/kv/offload.py): both tiers' invariants after every rule
TestPagedKVManagerOffloadTier = make_kv_manager_test(
    lambda: PagedKVManager(10, 2, enable_prefix_caching=True, num_cpu_blocks=4, num_offload_blocks=3)
)
TestPagedKVManagerWatermark = make_kv_manager_test(lambda: PagedKVManager(10, 2, watermark=0.2), max_examples=200)


class _FreeForgetsSharedBlocks(BlockAllocator):
    """Broken on purpose: freeing a shared block does not drop the reference."""

    def free(self, block_ids):
        super().free([b for b in block_ids if self.ref_count(b) == 1])


class _CopyOnWriteKeepsTheOldReference(BlockAllocator):
    """Broken on purpose: the writer gets a new block but still holds the shared one."""

    def copy_on_write(self, block_id):
        if self.ref_count(block_id) == 1:
            return block_id
        fresh = self.allocate(1)
        return None if fresh is None else fresh[0]


class _EvictsMostRecentlyFreed(BlockAllocator):
    """Broken on purpose: the free queue is a stack, so the freshest cached prefix is evicted first."""

    def free(self, block_ids):
        super().free(block_ids)
        for b in block_ids:
            if self.ref_count(b) == 0:
                self._free_queue.move_to_end(b, last=False)


class _OptimisticPagedKVManager(PagedKVManager):
    """Broken on purpose: says every allocation fits."""

    def can_allocate_slots(self, seq_ids, num_new_tokens, new=None, **lookahead):
        return True


class _RollbackKeepsTheDraftBlocks(PagedKVManager):
    """Broken on purpose: a rollback shrinks the token count but keeps the blocks the rejected drafts took."""

    def rollback(self, seq_id, num_tokens):
        seq = self._seqs[seq_id]
        seq.num_tokens, seq.num_lookahead = num_tokens, 0


class _RunsIgnoreSharedBlocks(PagedRuns):
    """Broken on purpose: a bulk decode run does not notice that a shared last block must be copied first."""

    def max_decode_steps(self, seq_groups, limit, waiting=False):
        tokens = [self.kv.num_tokens(i) for ids in seq_groups for i in ids]
        return min(limit, run_capacity(tokens, self.kv.block_size, self.kv.num_free_blocks)) if tokens else limit


@pytest.mark.parametrize(
    "make_test",
    [
        lambda: make_block_allocator_test(lambda: _FreeForgetsSharedBlocks(6, 4), max_examples=200),
        lambda: make_block_allocator_test(lambda: _CopyOnWriteKeepsTheOldReference(6, 4), max_examples=200),
        lambda: make_block_allocator_test(lambda: _EvictsMostRecentlyFreed(6, 4, True), max_examples=200),
        lambda: make_kv_manager_test(lambda: _OptimisticPagedKVManager(4, 4), max_examples=200),
        lambda: make_kv_manager_test(lambda: PagedKVManager(12, 4), max_examples=300, runs=_RunsIgnoreSharedBlocks),
        lambda: make_kv_manager_test(lambda: _RollbackKeepsTheDraftBlocks(12, 2), max_examples=300),
    ],
    ids=[
        "free-forgets-shared",
        "cow-keeps-old-ref",
        "evicts-most-recent",
        "can-allocate-lies",
        "run-skips-copy",
        "rollback-keeps-blocks",
    ],
)
def test_machines_catch_broken_implementations(make_test):
    test_case = make_test()
    # NOTE: no shrinking here: we only need to know the machine fails, not the shortest story (fast).
    test_case.settings = settings(test_case.settings, phases=[Phase.generate], report_multiple_bugs=False)
    with pytest.raises(AssertionError):
        test_case("runTest").runTest()


def test_machine_checks_the_reported_geometry():
    with pytest.raises(AssertionError, match="num_blocks: expected 5, found 6"):
        make_block_allocator_test(lambda: BlockAllocator(6, 4), num_blocks=5, max_examples=1)("runTest").runTest()
