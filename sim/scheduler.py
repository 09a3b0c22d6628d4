"""The scheduler: which sequence groups run each iteration, and what memory that takes.

Follows vLLM v0 (the paper's system: Kwon et al., SOSP 2023, sections 4.5 and 5; vllm/core/scheduler.py
of 2023) on top of Orca's iteration-level scheduling (Yu et al., OSDI 2022): FCFS; a new decision every
iteration; when memory runs out, the latest-arrived group is preempted, all its sequences together, by
swapping (its blocks move to CPU memory) or recompute (its blocks are freed and it starts over with a
prefill of prompt + tokens generated so far). `mode="static"` is the request-level baseline
(FasterTransformer): a batch is admitted only when nothing runs.

The same object serves the simulator and the reference engine (DESIGN.md): `schedule()` returns a
`StepPlan` whose blocks are already allocated; the executor runs it and reports a `StepOutcome` to
`finish_step()`. The scheduler alone talks to the KV manager about sequence memory.
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

from .kv.base import KVManager
from .plan import ScheduledSeq, StepOutcome, StepPlan, StepResult
from .request import Request
from .decode_run import RunMemo, advance_groups, group_may_fit, max_plain_run
from .sequence import (Sequence, SequenceGroup, SequenceStatus, blocks_to_grow, fits_swap_in, never_fits,
                       reselect_beams, sibling_entry)

__all__ = ["MODES", "PREEMPTION_MODES", "Scheduler", "SchedulerConfig", "StepResult"]

MODES = ("continuous", "static")
PREEMPTION_MODES = ("recompute", "swap")
WAITING, RUNNING, SWAPPED, FINISHED = SequenceStatus


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 256  # running sequences at most
    max_num_batched_tokens: int = 2560  # tokens in one step at most (a longer prompt is rejected)
    mode: str = "continuous"  # "continuous" (Orca/vLLM iteration-level) | "static" (FasterTransformer request-level)
    preemption: str = "recompute"  # "recompute" | "swap" (swap falls back to recompute when CPU memory is short)
    # Paged only: the share of GPU blocks an admission must leave free, so that a group just admitted is not
    # preempted at once by its elders' growth (vLLM v0's block-manager watermark, 0.01 there; off by default).
    watermark: float = 0.0

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(f"preemption must be one of {', '.join(PREEMPTION_MODES)}, got {self.preemption!r}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")


class Scheduler:
    """FCFS iteration-level scheduler over one KV manager. Queues: waiting (deque), running and swapped
    (lists kept in arrival order). Sequence ids come from a counter inside the instance."""

    def __init__(self, kv: KVManager, config: SchedulerConfig | None = None) -> None:
        self.kv = kv
        self.config = config if config is not None else SchedulerConfig()
        self._waiting: deque[SequenceGroup] = deque()
        self._running: list[SequenceGroup] = []
        self._swapped: list[SequenceGroup] = []
        self._groups: dict[int, SequenceGroup] = {}  # every request ever added, finished ones included
        self._seqs: dict[int, Sequence] = {}  # every sequence but dropped beams
        self._next_seq_id = 0
        self._num_added = 0
        self._num_preemptions = 0
        self._outstanding: StepPlan | None = None  # the plan schedule() returned and finish_step() has not seen
        # contiguous policies reserve at admission and never preempt: they need no watermark
        self._watermark_blocks = int(self.config.watermark * kv.num_blocks) if kv.policy == "paged" else 0
        self._version = 0  # bumped by every call that changes state: the key of _last_run
        self._last_run = RunMemo()  # decode_run_length's last answer

    # --- requests in and out ---------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request; ValueError if it can never be served (prompt over the token budget, more sequences
        than max_num_seqs, or a final length the whole pool cannot hold)."""
        rid, cfg = request.request_id, self.config
        if rid in self._groups:
            raise ValueError(f"request {rid} was already added (request ids must be unique)")
        if request.prompt_len > cfg.max_num_batched_tokens:
            raise ValueError(f"request {rid}: prompt_len {request.prompt_len} is over max_num_batched_tokens "
                             f"(allowed: <= {cfg.max_num_batched_tokens})")
        if request.num_seqs > cfg.max_num_seqs:
            raise ValueError(f"request {rid}: {request.num_seqs} sequences (allowed: <= max_num_seqs, {cfg.max_num_seqs})")
        problem = never_fits(self.kv, request, self._watermark_blocks)
        if problem is not None:
            raise ValueError(f"request {rid}: {problem}")
        seqs = [self._new_seq(request, 0) for _ in range(request.num_seqs)]
        group = SequenceGroup(request, seqs, arrival_order=self._num_added)
        self._num_added += 1
        self._groups[rid] = group
        self._waiting.append(group)
        self._version += 1

    def _new_seq(self, request: Request, num_generated: int) -> Sequence:
        seq = Sequence(self._next_seq_id, request.request_id, request.prompt_len, request.output_len, num_generated)
        self._next_seq_id += 1
        self._seqs[seq.seq_id] = seq
        return seq

    def abort(self, request_id: int) -> None:
        """Drop a request wherever it is and free its memory (GPU or CPU). Aborting a finished request does nothing."""
        group = self._group(request_id)
        if group.status is FINISHED:
            return
        self._version += 1
        for seq in group.live:
            if seq.status in (RUNNING, SWAPPED):
                self.kv.free(seq.seq_id)
        queue = {WAITING: self._waiting, RUNNING: self._running, SWAPPED: self._swapped}[group.status]
        queue.remove(group)
        group.set_status(FINISHED)
        group.pending_copies.clear()

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running or self._swapped)

    # --- one iteration -------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Decide the next iteration. The order, as vLLM v0's `_schedule`:

        1. Admission: if nothing is swapped out (and, in static mode, nothing runs), admit waiting groups
           FCFS while they fit in memory, max_num_seqs and max_num_batched_tokens; stop at the first that does
           not (no overtaking). If any was admitted, this is a prefill-only step: running groups decode next step.
        2. Decode: running groups, FCFS, get one slot per live sequence. A group that cannot grow preempts the
           latest-arrived running group (possibly itself) until it can: swap when configured and CPU memory
           allows, else recompute (free everything; back to the FRONT of waiting).
        3. Swap in: if step 2 preempted nothing, swap in swapped groups FCFS while they fit; they decode now.
        """
        if self._outstanding is not None and not self._outstanding.is_empty:
            raise RuntimeError("schedule() called twice: expected finish_step() for the previous plan first")
        self._version += 1
        # NOTE: beam-fork copies from the last finish_step go first. Only contiguous forks return copies, and
        # contiguous groups are never swapped, so no swap-out of this step can read a block before its copy lands.
        plan = StepPlan(blocks_to_copy=[c for g in self._running for c in g.pending_copies])
        for group in self._running:
            group.pending_copies.clear()
        if not (self._may_admit() and self._admit_waiting(plan)):
            self._decode_running(plan)
            if not plan.preempted:
                self._swap_in(plan)
        self._outstanding = plan
        return plan

    def _may_admit(self) -> bool:
        # NOTE: static batching (FasterTransformer) admits a new batch only once the previous one has left
        # entirely. A request whose sequences finish is complete at once (they stop decoding, memory is freed),
        # but its place stays idle until the whole batch is done: that idle capacity is the baseline's cost.
        # A batch member preempted by recompute waits at the front and opens the next batch.
        return not self._swapped and (self.config.mode == "continuous" or not self._running)

    def _admit_waiting(self, plan: StepPlan) -> bool:
        num_seqs, num_tokens = self.num_running_seqs, 0
        while self._waiting:
            group = self._waiting[0]
            live = group.live
            # NOTE: the budget counts the whole prompt, before knowing its prefix-cache hits (conservative).
            tokens = sum(group.prefill_lens())
            if group.shares_prompt and self.kv.policy != "paged":
                tokens *= len(live)  # contiguous sequences share no blocks: each computes the prompt (_admit)
            if num_seqs + len(live) > self.config.max_num_seqs:
                break
            # NOTE: the first group of a step always passes the token budget: a fresh prompt is within it
            # (add_request checks), a recompute (prompt + generated) may exceed it and then runs alone.
            if num_tokens and num_tokens + tokens > self.config.max_num_batched_tokens:
                break
            entries = self._admit(group, live) if self._above_watermark(group.prefill_lens()) else None
            if entries is None:
                break
            self._waiting.popleft()
            group.set_status(RUNNING)
            bisect.insort(self._running, group, key=lambda g: g.arrival_order)
            plan.prefills += entries
            num_seqs, num_tokens = num_seqs + len(live), num_tokens + tokens
        return bool(plan.prefills)

    def _above_watermark(self, prefill_lens: list[int]) -> bool:
        """Would admitting prefills of these lengths leave the watermark free? NOTE: counts blocks before any
        prefix-cache hit (conservative)."""
        need = sum(-(-n // self.kv.block_size) for n in prefill_lens)
        return not self._watermark_blocks or self.kv.num_free_blocks - need >= self._watermark_blocks

    def _admit(self, group: SequenceGroup, live: tuple[Sequence, ...]) -> list[ScheduledSeq] | None:
        """Give the group's live sequences their prefill memory; the prefill entries, or None with nothing changed."""
        kv, req, rid = self.kv, group.request, group.request_id
        if group.shares_prompt:  # fresh: one prompt, shared by all n (or k) sequences
            ids = [s.seq_id for s in live]
            cached = kv.admit(ids, req.prompt_len, [s.final_len for s in live], req.prompt_token_ids)
            if cached is None:
                return None
            computed = min(cached, req.prompt_len - 1)  # the last prompt token is always fed: its logits are sampled
            first = ScheduledSeq(ids[0], rid, computed, req.prompt_len - computed, kv.block_table(ids[0]))
            return [first] + [sibling_entry(kv, first, i) for i in ids[1:]]
        # After recompute: each live sequence alone, prompt + generated tokens, all or nothing. NOTE: no token
        # ids are passed (the scheduler never sees generated tokens), so a recompute gets no prefix-cache hits.
        done: list[int] = []
        for seq in live:
            if kv.admit([seq.seq_id], seq.prefill_len, [seq.final_len]) is None:
                for seq_id in done:
                    kv.free(seq_id)
                return None
            done.append(seq.seq_id)
        return [ScheduledSeq(s.seq_id, rid, 0, s.prefill_len, kv.block_table(s.seq_id)) for s in live]

    def _decode_running(self, plan: StepPlan) -> None:
        remaining = deque(self._running)  # FCFS: earliest arrival first
        kept: list[SequenceGroup] = []
        while remaining:
            group = remaining.popleft()
            while not self._can_grow(group):
                victim = remaining.pop() if remaining else group  # the latest-arrived running group
                self._preempt(victim, plan)
                if victim is group:
                    break
            else:
                plan.decodes += self._append(group, plan)
                kept.append(group)
        self._running = kept

    def _can_grow(self, group: SequenceGroup) -> bool:
        ids = group.live_seq_ids
        if self.kv.policy != "paged":  # contiguous: each sequence grows inside its own reservation
            return all(self.kv.can_append(i) for i in ids)
        return blocks_to_grow(self.kv, ids, 1) <= self.kv.num_free_blocks

    def _append(self, group: SequenceGroup, plan: StepPlan) -> list[ScheduledSeq]:
        kv, rid, entries = self.kv, group.request_id, []
        for seq_id in group.live_seq_ids:
            computed = kv.num_tokens(seq_id)
            copies = kv.append_slots(seq_id, 1)
            if copies is None:
                raise RuntimeError(f"seq {seq_id}: expected room for one more slot (checked before), found none")
            plan.blocks_to_copy += copies
            entries.append(ScheduledSeq(seq_id, rid, computed, 1, kv.block_table(seq_id)))
        return entries

    def _preempt(self, group: SequenceGroup, plan: StepPlan) -> None:
        ids = group.live_ids()
        self._num_preemptions += 1
        plan.preempted.append(group.request_id)
        if self.config.preemption == "swap" and self.kv.can_swap_out(ids):
            plan.blocks_to_swap_out += self.kv.swap_out(ids)
            group.set_status(SWAPPED)
            bisect.insort(self._swapped, group, key=lambda g: g.arrival_order)
            return
        for seq_id in ids:
            self.kv.free(seq_id)
        group.shares_prompt = False
        group.set_status(WAITING)
        self._waiting.appendleft(group)  # victims go latest-first, so the earliest ends up at the front

    def _swap_in(self, plan: StepPlan) -> None:
        num_seqs = self.num_running_seqs
        while self._swapped:
            group = self._swapped[0]
            ids = group.live_ids()
            if num_seqs + len(ids) > self.config.max_num_seqs or not fits_swap_in(self.kv, ids, self._watermark_blocks):
                break
            plan.blocks_to_swap_in += self.kv.swap_in(ids)
            self._swapped.pop(0)
            group.set_status(RUNNING)
            plan.decodes += self._append(group, plan)
            bisect.insort(self._running, group, key=lambda g: g.arrival_order)
            num_seqs += len(ids)

    # --- the executor's report -----------------------------------------------------------------------
    def finish_step(self, plan: StepPlan, outcome: StepOutcome) -> StepResult:
        """Apply what happened in `plan`: every scheduled sequence sampled one token; beams are re-chosen
        (unlisted ones freed FIRST, then repeated parents forked); finished sequences free their memory at once.

        NOTE: a sequence also finishes when it has generated output_len tokens (the simulator's rule, the engine's
        max_tokens), and for beam search all k beams end together: one finished beam finishes the group.
        """
        if plan is not self._outstanding:
            raise ValueError("finish_step() expects the plan the last schedule() returned")
        self._outstanding = None
        self._version += 1
        for entry in plan.prefills + plan.decodes:
            seq = self._seqs.get(entry.seq_id)
            if seq is not None and seq.status is RUNNING:  # an abort in between leaves it FINISHED
                seq.num_generated += 1
        for seq_id in outcome.finished_seq_ids:  # checked before beams are re-chosen: a dropped beam may be named
            seq = self._seqs.get(seq_id)
            if seq is None or seq.status not in (RUNNING, FINISHED):
                raise ValueError(f"finished_seq_ids: expected running sequences, found {seq_id} ({seq and seq.status})")
        beams_done = {self._seqs[i].request_id for i in outcome.finished_seq_ids}
        new_beams = {rid: self._reselect_beams(rid, parents) for rid, parents in outcome.beam_parents.items()}
        finished: list[int] = []
        done_ids = outcome.finished_seq_ids
        for group in list(self._running):
            live = group.live
            ending = [s for s in live if s.num_generated >= s.output_len or s.seq_id in done_ids]
            if group.is_beam_search and (ending or group.request_id in beams_done):
                ending = live
            for seq in ending:
                self.kv.free(seq.seq_id)
            if ending:
                group.finish(ending)
            if group.is_finished:
                group.status = FINISHED
                self._running.remove(group)
                finished.append(group.request_id)
        return StepResult(finished, new_beams)

    def _reselect_beams(self, request_id: int, parents: list[int]) -> list[int]:
        group = self._group(request_id)
        for dropped in reselect_beams(self.kv, group, parents, lambda n: self._new_seq(group.request, n)):
            del self._seqs[dropped.seq_id]
        return [s.seq_id for s in group.seqs]

    # --- jumping over runs of identical decode steps (the simulator's fast path) --------------------------
    def decode_run_length(self, max_steps: int) -> int:
        """How many of the next schedule()/finish_step() rounds (at most max_steps) are GUARANTEED to be plain
        decodes of exactly the current running set: no admission, swap, preemption, copy or finish.

        Free memory only shrinks during such a run, so a waiting group that cannot be admitted now cannot be
        admitted in it. Finishes come from output_len (the simulator's rule); the caller caps max_steps.
        """
        if max_steps < 1 or not self._running or self._swapped or self._outstanding is not None:
            return 0
        state = (self._version, self.kv.num_free_blocks)
        answer = self._last_run.get(state, max_steps)
        if answer is None:
            blocked = self._waiting and self._may_admit() and self._head_may_fit()
            answer = 0 if blocked else max_plain_run(self.kv, self._running, max_steps)
            self._last_run = RunMemo(state, max_steps, answer)
        return answer

    def _head_may_fit(self) -> bool:
        """Could the first waiting group be admitted now? (True when unsure: the run is then 0 steps.)"""
        group = self._waiting[0]
        if self.num_running_seqs + len(group.live) > self.config.max_num_seqs:
            return False
        return self._above_watermark(group.prefill_lens()) and group_may_fit(self.kv, group)

    def advance_decode_run(self, k: int) -> None:
        """Apply exactly the state change of k rounds of plain decode steps (see decode_run_length), with the
        same block ids as stepping one token at a time (appends go in step order, see append_in_step_order)."""
        allowed = self.decode_run_length(k)
        if k < 1 or allowed < k:
            raise ValueError(f"advance_decode_run: k must be in [1, {allowed}] (the guaranteed run now), got {k}")
        self._version += 1
        advance_groups(self.kv, self._running, k)

    # --- read-only views for executors and metrics ----------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_swapped(self) -> int:
        return len(self._swapped)

    @property
    def num_running_seqs(self) -> int:
        return sum(len(g.live) for g in self._running)

    @property
    def num_preemptions(self) -> int:
        return self._num_preemptions

    def waiting_request_ids(self) -> list[int]:
        return [g.request_id for g in self._waiting]

    def running_request_ids(self) -> list[int]:
        return [g.request_id for g in self._running]

    def swapped_request_ids(self) -> list[int]:
        return [g.request_id for g in self._swapped]

    def seq_ids(self, request_id: int) -> list[int]:
        """The request's current sequences (finished ones included, dropped beams not), in beam order."""
        return [s.seq_id for s in self._group(request_id).seqs]

    def num_generated(self, seq_id: int) -> int:
        return self._seqs[seq_id].num_generated

    def group_status(self, request_id: int) -> SequenceStatus:
        return self._group(request_id).status

    def is_finished(self, request_id: int) -> bool:
        return self._group(request_id).status is FINISHED

    def request(self, request_id: int) -> Request:
        return self._group(request_id).request

    def _group(self, request_id: int) -> SequenceGroup:
        if request_id not in self._groups:
            raise KeyError(f"unknown request {request_id}")
        return self._groups[request_id]
