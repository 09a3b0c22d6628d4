"""The event loop: the serving engine with a simulated clock (DESIGN.md, layer 6).

The loop plays the executor's part. Each iteration it asks the shared `Scheduler` for a `StepPlan`,
prices it with a cost model (the clock advances by the step's time), decides the outcome from the
workload's true lengths, and reports it back with `finish_step`: the same calls the reference engine
makes around a real forward pass. Three kinds of event live on one heap, ordered by the key
(time, kind, sequence number):

    ARRIVAL   a request reaches the server: scheduler.add_request         (first at equal times, so the
    STEP_END  a step's forward pass is done: scheduler.finish_step          next step sees every request
    SCHEDULE  start the next step: scheduler.schedule, priced               that arrived by then)

Jump (DESIGN.md 6): when the scheduler guarantees the next K steps are plain decodes of the same batch
(`decode_run_length`), the loop applies them at once (`advance_decode_run(K)`) and books the K steps
one by one with cheap arithmetic (`_decode_run_counts`: O(1) per step, exact integer slot counts), stopping
before the first step that would start after the next arrival. Results are the same as stepping token by
token (`jump=False`; tests/sim/test_jump.py): the same per-request times, steps and slot counts, bit for bit.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from .kv.base import SHARE_NAMES
from .metrics import StepLog, Table, request_table
from .plan import StepOutcome, StepPlan
from .request import Request
from .scheduler import Scheduler

ARRIVAL, STEP_END, SCHEDULE = 0, 1, 2  # tie-break priority at equal times (lower first)


@dataclass(slots=True)
class LoopResult:
    requests: Table  # per request (sim.metrics.REQUEST_COLUMNS)
    steps: Table  # per step (sim.metrics.STEP_COLUMNS)
    memory_integral: dict[str, float]  # slot-seconds of each kind over [start_time, end_time]
    start_time: float  # the first arrival
    end_time: float  # the end of the last step
    num_events: int  # events popped from the heap


class Simulator:
    """Serve `requests` (any order; sorted by arrival here) with `scheduler`, timing steps with `cost`.

    `block_bytes`: bytes of one KV block (block_size * kv_bytes_per_token), to price swaps.
    `seed`: the beam-search scores' generator. `jump`: allow jumping over runs of identical decode steps.
    `validate`: after each run, check the booked memory against the KV manager's own breakdown (O(seqs); tests).
    `on_step(simulator, plan)`: an observer called after every step ends (plan is None for a decode run, which
    has no plan object); it may read `simulator.now`, `.kv` and `.scheduler` (figures, the engine comparison).
    """

    def __init__(self, scheduler: Scheduler, cost, requests: list[Request], *, block_bytes: int,
                 seed: int = 0, jump: bool = True, validate: bool = False, progress: bool = False,
                 on_step=None) -> None:  # fmt: skip
        self.scheduler, self.kv, self.cost = scheduler, scheduler.kv, cost
        self.requests = sorted(requests, key=lambda r: (r.arrival_time, r.request_id))
        self.index = {r.request_id: i for i, r in enumerate(self.requests)}
        if len(self.index) != len(self.requests):
            raise ValueError("request ids must be unique")
        self.block_bytes, self.jump, self.validate = block_bytes, jump, validate
        self.on_step = on_step
        self.rng = np.random.default_rng([seed, 0xBEA])  # beam scores: a stream apart from the workload's
        self.progress = tqdm(total=len(requests), unit="req", disable=not progress)
        count = len(self.requests)
        self.first_token = np.full(count, np.nan)
        self.finish = np.full(count, np.nan)
        self.preemptions = np.zeros(count, dtype=np.int64)
        self.beam_scores: dict[int, float] = {}  # seq id -> cumulative log-prob of a beam
        self.log = StepLog()
        self.integral = dict.fromkeys(SHARE_NAMES, 0.0)
        self.now = 0.0
        self.busy = False  # a step is in flight or about to start
        self.idle_since: float | None = None
        self.idle_counts: tuple[int, ...] = ()
        self.next_arrival = math.inf
        self.last_step_end = 0.0
        # NOTE: a hint only: skipping a decode-run attempt never changes results (the step is then scheduled
        # normally), it saves the attempt's O(seqs) cost where a run is known or likely to be impossible.
        self.may_run = True
        # The pool's five raw slot counts (no waiting applied) when known without asking the KV manager: after
        # a step that freed nothing the pool is as schedule() left it, and a decode run's end is computed.
        self.pool: tuple[int, ...] | None = None

    # --- the loop ---------------------------------------------------------------------------------
    def run(self) -> LoopResult:
        heap: list[tuple[float, int, int, object]] = []
        handlers = {ARRIVAL: self._on_arrival, STEP_END: self._on_step_end, SCHEDULE: self._on_schedule}
        seq = 0
        if self.requests:
            self.next_arrival = self.requests[0].arrival_time
            heap.append((self.next_arrival, ARRIVAL, seq, 0))
        num_events = 0
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
        table = request_table(self.requests, self.first_token, self.finish, self.preemptions)
        return LoopResult(table, self.log.to_table(), self.integral, start, max(self.last_step_end, start), num_events)

    def _on_arrival(self, index: int) -> list:
        self.scheduler.add_request(self.requests[index])
        events = []
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
        if self.jump and self.may_run:
            end = self._try_decode_run()
            if end is not None:
                return [(end, STEP_END, None)]
        self.may_run = True
        # The pool's five raw slot counts (no waiting applied) when known without asking the KV manager: after
        # a step that freed nothing the pool is as schedule() left it, and a decode run's end is computed.
        self.pool: tuple[int, ...] | None = None
        plan = self.scheduler.schedule()
        for request_id in plan.preempted:
            self.preemptions[self.index[request_id]] += 1
        if plan.is_empty:
            self.scheduler.finish_step(plan, StepOutcome())
            if plan.preempted:  # a preemption freed memory: try again at once
                self.pool = None
                return [(self.now, SCHEDULE, None)]
            self.busy = False
            self.idle_since, self.idle_counts = self.now, self._counts()
            return []
        counts = self._counts()
        duration = self._price(plan)
        self._record(duration, plan, counts)
        return [(self.now + duration, STEP_END, (plan, *self._outcome(plan)))]

    def _on_step_end(self, payload) -> list:
        self.last_step_end = self.now
        if payload is not None:  # None: a decode run, already applied and finishing nothing
            plan, outcome, beam_scores = payload
            result = self.scheduler.finish_step(plan, outcome)
            if outcome.finished_seq_ids or outcome.beam_parents:  # memory was freed (and forked)
                self.pool = None
            for entry in plan.prefills:  # a request's first token comes from its first prefill
                i = self.index[entry.request_id]
                if math.isnan(self.first_token[i]):
                    self.first_token[i] = self.now
            for request_id, seq_ids in result.new_beam_seq_ids.items():
                old_ids, scores = beam_scores[request_id]
                for seq_id in old_ids:
                    self.beam_scores.pop(seq_id, None)
                self.beam_scores.update(zip(seq_ids, scores))
            for request_id in result.finished_request_ids:
                self.finish[self.index[request_id]] = self.now
            if result.finished_request_ids and self.scheduler.num_waiting:
                self.may_run = False  # freed memory: the next step most likely admits a waiting request
            self.progress.update(len(result.finished_request_ids))
        if self.on_step is not None:
            self.on_step(self, None if payload is None else payload[0])
        return [(self.now, SCHEDULE, None)]

    # --- the executor's part: price a plan, decide its outcome ----------------------------------------
    def _price(self, plan: StepPlan) -> float:
        """Forward pass (if any sequence runs) plus swap traffic. NOTE: swaps are not overlapped with compute
        (vLLM v0 waits for them before the forward pass); copy-on-write block copies are GPU-internal and
        cost ~microseconds, so they are not priced (a modelling approximation)."""
        duration = 0.0
        if plan.prefills or plan.decodes:
            prefill_tokens = sum(s.num_new_tokens for s in plan.prefills)
            duration = self.cost.step_time(prefill_tokens, len(plan.decodes), plan.num_context_tokens)
        swapped = len(plan.blocks_to_swap_out) + len(plan.blocks_to_swap_in)
        if swapped:
            duration += self.cost.swap_time(swapped * self.block_bytes, swapped)
        return duration

    def _outcome(self, plan: StepPlan) -> tuple[StepOutcome, dict]:
        """Every scheduled sequence samples one token; it finishes when it reaches its true output length.
        Beam search re-chooses its k beams each step (except the last: all k end together). Also returns
        per beam search (its current seq ids, the survivors' scores in beam_parents order)."""
        outcome, beam_scores = StepOutcome(), {}
        beams: dict[int, list[int]] = {}
        for entry in plan.prefills + plan.decodes:
            request = self.scheduler.request(entry.request_id)
            if self.scheduler.num_generated(entry.seq_id) + 1 >= request.output_len:
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

    # --- jumping over a run of identical decode steps --------------------------------------------------
    def _try_decode_run(self) -> float | None:
        """Apply the longest guaranteed run of plain decode steps that starts before the next arrival, book
        every step of it, and return the time it ends (None: no run; schedule one step normally)."""
        sched, kv = self.scheduler, self.kv
        seqs, steps_left = self._running_seqs()
        if steps_left < 1:  # some sequence finishes in the next step: not a plain decode
            return None
        # Step j feeds one token per sequence: context = sum(n) + num_seqs * (j + 1). Stop before the first
        # step that would start at or after the next arrival (stepping, that arrival would be seen first).
        num_seqs, starts, durations, t = len(seqs), [], [], self.now
        context = sum(n for n, _ in seqs) + num_seqs
        while len(durations) < steps_left and t < self.next_arrival:
            d = self.cost.step_time(0, num_seqs, context)
            starts.append(t)
            durations.append(d)
            t += d
            context += num_seqs
        k = sched.decode_run_length(len(durations))
        if k < 1:
            return None
        # Hints for the next attempt: after this run a sequence finishes (k == steps_left), or memory is short
        # (the scheduler cut the run), or an arrival comes: the next step is most likely not a plain decode.
        self.may_run = k == len(durations) < steps_left
        if k < len(durations):
            t = starts[k - 1] + durations[k - 1]  # the same sum as the loop above made
            del starts[k:], durations[k:]
        num_running, num_waiting = sched.num_running, sched.num_waiting
        if self.pool is None or self.validate:
            self.pool = self._check_pool(self.pool)
        counts, self.pool = _decode_run_counts(kv, self.pool, seqs, k, num_waiting > 0)
        sched.advance_decode_run(k)
        if self.validate:
            self._check_pool(self.pool)
        self._integrate_run(durations, counts)
        log = self.log.rows
        log["time"] += starts
        log["duration"] += durations
        for name, value in (("num_prefill_seqs", 0), ("num_decode_seqs", num_seqs), ("num_running", num_running),
                            ("num_batched_tokens", num_seqs), ("num_waiting", num_waiting), ("num_preempted", 0)):
            log[name] += [value] * k
        for name, column in zip(SHARE_NAMES, zip(*counts)):
            log[name] += column
        return t

    def _running_seqs(self) -> tuple[list[tuple[int, int]], int]:
        """(num_tokens, final_len) of every running sequence, and how many steps all can take without finishing.

        A running sequence that has sampled g tokens holds prompt_len + g - 1 = final_len - (output_len - g)
        K/V entries (notes/SCHEDULER_API.md), so it finishes in the step where num_tokens reaches final_len."""
        sched, num_tokens, requests, index = self.scheduler, self.kv.num_tokens, self.requests, self.index
        seqs = []
        for request_id in sched.running_request_ids():
            request = requests[index[request_id]]
            final = request.prompt_len + request.output_len - 1
            seqs += [(num_tokens(seq_id), final) for seq_id in sched.seq_ids(request_id)]
        return seqs, (min(final - n for n, final in seqs) - 1 if seqs else 0)

    # --- bookkeeping -----------------------------------------------------------------------------------
    def _check_pool(self, expected: tuple[int, ...] | None) -> tuple[int, ...]:
        """The KV manager's raw slot counts; raise if they differ from what the loop expected (None: anything)."""
        b = self.kv.breakdown(False)
        found = (b.token_states, b.reservation, b.internal_fragmentation, b.external_fragmentation, b.free)
        if expected is not None and found != expected:
            raise RuntimeError(f"decode run bookkeeping: expected pool counts {expected}, found {found}")
        return found

    def _counts(self) -> tuple[int, ...]:
        """The pool's five slot counts now; free slots count as external waste while a request waits."""
        self.pool = self._check_pool(None)
        return _as_seen(self.pool, self.scheduler.num_waiting + self.scheduler.num_swapped > 0)

    def _integrate(self, duration: float, counts: tuple[int, ...]) -> None:
        integral = self.integral
        for name, count in zip(SHARE_NAMES, counts):
            integral[name] += duration * count

    def _integrate_run(self, durations: list[float], counts: list[tuple[int, ...]]) -> None:
        """`_integrate` for each step in turn (the same float sums, in the same order), with fewer lookups."""
        sums = [self.integral[name] for name in SHARE_NAMES]
        for duration, step_counts in zip(durations, counts):
            for kind, count in enumerate(step_counts):
                sums[kind] += duration * count
        self.integral.update(zip(SHARE_NAMES, sums))

    def _record(self, duration: float, plan: StepPlan, counts: tuple[int, ...]) -> None:
        self._integrate(duration, counts)
        log = self.log.rows
        log["time"].append(self.now)
        log["duration"].append(duration)
        log["num_prefill_seqs"].append(len(plan.prefills))
        log["num_decode_seqs"].append(len(plan.decodes))
        log["num_running"].append(self.scheduler.num_running)
        log["num_batched_tokens"].append(plan.num_batched_tokens)
        for name, count in zip(SHARE_NAMES, counts):
            log[name].append(count)
        log["num_waiting"].append(self.scheduler.num_waiting)
        log["num_preempted"].append(len(plan.preempted))


def _as_seen(counts: tuple[int, ...], waiting: bool) -> tuple[int, ...]:
    """Raw counts as the breakdown reports them: while a request waits, free slots are external waste."""
    tokens, reservation, internal, external, free = counts
    return (tokens, reservation, internal, external + free, 0) if waiting else counts


def _decode_run_counts(
    kv, pool: tuple[int, ...], seqs: list[tuple[int, int]], num_steps: int, waiting: bool
) -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
    """The pool's five slot counts during each step of a decode run (as seen, `waiting` applied), and the raw
    counts at its end; O(1) per step after O(seqs) setup. `pool`: the raw counts before the run.

    Every step writes one token per sequence into a slot set aside for it: token_states += S, reservation -= S.
    Paged memory also moves when a sequence's token opens a new block (position n + j a multiple of
    block_size B): B slots leave `free`; the token takes one and the other B - 1 are `reservation`, except in
    the sequence's final block, where the r slots up to its final length are reservation and the rest
    internal fragmentation. A sequence opens blocks every B steps from step (-n) mod B. Contiguous memory
    holds the whole reservation already: nothing else moves.

        positions   ... | p  p+1 ... final-1 | final ... p+B-1 |     p = the final block's first position
                          token  reservation    internal frag.
    """
    tokens, reservation, internal, external, free = pool
    num_seqs, bs = len(seqs), kv.block_size
    opening = [0] * bs  # opening[m]: sequences that open a block at every step j with j % B == m
    to_internal: dict[int, int] = {}  # step -> slots of newly opened final blocks that are internal frag.
    if kv.policy == "paged":
        for n, final in seqs:
            opening[(-n) % bs] += 1
            last_open = (final - 1) // bs * bs  # first position of the final block
            if 0 <= last_open - n < num_steps:
                to_internal[last_open - n] = to_internal.get(last_open - n, 0) + bs - (final - last_open)
    counts = []
    for j in range(num_steps):
        opened = opening[j % bs] * bs
        moved = to_internal.get(j, 0)
        tokens += num_seqs
        reservation += opened - num_seqs - moved
        internal += moved
        free -= opened
        counts.append((tokens, reservation, internal, external + free, 0) if waiting else
                      (tokens, reservation, internal, external, free))  # fmt: skip
    return counts, (tokens, reservation, internal, external, free)
