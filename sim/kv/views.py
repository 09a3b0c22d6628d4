"""The pool slot by slot: what the viewer, the memory map and the pool page draw (`slot_segments`).

The memory breakdown (after the paper's Figure 2) counts the pool's slots in five kinds (sim/kv/base.py,
`MemoryBreakdown`); a view needs to know where each kind lies. Every block but a sequence's last is full, so only
partly filled last blocks hold empty slots; each empty slot is reservation if some owner will still write it, else
internal fragmentation.
"""
from __future__ import annotations

from .base import SlotSegment


def paged_slot_segments(kv) -> list[SlotSegment]:
    """(seq id, first slot, end slot, kind) of every held GPU slot, kinds as indices of SHARE_NAMES; a shared
    block is listed once, under its first owner: a paged manager's breakdown, slot by slot."""
    bs, segments, last = kv.block_size, [], {}
    seen: set[int] = set()
    for seq_id in kv.seq_ids:
        seq = kv.seq_state(seq_id)
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
                segments.append(SlotSegment(seq_id, b * bs, (b + 1) * bs, 0))
            else:
                last[b] = [seq_id, filled, reach]
    for b, (seq_id, filled, reach) in last.items():
        for kind, lo, hi in ((0, 0, filled), (1, filled, reach), (2, reach, bs)):
            if hi > lo:
                segments.append(SlotSegment(seq_id, b * bs + lo, b * bs + hi, kind))
    return segments
