"""A block allocator from outside (`block_allocator=`, the capstone's plug): the paged manager runs over any allocator
with lab 3's methods, and the simulator's results do not depend on which free block an allocator hands out.

The allocators here are written for the test, not the project's: one hands out the most recently freed block first
(a stack), one the highest free id; both keep reference counts in their own way. The property: on any small workload
(samples, beams, swap or recompute, any block size, a tight pool) every column of the step and request tables equals
the project's `BlockAllocator`'s, because the manager's decisions read only counts (free blocks, reference counts),
never block ids. A plugged allocator missing a method, of the wrong size, or on a policy that runs its own, is one
line naming it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.base.request import Request
from sim.base.specs import MODELS
from sim.kv import make_kv_manager, takes_block_allocator
from sim.kv.base import NewSequence
from sim.kv.paged import PagedKVManager
from sim.kv.plug import ALLOCATOR_METHODS


class StackAllocator:
    """Lab 3's methods over a stack of free blocks (the last freed is the next handed out) and a dict of counts."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size, self.enable_prefix_caching = num_blocks, block_size, False
        self.owners = dict.fromkeys(range(num_blocks), 0)
        self.stack = list(range(num_blocks))
        self.pick = lambda stack: stack.pop()

    num_free_blocks = property(lambda self: len(self.stack))
    num_used_blocks = property(lambda self: self.num_blocks - len(self.stack))

    def can_allocate(self, n: int) -> bool:
        return n <= len(self.stack)

    def ref_count(self, b: int) -> int:
        return self.owners[b]

    def check_invariants(self) -> None:
        assert sorted(self.stack) == sorted(b for b, n in self.owners.items() if n == 0)

    def allocate(self, n: int):
        if n > len(self.stack):
            return None
        out = [self.pick(self.stack) for _ in range(n)]
        for b in out:
            self.owners[b] = 1
        return out

    def share(self, block_ids) -> None:
        assert all(self.owners[b] for b in block_ids), "sharing a free block"
        for b in block_ids:
            self.owners[b] += 1

    def free(self, block_ids) -> None:
        for b in block_ids:
            assert self.owners[b] > 0, f"freeing free block {b}"
            self.owners[b] -= 1
            if self.owners[b] == 0:
                self.stack.append(b)

    def copy_on_write(self, b: int):
        if self.owners[b] == 1:
            return b
        fresh = self.allocate(1)
        if fresh is not None:
            self.owners[b] -= 1
            return fresh[0]
        return None


class HighestFirst(StackAllocator):
    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.pick = lambda stack: stack.pop(stack.index(max(stack)))


@st.composite
def workloads(draw) -> dict:
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    num_blocks = draw(st.integers(4, 24))
    wide = draw(st.sampled_from(["n", "beam_width"]))
    requests = []
    for at, prompt, output, width in sorted(
        draw(
            st.lists(
                st.tuples(st.integers(0, 200), st.integers(1, 40), st.integers(1, 40), st.integers(1, 3)),
                min_size=1,
                max_size=8,
            )
        )
    ):
        if width * math.ceil((prompt + output) / block_size) <= num_blocks:
            requests.append(Request(len(requests), at / 100, prompt, output, **{wide: width}))
    swap = draw(st.booleans())
    gib = num_blocks * block_size * MODELS["opt-13b"].kv_bytes_per_token / 2**30
    return {
        "requests": requests,
        "kv_slots": num_blocks * block_size,
        "block_size": block_size,
        "preemption": "swap" if swap else "recompute",
        "swap_space_gib": gib if swap else 4.0,
        "victim": draw(st.sampled_from(["latest_arrival", "fewest_computed"])),
        "jump": draw(st.booleans()),
    }


def assert_same_tables(a, b) -> None:
    for table in ("steps", "requests"):
        x, y = getattr(a, table), getattr(b, table)
        assert len(x) == len(y), table
        for name in y.columns:
            assert np.array_equal(x[name], y[name], equal_nan=True), (table, name)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(run=workloads(), allocator=st.sampled_from([StackAllocator, HighestFirst]))
def test_results_do_not_depend_on_which_free_block_is_handed_out(run, allocator):
    if not run["requests"]:
        return
    ours = sim.run(**run, validate=True)
    theirs = sim.run(**run, validate=True, block_allocator=allocator)
    assert_same_tables(theirs, ours)
    assert theirs.summary["block_allocator"] == allocator.__qualname__ and "block_allocator" not in ours.summary


def test_the_paper_trace_on_a_plugged_allocator_is_the_projects():
    settings = {"duration": 120.0, "kv_slots": 4000}  # OPT-13B, ShareGPT at 2 req/s, on a tenth of an A100: preempts
    ours, theirs = sim.run(**settings), sim.run(**settings, block_allocator=StackAllocator)
    assert ours.summary["num_preemptions"] > 0
    assert_same_tables(theirs, ours)


def test_the_manager_hands_the_allocator_fresh_lists():
    """free() may read its argument twice (check, then free): the manager never passes an iterator."""
    seen = []

    class Recording(StackAllocator):
        def free(self, block_ids) -> None:
            seen.append(type(block_ids))
            super().free(block_ids)

    kv = PagedKVManager(8, 4, num_cpu_blocks=8, block_allocator=Recording)
    assert kv.allocate_slots([0], [6], [NewSequence(6, 10)]) is not None
    kv.swap_out([0])
    kv.swap_in([0])
    kv.free(0)
    assert seen and all(t is list for t in seen)


@pytest.mark.parametrize(
    "factory, error, message",
    [
        (3, TypeError, "block_allocator must be a class or function (num_blocks, block_size) -> an allocator, got int"),
        (lambda n, b: object(), TypeError, "its allocator has no " + ", ".join(ALLOCATOR_METHODS)),
        (lambda n, b: StackAllocator(n + 1, b), ValueError, "says num_blocks 9, block_size 4"),
    ],
)
def test_a_bad_allocator_is_one_line(factory, error, message):
    with pytest.raises(error) as info:
        make_kv_manager("paged", 32, block_size=4, block_allocator=factory)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_prefix_caching_needs_the_cache_methods():
    with pytest.raises(TypeError, match=r"has no cached_block, cache_block, lookup, uncache \(prefix caching is on\)"):
        make_kv_manager("paged", 32, block_size=4, enable_prefix_caching=True, block_allocator=StackAllocator)


def test_only_a_policy_that_takes_one_runs_on_a_plugged_allocator():
    assert takes_block_allocator("paged") and not takes_block_allocator("radix")
    with pytest.raises(
        ValueError,
        match=r"policy 'radix' runs its own allocator \(allowed with block_allocator: "
        r"paged\)",
    ):
        make_kv_manager("radix", 32, block_size=4, block_allocator=StackAllocator)
    with pytest.raises(ValueError, match=r"applies to policy='paged' only; policy='max' runs its own"):
        sim.run(num_requests=2, policy="max", block_allocator=StackAllocator)
    with pytest.raises(ValueError, match=r"block_allocator: got 3 \(allowed: None, or a class or function"):
        sim.run(num_requests=2, block_allocator=3)


def test_a_victim_function_is_named_in_the_summary():
    def youngest(candidates):
        return max(candidates, key=lambda g: g.arrival_order)

    run = sim.run(duration=60.0, kv_slots=4000, victim=youngest)
    assert run.summary["victim"] == youngest.__qualname__
    assert_same_tables(run, sim.run(duration=60.0, kv_slots=4000, victim="latest_arrival"))
    with pytest.raises(ValueError, match=r"victim: got 3 \(allowed: latest_arrival, fewest_computed, or a function"):
        sim.run(num_requests=2, victim=3)
