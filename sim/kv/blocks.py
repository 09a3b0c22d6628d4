"""Physical KV memory as fixed-size blocks: a free queue, reference counts, copy-on-write, prefix cache.

This is the bottom layer of PagedAttention's memory manager (Kwon et al., SOSP 2023, section 4.2-4.4;
vLLM v1's `BlockPool` + `FreeKVCacheBlockQueue`). The GPU's KV cache is cut into `num_blocks` blocks
of `block_size` token slots each. The allocator deals only in integer block ids: it never sees a
request or a sequence. Whoever owns a block (a sequence's block table) holds one *reference* to it.

    ref_count[b] == 0    b is free: it sits in the free queue and may be handed out
    ref_count[b] == 1    b belongs to one owner, who may write into it
    ref_count[b] >= 2    b is shared (parallel sampling, beam search, a cached prefix); the first
                         owner to write into it must copy it first (`copy_on_write`)

Prefix caching (vLLM's automatic prefix caching): a FULL block is named by the hash of its tokens
chained with the hash of the block before it, so equal hashes mean equal prefixes. When a cached
block's last owner frees it, its K/V stays in memory: the block goes to the BACK of the free queue but keeps
its hash, and a later `lookup` may revive it. A freed block that holds no cached prefix goes to the FRONT
instead: it is reused first. `allocate` always takes the front, dropping (evicting) the hash of a cached block
it takes, so cached blocks are evicted last, least recently freed first. One ordered free queue serves both
purposes, exactly as vLLM v1's BlockPool (`free_blocks`: uncached blocks prepended, cached ones appended):

    free() puts uncached blocks here    allocate() pops here ->  [3] [9] | [4] [6] | [7] [2]  <- free() appends cached
                                                   freed, uncached | never used | freed, cached (LRU order)
                                                   lookup(h) may pull a cached block out of the middle

One hash may name several blocks (two requests computed the same prefix at once; vLLM keeps both, so that block
tables never change): a lookup finds the one cached first. `make peer` checks all of this against vLLM's own
BlockPool, operation by operation (tools/peer/block_pool_diff.py).

Out of memory is an answer (`None`, nothing changed); a broken invariant or a misuse (freeing a free
block, sharing a free block) raises `RuntimeError` and changes nothing.
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from typing import Callable, Iterable, Sequence

# Stands in for "no parent" in the hash chain. NOTE: not hash(None), which before Python 3.12 depends
# on None's memory address and so changes from run to run.
_NO_PARENT = b"\xff" * 8


def hash_block_tokens(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """The prefix-cache key of one full block: a 64-bit hash of (parent block's hash, this block's tokens).

    Chaining the parent's hash makes the key name the whole prefix up to this block, as in vLLM.
    Deterministic across runs and machines (blake2b over the ids as signed 64-bit integers), unlike
    Python's salted `hash()` of strings. NOTE: a 64-bit key can collide; at 2**-64 per pair we accept it.
    """
    parent = _NO_PARENT if parent_hash is None else int(parent_hash).to_bytes(8, "little", signed=False)
    digest = hashlib.blake2b(parent + array("q", token_ids).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class BlockAllocator:
    """Hands out block ids from a pool of `num_blocks` blocks of `block_size` token slots.

    With `enable_prefix_caching=False`, `cache_block` and `lookup` raise `RuntimeError` (there is no
    cache to use), `is_cached` is always False and the hit/miss counters stay 0.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref_counts = [0] * num_blocks
        # NOTE: an OrderedDict used as a queue: O(1) pop from the front, append at the back, and
        # removal from the middle (a lookup reviving a freed cached block). Insertion order = free order.
        self._free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # hash -> the blocks cached under it, in the order cached (an ordered set): two requests that computed the
        # same prefix at once both keep their blocks cached, as vLLM's BlockHashToBlockMap; a lookup takes the first.
        self._hash_to_block: dict[int, dict[int, None]] = {}
        self._block_to_hash: dict[int, int] = {}
        self.num_prefix_hits = 0
        self.num_prefix_misses = 0
        # on_evict(block_id, block_hash): told of every cached block that `allocate` evicts, after its entry is
        # forgotten and before the block is handed out (None: evicted blocks are just dropped)
        self.on_evict: Callable[[int, int], None] | None = None

    # --- sizes ----------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks with no owner, including freed cached blocks that may still be revived."""
        return len(self._free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free_queue)

    def free_queue(self) -> list[int]:
        """The free blocks in the order allocate() hands them out (front first): for tests and pictures."""
        return list(self._free_queue)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free_queue)

    def ref_count(self, block_id: int) -> int:
        if 0 <= block_id < self.num_blocks:  # NOTE: the check inlined: the simulator asks millions of times
            return self._ref_counts[block_id]
        self._check_id(block_id)  # raises

    # --- allocation, sharing, release -----------------------------------------------------------
    def allocate(self, num_blocks: int) -> list[int] | None:
        """`num_blocks` distinct free blocks, each with one reference; None (nothing changed) if too few are free.

        Blocks leave from the front of the free queue (see the module docstring); a cached one loses its hash
        (eviction).
        """
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        if num_blocks > len(self._free_queue):
            return None
        if not self._block_to_hash:  # nothing cached, nothing to evict (the simulator's hot path)
            pop, refs = self._free_queue.popitem, self._ref_counts
            block_ids = [pop(last=False)[0] for _ in range(num_blocks)]
            for block_id in block_ids:
                refs[block_id] = 1
            return block_ids
        block_ids = []
        for _ in range(num_blocks):
            block_id, _ = self._free_queue.popitem(last=False)
            if block_id in self._block_to_hash:  # evict: its old contents are about to be overwritten
                block_hash = self._block_to_hash[block_id]
                self._forget(block_id)
                if self.on_evict is not None:  # (an offload tier keeps the K/V: sim/kv/offload.py)
                    self.on_evict(block_id, block_hash)
            self._ref_counts[block_id] = 1
            block_ids.append(block_id)
        return block_ids

    def share(self, block_ids: Iterable[int]) -> None:
        """One more reference to each block (a fork). Every block must be in use."""
        block_ids = list(block_ids)
        for block_id in block_ids:
            if self.ref_count(block_id) == 0:
                raise RuntimeError(f"cannot share block {block_id}: expected ref count >= 1, found 0 (it is free)")
        for block_id in block_ids:
            self._ref_counts[block_id] += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """One reference less to each block; a block left with none joins the free queue: at the front if it holds
        no cached prefix (the first of this call first), at the back if it is cached.

        Raises (and changes nothing) if a block would be freed more times than it is referenced.
        """
        block_ids, refs, n = list(block_ids), self._ref_counts, self.num_blocks
        # the common case checked cheaply (distinct blocks in range, each referenced: type(...) is int keeps bools
        # and floats for the full check); anything else goes through it, which raises on what is wrong
        if len(set(block_ids)) != len(block_ids) or not all(
                type(b) is int and 0 <= b < n and refs[b] for b in block_ids):
            pending: dict[int, int] = {}
            for block_id in block_ids:
                pending[block_id] = pending.get(block_id, 0) + 1
                if pending[block_id] > self.ref_count(block_id):
                    raise RuntimeError(
                        f"cannot free block {block_id}: expected ref count >= {pending[block_id]}, "
                        f"found {self._ref_counts[block_id]}"
                    )
        first, last = [], []  # vLLM v1's BlockPool.free_blocks: reused first (uncached), evicted last (cached)
        cached = self._block_to_hash
        for block_id in block_ids:
            left = refs[block_id] - 1
            refs[block_id] = left
            if not left:
                (last if block_id in cached else first).append(block_id)
        queue = self._free_queue
        for block_id in reversed(first):  # to the front, in the order freed: the first one freed is handed out first
            queue[block_id] = None
            queue.move_to_end(block_id, last=False)
        for block_id in last:  # to the back: a freed prefix stays cached as long as possible
            queue[block_id] = None

    def copy_on_write(self, block_id: int) -> int | None:
        """The block a writer may write into: `block_id` itself if exclusive, else a fresh copy target.

        For a shared block the writer drops its reference and gets a new block (ref count 1); the caller
        must copy the K/V from `block_id` into it before writing. None (nothing changed) if no block is free.
        """
        refs = self.ref_count(block_id)
        if refs == 0:
            raise RuntimeError(f"cannot write block {block_id}: expected ref count >= 1, found 0 (it is free)")
        if refs == 1:
            return block_id
        fresh = self.allocate(1)
        if fresh is None:
            return None
        self._ref_counts[block_id] -= 1
        return fresh[0]

    # --- prefix cache ---------------------------------------------------------------------------
    def cache_block(self, block_id: int, block_hash: int) -> None:
        """Register a FULL block in use under `block_hash` so later prompts can find it (`lookup`, `is_cached`).

        Re-registering a block under the hash it already has changes nothing; under another hash it raises.
        NOTE: if another block already holds `block_hash` (two requests computed the same prefix at once), both
        stay cached under it, as in vLLM v1 (block tables never change); a lookup finds the one cached first,
        and each is evicted on its own.
        """
        self._require_caching("cache_block")
        if self.ref_count(block_id) == 0:
            raise RuntimeError(f"cannot cache block {block_id}: expected ref count >= 1, found 0 (it is free)")
        old_hash = self._block_to_hash.get(block_id)
        if old_hash is not None:
            if old_hash != block_hash:
                raise RuntimeError(
                    f"block {block_id} is already cached under hash {old_hash}, cannot re-cache it as {block_hash}"
                )
            return
        self._hash_to_block.setdefault(block_hash, {})[block_id] = None
        self._block_to_hash[block_id] = block_hash

    def uncache(self, block_ids: Iterable[int]) -> None:
        """Forget the prefix-cache entries of these blocks (their K/V was never written: a failed step), so no
        later prompt finds them. Blocks not cached are skipped; reference counts are unchanged."""
        for block_id in block_ids:
            if block_id in self._block_to_hash:
                self._forget(block_id)

    def _forget(self, block_id: int) -> None:
        """Drop a cached block's entry (its hash stays if other blocks hold it)."""
        block_hash = self._block_to_hash.pop(block_id)
        holders = self._hash_to_block[block_hash]
        del holders[block_id]
        if not holders:
            del self._hash_to_block[block_hash]

    def lookup(self, block_hash: int) -> int | None:
        """The cached block for `block_hash` with one more reference (a hit), or None (a miss).

        A hit on a freed cached block takes it out of the free queue: its K/V is reused, not recomputed.
        """
        self._require_caching("lookup")
        block_id = self.cached_block(block_hash)
        if block_id is None:
            self.num_prefix_misses += 1
            return None
        self.num_prefix_hits += 1
        if self._ref_counts[block_id] == 0:
            del self._free_queue[block_id]
        self._ref_counts[block_id] += 1
        return block_id

    def cached_block(self, block_hash: int) -> int | None:
        """The block cached under `block_hash` (the first cached, if several), without taking a reference or
        counting a hit (a peek)."""
        holders = self._hash_to_block.get(block_hash)
        return None if holders is None else next(iter(holders))

    def is_cached(self, block_id: int) -> bool:
        self._check_id(block_id)
        return block_id in self._block_to_hash

    # --- checks ---------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise RuntimeError (expected vs found) if the free queue, ref counts or cache maps disagree."""
        if len(self._ref_counts) != self.num_blocks:
            raise RuntimeError(f"expected {self.num_blocks} ref counts, found {len(self._ref_counts)}")
        negative = [b for b, r in enumerate(self._ref_counts) if r < 0]
        if negative:
            raise RuntimeError(f"expected ref counts >= 0, found negative counts for blocks {negative}")
        unowned = {b for b, r in enumerate(self._ref_counts) if r == 0}
        queued = set(self._free_queue)
        if queued != unowned:
            raise RuntimeError(
                f"expected the free queue to hold exactly the blocks with ref count 0; "
                f"queued but referenced: {sorted(queued - unowned)}, "
                f"unreferenced but not queued: {sorted(unowned - queued)}"
            )
        if self.num_free_blocks + self.num_used_blocks != self.num_blocks:
            raise RuntimeError(
                f"expected free + used == {self.num_blocks}, found {self.num_free_blocks} + {self.num_used_blocks}"
            )
        reverse = {b: block_hash for block_hash, holders in self._hash_to_block.items() for b in holders}
        if reverse != self._block_to_hash or any(not holders for holders in self._hash_to_block.values()):
            raise RuntimeError(
                f"expected the hash->block and block->hash maps to mirror each other, found "
                f"{self._hash_to_block} and {self._block_to_hash}"
            )
        if not self.enable_prefix_caching and self._hash_to_block:
            raise RuntimeError(f"expected no cached blocks with prefix caching off, found {self._hash_to_block}")

    def _check_id(self, block_id: int) -> None:
        if not 0 <= block_id < self.num_blocks:
            raise RuntimeError(f"block id {block_id} out of range (allowed: 0..{self.num_blocks - 1})")

    def _require_caching(self, what: str) -> None:
        if not self.enable_prefix_caching:
            raise RuntimeError(f"{what}() needs prefix caching; build BlockAllocator(..., enable_prefix_caching=True)")

    def __repr__(self) -> str:
        return (
            f"BlockAllocator(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"free={self.num_free_blocks}, cached={len(self._hash_to_block)})"
        )
