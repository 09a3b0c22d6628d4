"""Lab 13, correct but different: the allocator's free() reads its argument twice (check every block, then free),
blocks come from a deque (lowest id first), and the policy keeps its counts in a Counter and picks with min().

The engine and the simulator hand free() a list, so reading it twice is fine; a manager that passed an iterator
(reversed(table)) would leak every block here, and the capstone would say so."""

from collections import Counter, deque


class MyBlockAllocator:
    def __init__(self, num_blocks, block_size):
        self.num_blocks, self.block_size, self.enable_prefix_caching = num_blocks, block_size, False
        self.refs = [0] * num_blocks
        self.free_ids = deque(range(num_blocks))

    num_free_blocks = property(lambda self: len(self.free_ids))
    num_used_blocks = property(lambda self: self.num_blocks - len(self.free_ids))

    def can_allocate(self, n):
        return n <= len(self.free_ids)

    def ref_count(self, b):
        return self.refs[b]

    def check_invariants(self):
        assert sorted(self.free_ids) == [b for b in range(self.num_blocks) if self.refs[b] == 0]

    def allocate(self, n):
        if n > len(self.free_ids):
            return None
        out = [self.free_ids.popleft() for _ in range(n)]
        for b in out:
            self.refs[b] = 1
        return out

    def share(self, block_ids):
        for b in block_ids:
            if not self.refs[b]:
                raise RuntimeError(f"block {b} is free")
        for b in block_ids:
            self.refs[b] += 1

    def free(self, block_ids):
        need = Counter(block_ids)  # first pass
        for b, k in need.items():
            if k > self.refs[b]:
                raise RuntimeError(f"block {b} has {self.refs[b]} owner(s), freed {k} time(s)")
        for b in block_ids:  # second pass
            self.refs[b] -= 1
            if not self.refs[b]:
                self.free_ids.append(b)

    def copy_on_write(self, b):
        if not self.refs[b]:
            raise RuntimeError(f"block {b} is free")
        if self.refs[b] == 1:
            return b
        fresh = self.allocate(1)
        if fresh is None:
            return None
        self.refs[b] -= 1
        return fresh[0]


class MyVictimPolicy:
    def __init__(self, max_preemptions):
        self.max_preemptions, self.times = max_preemptions, Counter()

    def is_protected(self, request_id):
        return self.times[request_id] >= self.max_preemptions

    def victim(self, candidates):
        open_ = [g for g in candidates if not self.is_protected(g.request_id)]
        if open_:
            chosen = min(open_, key=lambda g: (g.num_computed_tokens, -g.arrival_order))
        else:
            chosen = max(candidates, key=lambda g: g.arrival_order)
        self.times[chosen.request_id] += 1
        return chosen


class MyServingStack:
    def block_allocator(self, num_blocks, block_size):
        return MyBlockAllocator(num_blocks, block_size)

    def victim_policy(self, max_preemptions):
        return MyVictimPolicy(max_preemptions)
