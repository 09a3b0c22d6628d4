"""Beam search's bookkeeping (Kwon et al., SOSP 2023, section 4.4), apart from the plain request's path.

A beam-search request is a group of k sequences (sim/scheduling/sequence.py). Every step each beam proposes candidates, the k
best survive (`beam_parents` in the executor's report), and the scheduler re-chooses its beams with
`reselect_beams`: beams no candidate descends from are freed, a beam two candidates descend from is forked (paged
managers share its blocks, copy-on-write; contiguous ones copy). The simulator has no model to score candidates:
`BeamScores` draws them.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..kv.base import KVManager
from .sequence import Sequence, SequenceGroup, SequenceStatus, queue_copies


def reselect_beams(
    kv: KVManager, group: SequenceGroup, parents: list[int], new_seq: Callable[[int], Sequence]
) -> list[Sequence]:
    """One beam-search step's bookkeeping (paper 4.4): keep the k beams `parents` names. Unlisted beams are
    freed FIRST (their memory makes room), then each repeated parent is forked: its first occurrence keeps the
    parent's id, later ones get a new sequence from `new_seq(num_generated)`. The fork's copies (contiguous
    policies copy; paged ones share) wait in group.pending_copies for the next plan. Returns the dropped beams.
    """
    live = {s.seq_id: s for s in group.live}
    width = group.request.beam_width
    valid = group.is_beam_search and group.status is SequenceStatus.RUNNING and len(parents) == width
    if not valid or not set(parents) <= live.keys():
        raise ValueError(
            f"beam_parents[{group.request_id}]: expected {width} of the running beams {sorted(live)}, got {parents}"
        )
    dropped = [seq for seq_id, seq in live.items() if seq_id not in parents]
    for seq in dropped:
        # a copy still waiting to fill a dropped beam (its fork in this same report) is moot: its blocks go
        gone = set(kv.block_table(seq.seq_id))
        group.pending_copies = [(src, dst) for src, dst in group.pending_copies if dst not in gone]
        kv.free(seq.seq_id)
        seq.status = SequenceStatus.FINISHED
    beams: list[Sequence] = []
    for i, parent_id in enumerate(parents):
        beam = live[parent_id]
        if parent_id in parents[:i]:  # a repeated parent: fork a new beam from it
            parent = beam
            beam = new_seq(parent.num_generated)
            beam.status, beam.num_computed_tokens, beam.prefilling = SequenceStatus.RUNNING, parent.num_computed_tokens, False
            copies = kv.fork(parent_id, beam.seq_id, beam.final_len)
            if copies is None:
                raise RuntimeError(f"fork of seq {parent_id}: expected room once dropped beams are freed, found none")
            queue_copies(group, copies)
        beams.append(beam)
    group.set_seqs(beams)  # refreshes the cached live tuple: dropped beams are gone, forks are in
    return dropped


class BeamScores:
    """The simulator's beam scores: each beam's cumulative log-prob, and the draw that picks each step's survivors.
    Modelling approximation: log-probs are -Exponential(1) draws, not a model's (they shape forks and frees only)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng([seed, 0xBEA])  # a stream apart from the workload's
        self.scores: dict[int, float] = {}  # seq id -> cumulative log-prob of a beam

    def choose(self, seq_ids: list[int]) -> tuple[list[int], list[float]]:
        """Each of the k beams proposes 2 next tokens; the k best candidates survive: their parents, their scores."""
        k = len(seq_ids)
        base = np.array([self.scores.get(s, 0.0) for s in seq_ids])
        candidates = np.repeat(base, 2) - self.rng.standard_exponential(2 * k)
        best = np.argsort(-candidates, kind="stable")[:k]
        return [seq_ids[c // 2] for c in best.tolist()], candidates[best].tolist()

    def update(self, old_ids: list[int], new_ids: list[int], scores: list[float]) -> None:
        """The beams re-chosen: `new_ids` (the scheduler's, in beam_parents order) now carry `scores`."""
        for seq_id in old_ids:
            self.scores.pop(seq_id, None)
        self.scores.update(zip(new_ids, scores))
