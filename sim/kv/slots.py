"""Contiguous memory: allocators that hand out runs of consecutive slots from one linear space.

This is the physical memory of the paper's Orca baselines (vLLM paper, section 6.1 and Figure 2):
each sequence's KV cache must live in ONE run of consecutive slots, so the allocator has to find a
long enough hole. Two classic allocators over the same surface:

- `BuddyAllocator`: Knuth's binary buddy system (TAOCP vol. 1, section 2.5), what the paper's
  Orca reimplementation used. Every run handed out is a power of two, aligned to its own size;
  rounding a request up to the power of two is slack the breakdown counts as external fragmentation.
- `FirstFitAllocator`: a sorted free list; takes the lowest-addressed hole that fits, hands out
  exactly what was asked, and coalesces neighbours on free.

Both deal only in integer offsets (a "slot" is whatever unit the caller chooses: a token slot or
a block of tokens). Out of memory is an answer (`allocate` returns None and changes nothing);
a broken invariant raises with what was expected and what was found.
"""
from __future__ import annotations

import bisect
import copy
from typing import Protocol


class SlotAllocator(Protocol):
    """The surface both allocators share (and `sim.testing.slots` checks)."""

    num_slots: int

    @property
    def num_free_slots(self) -> int: ...

    @property
    def largest_free_run(self) -> int: ...  # the largest size `allocate` would satisfy right now

    def allocate(self, size: int) -> int | None: ...

    def allocated_size(self, start: int) -> int: ...

    def free(self, start: int) -> None: ...

    def free_runs(self) -> list[tuple[int, int]]: ...  # sorted (start, length) of every free run

    def copy(self) -> "SlotAllocator": ...

    def check_invariants(self) -> None: ...


def _check_size(size: int) -> None:
    if size < 1:
        raise ValueError(f"allocation size must be >= 1, got {size}")


def _check_num_slots(num_slots: int) -> None:
    if num_slots < 1:
        raise ValueError(f"num_slots must be >= 1, got {num_slots}")


def _check_tiling(num_slots: int, free: list[tuple[int, int]], used: list[tuple[int, int]]) -> None:
    """Free runs and allocations, each (start, length), must cover [0, num_slots) exactly once."""
    pos = 0
    for start, length in sorted(free + used):
        if length < 1:
            raise RuntimeError(f"run at {start}: expected length >= 1, found {length}")
        if start != pos:
            kind = "gap" if start > pos else "overlap"
            raise RuntimeError(f"runs do not tile the space: expected a run at {pos}, found one at {start} ({kind})")
        pos = start + length
    if pos != num_slots:
        raise RuntimeError(f"runs do not tile the space: expected them to end at {num_slots}, found {pos}")


class BuddyAllocator:
    """Binary buddy system over `num_slots` slots.

    A block of order k holds 2**k slots and starts at a multiple of 2**k. Allocating splits a larger
    free block in halves until one of the right order is left; freeing merges a block with its buddy
    (the other half it was split from, at `start XOR 2**k`) while the buddy is free too.

    A total that is not a power of two is carved into top-level regions of descending powers of two,
    each aligned to its own size (so the buddy arithmetic holds inside it); blocks never merge across
    a region's edge. For 40 slots:

        offset  0                               32      40
                |<---------- region 2**5 ------>|<-2**3->|
    """

    def __init__(self, num_slots: int):
        _check_num_slots(num_slots)
        self.num_slots = num_slots
        self._regions: list[tuple[int, int]] = []  # (base, order) of each top-level region, ascending
        base = 0
        for order in range(num_slots.bit_length() - 1, -1, -1):
            if num_slots & (1 << order):
                self._regions.append((base, order))
                base += 1 << order
        self._free: list[set[int]] = [set() for _ in range(num_slots.bit_length())]  # order -> free starts
        for base, order in self._regions:
            self._free[order].add(base)
        self._allocated: dict[int, int] = {}  # start -> order of the block handed out
        self._num_free_slots = num_slots

    # --- what the caller reads ---------------------------------------------------------------------
    @property
    def num_free_slots(self) -> int:
        return self._num_free_slots

    @property
    def largest_free_run(self) -> int:
        """The largest free block: two free neighbours that are not buddies cannot serve one request."""
        for order in range(len(self._free) - 1, -1, -1):
            if self._free[order]:
                return 1 << order
        return 0

    def allocated_size(self, start: int) -> int:
        if start not in self._allocated:
            raise RuntimeError(f"no allocation starts at slot {start}")
        return 1 << self._allocated[start]

    def free_runs(self) -> list[tuple[int, int]]:
        return sorted((start, 1 << order) for order, starts in enumerate(self._free) for start in starts)

    def copy(self) -> "BuddyAllocator":
        return copy.deepcopy(self)

    # --- allocate / free ---------------------------------------------------------------------------
    def allocate(self, size: int) -> int | None:
        """Start of a block of 2**ceil(log2(size)) slots, or None (nothing changed) if none is free."""
        _check_size(size)
        want = (size - 1).bit_length()  # smallest order with 2**order >= size
        have = next((k for k in range(want, len(self._free)) if self._free[k]), None)
        if have is None:
            return None
        start = min(self._free[have])  # NOTE: lowest address, so runs are reproducible and easy to draw
        self._free[have].remove(start)
        while have > want:  # split: keep the lower half, free the upper half
            have -= 1
            self._free[have].add(start + (1 << have))
        self._allocated[start] = want
        self._num_free_slots -= 1 << want
        return start

    def free(self, start: int) -> None:
        if start not in self._allocated:
            raise RuntimeError(f"free of slot {start}, which starts no allocation")
        order = self._allocated.pop(start)
        self._num_free_slots += 1 << order
        top = self._region_order(start)
        while order < top and (start ^ (1 << order)) in self._free[order]:  # merge with the free buddy
            self._free[order].remove(start ^ (1 << order))
            start &= ~(1 << order)  # the merged block starts at the lower buddy
            order += 1
        self._free[order].add(start)

    def _region_order(self, start: int) -> int:
        for base, order in self._regions:
            if base <= start < base + (1 << order):
                return order
        raise RuntimeError(f"slot {start} lies outside [0, {self.num_slots})")

    # --- invariants --------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        free = [(s, 1 << k) for k, starts in enumerate(self._free) for s in starts]
        used = [(s, 1 << k) for s, k in self._allocated.items()]
        _check_tiling(self.num_slots, free, used)
        for start, size in free + used:
            order = size.bit_length() - 1
            if start % size != 0 or order > self._region_order(start):
                raise RuntimeError(f"block at {start} of {size} slots: expected it aligned inside its region")
        for order, starts in enumerate(self._free):
            for start in starts:
                if order < self._region_order(start) and (start ^ (1 << order)) in starts:
                    raise RuntimeError(f"free buddies {start} and {start ^ (1 << order)} of order {order} left unmerged")
        found = sum(size for _, size in free)
        if found != self._num_free_slots:
            raise RuntimeError(f"num_free_slots: expected {found} (sum of free blocks), found {self._num_free_slots}")


