"""Solution to exercise 4: an LRU prefix cache over a block allocator (notebooks/exercises/04_prefix_cache.ipynb).

vLLM's automatic prefix caching: a FULL block is named by a hash of its tokens (chained with its parent
block's hash). When the last owner frees a cached block, its K/V stays in memory: the block joins the
back of the free queue but keeps its hash, so a later prompt with the same prefix can revive it; a freed block
without a cached prefix joins the front and is reused first. `allocate` takes the front of the queue and evicts
the hash of a cached block it takes. Never-used blocks sit between the two. As vLLM v1's BlockPool.
"""
from __future__ import annotations

from collections import OrderedDict


class MyPrefixCachingAllocator:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = True
        self.ref_counts = [0] * num_blocks
        # The free queue, front = handed out next. An OrderedDict: pop the front, add at either end
        # (move_to_end), and remove from the middle (a lookup reviving a freed cached block), all in O(1).
        self.free_queue = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block = {}  # block hash -> list of the blocks holding that prefix's K/V, first cached first
        self.block_to_hash = {}  # block -> its hash, for eviction
        self.num_prefix_hits = 0
        self.num_prefix_misses = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self.free_queue)

    def ref_count(self, block_id: int) -> int:
        return self.ref_counts[block_id]

    def share(self, block_ids: list[int]) -> None:
        for b in block_ids:
            if self.ref_counts[b] == 0:
                raise RuntimeError(f"cannot share block {b}: it is free")
        for b in block_ids:
            self.ref_counts[b] += 1

    def free(self, block_ids: list[int]) -> None:
        """One owner less. A block left with none joins the free queue: at the FRONT if it holds no cached prefix
        (reused first; the first one freed here first), at the BACK if it is cached (evicted last, keeping its
        hash). vLLM v1's BlockPool.free_blocks does exactly this."""
        wanted = {}
        for b in block_ids:
            wanted[b] = wanted.get(b, 0) + 1
        for b, times in wanted.items():
            if times > self.ref_counts[b]:
                raise RuntimeError(f"cannot free block {b} {times} time(s): it has {self.ref_counts[b]} owner(s)")
        to_front = []
        for b in block_ids:
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                if b in self.block_to_hash:
                    self.free_queue[b] = None  # the back
                else:
                    to_front.append(b)
        for b in reversed(to_front):
            self.free_queue[b] = None
            self.free_queue.move_to_end(b, last=False)

    def copy_on_write(self, block_id: int) -> int | None:
        if self.ref_counts[block_id] == 0:
            raise RuntimeError(f"cannot write into block {block_id}: it is free")
        if self.ref_counts[block_id] == 1:
            return block_id
        fresh = self.allocate(1)
        if fresh is None:
            return None
        self.ref_counts[block_id] -= 1
        return fresh[0]

    def check_invariants(self) -> None:
        unowned = {b for b, refs in enumerate(self.ref_counts) if refs == 0}
        assert set(self.free_queue) == unowned, (
            f"the free queue must hold exactly the blocks with ref count 0: expected {sorted(unowned)}, "
            f"found {sorted(self.free_queue)}"
        )
        reverse = {b: h for h, blocks in self.hash_to_block.items() for b in blocks}
        assert reverse == self.block_to_hash and all(self.hash_to_block.values()), (
            f"hash_to_block and block_to_hash must mirror each other, "
            f"found {self.hash_to_block} and {self.block_to_hash}"
        )

    # --- the exercise ---------------------------------------------------------------------------
    def allocate(self, num_blocks: int) -> list[int] | None:
        """`num_blocks` blocks from the FRONT of the free queue, each with one owner; a cached one loses its hash."""
        if not self.can_allocate(num_blocks):
            return None
        blocks = []
        for _ in range(num_blocks):
            b, _ = self.free_queue.popitem(last=False)
            old_hash = self.block_to_hash.pop(b, None)
            if old_hash is not None:  # evicted: its K/V is about to be overwritten
                self.hash_to_block[old_hash].remove(b)
                if not self.hash_to_block[old_hash]:
                    del self.hash_to_block[old_hash]
            self.ref_counts[b] = 1
            blocks.append(b)
        return blocks

    def cache_block(self, block_id: int, block_hash: int) -> None:
        """Register a full block in use under `block_hash` (a hash may name several blocks: add it to the list)."""
        if self.ref_counts[block_id] == 0:
            raise RuntimeError(f"cannot cache block {block_id}: it is free")
        if block_id in self.block_to_hash:
            return
        self.hash_to_block.setdefault(block_hash, []).append(block_id)
        self.block_to_hash[block_id] = block_hash

    def lookup(self, block_hash: int) -> int | None:
        """The first block cached under `block_hash` with one more owner (a hit; revives it if free), or None."""
        b = self.hash_to_block[block_hash][0] if block_hash in self.hash_to_block else None
        if b is None:
            self.num_prefix_misses += 1
            return None
        self.num_prefix_hits += 1
        if self.ref_counts[b] == 0:
            del self.free_queue[b]
        self.ref_counts[b] += 1
        return b

    def is_cached(self, block_id: int) -> bool:
        return block_id in self.block_to_hash
