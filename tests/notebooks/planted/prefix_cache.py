"""The LRU prefix cache with one rule broken (tests/notebooks/test_grader.py grades each)."""

from __future__ import annotations


def evicts_most_recently_freed(base):
    class EvictsMostRecentlyFreed(base):
        def free(self, block_ids):  # freed blocks go to the FRONT: the freshest cached prefix is evicted first
            super().free(block_ids)
            for b in block_ids:
                if self.ref_counts[b] == 0:
                    self.free_queue.move_to_end(b, last=False)

    return EvictsMostRecentlyFreed


def hit_adds_no_owner(base):
    class HitAddsNoOwner(base):
        def lookup(self, block_hash):  # finds the block but the new prompt does not become an owner
            b = self.hash_to_block[block_hash][0] if block_hash in self.hash_to_block else None
            if b is None:
                self.num_prefix_misses += 1
            else:
                self.num_prefix_hits += 1
            return b

    return HitAddsNoOwner


def eviction_keeps_hash(base):
    class EvictionKeepsHash(base):
        def allocate(self, num_blocks):  # hands a cached block out again but leaves its hash in place
            if not self.can_allocate(num_blocks):
                return None
            blocks = [self.free_queue.popitem(last=False)[0] for _ in range(num_blocks)]
            for b in blocks:
                self.ref_counts[b] = 1
            return blocks

    return EvictionKeepsHash


def revival_stays_free(base):
    class RevivalStaysFree(base):
        def lookup(self, block_hash):  # revives a freed cached block but leaves it in the free queue
            b = self.hash_to_block[block_hash][0] if block_hash in self.hash_to_block else None
            if b is None:
                self.num_prefix_misses += 1
                return None
            self.num_prefix_hits += 1
            self.ref_counts[b] += 1
            return b

    return RevivalStaysFree


PLANTED = [
    (
        "evicts-most-recent",
        evicts_most_recently_freed,
        (),
        [
            "when the pool is short, allocate evicts the least recently freed cached block",
            "allocate(1): expected [1], found [2]",
        ],
    ),
    (
        "hit-adds-no-owner",
        hit_adds_no_owner,
        (),
        ["ref_count(0) after the hit lookup(111): the new prompt now shares it: expected 2, found 1"],
    ),
    (
        "eviction-keeps-hash",
        eviction_keeps_hash,
        (),
        ["is_cached(1) after it was handed out again: expected False, found True"],
    ),
    (
        "revival-stays-free",
        revival_stays_free,
        (),
        ["num_free_blocks after lookup(7): the revived block left the free queue: expected 1, found 2"],
    ),
]
