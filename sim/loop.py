"""The event loop: the serving engine with a simulated clock.

The loop plays the executor's part. Each iteration it asks the shared `Scheduler` for a `StepPlan`,
prices it with a cost model (the clock advances by the step's time), decides the outcome from the
workload's true lengths, and reports it back with `finish_step`: the same calls the reference engine
makes around a real forward pass. Three kinds of event live on one heap, ordered by the key
(time, kind, sequence number):

    ARRIVAL   a request reaches the server: scheduler.add_request         (first at equal times, so the
    STEP_END  a step's forward pass is done: scheduler.finish_step          next step sees every request
    SCHEDULE  start the next step: scheduler.schedule, priced               that arrived by then)

Fast-forward (sim/fastforward.py): when the next steps are plain decodes of the same batch, the loop applies
a whole run of them at once and books its steps one by one with cheap arithmetic; the results are those of
stepping token by token (`jump=False`), bit for bit.

Per request the loop records when it arrived, was first scheduled, produced its first token, each later
token (the largest gap) and its last: the latency metrics of sim/metrics.py.
"""
from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from . import fastforward
from .cost import check_step_time
from .kv.base import SHARE_NAMES, as_seen
from .limits import MAX_TIME_S
from .metrics import StepLog, StepTotals, Table, request_table
from .plan import StepOutcome, StepPlan
from .request import Request
from .scheduler import Scheduler

ARRIVAL, STEP_END, SCHEDULE = 0, 1, 2  # tie-break priority at equal times (lower first)
EPOCH_TRIM = 4096  # an open decode epoch's step ends kept before the first ones no member reads are dropped


@dataclass(slots=True)
class LoopResult:
    requests: Table  # per request (sim.metrics.REQUEST_COLUMNS)
    steps: Table | None  # per step (sim.metrics.STEP_COLUMNS); None when the loop kept only its totals
    step_totals: tuple[int, int, float | None]  # (steps, sum of their running requests, their seconds or None)
    memory_integral: dict[str, float]  # slot-seconds of each kind over [start_time, end_time]
    start_time: float  # the first arrival
    end_time: float  # the end of the last step
    num_events: int  # events popped from the heap (an implementation counter: how much the jump saved)
    extrapolated_steps: int = 0  # steps priced outside the cost model's calibrated range (`in_range`; 0 without one)
    extrapolated_time: float = 0.0  # their simulated seconds
    # speculative decoding: draft tokens verified, of them accepted, and lookahead slot-seconds (the slots the drafts
    # held during their steps: token states of the breakdown while they exist)
    speculation: tuple[int, int, float] = (0, 0, 0.0)


class _RequestTimes:
    """Per request (by index): the times the latency metrics are made of; NaN until they happen. NOTE: plain
    Python lists, not numpy arrays: the loop touches single items millions of times (arrays() at the end)."""

    def __init__(self, count: int) -> None:
        nan = math.nan
        self.first_scheduled = [nan] * count  # start of the first step that feeds one of its tokens
        self.first_token = [nan] * count  # end of the first step that samples for it
        self.last_token = [nan] * count
        self.max_gap = [0.0] * count  # the largest time between two of its consecutive token steps
        self.token_steps = [0] * count  # steps that sampled at least one token for it (a verify step: its tokens kept)
        self.finish = [nan] * count
        self.preemptions = [0] * count

    def sampled(self, i: int, now: float, tokens: int = 1) -> None:
        if self.token_steps[i]:
            gap = now - self.last_token[i]
            if gap > self.max_gap[i]:
                self.max_gap[i] = gap
        else:
            self.first_token[i] = now
        self.last_token[i] = now
        self.token_steps[i] += tokens

    def arrays(self) -> dict[str, np.ndarray]:
        ints = ("token_steps", "preemptions")
        return {name: np.array(getattr(self, name), dtype=np.int64 if name in ints else float)
                for name in ("first_scheduled", "first_token", "last_token", "max_gap", *ints, "finish")}  # fmt: skip


