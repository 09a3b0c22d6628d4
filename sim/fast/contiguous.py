"""The fast plane's contiguous pools (max / pow2 / oracle): runs of plain decode steps inside each reservation.

A contiguous sequence grows inside the run of slots reserved for it at admission (sim/kv/contiguous.py), which
usually holds the whole run of decode steps: nothing is allocated or freed, each step turns one reserved slot per
sequence into a token. The answers equal stepping, one allocate_slots(group, [1, ...]) per group and step (the KV
state machine, sim/testing/kv.py, checks them).
"""
from __future__ import annotations

from typing import Sequence

from ..kv.contiguous import ContiguousKVManager
from .records import records


class ContiguousRuns:
    """Runs of plain decode steps over a contiguous manager's records (`seq_state`: reserved_tokens, num_tokens,
    final_len)."""

    def __init__(self, kv: ContiguousKVManager) -> None:
        self.kv = kv

    def max_decode_steps(self, seq_groups: Sequence[Sequence[int]], limit: int, waiting: bool = False) -> int:
        """Each sequence grows inside its own reservation. Nothing is allocated or freed during a run, so `waiting`
        holds by construction and the groups' order changes nothing."""
        room = min((s.reserved_tokens - s.num_tokens for s in records(self.kv, seq_groups)), default=limit)
        return max(0, min(limit, room))

    def advance_decodes(self, seq_groups: Sequence[Sequence[int]], num_steps: int,
                        checked: bool = False) -> list[tuple[int, ...]]:
        """Nothing allocates: each step turns one reserved slot per sequence into a token. A slot is reservation up to
        the sequence's final length and internal fragmentation past it (an engine may write beyond a final length
        that is only max_tokens). The pool's five raw counts during each step."""
        runs = records(self.kv, seq_groups)
        room = num_steps if checked else self.max_decode_steps(seq_groups, num_steps)
        if room < num_steps:
            raise RuntimeError(f"advance_decodes: expected room for {num_steps} steps of distinct sequences")
        tokens, reservation, internal, external, free = self.kv.breakdown().counts()
        leaves_reservation = [0] * (num_steps + 1)  # at step j, this many sequences write past their final length
        for run in runs:
            leaves_reservation[min(num_steps, max(0, run.final_len - run.num_tokens))] += 1
            run.num_tokens += num_steps
        counts, past = [], 0
        for j in range(num_steps):
            past += leaves_reservation[j]
            tokens += len(runs)
            reservation -= len(runs) - past
            internal -= past
            counts.append((tokens, reservation, internal, external, free))
        return counts
