"""Exercise 2, correct but different: free blocks as a dict {order: sorted list of starts} (bisect), sizes instead
of orders, and the buddy arithmetic in module-level helpers; constants computed by calls."""

import bisect
import math

ORDERS = dict(enumerate(2**k for k in range(0, 31)))  # order -> size, computed at import


def order_of(size):
    return max(0, math.ceil(math.log2(size)))


def buddy_of(start, order):
    return start ^ ORDERS[order]


class MyBuddyAllocator:
    def __init__(self, num_slots):
        if num_slots < 1 or num_slots & (num_slots - 1):
            raise ValueError(f"num_slots must be a power of two, got {num_slots}")
        self.num_slots = num_slots
        self.top = order_of(num_slots)
        self.free_by_order = {k: [] for k in range(self.top + 1)}
        self.free_by_order[self.top].append(0)
        self.sizes = {}

    @property
    def num_free_slots(self):
        return sum(ORDERS[k] * len(v) for k, v in self.free_by_order.items())

    @property
    def largest_free_run(self):
        return max((ORDERS[k] for k, v in self.free_by_order.items() if v), default=0)

    def free_runs(self):
        return sorted((s, ORDERS[k]) for k, v in self.free_by_order.items() for s in v)

    def allocated_size(self, start):
        if start not in self.sizes:
            raise RuntimeError(f"no allocation starts at slot {start}")
        return self.sizes[start]

    def check_invariants(self):
        assert self.num_free_slots + sum(self.sizes.values()) == self.num_slots

    def allocate(self, size):
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        want = order_of(size)
        k = next((k for k in range(want, self.top + 1) if self.free_by_order[k]), None)
        if k is None:
            return None
        start = self.free_by_order[k].pop(0)  # the lowest-addressed block of that order
        while k > want:
            k -= 1
            bisect.insort(self.free_by_order[k], start + ORDERS[k])  # the upper half stays free
        self.sizes[start] = ORDERS[want]
        return start

    def free(self, start):
        if start not in self.sizes:
            raise RuntimeError(f"free of {start}: no block starts there")
        k = order_of(self.sizes.pop(start))
        while k < self.top and buddy_of(start, k) in self.free_by_order[k]:
            self.free_by_order[k].remove(buddy_of(start, k))
            start = min(start, buddy_of(start, k))
            k += 1
        bisect.insort(self.free_by_order[k], start)