class FirstFitAllocator:
    """A sorted list of free runs; allocation takes the lowest-addressed run long enough.

        before  |###|.......|##|.....|      allocate(4) -> 3
        after   |###|####...|##|.....|      (the hole's tail stays free)
    """

    def __init__(self, num_slots: int):
        _check_num_slots(num_slots)
        self.num_slots = num_slots
        self._free: list[tuple[int, int]] = [(0, num_slots)]  # (start, length), sorted by start
        self._allocated: dict[int, int] = {}  # start -> size handed out
        self._num_free_slots = num_slots

    @property
    def num_free_slots(self) -> int:
        return self._num_free_slots

    @property
    def largest_free_run(self) -> int:
        return max((length for _, length in self._free), default=0)

    def allocated_size(self, start: int) -> int:
        if start not in self._allocated:
            raise RuntimeError(f"no allocation starts at slot {start}")
        return self._allocated[start]

    def free_runs(self) -> list[tuple[int, int]]:
        return list(self._free)

    def copy(self) -> "FirstFitAllocator":
        return copy.deepcopy(self)

    def allocate(self, size: int) -> int | None:
        """Start of exactly `size` consecutive slots, or None (nothing changed) if no hole fits."""
        _check_size(size)
        for i, (start, length) in enumerate(self._free):
            if length >= size:
                if length == size:
                    del self._free[i]
                else:
                    self._free[i] = (start + size, length - size)
                self._allocated[start] = size
                self._num_free_slots -= size
                return start
        return None

    def free(self, start: int) -> None:
        if start not in self._allocated:
            raise RuntimeError(f"free of slot {start}, which starts no allocation")
        length = self._allocated.pop(start)
        self._num_free_slots += length
        i = bisect.bisect_left(self._free, (start, 0))
        if i < len(self._free) and self._free[i][0] == start + length:  # coalesce with the run after
            length += self._free.pop(i)[1]
        if i > 0 and sum(self._free[i - 1]) == start:  # ... and with the run before
            start, before = self._free[i - 1]
            length += before
            self._free[i - 1] = (start, length)
        else:
            self._free.insert(i, (start, length))

    def check_invariants(self) -> None:
        _check_tiling(self.num_slots, list(self._free), list(self._allocated.items()))
        for (a, la), (b, _) in zip(self._free, self._free[1:]):
            if a + la >= b:
                raise RuntimeError(f"free runs at {a} and {b}: expected sorted and coalesced, found them touching")
        found = sum(length for _, length in self._free)
        if found != self._num_free_slots:
            raise RuntimeError(f"num_free_slots: expected {found} (sum of free runs), found {self._num_free_slots}")


ALLOCATORS = {"buddy": BuddyAllocator, "first_fit": FirstFitAllocator}
