"""The radix KV manager: SGLang's RadixAttention, a radix tree of cached prefixes over a pool of pages.

Zheng et al., *SGLang* (NeurIPS 2024), section 3; SGLang's `RadixCache` with its token-to-KV pool. The pool is
paged as in vLLM (a block table per sequence, pages of `block_size` tokens, 1 by default as in SGLang, shared by
forks with reference counts and copy-on-write of a partly filled last page), and the prefix cache is a radix tree
over token ids (`radix_tree.py`) instead of vLLM's chained block hashes:

- a lookup (`get_computed_tokens`) matches the longest cached prefix at page granularity: with page size 1 any
  length hits, not only whole blocks of 16; the last token is still always computed;
- an admitted sequence locks its matched path, and its block table starts with the tree's pages; its own tokens
  go into fresh pages;
- as soon as the step computing them is scheduled (each allocation, as the paged manager registers its full
  blocks), the whole pages of a running sequence's known token ids (`NewSequence.token_ids`: the prompt, and
  generated ids when the workload knows them) become tree nodes locked by it (SGLang's `cache_unfinished_req`),
  so a request admitted while it runs can already hit them; its lock moves to the end of what it cached;
- when a sequence is freed (finished, preempted by recompute, aborted) it unlocks, and whole pages of known ids
  it could not cache while running (see below) are inserted then; the rest return to the pool;
- when an allocation finds too few free pages it evicts cached pages from the ends of unlocked leaves, least
  recently used leaf first.

    page size 1: A = "s s s s a a" finished and cached; B = "s s s s b b b" arrives

    get_computed_tokens(B) = 4          B's table: [tree pages of "s s s s" | its own pages for "b b b" ...]
    (vLLM, block size 16: 0 hits)       B's lock keeps "s s s s" from being evicted while B runs; once the
                                        step computing "b b b" is scheduled, B's lock is on a node [b b b]
                                        under [s s s s], and C = "s s s s b b b c" hits 7 tokens at once

A running sequence's pages are cached only where its table can stay as it is (the table must start with its
locked path): a page another live sequence also holds (a fork sibling, before its copy-on-write) and the pages
after it wait until the sequence is freed, and if another sequence has already cached its own copy of the next
page (both computed the same tokens at once), this one keeps its copy private and frees it as a duplicate at the
end. NOTE: SGLang would rewrite the request's table to the tree's copy and free its own at once; keeping the
table keeps every block id the scheduler has handed out valid. A failed step's pages (`uncache`) leave the tree
with everything cached below them.

Where it departs from the paged manager, whose rules it otherwise follows (it is a `PagedKVManager` with another
prefix cache): the tree instead of chained hashes, whole pages at any length. There is no CPU swap space: SGLang preempts by recompute only
(`num_cpu_blocks` is 0, and `sim.run` refuses preemption="swap"). Accounting is paged's: cached pages no one
has locked count as free (`num_free_blocks`, the breakdown's `free`), as paged counts its freed cached blocks,
since an allocation may evict them at once; a prefix-cache hit is counted in tokens (any length) and pages.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Sequence

from .base import Allocation, BlockCopy, NewSequence, PrefixCacheStats, cdiv
from .checks import check_lookahead, no_pending_lookahead
from .invariants import check_breakdown, note_fill, recounted_breakdown
from .paged import AdmissionNeed, PagedKVManager, SeqState
from .radix_tree import RadixNode, RadixTree


@dataclass(slots=True)
class _RadixSeqState(SeqState):
    node: RadixNode | None = None  # the tree node its lock is on (the root: none), where its cached prefix ends
    num_tree_pages: int = 0  # its table's first pages that are the tree's (the path to `node`)


class RadixPagePool:
    """Pages by integer id, with reference counts and a free queue (as sim/kv/blocks.py), over a radix tree that holds
    one reference to each page it owns. Pages of unlocked tree nodes count as free: `allocate` evicts them on demand.

        allocate() pops here ->  [3] [9] [4] [6]  <- pages the tree evicts join at the back
                                 freed pages of no cached prefix go to the front (reused first)

    NOTE: evicted pages join at the BACK, so that taking n pages at once (a run of decode steps) hands out the same
    pages as taking them one step at a time, each step evicting only when the queue is empty.
    """

    def __init__(self, num_blocks: int, tree: RadixTree) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.tree = tree
        self._refs = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._unwritten: set[int] = set()  # pages of a failed step (uncache): never cached; forgotten once reused

    @property
    def num_free_blocks(self) -> int:
        """Pages no sequence holds: in the free queue, or cached in unlocked tree nodes (evictable)."""
        return len(self._free) + self.tree.evictable_pages

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def ref_count(self, page: int) -> int:
        return self._refs[page]

    def allocate(self, num_pages: int) -> list[int] | None:
        """`num_pages` pages with one reference each, evicting least recently used cached pages if the free queue is
        short; None (nothing changed) if even eviction cannot find them."""
        if num_pages > self.num_free_blocks:
            return None
        short = num_pages - len(self._free)
        if short > 0:
            for page in self.tree.evict(short):  # the tree drops its reference
                self._refs[page] = 0
                self._free[page] = None
        pages = []
        for _ in range(num_pages):
            page, _ = self._free.popitem(last=False)
            self._refs[page] = 1
            self._unwritten.discard(page)
            pages.append(page)
        return pages

    def share(self, pages: Sequence[int]) -> None:
        """One more reference to each page; raises (and changes nothing) if one is free."""
        pages = list(pages)
        for page in pages:
            if self._refs[page] < 1:
                raise RuntimeError(f"cannot share page {page}: expected ref count >= 1, found 0 (it is free)")
        for page in pages:
            self._refs[page] += 1

    def free(self, pages: Sequence[int]) -> None:
        """One reference less to each page; pages left with none go to the front of the free queue, the first
        freed first (they hold no cached prefix)."""
        self._release(pages)

    def _release(self, pages: Sequence[int]) -> None:
        """free's body, which forget_unwritten shares (inside its own call). Raises (and changes nothing) if a page
        would be freed more times than it is held."""
        pages = list(pages)
        for page, times in Counter(pages).items():
            if times > self._refs[page]:
                raise RuntimeError(f"cannot free page {page}: expected ref count >= {times}, found {self._refs[page]}")
        released = []
        for page in pages:
            self._refs[page] -= 1
            if not self._refs[page]:
                released.append(page)
        for page in reversed(released):
            self._free[page] = None
            self._free.move_to_end(page, last=False)

    def copy_on_write(self, page: int) -> int | None:
        """The page a writer may write into: `page` if it is the only holder, else a fresh page (None if none)."""
        if self._refs[page] == 1:
            return page
        fresh = self.allocate(1)
        if fresh is None:
            return None
        self._refs[page] -= 1
        return fresh[0]

    def forget_unwritten(self, pages: Sequence[int]) -> dict[RadixNode, RadixNode]:
        """Pages a failed step was to write: never cached (until reused), and out of the tree with everything cached
        below them, the tree's references dropped (pages still in tables stay held). Returns {every node removed: the
        node left where it hung} (`RadixTree.forget`). NOTE: one call, so that the tree never lets go of pages
        without their references: should the tree raise (it then changes nothing), nothing has changed."""
        released, moved = self.tree.forget(pages)
        self._unwritten.update(pages)
        self._release(released)
        return moved

    def is_written(self, page: int) -> bool:
        return page not in self._unwritten

    def check_invariants(self, holders: dict[int, int]) -> None:
        """Reference counts equal `holders` (page -> tables holding it) plus one for each tree page; free pages are
        exactly the unreferenced ones; an unlocked tree node's pages are held by the tree alone."""
        tree_pages = set(self.tree.pages())
        if tree_pages & self._unwritten:
            raise RuntimeError(f"expected no tree page a failed step was to write, found {sorted(tree_pages & self._unwritten)}")
        for page in range(self.num_blocks):
            expected = holders.get(page, 0) + (page in tree_pages)
            if self._refs[page] != expected:
                raise RuntimeError(f"page {page}: expected ref count {expected} (tables + tree), found {self._refs[page]}")
        unreferenced = {p for p in range(self.num_blocks) if not self._refs[p]}
        if set(self._free) != unreferenced:
            raise RuntimeError(f"expected the free queue to hold exactly the unreferenced pages {sorted(unreferenced)}, "
                               f"found {sorted(self._free)}")
        for node in self.tree._nodes():
            if not node.lock_ref and any(self._refs[p] != 1 for p in node.pages):
                raise RuntimeError(f"{node!r} is unlocked, so only the tree may hold its pages; found ref counts "
                                   f"{[self._refs[p] for p in node.pages]}")


