"""Exercise 3, correct but different: `allocate` answers a tuple of block ids, which every caller (the stories, the
machines, the engine) reads as the sequence it is."""
from __future__ import annotations

from collections import deque


class MyBlockAllocator:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = False  # this allocator has no prefix cache
        self.ref_counts = [0] * num_blocks  # owners of each block
        self.free_blocks = deque(range(num_blocks))  # exactly the blocks with ref count 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self.free_blocks)

    def ref_count(self, block_id: int) -> int:
        return self.ref_counts[block_id]

    def check_invariants(self) -> None:
        unowned = sorted(b for b, refs in enumerate(self.ref_counts) if refs == 0)
        assert min(self.ref_counts) >= 0, f"ref counts must be >= 0, found {self.ref_counts}"
        assert sorted(self.free_blocks) == unowned, (
            f"the free queue must hold exactly the blocks with ref count 0: expected {unowned}, "
            f"found {sorted(self.free_blocks)}"
        )

    # --- the exercise ---------------------------------------------------------------------------
    def allocate(self, num_blocks: int) -> list[int] | None:
        """`num_blocks` free blocks, each now with one owner; None (and nothing changed) if too few are free."""
        if not self.can_allocate(num_blocks):
            return None
        blocks = [self.free_blocks.popleft() for _ in range(num_blocks)]
        for b in blocks:
            self.ref_counts[b] = 1
        return tuple(blocks)

    def share(self, block_ids: list[int]) -> None:
        """One more owner for each block (a fork). Sharing a free block is an error."""
        for b in block_ids:
            if self.ref_counts[b] == 0:
                raise RuntimeError(f"cannot share block {b}: it is free")
        for b in block_ids:
            self.ref_counts[b] += 1

    def free(self, block_ids: list[int]) -> None:
        """One owner less for each block; a block left with none becomes free. Raises if a block would drop below 0."""
        wanted = {}
        for b in block_ids:
            wanted[b] = wanted.get(b, 0) + 1
        for b, times in wanted.items():
            if times > self.ref_counts[b]:
                raise RuntimeError(f"cannot free block {b} {times} time(s): it has {self.ref_counts[b]} owner(s)")
        for b in block_ids:
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_blocks.append(b)

    def copy_on_write(self, block_id: int) -> int | None:
        """The block the writer may write into: the block itself if it has one owner, else a fresh one
        (the writer drops its reference to the shared block). None (nothing changed) if no block is free."""
        if self.ref_counts[block_id] == 0:
            raise RuntimeError(f"cannot write into block {block_id}: it is free")
        if self.ref_counts[block_id] == 1:
            return block_id
        fresh = self.allocate(1)
        if fresh is None:
            return None
        self.ref_counts[block_id] -= 1
        return fresh[0]
