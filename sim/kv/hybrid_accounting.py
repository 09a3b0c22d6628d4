"""The hybrid KV manager's memory breakdown (after the paper's Figure 2), slot by slot, and its invariants.

A mixin of `HybridKVManager` (sim/kv/hybrid.py), which owns the state it reads: `self._seqs` (seq id -> per group block
table and first logical block, token count, first query of its latest step, true final length), `self.windows`,
`self.allocator`, `self.block_size`. A slot is one token of one KV cache group.

Only two blocks of a group's table can hold anything but token states: its first, whose positions before
lo = first_query - window + 1 are dead (no query will read them again: internal fragmentation), and its last, partly
filled, whose empty slots are reservation up to the final length and internal fragmentation past it. block_size 4,
window 6, 11 tokens, final length 12, latest query 10 (lo = 5), sliding group:

    block     [ 9: pos 4..7 ]   [ 3: pos 8..11 ]
    slots       i t t t           t t t r            i internal (dead), t token_states, r reservation

A block shared by several sequences (a fork) counts once: a slot is a token state if ANY owner reads it (dead only
when dead for every owner), reservation if any owner will fill it.
"""
from __future__ import annotations

from .base import MemoryBreakdown


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class HybridAccounting:
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

    def slot_segments(self) -> list[tuple[int, int, int, int]]:
        """(seq id, first slot, end slot, kind) of every held slot, kinds as indices of SHARE_NAMES; a shared block is
        listed once, under its first owner. The breakdown above, slot by slot."""
        bs, segments = self.block_size, []
        for b, (seq_id, fill, dead, reach) in self._block_views().items():
            for kind, lo, hi in ((2, 0, dead), (0, dead, fill), (1, fill, reach), (2, reach, bs)):
                if hi > lo:
                    segments.append((seq_id, b * bs + lo, b * bs + hi, kind))
        return segments

    def check_invariants(self) -> None:
        """Each group's table holds exactly the blocks from the first one its latest query reads to its last token;
        reference counts equal the owners; the breakdown equals a slow block-by-block recount."""
        self.allocator.check_invariants()
        bs, owners = self.block_size, {}
        for seq_id, seq in self._seqs.items():
            if not (0 <= seq.first_query < seq.num_tokens or seq.first_query == seq.num_tokens == 0):
                raise RuntimeError(f"sequence {seq_id}: expected its latest query before its {seq.num_tokens} tokens, "
                                   f"found {seq.first_query}")  # fmt: skip
            held = [b for table in seq.tables for b in table]
            if len(set(held)) != len(held):
                raise RuntimeError(f"sequence {seq_id}: a block in two places of its tables {seq.tables}")
            for g, (window, table, start) in enumerate(zip(self.windows, seq.tables, seq.starts)):
                first = self.live_from(window, seq.first_query) // bs if seq.num_tokens else 0
                if start != first or len(table) != _cdiv(seq.num_tokens, bs) - first:
                    raise RuntimeError(
                        f"sequence {seq_id}, group {g} (window {window}): expected logical blocks {first} to "
                        f"{_cdiv(seq.num_tokens, bs) - 1} for {seq.num_tokens} tokens and latest query "
                        f"{seq.first_query}, found {len(table)} block(s) from {start}"
                    )
            for b in held:
                owners[b] = owners.get(b, 0) + 1
        for b in range(self.num_blocks):
            if self.allocator.ref_count(b) != owners.get(b, 0):
                raise RuntimeError(f"block {b}: expected ref count {owners.get(b, 0)} (owners), found "
                                   f"{self.allocator.ref_count(b)}")  # fmt: skip
        views = self._block_views().values()
        expected = MemoryBreakdown(
            token_states=sum(fill - dead for _, fill, dead, _ in views),
            reservation=sum(reach - fill for _, fill, _, reach in views),
            internal_fragmentation=sum(dead + bs - reach for _, _, dead, reach in views),
            external_fragmentation=0,
            free=self.allocator.num_free_blocks * bs,
        )
        if self.breakdown() != expected:
            raise RuntimeError(f"expected breakdown {expected} (block by block), found {self.breakdown()}")
