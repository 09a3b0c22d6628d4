"""Exercise 3, correct but different: a LIFO free list (the last block freed is the first handed out), ref counts
in a dict holding only owned blocks, and the all-or-nothing check as a module-level helper."""

from collections import Counter

MIN_BLOCKS = max(1, int("1"))  # a module-level constant computed by calls


def times_each(block_ids):
    return Counter(block_ids)


class MyBlockAllocator:
    def __init__(self, num_blocks, block_size):
        if num_blocks < MIN_BLOCKS or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = False
        self.owners = {}  # block -> owners, only blocks with at least one
        self.stack = list(range(num_blocks - 1, -1, -1))  # free blocks; the top (end) is handed out next

    @property
    def num_free_blocks(self):
        return len(self.stack)

    @property
    def num_used_blocks(self):
        return len(self.owners)

    def can_allocate(self, num_blocks):
        return num_blocks <= len(self.stack)

    def ref_count(self, block_id):
        return self.owners.get(block_id, 0)

    def check_invariants(self):
        assert sorted(self.stack) == sorted(set(range(self.num_blocks)) - set(self.owners))
        assert all(n > 0 for n in self.owners.values())

    def allocate(self, num_blocks):
        if num_blocks > len(self.stack):
            return None
        taken = [self.stack.pop() for _ in range(num_blocks)]
        self.owners.update(dict.fromkeys(taken, 1))
        return taken

    def share(self, block_ids):
        missing = [b for b in block_ids if b not in self.owners]
        if missing:
            raise RuntimeError(f"cannot share free block(s) {missing}")
        for b in block_ids:
            self.owners[b] += 1

    def free(self, block_ids):
        for b, times in times_each(block_ids).items():
            if times > self.owners.get(b, 0):
                raise RuntimeError(f"cannot free block {b} {times} time(s): it has {self.ref_count(b)} owner(s)")
        for b in block_ids:
            self.owners[b] -= 1
            if self.owners[b] == 0:
                del self.owners[b]
                self.stack.append(b)

    def copy_on_write(self, block_id):
        if block_id not in self.owners:
            raise RuntimeError(f"cannot write into free block {block_id}")
        if self.owners[block_id] == 1:
            return block_id
        if not self.stack:
            return None
        [fresh] = self.allocate(1)
        self.owners[block_id] -= 1
        return fresh