class RadixKVManager(PagedKVManager):
    """Block tables over a `RadixPagePool`, with a radix-tree prefix cache (see the module docstring).

    `watermark`: the share of pages an admission must leave free, as in the paged manager.
    """

    policy = "radix"

    def __init__(self, num_blocks: int, block_size: int = 1, watermark: float = 0.0) -> None:
        # NOTE: PagedKVManager.__init__ is not called: it would build a BlockAllocator this manager does not use.
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        self.tree = RadixTree(block_size)
        self.allocator = RadixPagePool(num_blocks, self.tree)  # the name paged's code and accounting read
        self.cpu_allocator = None
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.num_cpu_blocks = 0  # SGLang preempts by recompute: no swap space
        self.enable_prefix_caching = True  # the tree is the policy: always on
        self.watermark_blocks = int(watermark * num_blocks)
        self.gather_block_size = block_size  # attention gathers K/V page by page through the table
        self._seqs: dict[int, _RadixSeqState] = {}
        self._stats = PrefixCacheStats()

    # --- lookups -----------------------------------------------------------------------------------
    def _usable_pages(self, token_ids: Sequence[int] | None, num_tokens: int) -> int:
        """Whole pages of known ids a sequence of num_tokens tokens may hit: never its last token."""
        return 0 if not token_ids else min(len(token_ids), num_tokens - 1) // self.block_size

    def get_computed_tokens(self, token_ids: Sequence[int] | None, num_tokens: int) -> int:
        return self.tree.match(token_ids, self._usable_pages(token_ids, num_tokens))[0] * self.block_size if token_ids else 0

    def _admission_need(self, new: Sequence[NewSequence], counts: Sequence[int]) -> AdmissionNeed:
        """What admitting these new sequences takes; each lookup: (pages it could have hit, hits). Hit pages of
        unlocked nodes count too: locking them takes them out of the evictable ones."""
        bs, found, revived, need, watermark_need = self.block_size, [], {}, 0, 0
        for spec, k in zip(new, counts):
            total = spec.num_cached_tokens + k
            usable = 0 if spec.skip_reading_prefix_cache else self._usable_pages(spec.token_ids, spec.num_cached_tokens + max(k, 1))
            hits, path = self.tree.match(spec.token_ids, usable) if usable else (0, [])
            if spec.num_cached_tokens != hits * bs:
                raise RuntimeError(f"expected num_cached_tokens {spec.num_cached_tokens} to be the cache's current "
                                   f"hits, found {hits * bs} (look up and allocate in the same step)")
            if total > spec.final_len:
                raise ValueError(f"{total} tokens for a sequence of final length {spec.final_len}")
            for node, matched in path:
                if not node.lock_ref:
                    revived[node] = max(revived.get(node, 0), matched)
            need += cdiv(total, bs) - hits
            watermark_need += cdiv(total, bs)  # NOTE: before hits, as the paged manager (vLLM v0) counts
            found.append((usable, hits))
        return AdmissionNeed(found, need + sum(revived.values()), watermark_need)

    # --- admission, forks, release -------------------------------------------------------------------
    def allocate_slots(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int],
                       new: Sequence[NewSequence] | None = None, *,
                       num_lookahead_tokens: Sequence[int] | None = None) -> Allocation | None:
        """Growth is the paged manager's (which calls `_register`), lookahead slots and `rollback` included. An
        admission first locks every hit (before an eviction could take it), then takes fresh pages for its own tokens
        and caches those it computes now."""
        if new is None:
            return super().allocate_slots(seq_ids, num_new_tokens, num_lookahead_tokens=num_lookahead_tokens)
        check_lookahead(seq_ids, num_lookahead_tokens, new)  # (refuses lookahead slots for an admission)
        admission = self._admission(seq_ids, num_new_tokens, new)
        if admission is None:
            return None
        # NOTE: each sequence is registered as soon as it holds its lock, and its table grows as it takes pages:
        # should a call below raise (it then changes nothing), free(seq_id) gives back what it took (the scheduler
        # aborts the request). free copes with a table shorter than its tokens.
        seqs = []
        for seq_id, spec, k, (usable, hits) in zip(seq_ids, new, num_new_tokens, admission.lookups):
            node, pages = self.tree.lock_prefix(spec.token_ids, hits) if hits else (self.tree.root, [])
            seq = self._seqs[seq_id] = _RadixSeqState([], spec.num_cached_tokens + k, spec.final_len, spec.token_ids,
                                                      node=node)
            seqs.append(seq)
            self.allocator.share(pages)
            seq.block_table += pages
            seq.num_tree_pages = len(pages)
            self._stats.queried_blocks += usable
            self._stats.hit_blocks += hits
            if not spec.skip_reading_prefix_cache:  # counted as vLLM counts lookups
                self._stats.queried_tokens += spec.prompt_len
                self._stats.hit_tokens += spec.num_cached_tokens
        for seq_id, seq in zip(seq_ids, seqs):
            need = cdiv(seq.num_tokens, self.block_size) - len(seq.block_table)
            fresh = self.allocator.allocate(need)
            if fresh is None:
                raise RuntimeError(f"sequence {seq_id}: expected the planned {need} free pages, found "
                                   f"{self.allocator.num_free_blocks}")
            seq.block_table += fresh
            self._register(seq)
        return Allocation([])

    def _register(self, seq: _RadixSeqState) -> None:
        """Cache the sequence's newly allocated whole pages of known ids, locked by it: this step computes them.

            page size 1, ids known for 7 tokens, 6 allocated:   table [ 4  5 |  8  9 10 11 ]
                                                                        hit   pages grown into the tree now

        Stops before a page that is not the sequence's alone (a fork sibling's too) or that a failed step never
        wrote; nothing at all if the tree holds another copy of the next page (see the module docstring)."""
        ids = seq.token_ids
        if ids is None:
            return
        start, bs = seq.num_tree_pages, self.block_size
        whole = min(len(ids), seq.num_tokens - seq.num_lookahead) // bs  # (lookahead slots: cached once kept)
        if whole <= start:
            return
        table, pool = seq.block_table, self.allocator
        end = start
        while end < whole and pool.ref_count(table[end]) == 1 and pool.is_written(table[end]):
            end += 1
        if end == start:
            return
        pages, grown = table[start:end], ids[start * bs : end * bs]
        # NOTE: the tree's reference is taken before the tree takes the pages (a grow that happened cannot be undone)
        # and given back should grow raise; none is taken where another copy is cached (grow then changes nothing).
        takes = self.tree.can_grow(seq.node, grown)
        if takes:
            pool.share(pages)
        try:
            node = self.tree.grow(seq.node, grown, pages)
        except BaseException:
            if takes:
                pool.free(pages)
            raise
        if node is not None:
            seq.node, seq.num_tree_pages = node, end

    def fork(self, parent_id: int, child_id: int, final_len: int) -> list[BlockCopy] | None:
        """The child shares every page of the parent (paged) and holds its own lock on the parent's cached prefix.
        NOTE: the child knows only the token ids the two share (the parent's may run past the fork point)."""
        parent = self._gpu_seq(parent_id)
        no_pending_lookahead(parent_id, parent.num_lookahead)
        if child_id in self._seqs:
            raise ValueError(f"sequence {child_id} is already live")
        if final_len < parent.num_tokens:
            raise ValueError(f"final_len must be >= the parent's {parent.num_tokens} tokens, got {final_len}")
        ids = None if parent.token_ids is None else parent.token_ids[: parent.num_tokens]
        # NOTE: the child is registered as soon as it holds its lock, then takes the parent's pages: should the share
        # raise (it then changes nothing), free(child_id) releases the lock (the scheduler aborts the request).
        self.tree.lock(parent.node)
        child = self._seqs[child_id] = _RadixSeqState([], parent.num_tokens, final_len, ids, node=parent.node)
        self.allocator.share(parent.block_table)
        child.block_table += parent.block_table
        child.num_tree_pages = parent.num_tree_pages
        return []

    def free(self, seq_id: int) -> None:
        """Release the lock, cache the computed whole pages of known ids it could not cache while running, return
        the rest.

            page size 1, 8 computed tokens, ids known for the first 7:

            table  [ 4  5  6 | 11 12 | 13 14 | 15 ]
                     tree pages: its hit, and what it cached while running (they stay, unlocked)
                               11 12: another sequence cached its own copy first: duplicates, freed
                                       13 14: not cached yet (they follow the duplicates): the tree takes them
                                               15: no known id, freed

        NOTE: caching stops before a page another live sequence still holds (a fork sibling that has not
        finished): a tree page is shared only through locks. The last sibling to finish caches the shared part.
        """
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise KeyError(f"sequence {seq_id} is not live")
        ids, table, pool, bs = seq.token_ids, seq.block_table, self.allocator, self.block_size
        # computed, known, whole pages (of its table: one a failed allocation left short covers fewer)
        whole = min(len(ids), seq.num_tokens - seq.num_lookahead, len(table) * bs) // bs if ids else 0
        # everything cached while it ran (the common case): no walk from the root
        cached = whole if seq.num_tree_pages == whole else self.tree.match(ids, whole)[0] if whole else 0
        end = cached
        while end < whole and pool.ref_count(table[end]) == 1 and pool.is_written(table[end]):
            end += 1
        # NOTE: the questions above change nothing; the changes come in an order that leaves, should one raise (it
        # then changes nothing itself), either the sequence live as it was (the lock taken back), or nothing of it
        # held: the unlock, the pages it drops (tail first, as paged frees), and last the pages the tree takes
        # (the tree and the pool are apart, so this order gives the same pool and tree as any other).
        self.tree.unlock(seq.node)
        try:
            pool.free(list(reversed(table[end:])) + list(reversed(table[:cached])))
        except BaseException:
            self.tree.lock(seq.node)
            raise
        del self._seqs[seq_id]
        if end > cached:
            try:
                self.tree.insert(ids[: end * bs], table[:end])  # it takes table[cached:end]
            except BaseException:
                pool.free(list(reversed(table[cached:end])))  # not cached after all: given back
                raise

    def uncache(self, block_ids: Sequence[int]) -> None:
        """Pages a failed step was to write are never cached: those already in the tree (cached when the step was
        scheduled) leave it with everything below them, and a sequence whose lock was on a removed node now locks
        the node left where it hung. The scheduler calls this before it frees the sequences."""
        moved = self.allocator.forget_unwritten(block_ids)
        moved_seqs = [seq for seq in self._seqs.values() if seq.node in moved]
        # NOTE: every moved lock first, then the counts asked of the tree: should it raise, each lock is where the tree
        # counts it, and a count left stale at most keeps free() from caching pages (these sequences are the failed
        # step's, freed next).
        for seq in moved_seqs:
            seq.node = moved[seq.node]
        for seq in moved_seqs:
            seq.num_tree_pages = len(self.tree.path_pages(seq.node))

    # --- checks ------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Each table covers exactly its tokens and starts with the pages of its locked path; the tree's structure
        and lock counts hold; reference counts equal tables + tree; the breakdown equals a page-by-page recount."""
        bs, holders, locks = self.block_size, {}, {}
        fill: dict[int, tuple[int, int]] = {}  # page -> (filled slots, slots some owner will reach)
        for seq_id, seq in self._seqs.items():
            n = cdiv(seq.num_tokens, bs)
            if len(seq.block_table) != n or len(set(seq.block_table)) != n:
                raise RuntimeError(f"sequence {seq_id}: expected {n} distinct pages for {seq.num_tokens} tokens, "
                                   f"found block table {seq.block_table}")
            node = seq.node
            prefix = self.tree.path_pages(node)
            if seq.block_table[: len(prefix)] != prefix or len(prefix) != seq.num_tree_pages:
                raise RuntimeError(f"sequence {seq_id}: expected its table to start with its locked prefix {prefix} "
                                   f"({seq.num_tree_pages} pages), found {seq.block_table}")
            if node is not self.tree.root:
                locks[node.node_id] = locks.get(node.node_id, 0) + 1
            for i, page in enumerate(seq.block_table):
                holders[page] = holders.get(page, 0) + 1
                note_fill(fill, page, seq, i, bs, "page")
        self.tree.check_invariants(locks)
        self.allocator.check_invariants(holders)
        check_breakdown(self, recounted_breakdown(fill, bs, self.allocator.num_free_blocks), "page")

    def __repr__(self) -> str:
        return (f"RadixKVManager(num_blocks={self.num_blocks}, block_size={self.block_size}, seqs={len(self._seqs)}, "
                f"free_blocks={self.num_free_blocks}, evictable={self.tree.evictable_pages})")
