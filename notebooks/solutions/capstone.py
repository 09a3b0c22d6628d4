"""Solution to lab 13, the capstone: a block allocator (lab 3) and a victim policy (lab 8) plugged into the engine and
the simulator (notebooks/exercises/13_capstone.ipynb).

The glue is `MyServingStack`: a fresh allocator per pool and a fresh policy per run. The two pieces here are
written differently from notebooks/solutions/block_allocator.py and victim_policy.py on purpose (a stack of free
blocks handed out last-in-first-out, a policy that sorts): the engine's tokens and the simulator's tables must not
depend on how a correct piece is written, only on what it does.
"""
from __future__ import annotations


class MyBlockAllocator:
    """Lab 3: reference counts and copy-on-write; the free blocks on a stack (the last freed is handed out next)."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = False
        self.owners = dict.fromkeys(range(num_blocks), 0)
        self.stack = list(range(num_blocks - 1, -1, -1))  # the top (the end) is handed out first

    @property
    def num_free_blocks(self) -> int:
        return len(self.stack)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.stack)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self.stack)

    def ref_count(self, block_id: int) -> int:
        return self.owners[block_id]

    def check_invariants(self) -> None:
        assert sorted(self.stack) == sorted(b for b, n in self.owners.items() if n == 0), "free stack != unowned blocks"
        assert all(n >= 0 for n in self.owners.values()), "a negative reference count"

    def allocate(self, num_blocks: int) -> list[int] | None:
        if num_blocks > len(self.stack):
            return None
        blocks = [self.stack.pop() for _ in range(num_blocks)]
        for b in blocks:
            self.owners[b] = 1
        return blocks

    def share(self, block_ids: list[int]) -> None:
        if any(self.owners[b] == 0 for b in block_ids):
            raise RuntimeError(f"cannot share a free block: {[b for b in block_ids if self.owners[b] == 0]}")
        for b in block_ids:
            self.owners[b] += 1

    def free(self, block_ids: list[int]) -> None:
        block_ids = list(block_ids)
        for b in set(block_ids):
            if block_ids.count(b) > self.owners[b]:
                raise RuntimeError(f"cannot free block {b} {block_ids.count(b)} time(s): {self.owners[b]} owner(s)")
        for b in block_ids:
            self.owners[b] -= 1
            if self.owners[b] == 0:
                self.stack.append(b)

    def copy_on_write(self, block_id: int) -> int | None:
        if self.owners[block_id] == 0:
            raise RuntimeError(f"cannot write into block {block_id}: it is free")
        if self.owners[block_id] == 1:
            return block_id
        if not self.stack:
            return None
        self.owners[block_id] -= 1
        return self.allocate(1)[0]


class MyVictimPolicy:
    """Lab 8: the fewest computed tokens first (ties: the latest arrival), but a request preempted max_preemptions
    times is protected while anyone is below; when all are at the cap, the latest arrival."""

    def __init__(self, max_preemptions: int):
        self.max_preemptions = max_preemptions
        self.num_preempted = {}

    def is_protected(self, request_id: int) -> bool:
        return self.num_preempted.get(request_id, 0) >= self.max_preemptions

    def victim(self, candidates: list) -> object:
        by_arrival = sorted(candidates, key=lambda g: g.arrival_order, reverse=True)  # the latest first
        open_ = [g for g in by_arrival if not self.is_protected(g.request_id)]
        chosen = sorted(open_, key=lambda g: g.num_computed_tokens)[0] if open_ else by_arrival[0]  # stable sort
        self.num_preempted[chosen.request_id] = self.num_preempted.get(chosen.request_id, 0) + 1
        return chosen


class MyServingStack:
    """Your pieces as the engine and the simulator plug them in: LLM(..., block_allocator=stack.block_allocator,
    victim=stack.victim_policy(2).victim), and the same keywords for sim.run."""

    def block_allocator(self, num_blocks: int, block_size: int):
        """A FRESH allocator of yours (lab 3) for a pool of num_blocks blocks of block_size tokens."""
        return MyBlockAllocator(num_blocks, block_size)

    def victim_policy(self, max_preemptions: int):
        """A FRESH victim policy of yours (lab 8): the scheduler calls its victim(candidates)."""
        return MyVictimPolicy(max_preemptions)
