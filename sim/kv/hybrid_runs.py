"""Runs of plain decode steps in a hybrid pool: how long one can last, and applying it (the simulator's fast-forward).

In a paged pool free memory only shrinks during a run of decode steps (paged_runs.py). In a hybrid pool it also grows:
a sliding group frees a block each time the window passes a block boundary. Step j of a run (j = 1, 2, ...) feeds
position p = n + j - 1 of a sequence holding n tokens:

- it opens a block in EVERY group when p is the first position of a block (p % block_size == 0);
- each sliding group (window W) drops every block wholly before p - W + 1: logical block i at the step
  j_i = (i + 1) * block_size + W - n (at step 1 at the latest: a sequence whose latest step fed a long chunk drops
  several blocks at once). A dropped block returns to the pool when its last owner drops it (forks share blocks).

All of a step's drops happen before its openings (as allocate_slots makes them), so step j fits iff
opened_j - returned_j <= free blocks before it. Only steps where something opens or is dropped can change the
answer, so `max_decode_steps` walks those events in order: O(sequences x groups x limit / block_size).

`step_decodes` applies a run one allocate_slots at a time, recording the breakdown during each step: the same end
state, block ids and counts as stepping, by construction. NOTE: O(steps x sequences x groups), slower than the paged
manager's closed forms (paged_runs.py), which a hybrid pool's frees would complicate.
"""
from __future__ import annotations

from typing import Sequence


def max_decode_steps(kv, seqs: Sequence, limit: int) -> int:
    """The most plain decode steps (at most `limit`) that `seqs` (the manager's _Seq records) can take, each one token
    per sequence, with no copy and the memory the pool has; 0 if a partly filled last block is shared (the next write
    copies it, which a plain decode step may not)."""
    if limit < 1:
        return 0
    if not seqs:
        return limit
    bs, refs, groups = kv.block_size, kv.allocator.ref_count, len(kv.windows)
    opened: dict[int, int] = {}  # step -> blocks opened
    dropped: dict[int, list[int]] = {}  # step -> held blocks that lose a reference
    returned: dict[int, int] = {}  # step -> blocks opened during the run that are dropped (their only owner)
    for seq in seqs:
        n = seq.num_tokens
        if n % bs and any(refs(table[-1]) > 1 for table in seq.tables):
            return 0
        for j in range((-n) % bs + 1, limit + 1, bs):
            opened[j] = opened.get(j, 0) + groups
        end = -(-(n + limit) // bs)  # logical blocks the sequence would hold at the end of the run
        for window, table, start in zip(kv.windows, seq.tables, seq.starts):
            if window is None:
                continue
            for i in range(start, end):
                j = max(1, (i + 1) * bs + window - n)
                if j > limit:
                    break
                if i - start < len(table):
                    dropped.setdefault(j, []).append(table[i - start])
                else:
                    returned[j] = returned.get(j, 0) + 1
    free, left = kv.allocator.num_free_blocks, {}
    for j in sorted(opened.keys() | dropped.keys() | returned.keys()):
        back = returned.get(j, 0)
        for b in dropped.get(j, ()):
            left[b] = left.get(b, refs(b)) - 1
            back += left[b] == 0
        free += back - opened.get(j, 0)
        if free < 0:
            return j - 1
    return limit


def step_decodes(kv, seq_ids: Sequence[int], num_steps: int) -> list[tuple[int, ...]]:
    """Apply `num_steps` decode steps one at a time; the pool's five raw slot counts during each (after its
    allocation). Room is checked by the caller."""
    counts, ones = [], [1] * len(seq_ids)
    for _ in range(num_steps):
        if kv.allocate_slots(seq_ids, ones) is None:
            raise RuntimeError(f"advance_decodes: expected room for {num_steps} plain decode steps, found less")
        counts.append(kv.breakdown().counts())
    return counts
