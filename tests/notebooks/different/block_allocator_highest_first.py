"""Exercise 3, correct but different: the HIGHEST free block id first (a heap of negated ids), ref counts in a
list, every check before any change."""

import heapq


class MyBlockAllocator:
    def __init__(self, num_blocks, block_size):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = False
        self.ref_counts = [0] * num_blocks
        self.heap = [-b for b in range(num_blocks)]
        heapq.heapify(self.heap)

    num_free_blocks = property(lambda self: len(self.heap))
    num_used_blocks = property(lambda self: self.num_blocks - len(self.heap))

    def can_allocate(self, num_blocks):
        return len(self.heap) >= num_blocks

    def ref_count(self, block_id):
        return self.ref_counts[block_id]

    def check_invariants(self):
        assert sorted(-b for b in self.heap) == [b for b, r in enumerate(self.ref_counts) if r == 0]

    def allocate(self, num_blocks):
        if not self.can_allocate(num_blocks):
            return None
        out = [-heapq.heappop(self.heap) for _ in range(num_blocks)]
        for b in out:
            self.ref_counts[b] = 1
        return out

    def share(self, block_ids):
        if any(self.ref_counts[b] == 0 for b in block_ids):
            raise ValueError("sharing a free block")
        for b in block_ids:
            self.ref_counts[b] += 1

    def free(self, block_ids):
        for b in set(block_ids):
            if block_ids.count(b) > self.ref_counts[b]:
                raise RuntimeError(f"block {b} freed more often than it is owned")
        for b in block_ids:
            self.ref_counts[b] -= 1
            if not self.ref_counts[b]:
                heapq.heappush(self.heap, -b)

    def copy_on_write(self, block_id):
        if self.ref_counts[block_id] == 0:
            raise RuntimeError("free block")
        if self.ref_counts[block_id] == 1:
            return block_id
        got = self.allocate(1)
        if got is None:
            return None
        self.ref_counts[block_id] -= 1
        return got[0]
