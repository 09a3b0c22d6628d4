"""vAttention: a virtually contiguous KV cache whose physical memory is mapped on demand, in pages.

Prabhu et al., "vAttention: Dynamic Memory Management for Serving LLMs without PagedAttention", ASPLOS 2025.
Instead of a block table that an attention kernel must follow (PagedAttention), every request reserves one
contiguous range of *virtual* memory for its maximum length, so that kernels read its K/V as one tensor; physical
memory is mapped into that range only as tokens arrive, in pages, through the GPU's virtual memory API (CUDA VMM).
vAttention maps each layer's K and V buffers separately, with pages of 2 MiB by default (64 KiB and up with its
driver changes). The page table lives in the GPU's MMU, not in the serving system.

One sequence (page of P = 4 tokens, 6 tokens computed, final length 7):

    virtual range   | page 0      | page 1      | page 2 .. (max_seq_len / P)                |   reserved, costs nothing
    mapped to       | physical 7  | physical 3  | unmapped                                   |
    slots           t0 t1 t2 t3    t4 t5 r  i                                    r reservation, i internal frag.

The simulator's pool is physical memory: `num_blocks` pages of `block_size` = P tokens, where one simulator page
stands for the 2 x num_layers physical pages (a K and a V page per layer) that are mapped together for the same P
tokens. A sequence's `block_table` is the list of physical pages mapped to its virtual range, in order; a kernel
never reads it (`gather_block_size` None: no gather overhead in the cost model). The accounting is exact:

- physical pages count; unmapped virtual space costs nothing (`virtual_range` only names it);
- token_states = computed tokens; reservation = mapped slots the sequence will still fill (up to its final
  length); internal_fragmentation = mapped slots past its final length (the tail of its last page);
- no external fragmentation: any free page can back any virtual page (as in paging, and unlike a contiguous
  physical reservation), so only the contract's waiting rule (`as_seen`) turns free slots into external waste.

NOTE: mapping a page costs time on a real GPU (CUDA VMM calls, which vAttention hides by mapping ahead, in the
background); the simulator charges nothing for it. The cost model only drops the paged kernel's block gather.

As the page grows from a few tokens to the model's context, the policy moves from paged-like (waste: the tail of
one small page per sequence) toward reservation-like (one page covers a whole sequence, and its tail is waste).

NOTE: vAttention shares nothing: no prefix cache, and a fork (parallel sampling, beam search) copies the parent's
mapped pages into pages of the child's own (`fork` returns the copies). Siblings declared at admission
(`NewSequence.fork_final_lens`) have pages mapped for them alongside their leader's, as many as it maps, so that
their fork never runs out of memory (the scheduler counts on that, as it does with a contiguous run reserved at
admission); those pages are the siblings' reservation.

NOTE: preemption is by recompute only (`num_cpu_blocks` 0). Swapping pages would be easy to account, but a fork's
copies are made by the plan after the fork, and an executor swaps out before it copies (sim/scheduling/scheduler.py assumes
that a policy whose forks copy never swaps): a group swapped out right after a fork would save its child's pages
before the copy filled them.

Page size. A page is given in bytes per layer per K/V buffer; tokens per page = page bytes / (num_kv_heads x
head_dim x dtype_bytes / num_gpus): tensor parallelism splits the heads, so each GPU maps pages of its share.
A page must hold a whole number of tokens (`page_tokens`).

The manager is one class, in the contract's order: mapping, what the executor and the metrics read (the memory
breakdown), then the invariants. The closed forms behind runs of decode steps are the fast plane's
(sim/fast/vattention.py), with their own tests.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Sequence

from ..base.specs import ModelSpec
from .base import Allocation, BlockCopy, MemoryBreakdown, NewSequence, SlotSegment, as_seen, cdiv
from .blocks import BlockAllocator
from .checks import check_request_args, check_rollback, no_pending_lookahead, with_lookahead
from .no_sharing import NoPrefixCache, NoSwapSpace

KiB = 1024
# NOTE: the default page is the smallest page of whole tokens of at least 64 KiB, vAttention's smallest page size
# (CUDA's own granularity is 2 MiB). A 64 KiB page itself holds whole tokens only for some models (2 KiB per token
# per layer, as Llama-3-8B); OPT-13B's 10 KiB give 70 KiB = 7 tokens.
DEFAULT_MIN_PAGE_KIB = 64


def kv_bytes_per_token_per_buffer(model: ModelSpec, num_gpus: int = 1) -> Fraction:
    """Bytes of one token's K (or V) in one layer on each GPU: num_kv_heads x head_dim x dtype_bytes / num_gpus.
    NOTE: a fraction when the KV heads do not split evenly over the GPUs, as sim.base.specs.kv_capacity_tokens splits
    them (it ignores the replication real tensor parallelism would need)."""
    if num_gpus < 1:
        raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
    return Fraction(model.num_kv_heads * model.kv_head_bytes, num_gpus)  # kv_head_bytes: head_dim x dtype_bytes


def _kib(num_bytes: Fraction) -> str:
    return f"{float(num_bytes / KiB):g} KiB"


def page_tokens(model: ModelSpec, num_gpus: int = 1, page_kib: float | None = None) -> int:
    """Tokens one page of `page_kib` KiB per layer per K/V buffer holds (None: the default page, see
    DEFAULT_MIN_PAGE_KIB). A page that is not a whole, positive number of tokens is refused with one line."""
    per_token = kv_bytes_per_token_per_buffer(model, num_gpus)
    if page_kib is None:
        return math.ceil(DEFAULT_MIN_PAGE_KIB * KiB / per_token)
    tokens = Fraction(page_kib) * KiB / per_token
    if tokens.denominator == 1 and tokens >= 1:
        return int(tokens)
    step = (per_token / KiB).denominator  # the fewest tokens whose page is a whole number of KiB
    examples = sorted({step, math.lcm(step, 64), math.lcm(step, 256)})
    allowed = ", ".join(f"{_kib(t * per_token)} = {t} token{'s' * (t > 1)}" for t in examples)
    raise ValueError(f"page_kib: {page_kib:g} KiB is not a whole number of {model.name} tokens (allowed: a multiple "
                     f"of {_kib(per_token)}, one token's K or V in one layer on each of {num_gpus} GPU(s), e.g. "
                     f"{allowed})")


def _split(final_len: int, start: int, size: int) -> int:
    """Slots of a page of `size` slots starting at position `start` that lie below `final_len`."""
    return min(size, max(0, final_len - start))


@dataclass(slots=True)
class _Sibling:
    """A sibling declared at its leader's admission, not forked yet: the pages its fork will copy into."""

    final_len: int
    pages: list[int] = field(default_factory=list)  # as many as the leader maps


