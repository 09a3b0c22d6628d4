"""A reusable hypothesis state machine that checks any block allocator against the `BlockAllocator` contract.

Hypothesis's stateful testing (RuleBasedStateMachine) runs random programs of allocate / share / free /
copy-on-write / cache / lookup steps against the allocator under test and, beside it, a tiny model that
only counts references. After every step the two must agree. Small pools run out often, so the
out-of-memory path (`None`, nothing changed) is exercised as much as the happy path. Each step is
recorded with `note()`, so a failure prints as a story: "allocate(3) -> [0, 1, 2]", "free([1])", ...

Use it for your own allocator (the classroom exercises do):

    TestMine = make_block_allocator_test(lambda: MyAllocator(8, 4, enable_prefix_caching=True))

The allocator needs the surface of `sim.kv.blocks.BlockAllocator`; the prefix-cache rules run when its
`enable_prefix_caching` attribute is true. With prefix caching the model also checks the order of the free queue,
vLLM v1's (BlockPool.free_blocks): a freed block that holds no cached prefix goes to the FRONT (reused first,
the first one of a free() call first), a freed cached block to the BACK (evicted last, least recently freed
first); never-used blocks sit between the two, in any order. One hash may name several blocks; a lookup finds the
one cached first.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

from hypothesis import HealthCheck, Phase, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

NUM_HASHES = 6  # prefix-cache keys drawn from 0..5, so hits, misses and duplicates all happen


class BlockAllocatorMachine(RuleBasedStateMachine):
    """Model: a reference count per block, the free queue order, and the prefix cache's hash -> block map."""

    factory: Callable[[], Any]  # builds the allocator under test; set by make_block_allocator_test
    expected_num_blocks: int | None = None
    expected_block_size: int | None = None

    def __init__(self) -> None:
        super().__init__()
        self.alloc = type(self).factory()
        n = self.alloc.num_blocks
        for name, want in (("num_blocks", self.expected_num_blocks), ("block_size", self.expected_block_size)):
            if want is not None and getattr(self.alloc, name) != want:
                raise AssertionError(f"{name}: expected {want}, found {getattr(self.alloc, name)}")
        self.caching = bool(getattr(self.alloc, "enable_prefix_caching", False))
        self.refs = [0] * n  # the model's reference count of each block
        self.front: list[int] = []  # freed blocks without a cached prefix, handed out first (in this order)
        self.never_used = set(range(n))  # free since the start: handed out next, in any order
        self.back: list[int] = []  # freed cached blocks, least recently freed first: handed out (evicted) last
        self.cache: dict[int, list[int]] = {}  # hash -> the blocks cached under it, first cached first
        self.hits = self.misses = 0
        note(f"start: {n} blocks of {self.alloc.block_size} slots, prefix caching {'on' if self.caching else 'off'}")

    # --- helpers --------------------------------------------------------------------------------
    def owned(self) -> list[int]:
        return [b for b, r in enumerate(self.refs) if r > 0]

    def num_free(self) -> int:
        return self.refs.count(0)

    def snapshot(self) -> tuple:
        cached = tuple(self.alloc.is_cached(b) for b in range(len(self.refs))) if self.caching else ()
        refs = tuple(self.alloc.ref_count(b) for b in range(len(self.refs)))
        return self.alloc.num_free_blocks, refs, cached

    def expect_unchanged(self, before: tuple, what: str) -> None:
        after = self.snapshot()
        assert after == before, f"{what} must change nothing: (free, refs, cached) before {before}, after {after}"

    def cached(self, b: int) -> bool:
        return any(b in blocks for blocks in self.cache.values())

    def take_fresh(self, blocks: list[int], what: str) -> None:
        """Update the model for blocks just handed out, checking they were free (and, with caching, the order)."""
        assert len(set(blocks)) == len(blocks), f"{what}: expected distinct blocks, found {blocks}"
        for b in blocks:
            assert self.refs[b] == 0, f"{what}: handed out block {b}, expected a free one, found {self.refs[b]} owners"
        if self.caching:
            k = len(blocks)
            head = self.front[:k]
            middle = min(k - len(head), len(self.never_used))
            tail = self.back[: k - len(head) - middle]
            got_head, got_middle = blocks[: len(head)], blocks[len(head) : len(head) + middle]
            ok = got_head == head and set(got_middle) <= self.never_used and blocks[len(head) + middle :] == tail
            assert ok, (
                f"{what}: expected first the freed uncached blocks {head} (the free queue's front, most recently "
                f"freed first), then {middle} never-used block(s) (any of {sorted(self.never_used)}), then the "
                f"freed cached blocks {tail} (least recently freed first), found {blocks}"
            )
        for b in blocks:
            self.never_used.discard(b)
            for queue in (self.front, self.back):
                if b in queue:
                    queue.remove(b)
            self.refs[b] = 1
            for h, holders in list(self.cache.items()):  # its old contents are overwritten
                if b in holders:
                    holders.remove(b)
                    if not holders:
                        del self.cache[h]

    def released(self, blocks: list[int]) -> None:
        """Blocks whose last owner just let go, in the order freed: to the queue's front or back."""
        uncached = [b for b in blocks if not self.cached(b)]
        self.front[:0] = uncached
        self.back.extend(b for b in blocks if self.cached(b))

    # --- rules ----------------------------------------------------------------------------------
    @rule(n=st.integers(0, 4))
    def allocate(self, n: int) -> None:
        before = self.snapshot()
        ok = self.alloc.can_allocate(n)
        assert ok == (n <= self.num_free()), f"can_allocate({n}) with {self.num_free()} free: found {ok}"
        result = self.alloc.allocate(n)
        note(f"allocate({n}) -> {result}")
        if n > self.num_free():
            assert result is None, f"allocate({n}) with {self.num_free()} free: expected None, found {result}"
            self.expect_unchanged(before, f"allocate({n}) out of memory")
            return
        assert result is not None and len(result) == n, f"allocate({n}): expected {n} blocks, found {result}"
        self.take_fresh(list(result), f"allocate({n})")

    @precondition(lambda self: any(self.refs))
    @rule(data=st.data())
    def share(self, data: st.DataObject) -> None:
        b = data.draw(st.sampled_from(self.owned()), label="block")
        self.alloc.share([b])
        self.refs[b] += 1
        note(f"share([{b}]): block {b} now has {self.refs[b]} owners")

    @precondition(lambda self: any(self.refs))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        blocks = data.draw(st.lists(st.sampled_from(self.owned()), min_size=1, max_size=3, unique=True), label="blocks")
        self.alloc.free(blocks)
        for b in blocks:
            self.refs[b] -= 1
        self.released([b for b in blocks if self.refs[b] == 0])
        note(f"free({blocks}): owners now {[self.refs[b] for b in blocks]}")

    @precondition(lambda self: 0 in self.refs)
    @rule(data=st.data())
    def misuse_of_a_free_block_raises(self, data: st.DataObject) -> None:
        b = data.draw(st.sampled_from([b for b, r in enumerate(self.refs) if r == 0]), label="free block")
        before = self.snapshot()
        for action in ("free", "share"):
            try:
                getattr(self.alloc, action)([b])
            except Exception as exc:  # noqa: BLE001  (the contract names RuntimeError for free)
                ok = action != "free" or isinstance(exc, RuntimeError)
                assert ok, f"free of free block {b}: expected RuntimeError, got {exc!r}"
            else:
                raise AssertionError(f"{action}([{b}]) on a free block: expected an exception, none was raised")
        note(f"free([{b}]) and share([{b}]) on free block {b} raised, as they must")
        self.expect_unchanged(before, f"a refused free/share of block {b}")

    @precondition(lambda self: any(self.refs))
    @rule(data=st.data())
    def copy_on_write(self, data: st.DataObject) -> None:
        b = data.draw(st.sampled_from(self.owned()), label="block")
        before = self.snapshot()
        result = self.alloc.copy_on_write(b)
        note(f"copy_on_write({b}) with {self.refs[b]} owners -> {result}")
        if self.refs[b] == 1:
            assert result == b, f"copy_on_write({b}) on an exclusive block: expected {b}, found {result}"
        elif self.num_free() == 0:
            assert result is None, f"copy_on_write({b}) with no free block: expected None, found {result}"
            self.expect_unchanged(before, f"copy_on_write({b}) out of memory")
        else:
            assert result is not None, f"copy_on_write({b}) with {self.num_free()} free blocks returned None"
            self.take_fresh([result], f"copy_on_write({b})")
            self.refs[b] -= 1

    @precondition(lambda self: self.caching and any(not self.cached(b) for b in self.owned()))
    @rule(data=st.data(), block_hash=st.integers(0, NUM_HASHES - 1))
    def cache_block(self, data: st.DataObject, block_hash: int) -> None:
        candidates = [b for b in self.owned() if not self.cached(b)]
        b = data.draw(st.sampled_from(candidates), label="block")
        self.alloc.cache_block(b, block_hash)
        others = list(self.cache.get(block_hash, []))
        self.cache.setdefault(block_hash, []).append(b)  # a hash may name several blocks; lookups find the first
        note(f"cache_block({b}, {block_hash})" + (f": {block_hash} also names {others}" if others else ""))

    @precondition(lambda self: self.caching)
    @rule(block_hash=st.integers(0, NUM_HASHES - 1))
    def lookup(self, block_hash: int) -> None:
        expected = self.cache[block_hash][0] if block_hash in self.cache else None
        result = self.alloc.lookup(block_hash)
        note(f"lookup({block_hash}) -> {result}")
        assert result == expected, f"lookup({block_hash}): expected {expected}, found {result}"
        if result is None:
            self.misses += 1
            return
        self.hits += 1
        if self.refs[result] == 0:  # revived: it leaves the free queue with its contents intact
            self.never_used.discard(result)
            for queue in (self.front, self.back):
                if result in queue:
                    queue.remove(result)
        self.refs[result] += 1

    @precondition(lambda self: any(self.refs))
    @rule()
    def free_everything(self) -> None:
        self.release_all()
        note("free everything")
        assert self.alloc.num_free_blocks == self.alloc.num_blocks, (
            f"after freeing everything: expected {self.alloc.num_blocks} free blocks, "
            f"found {self.alloc.num_free_blocks}"
        )

    def release_all(self) -> None:
        for b in self.owned():
            self.alloc.free([b] * self.refs[b])
            self.released([b])
            self.refs[b] = 0

    # --- invariants -----------------------------------------------------------------------------
    @invariant()
    def agrees_with_model(self) -> None:
        self.alloc.check_invariants()
        a = self.alloc
        assert a.num_free_blocks + a.num_used_blocks == a.num_blocks, (
            f"free + used: expected {a.num_blocks}, found {a.num_free_blocks} + {a.num_used_blocks}"
        )
        for b, want in enumerate(self.refs):
            found = a.ref_count(b)
            assert found == want, f"block {b}: expected ref count {want} (owners in the model), found {found}"
        free = self.num_free()
        assert a.num_free_blocks == free, f"num_free_blocks: expected {free}, found {a.num_free_blocks}"
        if self.caching:
            for b in range(a.num_blocks):
                want = self.cached(b)
                assert a.is_cached(b) == want, f"is_cached({b}): expected {want}"
            counters = (a.num_prefix_hits, a.num_prefix_misses)
            want = (self.hits, self.misses)
            assert counters == want, f"(hits, misses): expected {want}, found {counters}"

    def teardown(self) -> None:
        # NOTE: teardown also runs after a failed step; only check the final release when nothing is failing,
        # so the original failure is the one reported.
        if sys.exc_info()[0] is None:
            self.release_all()
            full = self.alloc.num_free_blocks == self.alloc.num_blocks
            assert full, "freeing everything must return the pool to full"
            self.alloc.check_invariants()


