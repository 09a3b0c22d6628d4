"""The fast plane's hybrid pools: runs of plain decode steps, how long one can last, and applying them.

In a paged pool free memory only shrinks during a run of decode steps (sim/fast/paged.py). In a hybrid pool it grows:
a sliding group frees a block each time the window passes a block boundary. Step j of a run (j = 1, 2, ...) feeds
position p = n + j - 1 of a sequence holding n tokens:

- it opens a block in EVERY group when p is the first position of a block (p % block_size == 0);
- each sliding group (window W) drops every block wholly before p - W + 1: logical block i at the step
  j_i = (i + 1) * block_size + W - n (at step 1 at the latest: a sequence whose latest step fed a long chunk drops
  several blocks at once). A dropped block returns to the pool when its last owner drops it (forks share blocks).

A step allocates request by request (the scheduler calls allocate_slots once per request group: the contract's
`seq_groups`), and each call makes its own drops before its openings, all or nothing: so the blocks a later request
drops come back only after an earlier one opened its own, and step j fits iff no call of it finds the pool short.
Only steps where something opens or is dropped can change the answer, so `max_decode_steps` walks those events, call
by call, in order: O(sequences x groups x limit / block_size). The scheduler admits a waiting request after a step's
decodes, so with `waiting` the run also ends before a step that would leave more blocks free than when it began.

`step_decodes` applies a run one allocate_slots per request group per step, recording the breakdown during each step:
the same end state, block ids and counts as stepping, by construction. NOTE: O(steps x sequences x groups), slower
than the paged pool's closed forms (sim/fast/paged.py), which a hybrid pool's frees would complicate.
"""
from __future__ import annotations

import itertools
from typing import Sequence

from ..kv.base import cdiv
from ..kv.hybrid import HybridKVManager
from .records import records


def max_decode_steps(kv, seq_groups: Sequence[Sequence], limit: int, waiting: bool = False) -> int:
    """The most plain decode steps (at most `limit`) that the sequences of `seq_groups` (the manager's records, as
    a step allocates them: one allocate_slots call per group, in order) can take, each one token per sequence, with no
    copy and the memory the pool has; 0 if a partly filled last block is shared (the next write copies it, which a
    plain decode step may not). `waiting`: stop before a step after whose allocations more blocks would be free than
    at the start (the scheduler admits after a step's decodes: its waiting head, refused now, might fit then)."""
    if limit < 1:
        return 0
    if not any(seq_groups):
        return limit
    bs, refs, groups = kv.block_size, kv.allocator.ref_count, len(kv.windows)
    opened: dict[tuple[int, int], int] = {}  # (step, call) -> blocks opened
    dropped: dict[tuple[int, int], list[int]] = {}  # (step, call) -> held blocks that lose a reference
    returned: dict[tuple[int, int], int] = {}  # (step, call) -> blocks opened during the run, dropped by their owner
    for b, seqs in enumerate(seq_groups):
        for seq in seqs:
            n = seq.num_tokens
            if n % bs and any(refs(table[-1]) > 1 for table in seq.tables):
                return 0
            for j in range((-n) % bs + 1, limit + 1, bs):
                opened[j, b] = opened.get((j, b), 0) + groups
            end = cdiv(n + limit, bs)  # logical blocks the sequence would hold at the end of the run
            for window, table, start in zip(kv.windows, seq.tables, seq.starts):
                if window is None:
                    continue
                for i in range(start, end):
                    j = max(1, (i + 1) * bs + window - n)
                    if j > limit:
                        break
                    if i - start < len(table):
                        dropped.setdefault((j, b), []).append(table[i - start])
                    else:
                        returned[j, b] = returned.get((j, b), 0) + 1
    free, left = kv.allocator.num_free_blocks, {}
    max_free = free if waiting else None
    events = sorted(opened.keys() | dropped.keys() | returned.keys())
    for step, calls in itertools.groupby(events, key=lambda event: event[0]):
        for event in calls:  # each call frees its own drops, then opens (allocate_slots' order), all or nothing
            back = returned.get(event, 0)
            for block in dropped.get(event, ()):
                left[block] = left.get(block, refs(block)) - 1
                back += left[block] == 0
            free += back - opened.get(event, 0)
            if free < 0:
                return step - 1
        if max_free is not None and free > max_free:
            return step - 1
    return limit


def step_decodes(kv, seq_groups: Sequence[Sequence[int]], num_steps: int) -> list[tuple[int, ...]]:
    """Apply `num_steps` decode steps one at a time, each one allocate_slots per group of `seq_groups` in order; the
    pool's five raw slot counts during each step (after its allocation). Room is checked by the caller."""
    counts, calls = [], [(list(ids), [1] * len(ids)) for ids in seq_groups if ids]
    for _ in range(num_steps):
        for ids, ones in calls:
            if kv.allocate_slots(ids, ones) is None:
                raise RuntimeError(f"advance_decodes: expected room for {num_steps} plain decode steps, found less")
        counts.append(kv.breakdown().counts())
    return counts


class HybridRuns:
    """Runs of plain decode steps over a hybrid manager (its records, `seq_state`: num_tokens, tables, starts)."""

    def __init__(self, kv: HybridKVManager) -> None:
        self.kv = kv

    def max_decode_steps(self, seq_groups: Sequence[Sequence[int]], limit: int, waiting: bool = False) -> int:
        """Sliding groups free blocks during a run: each step is modelled as its allocate_slots calls, one per group of
        `seq_groups` in order, and with `waiting` the run ends before a step that would leave more blocks free than
        at its start."""
        records(self.kv, seq_groups)  # every id live, none twice
        state = self.kv.seq_state
        return max_decode_steps(self.kv, [[state(i) for i in ids] for ids in seq_groups], limit, waiting)

    def advance_decodes(self, seq_groups: Sequence[Sequence[int]], num_steps: int,
                        checked: bool = False) -> list[tuple[int, ...]]:
        """Steps one token at a time, one allocate_slots per group of `seq_groups` (the same end state and block ids as
        stepping, by construction); `checked`: the caller has just asked max_decode_steps for these groups (skips
        asking again)."""
        records(self.kv, seq_groups)
        if not checked and self.max_decode_steps(seq_groups, num_steps) < num_steps:
            raise RuntimeError(f"advance_decodes: expected room for {num_steps} plain decode steps, found less")
        return step_decodes(self.kv, seq_groups, num_steps)
