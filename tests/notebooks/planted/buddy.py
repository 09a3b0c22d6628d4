"""The buddy allocator with one rule broken (tests/notebooks/test_grader.py grades each)."""

from __future__ import annotations


def never_merges(base):
    class NeverMerges(base):
        def free(self, start):
            if start not in self.orders:
                raise RuntimeError(f"free of slot {start}, which starts no allocation")
            self.free_lists[self.orders.pop(start)].add(start)

    return NeverMerges


def highest_block(base):
    class HighestBlock(base):
        def allocate(self, size):  # the HIGHEST-addressed block of the smallest order that has one
            if size < 1:
                raise ValueError(f"size must be >= 1, got {size}")
            want = (size - 1).bit_length()
            order = next((k for k in range(want, self.max_order + 1) if self.free_lists[k]), None)
            if order is None:
                return None
            start = max(self.free_lists[order])
            self.free_lists[order].remove(start)
            while order > want:
                order -= 1
                self.free_lists[order].add(start + (1 << order))
            self.orders[start] = want
            return start

    return HighestBlock


def keeps_upper_half(base):
    class KeepsUpperHalf(base):
        def allocate(self, size):  # splits, but hands out the UPPER half and frees the lower one
            if size < 1:
                raise ValueError(f"size must be >= 1, got {size}")
            want = (size - 1).bit_length()
            order = next((k for k in range(want, self.max_order + 1) if self.free_lists[k]), None)
            if order is None:
                return None
            start = min(self.free_lists[order])
            self.free_lists[order].remove(start)
            while order > want:
                order -= 1
                self.free_lists[order].add(start)
                start += 1 << order
            self.orders[start] = want
            return start

    return KeepsUpperHalf


def merges_with_any_neighbour(base):
    class MergesWithAnyNeighbour(base):
        def free(self, start):  # merges with the free block of the same size just AFTER it, buddy or not
            if start not in self.orders:
                raise RuntimeError(f"free of slot {start}, which starts no allocation")
            order = self.orders.pop(start)
            while order < self.max_order:
                after = start + (1 << order)
                if after not in self.free_lists[order]:
                    break
                self.free_lists[order].remove(after)
                order += 1
            self.free_lists[order].add(start)

    return MergesWithAnyNeighbour


PLANTED = [
    (
        "never-merges",
        never_merges,
        ("rule",),
        [
            "0+4 merge into 8, which merges with 8 into 16: expected [(0, 16)]",
            "a freed block merges with its buddy (start ^ its size) while the buddy is free",
        ],
    ),
    (
        "highest-block",
        highest_block,
        ("rule",),
        [
            "allocate(2): the lower one, split into 4 + 6: expected 4, found 12",
            "the buddy rule rounds 1 up to 1 slot(s) and takes the lowest-addressed free block of the smallest order",
        ],
    ),
    ("keeps-upper-half", keeps_upper_half, ("rule",), ["allocate(3): expected 0, found 12", "keeping the lower half"]),
    (
        "merges-with-any-neighbour",
        merges_with_any_neighbour,
        ("rule",),
        [
            "after free(",
            "a freed block merges with its buddy (start ^ its size) while the buddy is free, and only with its buddy",
        ],
    ),
]
