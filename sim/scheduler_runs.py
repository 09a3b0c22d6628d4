"""Runs of plain decode steps: when the next steps are certain to decode exactly the running sequences, the
simulator's fast-forward (sim/fastforward.py) applies many of them at once, with exactly the results of stepping.

A mixin of `Scheduler` (sim/scheduler.py), which owns the state it reads and changes: the queues
(`self._waiting`, `self._running`, `self._swapped`), `self._groups`, `self._outstanding` (the plan in flight),
`self._plain` (the sequences the last `plain_decode_seqs` answered) and the admission and finish rules
(`_may_admit`, `_admission`, `_finish`).
"""
from __future__ import annotations

import itertools

from .sequence import Sequence


class SchedulerDecodeRuns:
    def plain_decode_seqs(self) -> list[Sequence] | None:
        """The running sequences, if the next schedule() is certain to be a plain decode of exactly them and
        stays so while memory lasts and none finishes: every running group decodes all its sequences (no prompt
        chunk, beam search or copy waiting), nothing is swapped out, the budget holds them all, and the first
        waiting group could not be admitted now (advance_decodes stops a run before free memory grows). Else None."""
        if self._outstanding is not None or not self._running or self._swapped:
            return None
        seqs: list[Sequence] = []
        for group in self._running:
            if group.is_beam_search or group.pending_copies or not group.forked:
                return None
            for seq in group.live:
                if seq.prefilling or seq.num_computed_tokens != seq.num_tokens - 1:
                    return None
                seqs.append(seq)
        budget = self.config.max_num_batched_tokens
        if self.config.mode == "v1":
            budget -= len(seqs)
            if budget < 0:
                return None
        if self._waiting and self._may_admit() and self._head_may_be_admitted(budget, len(seqs)):
            return None
        self._plain = seqs
        return seqs

    def can_admit_head(self) -> bool:
        """Would the first waiting group be admitted if a step started now with the whole budget (max_num_seqs,
        budget and memory, watermark included)? False when nothing waits or admission is closed."""
        if not self._waiting or not self._may_admit():
            return False
        return self._head_may_be_admitted(self.config.max_num_batched_tokens, self.num_running_seqs, first=True)

    def _head_may_be_admitted(self, budget: int, num_running_seqs: int, first: bool | None = None) -> bool:
        group = self._waiting[0]
        if num_running_seqs + group.num_seqs > self.config.max_num_seqs:
            return False
        asked = self._admission(group, budget, first=self.config.mode != "v1" if first is None else first)
        if asked is None:
            return False
        new, counts = asked
        if first:  # an exact answer for observers
            return self.kv.can_allocate_slots([s.seq_id for s in group.kv_seqs], counts, new)
        # NOTE: with chunking, losing a prefix-cache hit to eviction can SHRINK the chunk's memory need, so a
        # blocked group with hits might fit later in the run: treat it as admissible (no run; always safe).
        if self.config.chunked and any(spec.num_cached_tokens for spec in new):
            return True
        return self.kv.can_allocate_slots([s.seq_id for s in group.kv_seqs], counts, new)

    def advance_decodes(self, max_steps: int) -> tuple[list[tuple[int, ...]], list[int]]:
        """Apply as many plain decode steps as memory allows, at most `max_steps`, at once: the state as many
        rounds of schedule() and finish_step() with nothing reported would leave, with the same block ids. No
        sequence may reach its output_len before step `max_steps`; those that reach it in the last step applied
        finish then (the finish rule of finish_step). Returns the pool's five raw slot counts during each step
        applied (the KV manager's advance_decodes; none if memory allows no step) and the requests finished."""
        seqs = self._plain if self._plain is not None else self.plain_decode_seqs()
        self._plain = None
        if seqs is None or not 1 <= max_steps <= min(s.output_len - s.num_generated for s in seqs):
            raise ValueError(f"advance_decodes({max_steps}): expected a plain decode state and no sequence finishing "
                             "before the last step")  # fmt: skip
        ids = [s.seq_id for s in seqs]
        # a step allocates request by request: the same calls, so that a pool freeing blocks mid-run (hybrid) finds
        # the same room and hands out the block ids stepping would
        batches = [len(list(run)) for _, run in itertools.groupby(seqs, key=lambda s: s.request_id)]
        # a waiting group refused now stays refused while free memory does not grow (in a paged pool it only
        # shrinks during a run; a hybrid pool's sliding groups give blocks back): the run stops before it grows
        cap = self.kv.num_free_blocks if self._waiting and self._may_admit() else None
        num_steps = self.kv.max_decode_steps(ids, max_steps, max_free=cap, batches=batches)
        if num_steps < 1:
            return [], []
        counts = self.kv.advance_decodes(ids, num_steps, checked=True, batches=batches)
        for seq in seqs:
            seq.num_generated += num_steps
            seq.num_computed_tokens += num_steps
        ending = {s.request_id: self._groups[s.request_id] for s in seqs if s.num_generated >= s.output_len}
        return counts, self._finish(ending.values())