def make_block_allocator_test(
    factory: Callable[[], Any],
    num_blocks: int | None = None,
    block_size: int | None = None,
    max_examples: int = 500,
    stateful_step_count: int = 30,
    derandomize: bool = True,
) -> type:
    """A unittest.TestCase class running `BlockAllocatorMachine` on allocators built by `factory()`.

    `num_blocks` / `block_size`, when given, are checked against what the built allocator reports.
    Assign the result to a module-level name starting with `Test` so pytest collects it.
    """
    machine = type(
        "BlockAllocatorMachine",
        (BlockAllocatorMachine,),
        {"factory": staticmethod(factory), "expected_num_blocks": num_blocks, "expected_block_size": block_size},
    )
    machine.TestCase.settings = machine_settings(max_examples, stateful_step_count, derandomize)
    return machine.TestCase


def machine_settings(max_examples: int = 500, stateful_step_count: int = 30, derandomize: bool = True) -> settings:
    """The hypothesis settings every machine here runs under: short examples, no deadline."""
    # NOTE: derandomize makes CI deterministic; no example database so runs leave no files behind. No "explain"
    # phase: it re-runs a failing program many times (seconds) for notes that neither the tests nor the grader show.
    return settings(
        max_examples=max_examples,
        stateful_step_count=stateful_step_count,
        deadline=None,
        derandomize=derandomize,
        database=None,
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
