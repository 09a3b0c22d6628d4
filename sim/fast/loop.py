"""The fast plane's event loop: sim.clock.loop's Simulator, with runs of plain decode steps applied at once.

When the next steps are plain decodes of the same batch (sim/fast/runs.py), the loop applies a whole run of them
and books its steps one by one with cheap arithmetic; where the pool allows, it keeps the batch in a decode epoch
(sim/fast/epoch.py) across runs and arrivals. The results are those of stepping token by token (sim.clock.loop.Simulator,
`sim.run(..., jump=False)`), bit for bit: every step's start and duration are the same float additions in the same
order, every memory count the same integer, every token gap the same subtraction (tests/sim/test_fastforward.py).

What it adds to the plain loop, and nothing else:
- at a SCHEDULE event, runs first (`on_schedule`), each ending at the next arrival (or a time in `stop_at`), where
  memory runs out, or with the step in which a sequence samples its last token;
- the loop's calls into the scheduler (`schedule`, `finish_step`) and the pool's counts (`counts`) go through the
  open epoch, if any, which may take part in a step (an `EpochStep`);
- the bookkeeping of runs (memory, step table, token times), and, for epochs, each request's token times booked
  when it leaves the epoch, from the list of step ends.
It calls the plain loop's public methods and reads its public attributes only (docs/ARCHITECTURE.md, "The fast
plane").
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from ..clock.loop import SCHEDULE, STEP_END, Simulator
from ..kv.base import SHARE_NAMES, as_seen
from ..scheduling.plan import StepOutcome, StepPlan, StepResult
from .epoch import DecodeEpochs, EpochStep
from .runs import DecodeRun, decode_run, kv_runs, price_steps

EPOCH_TRIM = 4096  # an open decode epoch's step ends kept before the first ones no member reads are dropped


@dataclass(slots=True)
class EpochRun:
    """A run of an open decode epoch: the same steps as a DecodeRun, without the per-sequence lists (the epoch keeps
    them)."""

    starts: list[float]  # start time of each step
    durations: list[float]  # duration of each step
    counts: list[tuple[int, ...]]  # the pool's five raw slot counts during each step
    num_seqs: int  # the decoding sequences
    finished_request_ids: list[int]  # requests whose last sequence finished in the last step
    preempted: list[int] = field(default_factory=list)  # requests preempted in its one step (then the only step)

    @property
    def end(self) -> float:
        return self.starts[-1] + self.durations[-1]


def epoch_run(epochs: DecodeEpochs, cost, now: float, next_arrival: float, stop: float = math.inf) -> EpochRun | None:
    """decode_run for the open decode epoch: the same steps, priced the same way, in O(steps + blocks opened). Where
    memory runs out for the next step, that step alone, preempting inside the epoch as stepping would
    (DecodeEpochs.preempt): then a run of one step, or of none if every member was preempted. None when the next step
    is not such a run (no epoch open, an admission, a preemption the epoch cannot make). The run stops before a step
    that would start at or after `next_arrival`, unless a request already waits that no step of the run can admit
    (the arrival queues behind it), and always before `stop`."""
    shape = epochs.run_shape()
    if shape is None:
        return None
    num_seqs, context, steps_left, blocked = shape
    allowed = epochs.room(steps_left)  # (asked first: no step is priced that memory does not allow)
    if allowed:
        starts, durations = price_steps(cost, now, stop if blocked else min(next_arrival, stop), allowed, num_seqs,
                                        context)
        counts, finished = epochs.advance(len(durations))
        return EpochRun(starts, durations, counts, num_seqs, finished)
    preempted = epochs.preempt()
    if not preempted:
        return None
    if epochs.epoch is None:  # every member was preempted: no step (stepping's plan is empty too)
        return EpochRun([], [], [], 0, [], preempted)
    shape = epochs.run_shape(admission=False)
    starts, durations = price_steps(cost, now, next_arrival, 1, shape.num_seqs, shape.context)
    counts, finished = epochs.advance(1)
    return EpochRun(starts, durations, counts, shape.num_seqs, finished, preempted)


class FastSimulator(Simulator):
    """sim.clock.loop.Simulator with the fast plane: the same arguments, and

    `jump`: apply runs of plain decode steps at once (False: exactly the plain loop).
    `validate`: after each run, check the booked memory against the KV manager's own breakdown (O(seqs); tests).
    `stop_at`: times the fast-forward never jumps across, like arrivals (an observer's snapshot times).
    An observer (`on_step`) is called after a fast-forwarded run with its `DecodeRun`, after a step with its plan.
    """

    def __init__(self, *args, jump: bool = True, validate: bool = False, stop_at=(), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.jump, self.validate = jump, validate
        self.stop_at = sorted(stop_at)
        self.next_arrival = self.requests[0].arrival_time if self.requests else math.inf
        self.next_index = 0  # the next request to arrive
        self.arrival_times = [r.arrival_time for r in self.requests]
        # NOTE: a hint only: skipping a fast-forward attempt never changes results (the step is then scheduled
        # normally); it saves the attempt's O(seqs) cost where a run is known or likely to be impossible.
        self.may_run = True
        self.runs = kv_runs(self.kv)  # the pool's arithmetic of runs (None: a manager the fast plane does not know)
        # Decode epochs: runs whose cost does not grow with the batch, where nothing watches every step (no observer,
        # no check, no range, no shared reads). The token times of the epoch's requests are then booked when each
        # finishes or the epoch closes, from the end of every step in it.
        epochs = DecodeEpochs(self.scheduler)
        self.epochs = epochs if (jump and not validate and self.on_step is None and self.in_range is None
                                 and not self.shared_reads and epochs.possible) else None
        self.epoch_members: dict[int, int] = {}  # the open epoch's unfinished requests (index -> the step they joined)
        self.epoch_ends: list[float] = []  # the end of each of its steps
        # the differences of consecutive step ends (step j's end minus step j - 1's) that no later one reaches or
        # passes, as (j, difference), differences decreasing: the largest from any step on is the first with j beyond
        self.epoch_gaps: list[tuple[int, float]] = []
        self.epoch_trim_at = EPOCH_TRIM  # its lists lose the steps no member needs once they are this long
        self.epoch_running = False  # inside a run of the epoch

    # --- the events -------------------------------------------------------------------------------------
    def on_arrival(self, index: int) -> list:
        self.next_index = index + 1
        self.next_arrival = self.arrival_times[index + 1] if index + 1 < len(self.requests) else math.inf
        self.may_run = False  # the next step most likely admits it: don't try a decode run first
        return super().on_arrival(index)

    def on_schedule(self, payload) -> list:
        if self.idle_since is not None:
            self.end_idle()  # (before any run: the pool sat idle until now)
        epochs = self.epochs
        jumps = self.jump and self.runs is not None
        while jumps and (self.may_run or (epochs is not None and epochs.epoch is not None)):
            while self.stop_at and self.stop_at[0] <= self.now:
                self.stop_at.pop(0)
            stop = self.stop_at[0] if self.stop_at else math.inf
            horizon = min(self.next_arrival, stop)
            run: EpochRun | DecodeRun | bool | None  # an epoch's run, False (none here), then a run's or None
            run = self._epoch_run(self.next_arrival, stop) if epochs is not None else False
            if run is False:  # run by run: no epoch here, or none for these sequences now
                run = decode_run(self.scheduler, self.cost, self.now, horizon, self.shared_reads, self.runs)
                if run is not None:
                    self._book_run(run)
            if run is None:
                break
            if not run.durations:  # an epoch's run that preempted every member has no step: schedule again
                return [(self.now, SCHEDULE, None)]
            if not (run.finished_request_ids and run.end < horizon and self.on_step is None
                    and not self.scheduler.num_waiting + self.scheduler.num_swapped):
                return [(run.end, STEP_END, run)]
            # A finish with nobody waiting and no arrival before the run's end: the events would be the run's end, then
            # a schedule at once (nothing else happens meanwhile), so both are taken here, without the event queue.
            self.now = run.end
            self._run_ended(run)
            self.num_events += 2  # (counted: num_events stays the events of the loop's logic, however taken)
        self.may_run = True
        return super().on_schedule(payload)

    def on_step_end(self, payload) -> list:
        if isinstance(payload, (DecodeRun, EpochRun)):  # applied and booked, but its finishes
            self.last_step_end = self.now
            self._run_ended(payload)
            return [(self.now, SCHEDULE, None)]
        return super().on_step_end(payload)

    # --- the loop's calls into the scheduler, through the open epoch ------------------------------------
    def schedule(self) -> StepPlan:
        return self.scheduler.schedule() if self.epochs is None else self.epochs.schedule()

    def finish_step(self, plan: StepPlan, outcome: StepOutcome) -> StepResult:
        if self.epochs is None:
            result = self.scheduler.finish_step(plan, outcome)
        elif isinstance(plan, EpochStep):  # the epoch's members sampled in this step too (booked before it may close)
            self._epoch_ends([self.now])
            result = self.epochs.finish_step(plan, outcome)
            members = self.epoch_members
            for request_id in result.finished_request_ids:
                i = self.index[request_id]
                if i in members:  # (gone if the epoch closed: then all were booked)
                    self._settle(i, members.pop(i), len(self.epoch_ends))
        else:
            result = self.epochs.finish_step(plan, outcome)
        if result.finished_request_ids and self.scheduler.num_waiting:
            self.may_run = False  # freed memory: the next step most likely admits a waiting request
        return result

    def counts(self) -> tuple[int, ...]:
        epochs = self.epochs
        if epochs is None or epochs.epoch is None:
            return super().counts()
        # the epoch carries the pool's counts (its members' token counts are held)
        return as_seen(epochs.epoch.kv.counts, self.scheduler.num_waiting + self.scheduler.num_swapped > 0)

    # --- runs ---------------------------------------------------------------------------------------------
    def _run_ended(self, run: DecodeRun | EpochRun) -> None:
        """A fast-forwarded run (applied and booked) ends now: its finishes."""
        self.last_step_end = self.now
        for request_id in run.finished_request_ids:
            self.times.finish[self.index[request_id]] = self.now
        self.progress.update(len(run.finished_request_ids))
        if self.on_step is not None:
            self.on_step(self, run)

    def _book_run(self, run: DecodeRun) -> None:
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

    def _epoch_run(self, next_arrival: float, stop: float) -> EpochRun | bool | None:
        """The next run of the open decode epoch (opened here if the hint allows and the scheduler can), applied and
        booked; None: the step is scheduled normally (which closes the epoch); False: a plain decode run the epoch
        cannot take (the KV manager has none for these sequences now): run by run."""
        scheduler, epochs = self.scheduler, self.epochs
        if epochs.epoch is None:
            if not self.may_run:
                return None
            opened = epochs.open(self._settle_epoch)
            if not opened:
                return opened
            self.epoch_members = {self.index[rid]: 0 for rid in scheduler.running_request_ids()}
        num_running = scheduler.num_running
        num_waiting: int | list[int] = scheduler.num_waiting  # per step (a list) when requests arrive during the run
        waiting = num_waiting + scheduler.num_swapped > 0
        self.epoch_running = True  # an epoch closing inside (its last members left) is settled below, once booked
        joined_at = len(self.epoch_ends)
        try:
            run = epoch_run(epochs, self.cost, self.now, next_arrival, stop)
        finally:
            self.epoch_running = False
        for request_id in epochs.joined_requests():  # admitted while it was open, joined before this run
            self.epoch_members[self.index[request_id]] = joined_at
        if run is None:
            if epochs.epoch is None:  # it closed (a group that could not join)
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
        # as the breakdown reports them: while a request waits, free slots are external waste (kv.base.as_seen)
        seen = [(t, r, i, e + f, 0) for t, r, i, e, f in run.counts] if waiting else run.counts
        durations = run.durations
        if run.starts[-1] >= next_arrival and self.log.kept:  # requests arrived during it, queueing: step by step
            arrivals, first = self.arrival_times, self.next_index
            num_waiting = [num_waiting + bisect.bisect_right(arrivals, t, first) - first for t in run.starts]
        self._book_steps(run.starts, durations, seen, run.num_seqs, num_running, num_waiting, len(run.preempted))
        self._epoch_ends(run.starts[1:] + [run.end])  # (a step starts where the one before ended: the same floats)
        for request_id in run.finished_request_ids:
            i = self.index[request_id]
            self._settle(i, members.pop(i), len(ends))
        if epochs.epoch is None:  # the last members left: it closed
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
                    num_running: int, num_waiting: int | list[int], num_preempted: int = 0) -> None:
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
