"""The event loop: the serving engine with a simulated clock.

The loop plays the executor's part. Each iteration it asks the shared `Scheduler` for a `StepPlan`,
prices it with a cost model (the clock advances by the step's time), decides the outcome from the
workload's true lengths, and reports it back with `finish_step`: the same calls the reference engine
makes around a real forward pass. Three kinds of event live on one heap, ordered by the key
(time, kind, sequence number):

    ARRIVAL   a request reaches the server: scheduler.add_request         (first at equal times, so the
    STEP_END  a step's forward pass is done: scheduler.finish_step          next step sees every request
    SCHEDULE  start the next step: scheduler.schedule, priced               that arrived by then)

This loop steps one step at a time (`sim.run(..., jump=False)`). The fast plane's loop (sim/fast/loop.py,
`sim.run`'s default) is this class with runs of plain decode steps applied at once: the same results, bit for bit.

Per request the loop records when it arrived, was first scheduled, produced its first token, each later
token (the largest gap) and its last: the latency metrics of sim/clock/metrics.py.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import NamedTuple

from tqdm import tqdm

from ..base.limits import MAX_TIME_S
from ..base.request import Request
from ..kv.base import SHARE_NAMES, as_seen
from ..scheduling.beam import BeamScores
from ..scheduling.plan import StepOutcome, StepPlan, StepResult
from ..scheduling.scheduler import Scheduler
from ..scheduling.speculative import tokens_kept
from ..scheduling.step_shape import shared_context_tokens, step_shape
from .cost import check_step_time
from .metrics import RequestTimes, StepLog, StepTotals, Table, request_table

ARRIVAL, STEP_END, SCHEDULE = 0, 1, 2  # tie-break priority at equal times (lower first)


@dataclass(slots=True)
class LoopResult:
    requests: Table  # per request (sim.clock.metrics.REQUEST_COLUMNS)
    steps: Table | None  # per step (sim.clock.metrics.STEP_COLUMNS); None when the loop kept only its totals
    step_totals: tuple[int, int, float | None]  # (steps, sum of their running requests, their seconds or None)
    memory_integral: dict[str, float]  # slot-seconds of each kind over [start_time, end_time]
    start_time: float  # the first arrival
    end_time: float  # the end of the last step
    num_events: int  # events handled (an implementation counter: how much the fast plane saved)
    extrapolated_steps: int = 0  # steps priced outside the cost model's calibrated range (`in_range`; 0 without one)
    extrapolated_time: float = 0.0  # their simulated seconds
    # speculative decoding: draft tokens verified, of them accepted, and lookahead slot-seconds (the slots the drafts
    # held during their steps: token states of the breakdown while they exist)
    speculation: tuple[int, int, float] = (0, 0, 0.0)


class StepEnd(NamedTuple):
    """A step in flight (a STEP_END event's payload): what the loop decided will happen when it ends."""

    plan: StepPlan
    outcome: StepOutcome  # from the true lengths (sim.clock.loop.Simulator.outcome)
    beam_scores: dict  # beam-search request id -> (its current seq ids, the survivors' scores in beam_parents order)


class Simulator:
    """Serve `requests` (any order; sorted by arrival here) with `scheduler`, timing steps with `cost`, one step at a
    time.

    `block_bytes`: bytes of one KV block (block_size * kv_bytes_per_token), to price swaps.
    `seed`: the beam-search scores' generator.
    `on_step(simulator, step)`: an observer called after every step ends, with its `StepPlan`; it may read
    `simulator.now`, `.kv` and `.scheduler` (the figures' probes).
    `in_range(num_prefill_tokens, num_decode_seqs, num_context_tokens, num_prefill_pairs)`: the cost model's
    calibrated range (sim.clock.cost.PiecewiseCostModel.in_range); the steps priced outside it are counted.
    `shared_reads`: give the cost model each step's num_shared_context_tokens (O(blocks) a step; else 0).
    `step_table`: keep the per-step table (else only its totals: steps, mean batch; a million-request run's table
    would take gigabytes).
    `acceptance`: speculative decoding's acceptance model (sim.scheduling.speculative.AcceptanceModel), which draws how many draft
    tokens each verify entry keeps; needed when the scheduler plans drafts (num_speculative_tokens > 0).
    """

    def __init__(self, scheduler: Scheduler, cost, requests: list[Request], *, block_bytes: int, seed: int = 0,
                 progress: bool = False, on_step=None, in_range=None, shared_reads: bool = False,
                 step_table: bool = True, acceptance=None) -> None:
        self.scheduler, self.kv, self.cost = scheduler, scheduler.kv, cost
        if scheduler.config.num_speculative_tokens and acceptance is None:
            raise ValueError("num_speculative_tokens > 0: the simulator needs an acceptance model (acceptance=...)")
        self.acceptance = acceptance
        self.speculation = [0, 0, 0.0]  # drafts verified, accepted, lookahead slot-seconds (LoopResult.speculation)
        self.in_range, self.shared_reads = in_range, shared_reads
        self.extrapolated_steps, self.extrapolated_time = 0, 0.0
        self.requests = sorted(requests, key=lambda r: (r.arrival_time, r.request_id))
        self.index = {r.request_id: i for i, r in enumerate(self.requests)}
        if len(self.index) != len(self.requests):
            raise ValueError("request ids must be unique")
        self.block_bytes = block_bytes
        self.on_step = on_step
        self.beams = BeamScores(seed)
        self.progress = tqdm(total=len(requests), unit="req", disable=not progress)
        self.times = RequestTimes(len(self.requests))
        self.log = StepLog() if step_table else StepTotals()
        self.integral = dict.fromkeys(SHARE_NAMES, 0.0)
        self.now = 0.0
        self.num_events = 0  # events handled
        self.busy = False  # a step is in flight or about to start
        self.idle_since: float | None = None
        self.idle_counts: tuple[int, ...] = ()
        self.last_step_end = 0.0

    # --- the loop ---------------------------------------------------------------------------------
    def run(self) -> LoopResult:
        heap: list[tuple[float, int, int, object]] = []
        handlers = {ARRIVAL: self.on_arrival, STEP_END: self.on_step_end, SCHEDULE: self.on_schedule}
        seq = 0
        if self.requests:
            heap.append((self.requests[0].arrival_time, ARRIVAL, seq, 0))
        while heap:
            self.now, kind, _, payload = heapq.heappop(heap)
            self.num_events += 1
            for time, new_kind, new_payload in handlers[kind](payload):
                seq += 1
                heapq.heappush(heap, (time, new_kind, seq, new_payload))
        self.progress.close()
        if self.scheduler.has_unfinished():
            raise RuntimeError("expected every request served when events run out, found some unfinished")
        start = self.requests[0].arrival_time if self.requests else 0.0
        table = request_table(self.requests, self.times.arrays())
        return LoopResult(table, self.log.to_table(), self.log.totals(), self.integral, start,
                          max(self.last_step_end, start), self.num_events, self.extrapolated_steps,
                          self.extrapolated_time, tuple(self.speculation))

    def on_arrival(self, index: int) -> list:
        self.scheduler.add_request(self.requests[index])
        events = []
        if index + 1 < len(self.requests):
            events.append((self.requests[index + 1].arrival_time, ARRIVAL, index + 1))
        if not self.busy:  # wake the idle engine (after any other arrival at this very time)
            self.busy = True
            events.append((self.now, SCHEDULE, None))
        return events

    def on_schedule(self, _) -> list:
        self.end_idle()
        plan = self.schedule()
        for request_id in plan.preempted:
            self.times.preemptions[self.index[request_id]] += 1
        if plan.is_empty:
            self.finish_step(plan, StepOutcome())
            if plan.preempted:  # a preemption freed memory: try again at once
                return [(self.now, SCHEDULE, None)]
            self.busy = False
            self.idle_since, self.idle_counts = self.now, self.counts()
            return []
        first_scheduled = self.times.first_scheduled
        for entry in plan.prefills:
            i = self.index[entry.request_id]
            if entry.num_new_tokens and math.isnan(first_scheduled[i]):
                first_scheduled[i] = self.now
        counts = self.counts()
        duration = self.price(plan)
        # A CPU offload tier's reloads (sim/kv/offload.py) are priced as swaps are: over PCIe, before the forward pass,
        # so the whole step waits for them (the admitted requests' TTFT included). NOTE: its offloads (GPU -> CPU
        # copies of evicted blocks) are not charged: a modelling approximation, taken as overlapped with compute on
        # a copy stream of their own, as vLLM's offloading connector stores blocks.
        reloads = sum(not copy.to_cpu for copy in self.kv.take_tier_copies())
        if reloads:
            duration += self.cost.swap_time(reloads * self.block_bytes, reloads)
        self.record(duration, plan, counts)
        return [(self.now + duration, STEP_END, self.outcome(plan))]

    def on_step_end(self, payload: StepEnd) -> list:
        self.last_step_end = self.now
        plan, outcome, beam_scores = payload.plan, payload.outcome, payload.beam_scores
        result = self.finish_step(plan, outcome)
        if plan.num_draft_tokens:  # a verify step: a request's tokens count (1 + its accepted drafts)
            for request_id, tokens in tokens_kept(plan, outcome).items():
                self.times.sampled(self.index[request_id], self.now, tokens)
        else:
            sampled = {entry.request_id for entry in plan.entries if entry.sample}
            for request_id in sampled:
                self.times.sampled(self.index[request_id], self.now)
        for request_id, seq_ids in result.new_beam_seq_ids.items():
            old_ids, scores = beam_scores[request_id]
            self.beams.update(old_ids, seq_ids, scores)
        for request_id in result.finished_request_ids:
            self.times.finish[self.index[request_id]] = self.now
        self.progress.update(len(result.finished_request_ids))
        if self.on_step is not None:
            self.on_step(self, plan)
        return [(self.now, SCHEDULE, None)]

    # --- the loop's calls into the scheduler and the pool (the fast plane's loop routes them through its epochs) ---
    def schedule(self) -> StepPlan:
        return self.scheduler.schedule()

    def finish_step(self, plan: StepPlan, outcome: StepOutcome) -> StepResult:
        return self.scheduler.finish_step(plan, outcome)

    def counts(self) -> tuple[int, ...]:
        """The pool's five slot counts now; free slots count as external waste while a request waits."""
        return as_seen(self.kv.breakdown(False).counts(), self.scheduler.num_waiting + self.scheduler.num_swapped > 0)

    # --- the executor's part: price a plan, decide its outcome ----------------------------------------
    def price(self, plan: StepPlan) -> float:
        """Forward pass (if any sequence runs) plus swap traffic. NOTE: swaps are not overlapped with compute
        (vLLM v0 waits for them before the forward pass); copy-on-write block copies are GPU-internal and
        cost ~microseconds, so they are not priced (a modelling approximation)."""
        duration = 0.0
        if plan.num_seqs:
            shape = step_shape(plan, shared_context_tokens(plan, self.kv.block_size) if self.shared_reads else 0)
            duration = self.cost.step_time(*shape)
            if not duration <= MAX_TIME_S:  # (NaN too) a cost model that is no machine's: one line, not a run
                check_step_time(duration, tuple(shape))
            if self.in_range is not None and not self.in_range(*shape):
                self.extrapolated_steps += 1
                self.extrapolated_time += duration
        swapped = len(plan.blocks_to_swap_out) + len(plan.blocks_to_swap_in)
        if swapped:
            duration += self.cost.swap_time(swapped * self.block_bytes, swapped)
            if not duration <= MAX_TIME_S:
                check_step_time(duration, (f"{swapped} blocks swapped",))
        return duration

    def outcome(self, plan: StepPlan) -> StepEnd:
        """Every sampling entry samples one token; a sequence finishes when it reaches its true output length.
        Beam search re-chooses its k beams each step (except the last: all k end together)."""
        outcome, beam_scores = StepOutcome(), {}
        beams: dict[int, list[int]] = {}
        for entry in plan.entries:
            if not entry.sample:
                continue
            request = self.scheduler.request(entry.request_id)
            accepted = 0
            if entry.num_draft_tokens:  # a verify entry: how many drafts the target keeps (sim.scheduling.speculative)
                accepted = outcome.num_accepted[entry.seq_id] = self.acceptance.accepted(entry.num_draft_tokens)
                self.speculation[0] += entry.num_draft_tokens
                self.speculation[1] += accepted
            if self.scheduler.num_generated(entry.seq_id) + 1 + accepted >= request.output_len:
                outcome.finished_seq_ids.add(entry.seq_id)
            elif request.beam_width > 1:
                beams.setdefault(entry.request_id, []).append(entry.seq_id)
        for request_id, seq_ids in beams.items():
            parents, scores = self.beams.choose(seq_ids)
            outcome.beam_parents[request_id] = parents
            beam_scores[request_id] = (seq_ids, scores)
        return StepEnd(plan, outcome, beam_scores)

    # --- bookkeeping -----------------------------------------------------------------------------------
    def end_idle(self) -> None:
        """Close an idle period (nothing ran since idle_since): the pool sat as it was."""
        if self.idle_since is not None:
            self.integrate(self.now - self.idle_since, self.idle_counts)
            self.idle_since = None

    def integrate(self, duration: float, counts: tuple[int, ...]) -> None:
        integral = self.integral
        for name, count in zip(SHARE_NAMES, counts):
            integral[name] += duration * count

    def record(self, duration: float, plan: StepPlan, counts: tuple[int, ...]) -> None:
        """One step into the memory integral and the step log."""
        self.integrate(duration, counts)
        if plan.num_draft_tokens:
            self.speculation[2] += duration * plan.num_draft_tokens
        scheduler = self.scheduler
        self.log.append((self.now, duration, len(plan.prefills), plan.num_decode_seqs, scheduler.num_running,
                         plan.num_batched_tokens, plan.num_prefill_tokens, *counts, scheduler.num_waiting,
                         len(plan.preempted), len(plan.blocks_to_swap_out), len(plan.blocks_to_swap_in),
                         len(plan.blocks_to_copy)))  # copies: copy-on-write and beam forks