class Simulator:
    """Serve `requests` (any order; sorted by arrival here) with `scheduler`, timing steps with `cost`.

    `block_bytes`: bytes of one KV block (block_size * kv_bytes_per_token), to price swaps.
    `seed`: the beam-search scores' generator. `jump`: fast-forward over runs of identical decode steps.
    `validate`: after each run, check the booked memory against the KV manager's own breakdown (O(seqs); tests).
    `on_step(simulator, step)`: an observer called after every step ends, with its `StepPlan`, or after a
    fast-forwarded run with its `fastforward.DecodeRun`; it may read `simulator.now`, `.kv` and `.scheduler`
    (the figures' probes). `stop_at`: times the fast-forward never jumps across, like arrivals.
    `in_range(num_prefill_tokens, num_decode_seqs, num_context_tokens, num_prefill_pairs)`: the cost model's
    calibrated range (sim.cost.PiecewiseCostModel.in_range); the steps priced outside it are counted.
    `shared_reads`: give the cost model each step's num_shared_context_tokens (O(blocks) a step; else 0).
    `step_table`: keep the per-step table (else only its totals: steps, mean batch; a million-request run's table
    would take gigabytes).
    `acceptance`: speculative decoding's acceptance model (sim.speculative.AcceptanceModel), which draws how many draft
    tokens each verify entry keeps; needed when the scheduler plans drafts (num_speculative_tokens > 0).
    """

    def __init__(self, scheduler: Scheduler, cost, requests: list[Request], *, block_bytes: int,
                 seed: int = 0, jump: bool = True, validate: bool = False, progress: bool = False,
                 on_step=None, stop_at=(), in_range=None, shared_reads: bool = False,
                 step_table: bool = True, acceptance=None) -> None:  # fmt: skip
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
        self.block_bytes, self.jump, self.validate = block_bytes, jump, validate
        self.on_step = on_step
        self.stop_at = sorted(stop_at)
        self.rng = np.random.default_rng([seed, 0xBEA])  # beam scores: a stream apart from the workload's
        self.progress = tqdm(total=len(requests), unit="req", disable=not progress)
        self.times = _RequestTimes(len(self.requests))
        self.beam_scores: dict[int, float] = {}  # seq id -> cumulative log-prob of a beam
        self.log = StepLog() if step_table else StepTotals()
        self.integral = dict.fromkeys(SHARE_NAMES, 0.0)
        self.now = 0.0
        self.busy = False  # a step is in flight or about to start
        self.idle_since: float | None = None
        self.idle_counts: tuple[int, ...] = ()
        self.next_arrival = math.inf
        self.next_index = 0  # the next request to arrive
        self.arrival_times = [r.arrival_time for r in self.requests]
        self.last_step_end = 0.0
        # NOTE: a hint only: skipping a fast-forward attempt never changes results (the step is then scheduled
        # normally); it saves the attempt's O(seqs) cost where a run is known or likely to be impossible.
        self.may_run = True
        # Decode epochs (Scheduler.open_decode_epoch): runs whose cost does not grow with the batch, where nothing
        # watches every step (no observer, no check, no range, no shared reads). The token times of the epoch's
        # requests are then booked when each finishes or the epoch closes, from the end of every step in it.
        self.epochs = (jump and not validate and on_step is None and in_range is None and not shared_reads
                       and self.kv.has_decode_epochs)  # fmt: skip
        self.epoch_members: dict[int, int] = {}  # the open epoch's unfinished requests (index -> the step they joined)
        self.epoch_ends: list[float] = []  # the end of each of its steps
        # the differences of consecutive step ends (step j's end minus step j - 1's) that no later one reaches or
        # passes, as (j, difference), differences decreasing: the largest from any step on is the first with j beyond
        self.epoch_gaps: list[tuple[int, float]] = []
        self.epoch_trim_at = EPOCH_TRIM  # its lists lose the steps no member needs once they are this long
        self.epoch_running = False  # inside a run of the epoch

    # --- the loop ---------------------------------------------------------------------------------
    def run(self) -> LoopResult:
        heap: list[tuple[float, int, int, object]] = []
        handlers = {ARRIVAL: self._on_arrival, STEP_END: self._on_step_end, SCHEDULE: self._on_schedule}
        seq = 0
        if self.requests:
            self.next_arrival = self.requests[0].arrival_time
            heap.append((self.next_arrival, ARRIVAL, seq, 0))
        num_events, self.inline_events = 0, 0
        while heap:
            self.now, kind, _, payload = heapq.heappop(heap)
            num_events += 1
            for time, new_kind, new_payload in handlers[kind](payload):
                seq += 1
                heapq.heappush(heap, (time, new_kind, seq, new_payload))
        self.progress.close()
        if self.scheduler.has_unfinished():
            raise RuntimeError("expected every request served when events run out, found some unfinished")
        start = self.requests[0].arrival_time if self.requests else 0.0
        table = request_table(self.requests, self.times.arrays())
        return LoopResult(table, self.log.to_table(), self.log.totals(), self.integral, start,
                          max(self.last_step_end, start), num_events + self.inline_events, self.extrapolated_steps,
                          self.extrapolated_time, tuple(self.speculation))  # fmt: skip

    def _on_arrival(self, index: int) -> list:
        self.scheduler.add_request(self.requests[index])
        events = []
        self.next_index = index + 1
        if index + 1 < len(self.requests):
            self.next_arrival = self.requests[index + 1].arrival_time
            events.append((self.next_arrival, ARRIVAL, index + 1))
        else:
            self.next_arrival = math.inf
        self.may_run = False  # the next step most likely admits it: don't try a decode run first
        if not self.busy:  # wake the idle engine (after any other arrival at this very time)
            self.busy = True
            events.append((self.now, SCHEDULE, None))
        return events

    def _on_schedule(self, _) -> list:
        if self.idle_since is not None:  # close the idle period: the pool sat as it was
            self._integrate(self.now - self.idle_since, self.idle_counts)
            self.idle_since = None
        while self.jump and (self.may_run or self.scheduler.decode_epoch_open):
            while self.stop_at and self.stop_at[0] <= self.now:
                self.stop_at.pop(0)
            stop = self.stop_at[0] if self.stop_at else math.inf
            horizon = min(self.next_arrival, stop)
            run = self._epoch_run(self.next_arrival, stop) if self.epochs else False
            if run is False:  # run by run: no epoch here, or none for these sequences now
                run = fastforward.decode_run(self.scheduler, self.cost, self.now, horizon, self.shared_reads)
                if run is not None:
                    self._book_run(run)
            if run is None:
                break
            if not run.durations:  # an epoch's run that preempted every member has no step: schedule again
                return [(self.now, SCHEDULE, None)]
            if not (run.finished_request_ids and run.end < horizon and self.on_step is None
                    and not self.scheduler.num_waiting + self.scheduler.num_swapped):  # fmt: skip
                return [(run.end, STEP_END, run)]
            # A finish with nobody waiting and no arrival before the run's end: the events would be the run's end, then
            # a schedule at once (nothing else happens meanwhile), so both are taken here, without the event queue.
            self.now = run.end
            self._run_ended(run)
            self.inline_events += 2  # (counted: num_events stays the events of the loop's logic, however taken)
        self.may_run = True
        plan = self.scheduler.schedule()  # (it closes an open epoch, or takes its decodes: _settle_epoch books)
        epoch_step = self.scheduler.pending_epoch_step  # (sequences, K/V read) of decodes the plan does not list
        for request_id in plan.preempted:
            self.times.preemptions[self.index[request_id]] += 1
        if plan.is_empty and epoch_step is None:
            self.scheduler.finish_step(plan, StepOutcome())
            if plan.preempted:  # a preemption freed memory: try again at once
                return [(self.now, SCHEDULE, None)]
            self.busy = False
            self.idle_since, self.idle_counts = self.now, self._counts()
            return []
        first_scheduled = self.times.first_scheduled
        for entry in plan.prefills:
            i = self.index[entry.request_id]
            if entry.num_new_tokens and math.isnan(first_scheduled[i]):
                first_scheduled[i] = self.now
        counts = self._counts()
        duration = self._price(plan, epoch_step)
        # A CPU offload tier's reloads (sim/kv/offload.py) are priced as swaps are: over PCIe, before the forward pass,
        # so the whole step waits for them (the admitted requests' TTFT included). NOTE: its offloads (GPU -> CPU
        # copies of evicted blocks) are not charged: a modelling approximation, taken as overlapped with compute on
        # a copy stream of their own, as vLLM's offloading connector stores blocks.
        reloads = sum(not copy.to_cpu for copy in self.kv.take_tier_copies())
        if reloads:
            duration += self.cost.swap_time(reloads * self.block_bytes, reloads)
        self._record(duration, plan, counts, epoch_step)
        return [(self.now + duration, STEP_END, (plan, *self._outcome(plan), epoch_step))]

    def _on_step_end(self, payload) -> list:
        self.last_step_end = self.now
        if isinstance(payload, (fastforward.DecodeRun, fastforward.EpochRun)):  # applied and booked, but its finishes
            self._run_ended(payload)
            return [(self.now, SCHEDULE, None)]
        plan, outcome, beam_scores, epoch_step = payload
        if epoch_step is not None:  # the epoch's members sampled in this step too (booked before it may close)
            self._epoch_ends([self.now])
        result = self.scheduler.finish_step(plan, outcome)
        if epoch_step is not None:
            members = self.epoch_members
            for request_id in result.finished_request_ids:
                i = self.index[request_id]
                if i in members:  # (gone if the epoch closed: then all were booked)
                    self._settle(i, members.pop(i), len(self.epoch_ends))
        if plan.num_draft_tokens:  # a verify step: a request's tokens count (1 + its accepted drafts)
            kept: dict[int, int] = {}
            for entry in plan.entries:
                if entry.sample:
                    tokens = 1 + outcome.num_accepted.get(entry.seq_id, 0)
                    kept[entry.request_id] = max(tokens, kept.get(entry.request_id, 0))
            for request_id, tokens in kept.items():
                self.times.sampled(self.index[request_id], self.now, tokens)
        else:
            sampled = {entry.request_id for entry in plan.entries if entry.sample}
            for request_id in sampled:
                self.times.sampled(self.index[request_id], self.now)
        for request_id, seq_ids in result.new_beam_seq_ids.items():
            old_ids, scores = beam_scores[request_id]
            for seq_id in old_ids:
                self.beam_scores.pop(seq_id, None)
            self.beam_scores.update(zip(seq_ids, scores))
        for request_id in result.finished_request_ids:
            self.times.finish[self.index[request_id]] = self.now
        if result.finished_request_ids and self.scheduler.num_waiting:
            self.may_run = False  # freed memory: the next step most likely admits a waiting request
        self.progress.update(len(result.finished_request_ids))
        if self.on_step is not None:
            self.on_step(self, plan)
        return [(self.now, SCHEDULE, None)]

    def _run_ended(self, run: fastforward.DecodeRun | fastforward.EpochRun) -> None:
        """A fast-forwarded run (applied and booked) ends now: its finishes."""
        self.last_step_end = self.now
        for request_id in run.finished_request_ids:
            self.times.finish[self.index[request_id]] = self.now
        self.progress.update(len(run.finished_request_ids))
        if self.on_step is not None:
            self.on_step(self, run)

    # --- the executor's part: price a plan, decide its outcome ----------------------------------------
    def _price(self, plan: StepPlan, epoch_step: tuple[int, int] | None = None) -> float:
        """Forward pass (if any sequence runs) plus swap traffic. NOTE: swaps are not overlapped with compute
        (vLLM v0 waits for them before the forward pass); copy-on-write block copies are GPU-internal and
        cost ~microseconds, so they are not priced (a modelling approximation). `epoch_step`: decodes a decode
        epoch takes in this step, not listed in the plan (Scheduler.pending_epoch_step)."""
        duration = 0.0
        if plan.prefills or plan.decodes or epoch_step:
            shared = plan.num_shared_context_tokens(self.kv.block_size) if self.shared_reads else 0
            num_decodes, context = epoch_step or (0, 0)
            shape = (plan.num_prefill_tokens, len(plan.decodes) + num_decodes, plan.num_context_tokens + context,
                     plan.num_prefill_pairs, shared)  # fmt: skip
            if plan.num_draft_tokens:  # speculative decoding: a verify entry's drafts are priced as a chunk after it
                shape = (shape[0] + plan.num_draft_tokens, shape[1], shape[2], shape[3] + plan.num_draft_pairs, shared)
            duration = self.cost.step_time(*shape)
            if not duration <= MAX_TIME_S:  # (NaN too) a cost model that is no machine's: one line, not a run
                check_step_time(duration, shape)
            if self.in_range is not None and not self.in_range(*shape):
                self.extrapolated_steps += 1
                self.extrapolated_time += duration
        swapped = len(plan.blocks_to_swap_out) + len(plan.blocks_to_swap_in)
        if swapped:
            duration += self.cost.swap_time(swapped * self.block_bytes, swapped)
            if not duration <= MAX_TIME_S:
                check_step_time(duration, (f"{swapped} blocks swapped",))
        return duration

    def _outcome(self, plan: StepPlan) -> tuple[StepOutcome, dict]:
        """Every sampling entry samples one token; a sequence finishes when it reaches its true output length.
        Beam search re-chooses its k beams each step (except the last: all k end together). Also returns
        per beam search (its current seq ids, the survivors' scores in beam_parents order)."""
        outcome, beam_scores = StepOutcome(), {}
        beams: dict[int, list[int]] = {}
        for entry in plan.entries:
            if not entry.sample:
                continue
            request = self.scheduler.request(entry.request_id)
            accepted = 0
            if entry.num_draft_tokens:  # a verify entry: how many drafts the target keeps (sim.speculative)
                accepted = outcome.num_accepted[entry.seq_id] = self.acceptance.accepted(entry.num_draft_tokens)
                self.speculation[0] += entry.num_draft_tokens
                self.speculation[1] += accepted
            if self.scheduler.num_generated(entry.seq_id) + 1 + accepted >= request.output_len:
                outcome.finished_seq_ids.add(entry.seq_id)
            elif request.beam_width > 1:
                beams.setdefault(entry.request_id, []).append(entry.seq_id)
        for request_id, seq_ids in beams.items():
            parents, scores = self._choose_beams(seq_ids)
            outcome.beam_parents[request_id] = parents
            beam_scores[request_id] = (seq_ids, scores)
        return outcome, beam_scores

    def _choose_beams(self, seq_ids: list[int]) -> tuple[list[int], list[float]]:
        """Each of the k beams proposes 2 next tokens with random log-probs; the k best candidates survive.
        Modelling approximation: log-probs are -Exponential(1) draws, not a model's (shapes forks and frees only)."""
        k = len(seq_ids)
        base = np.array([self.beam_scores.get(s, 0.0) for s in seq_ids])
        candidates = np.repeat(base, 2) - self.rng.standard_exponential(2 * k)
        best = np.argsort(-candidates, kind="stable")[:k]
        return [seq_ids[c // 2] for c in best.tolist()], candidates[best].tolist()

    # --- bookkeeping -----------------------------------------------------------------------------------
    def _book_run(self, run: fastforward.DecodeRun) -> None:
        """Book every step of a fast-forwarded run: memory, the step table, and each request's token times."""
        # Hints for the next attempt: a run ends at a finish, an arrival or a memory shortage; after a finish with
        # nobody waiting the next step is likely a plain decode again, else most likely not. NOTE: a hint only.
        self.may_run = run.frees
        if self.validate and not run.frees:  # (a finish frees memory after the last step)
            self._check_pool(run.counts[-1])
        seen = run.seen_counts()
        durations = run.durations
        if self.in_range is not None:  # step j of the run reads the K/V held before it plus j + 1 tokens a sequence
            num_seqs, context = len(run.seq_ids), sum(run.num_tokens_before)
            for j, duration in enumerate(durations):
                if not self.in_range(0, num_seqs, context + num_seqs * (j + 1), 0, run.shared_context_tokens):
                    self.extrapolated_steps += 1
                    self.extrapolated_time += duration
        self._book_steps(run.starts, durations, seen, len(run.seq_ids), run.num_running, run.num_waiting)
        # Token times: each step ends with a token for every running request, so the gaps are the first step's
        # end minus the last token before, then the differences of consecutive step ends (the same float
        # subtractions stepping makes).
        ends = [start + duration for start, duration in zip(run.starts, run.durations)]
        first_end = ends[0]
        later = max((b - a for a, b in zip(ends, ends[1:])), default=0.0)
        times, index = self.times, self.index
        for request_id in run.request_ids:
            i = index[request_id]
            gap = max(first_end - times.last_token[i], later)
            if gap > times.max_gap[i]:
                times.max_gap[i] = gap
            times.last_token[i] = run.end
            times.token_steps[i] += run.num_steps

    def _epoch_run(self, next_arrival: float, stop: float) -> fastforward.EpochRun | bool | None:
        """The next run of the open decode epoch (opened here if the hint allows and the scheduler can), applied and
        booked; None: the step is scheduled normally (which closes the epoch); False: a plain decode run the epoch
        cannot take (the KV manager has none for these sequences now): run by run."""
        scheduler = self.scheduler
        if not scheduler.decode_epoch_open:
            if not self.may_run:
                return None
            opened = scheduler.open_decode_epoch(self._settle_epoch)
            if not opened:
                return opened
            self.epoch_members = {self.index[rid]: 0 for rid in scheduler.running_request_ids()}
        num_running, num_waiting = scheduler.num_running, scheduler.num_waiting
        waiting = num_waiting + scheduler.num_swapped > 0
        self.epoch_running = True  # an epoch closing inside (its last members left) is settled below, once booked
        joined_at = len(self.epoch_ends)
        try:
            run = fastforward.epoch_run(scheduler, self.cost, self.now, next_arrival, stop)
        finally:
            self.epoch_running = False
        for request_id in scheduler.joined_requests():  # admitted while it was open, joined before this run
            self.epoch_members[self.index[request_id]] = joined_at
        if run is None:
            if not scheduler.decode_epoch_open:  # it closed (a group that could not join)
                self._settle_epoch()
            return None
        self.may_run = True
        members, ends = self.epoch_members, self.epoch_ends
        if run.preempted:  # a step that preempted (the run's only one, if any): its counts are those after it
            waiting, num_running = True, scheduler.num_running + len(run.finished_request_ids)
            num_waiting = scheduler.num_waiting
            for request_id in run.preempted:  # their tokens until now, booked
                i = self.index[request_id]
                self.times.preemptions[i] += 1
                self._settle(i, members.pop(i), len(ends))
            if not run.durations:  # nobody left to step: the epoch closed
                self._settle_epoch()
                return run
        seen = [as_seen(c, True) for c in run.counts] if waiting else run.counts
        durations = run.durations
        if run.starts[-1] >= next_arrival and self.log.kept:  # requests arrived during it, queueing: step by step
            arrivals, first = self.arrival_times, self.next_index
            num_waiting = [num_waiting + bisect.bisect_right(arrivals, t, first) - first for t in run.starts]
        self._book_steps(run.starts, durations, seen, run.num_seqs, num_running, num_waiting, len(run.preempted))
        self._epoch_ends(run.starts[1:] + [run.end])  # (a step starts where the one before ended: the same floats)
        for request_id in run.finished_request_ids:
            i = self.index[request_id]
            self._settle(i, members.pop(i), len(ends))
        if not scheduler.decode_epoch_open:  # the last members left: it closed
            self._settle_epoch()
        return run

    def _epoch_ends(self, new_ends: list[float]) -> None:
        """The ends of the open epoch's next steps, and the differences no later one reaches (see epoch_gaps)."""
        ends, gaps = self.epoch_ends, self.epoch_gaps
        for end in new_ends:
            if ends:
                diff = end - ends[-1]
                while gaps and gaps[-1][1] <= diff:
                    gaps.pop()
                gaps.append((len(ends), diff))
            ends.append(end)
        if len(ends) > self.epoch_trim_at:  # an epoch may stay open for a whole run: keep what members still read
            first = min(self.epoch_members.values(), default=len(ends))
            del ends[:first]
            for i in self.epoch_members:
                self.epoch_members[i] -= first
            gaps[:] = [(j - first, diff) for j, diff in gaps if j > first]  # (a member reads those after its first)
            self.epoch_trim_at = max(EPOCH_TRIM, 2 * len(ends))

    def _book_steps(self, starts: list[float], durations: list[float], seen: list[tuple[int, ...]], num_seqs: int,
                    num_running: int, num_waiting: int, num_preempted: int = 0) -> None:  # fmt: skip
        """A run's plain decode steps into the memory integral and the step log (the seen slot counts of each;
        `num_preempted`: the requests a one-step run preempted)."""
        integral = self.integral
        t0, t1, t2, t3, t4 = (integral[name] for name in SHARE_NAMES)
        for duration, (c0, c1, c2, c3, c4) in zip(durations, seen):  # each kind's float sum in stepping's order
            t0 += duration * c0
            t1 += duration * c1
            t2 += duration * c2
            t3 += duration * c3
            t4 += duration * c4
        integral.update(zip(SHARE_NAMES, (t0, t1, t2, t3, t4)))
        self.log.extend_run(starts, durations, seen, num_seqs, num_running, num_waiting, num_preempted)

    def _settle(self, i: int, first: int, end: int) -> None:
        """Request i's token times after the epoch's steps first .. end - 1 (end: all so far), each of which sampled
        a token for it: the gaps are the first one's end minus its last token before, then the differences of
        consecutive step ends (the same float subtractions stepping makes, and the same largest)."""
        if first >= end:
            return
        times, ends, gaps = self.times, self.epoch_ends, self.epoch_gaps
        later = bisect.bisect_right(gaps, (first, math.inf))  # the first difference after step `first`
        gap = max(ends[first] - times.last_token[i], gaps[later][1] if later < len(gaps) else 0.0)
        if gap > times.max_gap[i]:
            times.max_gap[i] = gap
        times.last_token[i] = ends[end - 1]
        times.token_steps[i] += end - first

    def _settle_epoch(self, _steps: int | None = None) -> None:
        """The epoch closed (on_close passes its `_steps`, every one of them in epoch_ends, whose start may have been
        trimmed): book the token times of the requests still in it."""
        if self.epoch_running:
            return
        end = len(self.epoch_ends)
        for i, first in self.epoch_members.items():
            self._settle(i, first, end)
        self.epoch_members, self.epoch_ends, self.epoch_gaps = {}, [], []
        self.epoch_trim_at = EPOCH_TRIM

    def _check_pool(self, expected: tuple[int, ...]) -> None:
        found = self.kv.breakdown(False).counts()
        if found != tuple(expected):
            raise RuntimeError(f"decode run bookkeeping: expected pool counts {tuple(expected)}, found {found}")

    def _counts(self) -> tuple[int, ...]:
        """The pool's five slot counts now; free slots count as external waste while a request waits."""
        return as_seen(self.kv.breakdown(False).counts(), self.scheduler.num_waiting + self.scheduler.num_swapped > 0)

    def _integrate(self, duration: float, counts: tuple[int, ...]) -> None:
        integral = self.integral
        for name, count in zip(SHARE_NAMES, counts):
            integral[name] += duration * count

    def _record(self, duration: float, plan: StepPlan, counts: tuple[int, ...],
                epoch_step: tuple[int, int] | None = None) -> None:  # fmt: skip
        self._integrate(duration, counts)
        if plan.num_draft_tokens:
            self.speculation[2] += duration * plan.num_draft_tokens
        scheduler = self.scheduler
        num_decodes = epoch_step[0] if epoch_step else 0
        self.log.append((self.now, duration, len(plan.prefills), len(plan.decodes) + num_decodes, scheduler.num_running,
                         plan.num_batched_tokens + num_decodes, plan.num_prefill_tokens, *counts, scheduler.num_waiting,
                         len(plan.preempted), len(plan.blocks_to_swap_out), len(plan.blocks_to_swap_in),
                         len(plan.blocks_to_copy)))  # copies: copy-on-write and beam forks  # fmt: skip
