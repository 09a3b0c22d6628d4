"""Slot allocators (sim/kv/slots.py): the shared state machine for both, then narrated examples."""

from __future__ import annotations

import pytest
from hypothesis import Phase

from sim.kv.slots import BuddyAllocator, FirstFitAllocator
from sim.testing.slots import make_slot_allocator_test

TestBuddyMachine = make_slot_allocator_test(BuddyAllocator, max_examples=500)
TestBuddyMachine = pytest.mark.slow(TestBuddyMachine)  # hundreds of programs: `make test` only (tests/conftest.py)
TestFirstFitMachine = make_slot_allocator_test(FirstFitAllocator, max_examples=500)
TestFirstFitMachine = pytest.mark.slow(
    TestFirstFitMachine
)  # hundreds of programs: `make test` only (tests/conftest.py)


# --- the machine catches broken allocators ---------------------------------------------------------
class NoCoalesceFirstFit(FirstFitAllocator):
    """Broken on purpose: free puts the run back without merging it with its neighbours."""

    def free(self, start: int) -> None:
        if start not in self._allocated:
            raise RuntimeError(f"free of slot {start}, which starts no allocation")
        length = self._allocated.pop(start)
        self._num_free_slots += length
        self._free = sorted(self._free + [(start, length)])


class OverlappingBuddy(BuddyAllocator):
    """Broken on purpose: a block of the exact order is handed out but left on its free list."""

    def allocate(self, size: int) -> int | None:
        start = super().allocate(size)
        if start is not None and size == 1:
            self._free[0].add(start)  # double-booked: allocated AND free
        return start


@pytest.mark.parametrize("broken", [NoCoalesceFirstFit, OverlappingBuddy])
def test_machine_catches_broken_allocator(broken):
    # No shrinking: we only need to see the machine fail, not the smallest failing run.
    test = make_slot_allocator_test(broken, max_examples=200, phases=[Phase.generate])
    with pytest.raises((AssertionError, RuntimeError)):
        test("runTest").runTest()


# --- buddy: split and merge ------------------------------------------------------------------------
def test_buddy_splits_and_merges():
    alloc = BuddyAllocator(16)
    assert alloc.free_runs() == [(0, 16)]
    # allocate(3) rounds up to 4: 16 splits into 8+8, the lower 8 into 4+4; the lower 4 is handed out
    assert alloc.allocate(3) == 0
    assert alloc.allocated_size(0) == 4
    assert alloc.free_runs() == [(4, 4), (8, 8)]
    # allocate(4) takes the free 4 at offset 4, its buddy
    assert alloc.allocate(4) == 4
    assert alloc.free_runs() == [(8, 8)]
    assert alloc.num_free_slots == 8
    alloc.check_invariants()
    # free both: 0 and 4 merge into 8 at 0, which merges with its buddy 8 into the whole 16
    alloc.free(0)
    assert alloc.free_runs() == [(0, 4), (8, 8)]  # buddy 4 still allocated: no merge yet
    alloc.free(4)
    assert alloc.free_runs() == [(0, 16)]
    assert alloc.num_free_slots == 16
    alloc.check_invariants()


def test_buddy_non_power_of_two_total():
    # 40 slots = a region of 32 at 0 and a region of 8 at 32; blocks never merge across the edge
    alloc = BuddyAllocator(40)
    assert alloc.free_runs() == [(0, 32), (32, 8)]
    assert alloc.largest_free_run == 32
    # allocate(5) needs a block of 8: buddy takes the smallest free block that fits, which is the
    # whole 8-region at 32 (no split), not a piece of the big region
    assert alloc.allocate(5) == 32
    assert alloc.free_runs() == [(0, 32)]
    assert alloc.allocate(33) is None  # larger than any region, though 35 slots are free
    assert alloc.allocate(8) == 0  # now 32 splits 32 -> 16 -> 8; the lowest 8 is handed out
    assert alloc.free_runs() == [(8, 8), (16, 16)]
    alloc.free(0)
    alloc.free(32)
    assert alloc.free_runs() == [(0, 32), (32, 8)]  # back to the two regions, not one run of 40
    alloc.check_invariants()


def test_buddy_adjacent_non_buddies_do_not_serve_one_request():
    alloc = BuddyAllocator(16)
    a, b, c, d = (alloc.allocate(4) for _ in range(4))
    assert (a, b, c, d) == (0, 4, 8, 12)
    alloc.free(b)
    alloc.free(c)
    # 4..12 is 8 free slots in a row, but 4 and 8 are not buddies (4's buddy is 0, 8's is 12)
    assert alloc.free_runs() == [(4, 4), (8, 4)]
    assert alloc.largest_free_run == 4
    assert alloc.allocate(8) is None


# --- first-fit: hole reuse and coalescing ----------------------------------------------------------
def test_first_fit_reuses_lowest_hole_and_coalesces():
    alloc = FirstFitAllocator(20)
    assert [alloc.allocate(n) for n in (3, 5, 4)] == [0, 3, 8]  # exact sizes, packed from 0
    assert alloc.allocated_size(3) == 5
    alloc.free(3)  # a hole of 5 at 3
    assert alloc.free_runs() == [(3, 5), (12, 8)]
    assert alloc.allocate(2) == 3  # the lowest hole that fits, not the bigger tail run
    assert alloc.free_runs() == [(5, 3), (12, 8)]
    alloc.free(8)  # 8..12 joins the hole before it (5..8) and the tail after it (12..20)
    assert alloc.free_runs() == [(5, 15)]
    alloc.free(0)
    alloc.free(3)
    assert alloc.free_runs() == [(0, 20)]
    alloc.check_invariants()


@pytest.mark.parametrize("cls", [BuddyAllocator, FirstFitAllocator])
def test_out_of_memory_changes_nothing(cls):
    alloc = cls(8)
    assert alloc.allocate(6) == 0
    before = (alloc.free_runs(), alloc.num_free_slots, alloc.largest_free_run)
    assert alloc.allocate(5) is None
    assert (alloc.free_runs(), alloc.num_free_slots, alloc.largest_free_run) == before
    alloc.check_invariants()


@pytest.mark.parametrize("cls", [BuddyAllocator, FirstFitAllocator])
def test_bad_input_raises(cls):
    with pytest.raises(ValueError, match="num_slots"):
        cls(0)
    alloc = cls(8)
    with pytest.raises(ValueError, match="size"):
        alloc.allocate(0)
    with pytest.raises(RuntimeError, match="slot 3"):
        alloc.free(3)


def test_check_invariants_reports_expected_and_found():
    alloc = FirstFitAllocator(8)
    alloc.allocate(4)
    alloc._num_free_slots = 3  # corrupt the counter by hand
    with pytest.raises(RuntimeError, match="expected 4.*found 3"):
        alloc.check_invariants()
