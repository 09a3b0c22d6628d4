"""The hybrid KV manager: vLLM's hybrid KV cache manager for models that interleave full and sliding-window attention.

Gemma 3 computes 5 of every 6 layers with sliding-window attention: a query at position p attends only to the keys of
positions p - W + 1 .. p (W = 512 for Gemma-3-270m, 1024 for Gemma-3-27B). A paged pool that treats every layer as
full attention keeps every token's K/V in every layer for the whole life of a request; most of it is never read again.
vLLM's hybrid allocator (vllm/v1/core/kv_cache_coordinator.py, single_type_kv_cache_manager.py; the same idea as Jenga,
SOSP 2025) gives each kind of layer its own block tables and returns a sliding layer's blocks to the pool as soon as
they fall out of the window.

KV cache groups. Layers are split into groups of equally many layers (vLLM's `_get_kv_cache_groups_uniform_page_size`:
the group size is the smaller layer count of the two kinds, or the larger when they are within 25% of each other; the
last group of a kind is padded with empty layers). Gemma-3-270m: 3 full + 15 sliding layers -> 6 groups of 3 layers,
one full and five sliding. Gemma-3-27B: 10 full + 52 sliding -> groups of 10, one full and six sliding, the last of
them 2 layers + 8 layers of padding (vLLM warns of the same waste). The rule lives in groups.py (`group_size`, and
`layer_groups`: which layers each group serves, from the manager's `windows` alone). Every group takes its blocks from
ONE shared pool of equal pages: a page holds `block_size` tokens of the K/V of one group's layers, so a page is a page
whatever group holds it. Each sequence has one block table per group; a block covers the same token positions in every
group.

One sequence, block_size 4, window W = 6, final length 12, 11 tokens, the latest step fed position 10:

    positions          0..3     4..7      8..11
    full group        [ 7,       2,        5 ]        every block kept
    sliding group     [ -,       9,        3 ]        block 0 freed: the step's query (10) reads positions 5..10
    slots of group 1             d t t t   t t t r    d: position 4, read by no query of this step or a later one

A sliding group frees, before a step's new tokens get slots, every block whose positions all lie before
lo = q - W + 1, q being the first position the step feeds: no query of this step or any later one reads them (vLLM's
`remove_skipped_blocks`, called with num_computed_tokens). Its table then holds logical blocks lo // block_size
onward (vLLM keeps null blocks in front; here the table just starts later, see `group_tables`).

Slots and the breakdown. The pool has `num_blocks` pages of `block_size` slots, a slot being ONE token of ONE group (a
token of a full-attention model in a paged pool fills one slot in each of the G groups). Every slot of the pool is
exactly one of the five kinds, so the counts are integers that sum to num_slots:
- token_states: K/V that a query of the sequence's latest step or a later one reads (a shared block counts once);
- reservation: empty slots of a sequence's last block that its tokens will fill (up to its final length);
- internal_fragmentation: empty slots of a last block past the final length, AND held slots of a sliding group
  before lo ("dead": K/V no query will read again, held because its block still holds live tokens);
- external_fragmentation: 0 (any free page fits any group), until the contract's waiting rule;
- free: free pages.

Sizing (sim.run): `pool_blocks` turns the all-layer token slots vLLM's rule gives (sim.base.specs.kv_capacity_tokens, the
pool a paged manager gets) into pages of the same bytes: floor(slots x num_layers / (group_size x block_size)). The
comparison with `policy="paged"` on the same model is therefore apples to apples: the same bytes of KV memory, one
pool treating all layers as full attention, the other freeing what the sliding layers no longer read.

NOTE: no prefix cache (vLLM's hybrid manager caches a prefix only where every group hits; not modelled) and no swap
space: preemption is by recompute. Both are refused with one line by sim.run.
NOTE: a step's whole chunk gets slots in every group, even tokens the chunk itself pushes out of the window (vLLM
allocates them too); they are freed by the sequence's next step. So the memory a sequence needs at its peak depends on
the scheduler's chunks, and `check_request` asks for what an unchunked prefill of the whole sequence would take.

The manager is one class, in the contract's order: allocation, what the executor and the metrics read (the memory
breakdown), then the invariants. Runs of decode steps are the fast plane's (sim/fast/hybrid.py), with their own tests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .base import Allocation, BlockCopy, MemoryBreakdown, NewSequence, SlotSegment, cdiv
from .blocks import BlockAllocator
from .checks import check_request_args, check_rollback, no_pending_lookahead, with_lookahead
from .groups import group_size
from .invariants import check_breakdown
from .no_sharing import NoPrefixCache, NoSwapSpace


def kv_cache_groups(model) -> tuple[int, tuple[int | None, ...]]:
    """(layers per group, the window of each group: None = full attention, full groups first) for a sim.base.specs.ModelSpec,
    by vLLM's rule (see the module docstring; `groups.group_size`). Which layers each group serves is `groups.layer_groups`
    of these windows. One line of error for a model without sliding-window layers."""
    full, sliding = model.num_full_layers, model.num_sliding_layers
    if not sliding or not full:
        raise ValueError(f"policy 'hybrid' needs a model that interleaves full and sliding-window attention, and "
                         f"{model.name} has {full} full and {sliding} sliding layers (allowed: gemma3-270m, "
                         f"gemma3-27b or another model with sliding_window)")
    size = group_size([full, sliding])
    return size, (None,) * cdiv(full, size) + (model.sliding_window,) * cdiv(sliding, size)


def pool_blocks(model, num_slots: int, block_size: int) -> int:
    """Pages of `block_size` tokens of one group in the bytes of `num_slots` all-layer token slots (a paged pool's)."""
    size, _ = kv_cache_groups(model)
    return num_slots * model.num_layers // (size * block_size)


@dataclass(slots=True)
class _Seq:
    tables: list[list[int]]  # per group: its held blocks, logical blocks `start` .. cdiv(num_tokens, bs) - 1
    starts: list[int]  # per group: the logical index of its first held block (0 in a full group)
    num_tokens: int  # tokens whose K/V the sequence holds (or will hold after the current step)
    first_query: int  # the first position the sequence's latest step feeds (its queries read from there - W + 1)
    final_len: int  # its true final length (reservation ends and internal fragmentation begins there)
    num_lookahead: int = 0  # the last of num_tokens that are lookahead slots (drafts), until rollback


class HybridKVManager(NoSwapSpace, NoPrefixCache):
    """Per-group block tables over one shared pool of pages (see the module docstring).

    `windows`: one per KV cache group, None for full attention, full groups first (`block_table` is the first group's).
    `watermark`: the share of pages an admission must leave free (as the paged manager's)."""

    policy = "hybrid"
    # preemption by recompute only: NoSwapSpace answers the swap questions
    # no prefix cache (NoPrefixCache)

    def __init__(self, num_blocks: int, block_size: int, windows: Sequence[int | None], watermark: float = 0.0,
                 max_seq_len: int = 2048) -> None:
        if not windows or windows[0] is not None:
            raise ValueError(f"windows: expected one per KV cache group, a full-attention group (None) first, got "
                             f"{list(windows)}")
        if any(w is not None and not 1 <= w < max_seq_len for w in windows):
            raise ValueError(f"windows: every sliding window must be from 1 to less than max_seq_len {max_seq_len} "
                             f"(a window that covers the context is full attention), got {list(windows)}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        self.allocator = BlockAllocator(num_blocks, block_size)  # checks num_blocks and block_size >= 1
        self.block_size, self.num_blocks, self.max_seq_len = block_size, num_blocks, max_seq_len
        self.windows = tuple(windows)
        self.watermark_blocks = int(watermark * num_blocks)
        self.gather_block_size = block_size
        self._seqs: dict[int, _Seq] = {}

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    def live_from(self, window: int | None, first_query: int) -> int:
        """The first position a group still reads: 0 with full attention, else first_query - window + 1."""
        return 0 if window is None else max(0, first_query - window + 1)

    # --- what the scheduler asks before admitting ---------------------------------------------------
    def check_request(self, prompt_len: int, final_len: int, num_seqs: int) -> str | None:
        """Counted as if the whole sequence were fed in one chunk (see the module docstring's NOTE), each sequence
        alone (as the paged manager counts a group re-admitted after a preemption)."""
        if final_len > self.max_seq_len:
            return f"final length {final_len} is past the model's context (allowed: <= {self.max_seq_len})"
        need = num_seqs * len(self.windows) * cdiv(final_len, self.block_size)
        usable = self.num_blocks - self.watermark_blocks
        if need > usable:
            return (f"{num_seqs} sequence(s) of final length {final_len} need {need} pages over {len(self.windows)} "
                    f"KV cache groups (allowed: <= {usable} of {self.num_blocks})")
        return None

    # --- slots for the tokens a step computes ---------------------------------------------------------
    def _seq(self, seq_id: int) -> _Seq:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise KeyError(f"sequence {seq_id} is not live")
        return seq

    def seq_state(self, seq_id: int) -> _Seq | None:
        """The manager's own record of a live sequence (None if it holds none): its `num_tokens`, one table and the
        first logical block per KV cache group (`tables`, `starts`), what the fast plane reads (docs/ARCHITECTURE.md,
        "The fast plane")."""
        return self._seqs.get(seq_id)

    def _drops(self, seq: _Seq, k: int) -> list[int]:
        """Per group: how many leading blocks a step feeding k > 0 tokens frees (its first query is num_tokens)."""
        return [self.live_from(w, seq.num_tokens) // self.block_size - start if k else 0
                for w, start in zip(self.windows, seq.starts)]

    def _need(self, seq_ids, num_new_tokens, new) -> int | None:
        """Pages the allocation takes from the pool, net of what its sliding groups free, or None if it does not fit
        (for an admission: also the watermark). Frees come first, as allocate_slots makes them."""
        check_request_args(seq_ids, num_new_tokens, new)
        bs, free, groups = self.block_size, self.allocator.num_free_blocks, len(self.windows)
        if new is not None:
            for seq_id, k, spec in zip(seq_ids, num_new_tokens, new):
                if seq_id in self._seqs:
                    raise ValueError(f"sequence {seq_id} is already live")
                if spec.num_cached_tokens:
                    raise ValueError(f"hybrid has no prefix cache, got num_cached_tokens {spec.num_cached_tokens}")
                if k > spec.final_len:
                    raise ValueError(f"{k} tokens for a sequence of final length {spec.final_len}")
            need = sum(groups * cdiv(k, bs) for k in num_new_tokens)
            return need if need <= free and free - need >= self.watermark_blocks else None
        seqs = [self._seq(i) for i in seq_ids]
        refs, left, need = self.allocator.ref_count, {}, 0
        for seq, k in zip(seqs, num_new_tokens):
            for table, drop in zip(seq.tables, self._drops(seq, k)):
                for b in table[:drop]:
                    left[b] = left.get(b, refs(b)) - 1
                    need -= left[b] == 0  # its last reference: back to the pool
        for seq, k in zip(seqs, num_new_tokens):
            if not k:
                continue
            n = seq.num_tokens
            need += groups * (cdiv(n + k, bs) - cdiv(n, bs))
            if n % bs:  # the partly filled last block of each group is written: of m owners, m - 1 copy
                for table in seq.tables:
                    r = left.get(table[-1], refs(table[-1]))
                    need += r > 1
                    left[table[-1]] = r - 1
        return need if need <= free else None

    def can_allocate_slots(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int],
                           new: Sequence[NewSequence] | None = None, *,
                           num_lookahead_tokens: Sequence[int] | None = None) -> bool:
        num_new_tokens, _ = self._with_lookahead(seq_ids, num_new_tokens, new, num_lookahead_tokens)
        return self._need(seq_ids, num_new_tokens, new) is not None

    def _with_lookahead(self, seq_ids, num_new_tokens, new, num_lookahead_tokens):
        """(tokens each sequence grows by, drafts included; the drafts, or zeros), checked (checks.with_lookahead)."""
        grown, lookahead = with_lookahead(seq_ids, num_new_tokens, new, num_lookahead_tokens,
                                          lambda seq_id: self._seq(seq_id).num_lookahead)
        return grown, lookahead if lookahead is not None else [0] * len(seq_ids)

    def allocate_slots(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int],
                       new: Sequence[NewSequence] | None = None, *,
                       num_lookahead_tokens: Sequence[int] | None = None) -> Allocation | None:
        """Room for num_new_tokens[i] more tokens in each sequence, all or none (see the KV contract in base.py).

            W = 6, block_size 4, 10 tokens, sliding table [-, 9, 3]; allocate 2 (queries 10, 11 read from 5):
            nothing to free (block 1 still holds 5..7); positions 10, 11 fill block 3      [-, 9, 3]
            allocate 1 more (query 12 reads from 7): block 1 holds 4..7, 7 still read       [-, 9, 3, 6]

        First every sequence's sliding groups free the blocks its new first query no longer reads, then each group's
        shared, partly filled last block is copied (copy-on-write) and new blocks are taken. Lookahead slots are
        taken as tokens; a verify step's first query is its first fed token, so nothing a kept draft needs is freed."""
        num_new_tokens, lookahead = self._with_lookahead(seq_ids, num_new_tokens, new, num_lookahead_tokens)
        if self._need(seq_ids, num_new_tokens, new) is None:
            return None
        # NOTE: new sequences are registered before any block is taken, and each table holds its blocks as they are
        # taken: should the allocator raise, free(seq_id) gives back what was taken (the scheduler aborts the request).
        if new is not None:
            for seq_id, spec in zip(seq_ids, new):
                self._seqs[seq_id] = _Seq([[] for _ in self.windows], [0] * len(self.windows), 0, 0, spec.final_len)
        seqs = [self._seqs[i] for i in seq_ids]
        for seq, k in zip(seqs, num_new_tokens):
            self._free_skipped(seq, self._drops(seq, k))
        copies: list[BlockCopy] = []
        for seq, k, la in zip(seqs, num_new_tokens, lookahead):
            copies += self._grow(seq, k)
            seq.num_lookahead = la
        return Allocation(copies)

    def rollback(self, seq_id: int, num_tokens: int) -> None:
        """Keep the first `num_tokens` tokens (the contract in base.py): every group gives back its blocks wholly past
        the new end (the drafts' blocks, its own: taken after any copy-on-write). The new end is past the verify step's
        first query, so no sliding group has freed a block the next query reads."""
        seq = self._seq(seq_id)
        check_rollback(seq_id, num_tokens, seq.num_tokens, seq.num_lookahead)
        keep = cdiv(num_tokens, self.block_size)
        for table, start in zip(seq.tables, seq.starts):  # NOTE: each table shrinks as its blocks go back
            if keep - start < len(table):
                self.allocator.free(table[keep - start:][::-1])
                del table[keep - start:]
        seq.num_tokens, seq.num_lookahead = num_tokens, 0

    def _free_skipped(self, seq: _Seq, drops: list[int]) -> None:
        for g, drop in enumerate(drops):
            if drop:
                self.allocator.free(seq.tables[g][:drop])
                del seq.tables[g][:drop]
                seq.starts[g] += drop

    def _grow(self, seq: _Seq, k: int) -> list[BlockCopy]:
        """Append k tokens to one sequence (room checked, skipped blocks freed): copy-on-write, then new blocks."""
        if not k:
            return []
        copies, n, bs = [], seq.num_tokens, self.block_size
        grow = cdiv(n + k, bs) - cdiv(n, bs)
        for table in seq.tables:
            if n % bs and self.allocator.ref_count(table[-1]) > 1:
                src = table[-1]
                table[-1] = self.allocator.copy_on_write(src)
                copies.append((src, table[-1]))
            if grow:
                table += self.allocator.allocate(grow)
        seq.first_query, seq.num_tokens = n, n + k
        return copies

    def fork(self, parent_id: int, child_id: int, final_len: int) -> list[BlockCopy] | None:
        """The child shares every block the parent holds, in every group (reference counts); nothing is copied
        now: the first write into a shared, partly filled last block copies it. Never out of memory."""
        parent = self._seq(parent_id)
        no_pending_lookahead(parent_id, parent.num_lookahead)
        if child_id in self._seqs:
            raise ValueError(f"sequence {child_id} is already live")
        if not parent.num_tokens <= final_len <= self.max_seq_len:
            raise ValueError(f"final_len must be from the parent's {parent.num_tokens} tokens to {self.max_seq_len}, "
                             f"got {final_len}")
        # NOTE: the child is registered first and takes each group's blocks as they are shared: should a share raise
        # (it then changes nothing), free(child_id) gives back what the child took (the scheduler aborts the request).
        child = self._seqs[child_id] = _Seq([[] for _ in parent.tables], list(parent.starts), parent.num_tokens,
                                            parent.first_query, final_len)
        for table, shared in zip(parent.tables, child.tables):
            self.allocator.share(table)
            shared += table
        return []

    def free(self, seq_id: int) -> None:
        seq = self._seq(seq_id)
        # NOTE: each group's blocks first, emptying its table, and the entry last: should the allocator raise (it then
        # changes nothing), the sequence stays live holding exactly the blocks not yet given back, and a later free
        # gives those back (the scheduler aborts the request).
        for table in seq.tables:
            self.allocator.free(reversed(table))
            table.clear()
        del self._seqs[seq_id]

    # --- what the executor and the metrics read ----------------------------------------------------
    def block_table(self, seq_id: int) -> list[int]:
        """A copy of the first (full-attention) group's table: block i holds positions i*bs .. (i+1)*bs - 1."""
        return list(self._seq(seq_id).tables[0])

    def group_tables(self, seq_id: int) -> list[list[int | None]]:
        """Every group's table, position-indexed: None for a sliding group's freed blocks (vLLM's null block)."""
        seq = self._seq(seq_id)
        return [[None] * start + list(table) for table, start in zip(seq.tables, seq.starts)]

    def num_tokens(self, seq_id: int) -> int:
        return self._seq(seq_id).num_tokens

    @property
    def seq_ids(self) -> list[int]:
        return list(self._seqs)

    # The memory breakdown (after the paper's Figure 2), slot by slot; a slot is one token of one KV cache group.
    # Only two blocks of a group's table can hold anything but token states: its first, whose positions before
    # lo = first_query - window + 1 are dead (no query will read them again: internal fragmentation), and its last,
    # partly filled, whose empty slots are reservation up to the final length and internal fragmentation past it
    # (the module docstring draws both in group 1 of its example). A block shared by several sequences (a fork)
    # counts once: a slot is a token state if ANY owner reads it (dead only when dead for every owner), reservation
    # if any owner will fill it.
    def _ends(self, seq, window: int | None, start: int, length: int) -> tuple[int, int, int]:
        """(dead slots of the group's first held block, filled slots of its last, reach of its last), the reach
        being how far the sequence's final length goes in that block."""
        bs, last = self.block_size, start + length - 1
        dead = self.live_from(window, seq.first_query) - start * bs
        fill = seq.num_tokens - last * bs
        return dead, fill, max(fill, min(bs, seq.final_len - last * bs))

    def breakdown(self, waiting: bool = False) -> MemoryBreakdown:
        """The pool in five kinds of slot (see the module docstring). Cost: O(live sequences x groups)."""
        bs, refs = self.block_size, self.allocator.ref_count
        special: dict[int, list[int]] = {}  # block -> [filled, dead (min over owners), reach (max), owners reporting]

        def report(block: int, fill: int, dead: int, reach: int) -> None:
            entry = special.get(block)
            if entry is None:
                special[block] = [fill, dead, reach, 1]
            else:
                entry[1], entry[2], entry[3] = min(entry[1], dead), max(entry[2], reach), entry[3] + 1

        for seq in self._seqs.values():
            for window, table, start in zip(self.windows, seq.tables, seq.starts):
                if not table:
                    continue
                dead, fill, reach = self._ends(seq, window, start, len(table))
                if len(table) == 1:
                    report(table[0], fill, dead, reach)
                    continue
                if dead:
                    report(table[0], bs, dead, bs)
                if fill < bs:
                    report(table[-1], fill, 0, reach)
        empty = reservation = internal = dead_slots = 0
        for block, (fill, dead, reach, owners) in special.items():
            dead = dead if owners == refs(block) else 0  # an owner that reported nothing reads the whole block
            empty += bs - fill
            reservation += reach - fill
            internal += bs - reach
            dead_slots += dead
        result = MemoryBreakdown(
            token_states=self.allocator.num_used_blocks * bs - empty - dead_slots,
            reservation=reservation,
            internal_fragmentation=internal + dead_slots,
            external_fragmentation=0,  # any free page fits any group
            free=self.allocator.num_free_blocks * bs,
        )
        return result.with_waiting() if waiting else result

    def _block_views(self) -> dict[int, list[int]]:
        """Block by block (slow, every held block): block -> [first owner, filled, dead (min), reach (max)]."""
        bs, views = self.block_size, {}
        for seq_id, seq in self._seqs.items():
            for window, table, start in zip(self.windows, seq.tables, seq.starts):
                lo = self.live_from(window, seq.first_query)
                for i, b in enumerate(table, start=start):
                    fill = min(bs, seq.num_tokens - i * bs)
                    dead = min(fill, max(0, lo - i * bs))
                    reach = max(fill, min(bs, seq.final_len - i * bs))
                    view = views.get(b)
                    if view is None:
                        views[b] = [seq_id, fill, dead, reach]
                        continue
                    if view[1] != fill:
                        raise RuntimeError(f"block {b}: owners disagree on its fill ({view[1]} vs {fill} tokens)")
                    view[2], view[3] = min(view[2], dead), max(view[3], reach)
        return views

    def slot_segments(self) -> list[SlotSegment]:
        """(seq id, first slot, end slot, kind) of every held slot, kinds as indices of SHARE_NAMES; a shared block is
        listed once, under its first owner. The breakdown above, slot by slot."""
        bs, segments = self.block_size, []
        for b, (seq_id, fill, dead, reach) in self._block_views().items():
            for kind, lo, hi in ((2, 0, dead), (0, dead, fill), (1, fill, reach), (2, reach, bs)):
                if hi > lo:
                    segments.append(SlotSegment(seq_id, b * bs + lo, b * bs + hi, kind))
        return segments

    # --- invariants ----------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Each group's table holds exactly the blocks from the first one its latest query reads to its last token;
        reference counts equal the owners; the breakdown equals a slow block-by-block recount."""
        self.allocator.check_invariants()
        bs, owners = self.block_size, {}
        for seq_id, seq in self._seqs.items():
            if not (0 <= seq.first_query < seq.num_tokens or seq.first_query == seq.num_tokens == 0):
                raise RuntimeError(f"sequence {seq_id}: expected its latest query before its {seq.num_tokens} tokens, "
                                   f"found {seq.first_query}")
            held = [b for table in seq.tables for b in table]
            if len(set(held)) != len(held):
                raise RuntimeError(f"sequence {seq_id}: a block in two places of its tables {seq.tables}")
            for g, (window, table, start) in enumerate(zip(self.windows, seq.tables, seq.starts)):
                first = self.live_from(window, seq.first_query) // bs if seq.num_tokens else 0
                if start != first or len(table) != cdiv(seq.num_tokens, bs) - first:
                    raise RuntimeError(
                        f"sequence {seq_id}, group {g} (window {window}): expected logical blocks {first} to "
                        f"{cdiv(seq.num_tokens, bs) - 1} for {seq.num_tokens} tokens and latest query "
                        f"{seq.first_query}, found {len(table)} block(s) from {start}"
                    )
            for b in held:
                owners[b] = owners.get(b, 0) + 1
        for b in range(self.num_blocks):
            if self.allocator.ref_count(b) != owners.get(b, 0):
                raise RuntimeError(f"block {b}: expected ref count {owners.get(b, 0)} (owners), found "
                                   f"{self.allocator.ref_count(b)}")
        views = self._block_views().values()
        expected = MemoryBreakdown(
            token_states=sum(fill - dead for _, fill, dead, _ in views),
            reservation=sum(reach - fill for _, fill, _, reach in views),
            internal_fragmentation=sum(dead + bs - reach for _, _, dead, reach in views),
            external_fragmentation=0,
            free=self.allocator.num_free_blocks * bs,
        )
        check_breakdown(self, expected, "block")

    def __repr__(self) -> str:
        return (f"HybridKVManager(num_blocks={self.num_blocks}, block_size={self.block_size}, windows={self.windows}, "
                f"seqs={len(self._seqs)}, free_blocks={self.num_free_blocks})")
