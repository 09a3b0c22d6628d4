"""A radix tree over token ids whose nodes own KV pages: the prefix cache of SGLang's RadixAttention.

Zheng et al., *SGLang: Efficient Execution of Structured Language Model Programs* (NeurIPS 2024), section 3;
SGLang's `RadixCache` (python/sglang/srt/mem_cache/radix_cache.py). A radix tree (a compressed trie) stores
token sequences whose K/V is in the pool. Each edge holds a run of token ids, cut at page boundaries, and the
node below it owns the pages holding those tokens' K/V (one page per `page_size` tokens). A path from the root
spells a prefix; two sequences share the nodes of their common prefix. Page size 1 (SGLang's default) makes
any prefix length a hit; a larger page size matches whole pages only.

    after caching "a b c d e" and "a b c x y" (page size 1):

    root --[a b c]--> N1 (pages 4 5 6) --[d e]--> N2 (pages 7 8)
                                       \\-[x y]--> N3 (pages 2 9)

    a lookup of "a b c d z" matches [a b c] + [d]: 4 tokens. Locking that match splits N2 into
    [d] (page 7) and its child [e] (page 8), so the lock covers exactly the matched pages.

Locks (SGLang's `lock_ref`): a live sequence holds a lock on the last node of its cached prefix (the path its
prompt matched, then grown by the pages it computes while it runs, `grow`), counted on every node up to the
root, so `lock_ref(n)` = the locks held in n's subtree. A node with no lock is
*evictable*: its pages hold cached K/V that nobody reads. Eviction (`evict`) takes pages from the ends of unlocked
leaves, least recently used leaf first (a node is used when a lookup locks it or an insertion passes through it),
and a parent left childless and unlocked becomes a leaf in its turn, as in SGLang's heap of leaves.

The tree deals in token ids and integer page ids only: the pool's reference counts and free queue belong to
the KV manager (`sim/kv/radix.py`).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Sequence


@dataclass(slots=True, eq=False)
class RadixNode:
    key: tuple[int, ...]  # token ids on the edge from the parent (a whole number of pages; empty for the root)
    pages: list[int]  # page ids holding those tokens' K/V, one per page_size tokens
    parent: RadixNode | None
    node_id: int  # creation order: breaks ties between equally recent leaves, so eviction is deterministic
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)  # keyed by the child's first page
    lock_ref: int = 0  # locks held on this node or below it
    last_access: int = 0  # the tree's logical clock when the node was last used

    def __repr__(self) -> str:
        return f"RadixNode({self.node_id}, {len(self.key)} tokens, pages {self.pages}, lock_ref {self.lock_ref})"


class RadixTree:
    """Token-id prefixes -> the pages holding their K/V, with locks and LRU eviction of unlocked leaves."""

    def __init__(self, page_size: int) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.root = RadixNode((), [], None, 0)
        self.evictable_pages = 0  # pages of nodes with lock_ref 0: cached, evicted on demand
        self._num_nodes = 1
        self._clock = 0

    # --- lookups ---------------------------------------------------------------------------------
    def _walk(self, token_ids: Sequence[int], max_pages: int):
        """Yield (node, pages matched in it) along the longest cached prefix of token_ids[:max_pages * page_size];
        the last node may match only part of its edge."""
        node, done, ps = self.root, 0, self.page_size
        while done < max_pages:
            child = node.children.get(tuple(token_ids[done * ps : (done + 1) * ps]))
            if child is None:
                return
            most = min(len(child.pages), max_pages - done)
            rest = token_ids[done * ps : (done + most) * ps]
            same = 0
            while same < len(rest) and rest[same] == child.key[same]:
                same += 1
            matched = same // ps
            yield child, matched
            if matched < len(child.pages):
                return
            node, done = child, done + matched

    def match(self, token_ids: Sequence[int], max_pages: int) -> tuple[int, list[tuple[RadixNode, int]]]:
        """(pages of the longest cached prefix within the first `max_pages` pages, the path as (node, pages matched
        in it)). A peek: changes nothing (no split, no lock, no LRU touch)."""
        path = list(self._walk(token_ids, max_pages))
        return sum(m for _, m in path), path

    def lock_prefix(self, token_ids: Sequence[int], num_pages: int) -> tuple[RadixNode, list[int]]:
        """Lock the cached prefix of exactly `num_pages` pages (it must be cached): split the last node if the
        prefix ends inside its edge, mark the path used, lock it. Returns (the node now locked, the prefix's pages)."""
        node, pages = self._descend(token_ids, num_pages)
        if len(pages) != num_pages:
            raise RuntimeError(f"expected {num_pages} cached pages to lock, found {len(pages)}")
        self.lock(node)
        return node, pages

    def _descend(self, token_ids: Sequence[int], num_pages: int) -> tuple[RadixNode, list[int]]:
        """Follow the cached prefix of at most `num_pages` pages, splitting where it ends mid-edge; touch the path."""
        self._clock += 1
        node, pages = self.root, []
        for child, matched in list(self._walk(token_ids, num_pages)):
            if matched == 0:
                break
            if matched < len(child.pages):
                child = self._split(child, matched)
            child.last_access = self._clock
            node = child
            pages += child.pages
        return node, pages

    # --- changes ---------------------------------------------------------------------------------
    def _split(self, node: RadixNode, num_pages: int) -> RadixNode:
        """Cut `node`'s edge after `num_pages` pages: a new node takes the first part and becomes node's parent.

            parent --[a b c d]--> node        ->       parent --[a b]--> top --[c d]--> node

        `top` inherits node's lock count (every lock below `top` is below node) and its last use."""
        cut = num_pages * self.page_size
        top = RadixNode(node.key[:cut], node.pages[:num_pages], node.parent, self._num_nodes,
                        lock_ref=node.lock_ref, last_access=node.last_access)
        self._num_nodes += 1
        node.parent.children[node.key[: self.page_size]] = top
        node.key, node.pages, node.parent = node.key[cut:], node.pages[num_pages:], top
        top.children[node.key[: self.page_size]] = node
        return top

    def insert(self, token_ids: Sequence[int], pages: Sequence[int]) -> int:
        """Cache `token_ids` (a whole number of pages) with their `pages`: the part not cached yet becomes a new
        unlocked leaf owning its pages. Returns how many leading pages were cached already (the caller still owns
        those of its pages: duplicates, or the very pages of the tree it had locked)."""
        ps = self.page_size
        if len(token_ids) != len(pages) * ps:
            raise ValueError(f"expected {len(pages) * ps} token ids for {len(pages)} pages, got {len(token_ids)}")
        node, cached = self._descend(token_ids, len(pages))
        if len(cached) < len(pages):
            leaf = RadixNode(tuple(token_ids[len(cached) * ps :]), list(pages[len(cached) :]), node, self._num_nodes,
                             last_access=self._clock)
            self._num_nodes += 1
            node.children[leaf.key[:ps]] = leaf
            self.evictable_pages += len(leaf.pages)
        return len(cached)

    def grow(self, node: RadixNode, token_ids: Sequence[int], pages: Sequence[int]) -> RadixNode | None:
        """Cache `pages` (holding `token_ids`, a whole number of pages) right after the prefix that `node` ends, for
        the running sequence whose lock is on `node` (no lock if node is the root) and which is computing them
        (SGLang's `cache_unfinished_req`); its lock moves to their end. Returns the node it now locks, or None
        (nothing changed) if `node` already has a child starting with the same page: another sequence's copy.

            node a leaf that only this sequence locks:   its edge grows in place     --[a b c]-->  =>  --[a b c d e]-->
            otherwise (another lock on it, or children): a new locked child          --[a b c]--> node --[d e]--> new

        Lock counts above do not change: the lock moves inside node's subtree. O(pages): no walk from the root.
        NOTE: the grown node is touched (LRU), its ancestors are not; a run of decode steps taken at once
        (sim/fast/paged.py) therefore leaves the same tree, and the same eviction order, as stepping."""
        ps = self.page_size
        if len(token_ids) != len(pages) * ps or not pages:
            raise ValueError(f"expected {len(pages) * ps} token ids for {len(pages)} pages (at least one), "
                             f"got {len(token_ids)}")
        self._clock += 1
        if node is not self.root and not node.children and node.lock_ref == 1:
            node.key += tuple(token_ids)
            node.pages += pages
            node.last_access = self._clock
            return node
        first = tuple(token_ids[:ps])
        if first in node.children:
            return None
        child = RadixNode(tuple(token_ids), list(pages), node, self._num_nodes, lock_ref=1, last_access=self._clock)
        self._num_nodes += 1
        node.children[first] = child
        return child

    def can_grow(self, node: RadixNode, token_ids: Sequence[int]) -> bool:
        """Whether `grow(node, token_ids, ...)` would cache the pages: not if node already has a child starting with
        the same page (another sequence's copy). A peek: changes nothing."""
        return tuple(token_ids[: self.page_size]) not in node.children

    def forget(self, pages: Sequence[int]) -> tuple[list[int], dict[RadixNode, RadixNode]]:
        """Take pages whose K/V was never written (a failed step) out of the tree, and with each everything cached
        below it (computed after it, in the same failed step). Returns (the pages the tree lets go of, {every node
        removed: the node left where it hung}); a lock held on a removed node now belongs on that node, whose
        lock count already includes it.

            root --[a b c d]--> N --[e]--> M      forget(page of c)  ->  root --[a b]--> top      (c d, e released)
        """
        named, ps = set(pages), self.page_size
        released: list[int] = []
        moved: dict[RadixNode, RadixNode] = {}
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            cut = next((i for i, page in enumerate(node.pages) if page in named), None)
            if cut is None:
                stack += node.children.values()
                continue
            keep = self._split(node, cut) if cut else node.parent
            del keep.children[node.key[:ps]]
            gone = [node]
            while gone:
                n = gone.pop()
                gone += n.children.values()
                released += n.pages
                if not n.lock_ref:
                    self.evictable_pages -= len(n.pages)
                moved[n] = keep
        return released, moved

    def lock(self, node: RadixNode) -> None:
        """One more lock on node (counted on it and every ancestor); pages of newly locked nodes stop being evictable."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_pages -= len(node.pages)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_ref < 1:
                raise RuntimeError(f"cannot unlock {node!r}: expected lock_ref >= 1")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_pages += len(node.pages)
            node = node.parent

    def evict(self, num_pages: int) -> list[int]:
        """Release `num_pages` pages (fewer if fewer are evictable) from the ends of unlocked leaves, the least
        recently used leaf first, its last page first; a leaf left empty is removed, and its parent, if now an
        unlocked leaf, joins the candidates. Returns the pages in the order released.

        NOTE: SGLang evicts whole leaves (and may release more than asked); trimming a leaf page by page keeps
        the rest of its prefix cached, as the paged cache evicts one block at a time, and makes evicting k pages
        and then m the same as evicting k + m at once (the decode fast-forward relies on it).
        O(nodes) to gather the leaves, as SGLang's `_collect_leaves` per eviction."""
        heap = [(n.last_access, n.node_id, n) for n in self._nodes() if not n.children and not n.lock_ref]
        heapq.heapify(heap)
        released: list[int] = []
        while len(released) < num_pages and heap:
            leaf = heap[0][2]
            take = min(num_pages - len(released), len(leaf.pages))
            released += reversed(leaf.pages[len(leaf.pages) - take :])
            self.evictable_pages -= take
            if take < len(leaf.pages):  # the leaf keeps its first pages (and stays least recently used)
                del leaf.pages[len(leaf.pages) - take :]
                leaf.key = leaf.key[: len(leaf.pages) * self.page_size]
                break
            heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.key[: self.page_size]]
            if parent is not self.root and not parent.children and not parent.lock_ref:
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        return released

    # --- reading and checking --------------------------------------------------------------------
    def _nodes(self) -> list[RadixNode]:
        """Every node but the root, parents before children."""
        found, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            found.append(node)
            stack += node.children.values()
        return found

    def path_pages(self, node: RadixNode) -> list[int]:
        """The pages on the path from the root to node (the prefix it ends)."""
        parts = []
        while node is not self.root:
            parts.append(node.pages)
            node = node.parent
        return [p for part in reversed(parts) for p in part]

    def pages(self) -> list[int]:
        """Every page the tree owns."""
        return [p for n in self._nodes() for p in n.pages]

    def check_invariants(self, locks: dict[int, int]) -> None:
        """Edges are whole pages keyed by their first page; parents and children agree; `lock_ref` of each node
        equals the locks held in its subtree (`locks`: node_id -> locks held directly on it); the evictable count
        equals the pages of unlocked nodes; no page is owned twice."""
        ps, nodes = self.page_size, self._nodes()
        below = {n.node_id: locks.get(n.node_id, 0) for n in nodes}
        for node in reversed(nodes):  # children before parents: add each subtree's locks to its parent
            if node.parent is not self.root:
                below[node.parent.node_id] += below[node.node_id]
        for node in nodes:
            if not node.key or len(node.key) != len(node.pages) * ps:
                raise RuntimeError(f"{node!r}: expected a non-empty edge of {len(node.pages)} x {ps} tokens, "
                                   f"found {len(node.key)}")
            if node.parent.children.get(node.key[:ps]) is not node:
                raise RuntimeError(f"{node!r}: its parent does not list it under its first page {node.key[:ps]}")
            if node.lock_ref != below[node.node_id]:
                raise RuntimeError(f"{node!r}: expected lock_ref {below[node.node_id]} (locks in its subtree), "
                                   f"found {node.lock_ref}")
        unlocked = sum(len(n.pages) for n in nodes if not n.lock_ref)
        if unlocked != self.evictable_pages:
            raise RuntimeError(f"expected {unlocked} evictable pages (pages of unlocked nodes), found {self.evictable_pages}")
        owned = self.pages()
        if len(owned) != len(set(owned)):
            raise RuntimeError(f"expected every tree page owned once, found {sorted(owned)}")
        unknown = set(locks) - {n.node_id for n in nodes}
        if unknown:
            raise RuntimeError(f"locks held on nodes {sorted(unknown)} that are not in the tree")
