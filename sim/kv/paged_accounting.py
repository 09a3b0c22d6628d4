"""The paged KV manager's memory breakdown (after the paper's Figure 2), slot by slot, and its invariants.

A mixin of `PagedKVManager` (sim/kv/paged.py), which owns the state it reads: `self._seqs` (seq id -> block
table, token count, true final length, `swapped` flag), `self.allocator`, `self.cpu_allocator`,
`self.block_size`. Every block but a sequence's last is full, so only partly filled last blocks hold empty
slots; each empty slot is reservation if some owner will still write it, else internal fragmentation.
"""
from __future__ import annotations

from .base import MemoryBreakdown


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class PagedAccounting:
    def slot_segments(self) -> list[tuple[int, int, int, int]]:
        """(seq id, first slot, end slot, kind) of every held GPU slot, kinds as indices of SHARE_NAMES; a shared
        block is listed once, under its first owner. The breakdown below, slot by slot."""
        bs, segments, last = self.block_size, [], {}
        seen: set[int] = set()
        for seq_id, seq in self._seqs.items():
            if seq.swapped:  # its blocks are in CPU memory
                continue
            for i, b in enumerate(seq.block_table):
                filled = min(bs, seq.num_tokens - i * bs)
                reach = max(filled, min(bs, seq.final_len - i * bs))
                if b in seen:
                    if b in last:
                        last[b][2] = max(last[b][2], reach)
                    continue
                seen.add(b)
                if filled == bs:
                    segments.append((seq_id, b * bs, (b + 1) * bs, 0))
                else:
                    last[b] = [seq_id, filled, reach]
        for b, (seq_id, filled, reach) in last.items():
            for kind, lo, hi in ((0, 0, filled), (1, filled, reach), (2, reach, bs)):
                if hi > lo:
                    segments.append((seq_id, b * bs + lo, b * bs + hi, kind))
        return segments

    def breakdown(self, waiting: bool = False) -> MemoryBreakdown:
        """The pool in five kinds of slot, exact from each sequence's true final length; shared blocks count once.

        Every block but a sequence's last is full, so only partly filled last blocks hold empty slots. Each
        empty slot of such a block is `reservation` if some owner will still write it (its final length
        reaches that far), else `internal_fragmentation`. Example, block_size 4, 6 tokens, final length 7:

            last block   t4 t5 r  i        2 token_states, 1 reservation, 1 internal_fragmentation

        Swapped-out sequences hold no GPU memory; freed cached blocks count as free. Cost: O(live sequences).
        """
        bs = self.block_size
        partial: dict[int, list[int]] = {}  # partly filled last block -> [filled, reach over its owners]
        for seq in self._seqs.values():
            filled = seq.num_tokens % bs  # NOTE: the loop is hot (the simulator asks every step): kept lean
            if not filled or seq.swapped:
                continue
            reach = seq.final_len - seq.num_tokens + filled  # the final length, counted from the block's start
            reach = filled if reach < filled else (bs if reach > bs else reach)
            entry = partial.get(seq.block_table[-1])
            if entry is None:
                partial[seq.block_table[-1]] = [filled, reach]
            elif reach > entry[1]:
                entry[1] = reach
        empty = sum(bs - filled for filled, _ in partial.values())
        reservation = sum(reach - filled for filled, reach in partial.values())
        result = MemoryBreakdown(
            token_states=self.allocator.num_used_blocks * bs - empty,
            reservation=reservation,
            internal_fragmentation=empty - reservation,
            external_fragmentation=0,  # blocks are all alike: any free block fits any request
            free=self.allocator.num_free_blocks * bs,
        )
        return result.with_waiting() if waiting else result

    def check_invariants(self) -> None:
        """Ref counts equal the owners in every table (GPU and CPU); each table covers exactly its tokens;
        the breakdown equals a slow block-by-block recount."""
        self.allocator.check_invariants()
        if self.cpu_allocator is not None:
            self.cpu_allocator.check_invariants()
        bs = self.block_size
        refs: dict[bool, dict[int, int]] = {False: {}, True: {}}
        fill: dict[int, tuple[int, int]] = {}  # GPU block -> (filled slots, slots some owner will reach)
        for seq_id, seq in self._seqs.items():
            n = _cdiv(seq.num_tokens, bs)
            if len(seq.block_table) != n or len(set(seq.block_table)) != n:
                raise RuntimeError(
                    f"sequence {seq_id}: expected {n} distinct blocks for "
                    f"{seq.num_tokens} tokens, found block table {seq.block_table}"
                )
            for i, b in enumerate(seq.block_table):
                refs[seq.swapped][b] = refs[seq.swapped].get(b, 0) + 1
                if seq.swapped:
                    continue
                note_fill(fill, b, seq, i, bs, "block")
        for pool, held, name in ((self.allocator, refs[False], "GPU"), (self.cpu_allocator, refs[True], "CPU")):
            size = 0 if pool is None else pool.num_blocks
            for b in set(range(size)) | set(held):
                found = pool.ref_count(b) if b < size else None
                if found != held.get(b, 0):
                    raise RuntimeError(f"{name} block {b}: expected ref count {held.get(b, 0)} (owners), found {found}")
        expected = recounted_breakdown(fill, bs, self.allocator.num_free_blocks)
        if self.breakdown() != expected:
            raise RuntimeError(f"expected breakdown {expected} (block by block), found {self.breakdown()}")


def note_fill(fill: dict[int, tuple[int, int]], block: int, seq, i: int, bs: int, word: str) -> None:
    """Record in `fill` (block -> (filled slots, slots some owner will reach)) what logical block `i` of `seq` (its
    num_tokens, final_len) holds in physical `block`; every owner of a shared block must see the same fill."""
    filled = min(bs, seq.num_tokens - i * bs)
    reach = max(filled, min(bs, seq.final_len - i * bs))
    if block in fill and fill[block][0] != filled:
        raise RuntimeError(f"{word} {block}: owners disagree on its fill ({fill[block][0]} vs {filled} tokens)")
    fill[block] = (filled, max(reach, fill.get(block, (0, 0))[1]))


def recounted_breakdown(fill: dict[int, tuple[int, int]], bs: int, num_free_blocks: int) -> MemoryBreakdown:
    """The breakdown a block-by-block recount gives (no external fragmentation: blocks fit anywhere)."""
    return MemoryBreakdown(
        token_states=sum(f for f, _ in fill.values()),
        reservation=sum(r - f for f, r in fill.values()),
        internal_fragmentation=sum(bs - r for _, r in fill.values()),
        external_fragmentation=0,
        free=num_free_blocks * bs,
    )