@dataclass(slots=True)
class _Seq:
    pages: list[int]  # physical pages mapped to its virtual range, in order: its block table
    num_tokens: int  # tokens whose K/V it holds (or will hold after the current step)
    final_len: int  # its true final length (reservation ends and internal fragmentation begins there)
    request_slot: int  # its virtual range is [request_slot * max_seq_len, (request_slot + 1) * max_seq_len)
    siblings: list[_Sibling] = field(default_factory=list)
    num_lookahead: int = 0  # the last of num_tokens that are lookahead slots (drafts), until rollback


class VAttentionKVManager(NoSwapSpace, NoPrefixCache):
    """vAttention's KV memory for sequences named by integer ids (see the module docstring).

    `watermark`: the share of pages an admission must leave free (as the paged manager's)."""

    policy = "vattention"
    # preemption by recompute only (see the module docstring): NoSwapSpace answers the swap questions
    # no prefix cache (NoPrefixCache): vAttention shares nothing
    windows: tuple[int | None, ...] = (None,)  # every layer full attention: one KV cache group, the pages mapped
    gather_block_size = None  # attention reads each sequence's K/V as one virtually contiguous tensor

    def __init__(self, num_blocks: int, page_tokens: int, watermark: float = 0.0, max_seq_len: int = 2048) -> None:
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        if max_seq_len < 1:
            raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
        self.allocator = BlockAllocator(num_blocks, page_tokens)  # checks num_blocks and page_tokens >= 1
        self.block_size = page_tokens
        self.num_blocks = num_blocks
        self.max_seq_len = max_seq_len
        self.watermark_blocks = int(watermark * num_blocks)
        self._seqs: dict[int, _Seq] = {}
        self._released_slots: list[int] = []  # a heap: request slots (virtual ranges) to reuse, lowest first
        self._next_slot = 0

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    # --- what the scheduler asks before admitting ---------------------------------------------------
    def check_request(self, prompt_len: int, final_len: int, num_seqs: int) -> str | None:
        """Each sequence maps its own pages (nothing is shared), up to ceil(final_len / P) of them."""
        if final_len > self.max_seq_len:
            return f"final length {final_len} is past the virtual range of a sequence (allowed: <= {self.max_seq_len})"
        need, usable = num_seqs * cdiv(final_len, self.block_size), self.num_blocks - self.watermark_blocks
        if need > usable:
            return (f"{num_seqs} sequence(s) of final length {final_len} need {need} pages of {self.block_size} tokens "
                    f"(allowed: <= {usable} of {self.num_blocks})")
        return None

    # --- slots for the tokens a step computes ---------------------------------------------------------
    def _seq(self, seq_id: int) -> _Seq:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise KeyError(f"sequence {seq_id} is not live")
        return seq

    def seq_state(self, seq_id: int) -> _Seq | None:
        """The manager's own record of a live sequence (None if it holds none): its `num_tokens`, `final_len`, `pages`
        and unforked `siblings`, what the fast plane reads and grows (docs/ARCHITECTURE.md, "The fast plane")."""
        return self._seqs.get(seq_id)

    def _need(self, seq_ids, num_new_tokens, new) -> int | None:
        """Pages the allocation maps, or None if it does not fit (for an admission: also the watermark)."""
        check_request_args(seq_ids, num_new_tokens, new)
        bs, free = self.block_size, self.allocator.num_free_blocks
        if new is None:
            need = 0
            for seq_id, k in zip(seq_ids, num_new_tokens):
                seq = self._seq(seq_id)
                if seq.num_tokens + k > self.max_seq_len:
                    raise ValueError(f"sequence {seq_id}: {seq.num_tokens + k} tokens overrun its virtual range of "
                                     f"{self.max_seq_len}")
                need += (cdiv(seq.num_tokens + k, bs) - len(seq.pages)) * (1 + len(seq.siblings))
            return need if need <= free else None
        need = 0
        for seq_id, k, spec in zip(seq_ids, num_new_tokens, new):
            if seq_id in self._seqs:
                raise ValueError(f"sequence {seq_id} is already live")
            if spec.num_cached_tokens:
                raise ValueError(f"vattention has no prefix cache, got num_cached_tokens {spec.num_cached_tokens}")
            if k > spec.final_len:
                raise ValueError(f"{k} tokens for a sequence of final length {spec.final_len}")
            if max((spec.final_len, *spec.fork_final_lens)) > self.max_seq_len:
                raise ValueError(f"final lengths {spec.final_len}, {spec.fork_final_lens} overrun the virtual range "
                                 f"of {self.max_seq_len} tokens")
            need += cdiv(k, bs) * (1 + len(spec.fork_final_lens))
        return need if need <= free and free - need >= self.watermark_blocks else None

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
        """Map pages for num_new_tokens[i] more tokens in each sequence, all or none (see the KV contract).

            before (P = 4, 6 tokens):   pages [7, 3]      t4 t5 . .
            allocate 3:                 pages [7, 3, 5]   t4 t5 t6 t7 | t8 . . .      (page 5 mapped at position 8)

        A sequence with siblings not forked yet maps, for each of them, a page beside each page of its own. Nothing
        is ever shared, so nothing is copied here. Lookahead slots are mapped as tokens."""
        num_new_tokens, lookahead = self._with_lookahead(seq_ids, num_new_tokens, new, num_lookahead_tokens)
        if self._need(seq_ids, num_new_tokens, new) is None:
            return None
        # NOTE: new sequences are registered before any page is mapped, and `_map` appends pages as it takes them:
        # should the allocator raise, free(seq_id) gives back what was taken (the scheduler aborts the request).
        if new is not None:
            for seq_id, spec in zip(seq_ids, new):
                siblings = [_Sibling(f) for f in spec.fork_final_lens]
                self._seqs[seq_id] = _Seq([], 0, spec.final_len, self._take_slot(), siblings)
        for seq_id, k, la in zip(seq_ids, num_new_tokens, lookahead):
            self._map(self._seqs[seq_id], k)
            self._seqs[seq_id].num_lookahead = la
        return Allocation([])

    def rollback(self, seq_id: int, num_tokens: int) -> None:
        """Keep the first `num_tokens` tokens (the contract in base.py): the pages mapped wholly past the new end are
        unmapped (and as many of the pages mapped for siblings not forked yet, which follow the leader's)."""
        seq = self._seq(seq_id)
        check_rollback(seq_id, num_tokens, seq.num_tokens, seq.num_lookahead)
        keep = cdiv(num_tokens, self.block_size)
        if keep < len(seq.pages):
            self.allocator.free([*seq.pages[keep:][::-1], *(p for s in seq.siblings for p in s.pages[keep:][::-1])])
            del seq.pages[keep:]
            for sibling in seq.siblings:
                del sibling.pages[keep:]
        seq.num_tokens, seq.num_lookahead = num_tokens, 0

    def _map(self, seq: _Seq, k: int) -> None:
        """Append k tokens to one sequence (room checked by the caller): its new pages, then its siblings'."""
        seq.num_tokens += k
        grow = cdiv(seq.num_tokens, self.block_size) - len(seq.pages)
        if grow:
            seq.pages += self.allocator.allocate(grow)
            for sibling in seq.siblings:
                sibling.pages += self.allocator.allocate(grow)

    def fork(self, parent_id: int, child_id: int, final_len: int) -> list[BlockCopy] | None:
        """The child gets pages of its own (those mapped for it at the parent's admission, or fresh ones) and the
        executor copies the parent's mapped pages into them, page i to page i. None if fresh pages are short."""
        parent = self._seq(parent_id)
        no_pending_lookahead(parent_id, parent.num_lookahead)
        if child_id in self._seqs:
            raise ValueError(f"sequence {child_id} is already live")
        if not parent.num_tokens <= final_len <= self.max_seq_len:
            raise ValueError(f"final_len must be from the parent's {parent.num_tokens} tokens to {self.max_seq_len}, "
                             f"got {final_len}")
        sibling = next((s for s in parent.siblings if s.final_len == final_len), None)
        if sibling is not None:
            parent.siblings.remove(sibling)
            pages = sibling.pages
        else:
            fresh = self.allocator.allocate(len(parent.pages))
            if fresh is None:
                return None
            pages = fresh
        self._seqs[child_id] = _Seq(pages, parent.num_tokens, final_len, self._take_slot())
        return list(zip(parent.pages, pages))

    def free(self, seq_id: int) -> None:
        """Unmap the sequence's pages (and those mapped for its siblings not forked yet); its virtual range is
        released for a later request."""
        seq = self._seq(seq_id)
        # NOTE: the pages first, the entry after: should the allocator raise (it then changes nothing), the sequence
        # stays live with every page it held, and a later free gives them back (the scheduler aborts the request).
        self.allocator.free([*reversed(seq.pages), *(p for s in seq.siblings for p in reversed(s.pages))])
        del self._seqs[seq_id]
        heapq.heappush(self._released_slots, seq.request_slot)

    def _take_slot(self) -> int:
        if self._released_slots:
            return heapq.heappop(self._released_slots)
        self._next_slot += 1
        return self._next_slot - 1

    def virtual_range(self, seq_id: int) -> range:
        """Token positions of the sequence's virtual range: reserved for max_seq_len tokens, mapped only as far as
        its pages go (vAttention reserves one such range per request slot of the batch)."""
        start = self._seq(seq_id).request_slot * self.max_seq_len
        return range(start, start + self.max_seq_len)

    # --- what the executor and the metrics read ----------------------------------------------------
    def block_table(self, seq_id: int) -> list[int]:
        """A copy of the pages mapped to the sequence's virtual range, in order."""
        return list(self._seq(seq_id).pages)

    def group_tables(self, seq_id: int) -> list[list[int | None]]:
        """One KV cache group (`windows`): its table is the block table."""
        return [self.block_table(seq_id)]

    def num_tokens(self, seq_id: int) -> int:
        return self._seq(seq_id).num_tokens

    @property
    def seq_ids(self) -> list[int]:
        return list(self._seqs)

    # The memory breakdown (after the paper's Figure 2). Nothing is shared, so every mapped page has one owner and its
    # slots split by that owner's final length alone.
    def breakdown(self, waiting: bool = False) -> MemoryBreakdown:
        """The pool in five kinds of slot, exact from true final lengths. A sequence's m mapped pages hold its n
        tokens, then reservation up to its final length, then internal fragmentation to the end of page m;
        the pages mapped for a sibling not forked yet are its reservation up to the sibling's final length."""
        bs = self.block_size
        tokens = reservation = internal = 0
        for seq in self._seqs.values():
            mapped = len(seq.pages) * bs
            reach = max(seq.num_tokens, min(seq.final_len, mapped))  # NOTE: a caller may write past final_len
            tokens += seq.num_tokens
            reservation += reach - seq.num_tokens
            internal += mapped - reach
            for sibling in seq.siblings:
                reserved = min(sibling.final_len, mapped)
                reservation += reserved
                internal += mapped - reserved
        free = self.allocator.num_free_blocks * bs
        return MemoryBreakdown(*as_seen((tokens, reservation, internal, 0, free), waiting))

    def _pages_by_owner(self):
        """(seq id, page index, physical page, tokens filled, slots below the final length) of every mapped page;
        a sibling's pages belong to its leader."""
        bs = self.block_size
        for seq_id, seq in self._seqs.items():
            for i, page in enumerate(seq.pages):
                filled = _split(seq.num_tokens, i * bs, bs)
                yield seq_id, i, page, filled, max(filled, _split(seq.final_len, i * bs, bs))
            for sibling in seq.siblings:
                for i, page in enumerate(sibling.pages):
                    yield seq_id, i, page, 0, _split(sibling.final_len, i * bs, bs)

    def slot_segments(self) -> list[SlotSegment]:
        """(seq id, first slot, end slot, kind) of every mapped slot, kinds as indices of SHARE_NAMES, page by page."""
        bs, segments = self.block_size, []
        for seq_id, _, page, filled, reach in self._pages_by_owner():
            for kind, lo, hi in ((0, 0, filled), (1, filled, reach), (2, reach, bs)):
                if hi > lo:
                    segments.append(SlotSegment(seq_id, page * bs + lo, page * bs + hi, kind))
        return segments

    # --- invariants ----------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Every mapped page has exactly one owner and the allocator agrees; each sequence maps exactly the pages its
        tokens need (its siblings as many); request slots are distinct; the breakdown equals a page-by-page recount."""
        self.allocator.check_invariants()
        owners: dict[int, int] = {}
        for seq_id, _, page, _, _ in self._pages_by_owner():
            if page in owners or self.allocator.ref_count(page) != 1:
                raise RuntimeError(f"page {page}: expected one owner and ref count 1, found owners "
                                   f"{owners.get(page)} and {seq_id}, ref count {self.allocator.ref_count(page)}")
            owners[page] = seq_id
        if len(owners) != self.allocator.num_used_blocks:
            raise RuntimeError(f"expected {self.allocator.num_used_blocks} mapped pages (the allocator's), "
                               f"found {len(owners)}")
        for seq_id, seq in self._seqs.items():
            need = cdiv(seq.num_tokens, self.block_size)
            if len(seq.pages) != need or any(len(s.pages) != need for s in seq.siblings):
                raise RuntimeError(f"sequence {seq_id}: expected {need} pages for {seq.num_tokens} tokens (and as many "
                                   f"per sibling), found {len(seq.pages)} and {[len(s.pages) for s in seq.siblings]}")
        slots = [seq.request_slot for seq in self._seqs.values()] + self._released_slots
        if sorted(slots) != list(range(self._next_slot)):
            raise RuntimeError(f"expected request slots 0..{self._next_slot - 1}, each live or released once, "
                               f"found {slots}")
        recount = [0] * 5
        for _, lo, hi, kind in self.slot_segments():
            recount[kind] += hi - lo
        recount[4] = self.allocator.num_free_blocks * self.block_size
        if list(self.breakdown().counts()) != recount:
            raise RuntimeError(f"expected breakdown {recount} (page by page), found {self.breakdown()}")

    def __repr__(self) -> str:
        return (f"VAttentionKVManager(num_blocks={self.num_blocks}, page_tokens={self.block_size}, "
                f"seqs={len(self._seqs)}, free_pages={self.num_free_blocks})")
