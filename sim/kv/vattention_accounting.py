"""The vAttention manager's memory breakdown, page by page, and its invariants (see sim/kv/vattention.py).

A mixin of `VAttentionKVManager`, which owns the state it reads: `self._seqs` (seq id -> its mapped pages, token
count, true final length, request slot, and its siblings not forked yet with their pages), `self.allocator` (the
physical pages), `self.block_size` (tokens per page), `self._released_slots` and `self._next_slot` (request slots).
Nothing is shared, so every mapped page has one owner and its slots split by that owner's final length alone.
"""
from __future__ import annotations

from .base import MemoryBreakdown, as_seen


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _split(final_len: int, start: int, size: int) -> int:
    """Slots of a page of `size` slots starting at position `start` that lie below `final_len`."""
    return min(size, max(0, final_len - start))


class VAttentionAccounting:
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

    def slot_segments(self) -> list[tuple[int, int, int, int]]:
        """(seq id, first slot, end slot, kind) of every mapped slot, kinds as indices of SHARE_NAMES, page by page."""
        bs, segments = self.block_size, []
        for seq_id, _, page, filled, reach in self._pages_by_owner():
            for kind, lo, hi in ((0, 0, filled), (1, filled, reach), (2, reach, bs)):
                if hi > lo:
                    segments.append((seq_id, page * bs + lo, page * bs + hi, kind))
        return segments

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
                               f"found {len(owners)}")  # fmt: skip
        for seq_id, seq in self._seqs.items():
            need = _cdiv(seq.num_tokens, self.block_size)
            if len(seq.pages) != need or any(len(s.pages) != need for s in seq.siblings):
                raise RuntimeError(f"sequence {seq_id}: expected {need} pages for {seq.num_tokens} tokens (and as many "
                                   f"per sibling), found {len(seq.pages)} and {[len(s.pages) for s in seq.siblings]}")
        slots = [seq.request_slot for seq in self._seqs.values()] + self._released_slots
        if sorted(slots) != list(range(self._next_slot)):
            raise RuntimeError(f"expected request slots 0..{self._next_slot - 1}, each live or released once, "
                               f"found {slots}")  # fmt: skip
        recount = [0] * 5
        for _, lo, hi, kind in self.slot_segments():
            recount[kind] += hi - lo
        recount[4] = self.allocator.num_free_blocks * self.block_size
        if list(self.breakdown().counts()) != recount:
            raise RuntimeError(f"expected breakdown {recount} (page by page), found {self.breakdown()}")
