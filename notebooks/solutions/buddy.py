"""Solution to exercise 2: a binary buddy allocator (notebooks/exercises/02_buddy.ipynb).

Knuth's buddy system (TAOCP vol. 1, 2.5), the allocator of the vLLM paper's Orca baselines (section 6.1).
The space has a power-of-two number of slots. A block of order k holds 2**k slots and starts at a
multiple of 2**k; its buddy is the other half of the block it was split from, at `start ^ 2**k`.
"""
from __future__ import annotations


class MyBuddyAllocator:
    def __init__(self, num_slots: int):
        if num_slots < 1 or num_slots & (num_slots - 1):
            raise ValueError(f"num_slots must be a power of two, got {num_slots}")
        self.num_slots = num_slots
        self.max_order = num_slots.bit_length() - 1
        self.free_lists = [set() for _ in range(self.max_order + 1)]  # order -> starts of free blocks
        self.free_lists[self.max_order].add(0)
        self.orders = {}  # start -> order of every block handed out

    @property
    def num_free_slots(self) -> int:
        return sum(len(starts) << order for order, starts in enumerate(self.free_lists))

    @property
    def largest_free_run(self) -> int:
        for order in range(self.max_order, -1, -1):
            if self.free_lists[order]:
                return 1 << order
        return 0

    def free_runs(self) -> list[tuple[int, int]]:
        return sorted((start, 1 << order) for order, starts in enumerate(self.free_lists) for start in starts)

    def allocated_size(self, start: int) -> int:
        if start not in self.orders:
            raise RuntimeError(f"no allocation starts at slot {start}")
        return 1 << self.orders[start]

    def check_invariants(self) -> None:
        blocks = self.free_runs() + sorted((s, 1 << k) for s, k in self.orders.items())
        end = 0
        for start, size in sorted(blocks):
            assert start == end, f"blocks must tile the space: expected one at {end}, found {start}"
            assert start % size == 0, f"block at {start} of {size} slots: expected it aligned to its size"
            end = start + size
        assert end == self.num_slots, f"blocks must end at {self.num_slots}, found {end}"
        for order, starts in enumerate(self.free_lists[: self.max_order]):
            for start in starts:
                buddy = start ^ (1 << order)
                assert buddy not in starts, f"free buddies {start} and {buddy} of order {order} left unmerged"

    # --- the exercise ---------------------------------------------------------------------------
    def allocate(self, size: int) -> int | None:
        """Start of a free block of the smallest order with 2**order >= size, splitting a larger one if needed."""
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        want = (size - 1).bit_length()
        order = want
        while order <= self.max_order and not self.free_lists[order]:
            order += 1
        if order > self.max_order:
            return None
        start = min(self.free_lists[order])
        self.free_lists[order].remove(start)
        while order > want:  # split: keep the lower half, the upper half becomes a free block
            order -= 1
            self.free_lists[order].add(start + (1 << order))
        self.orders[start] = want
        return start

    def free(self, start: int) -> None:
        """Give the block at `start` back, merging it with its buddy for as long as the buddy is free."""
        if start not in self.orders:
            raise RuntimeError(f"free of slot {start}, which starts no allocation")
        order = self.orders.pop(start)
        while order < self.max_order:
            buddy = start ^ (1 << order)
            if buddy not in self.free_lists[order]:
                break
            self.free_lists[order].remove(buddy)
            start = min(start, buddy)
            order += 1
        self.free_lists[order].add(start)
