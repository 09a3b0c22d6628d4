"""Fast-forward: the simulator jumps over runs of identical decode steps, with exactly the result of stepping.

Between events (an arrival, a finish, a preemption) a busy server mostly repeats one step: every running
sequence feeds its last token and samples the next. Such steps are deterministic, so the event loop may
apply a whole run of them at once, provided the result is what stepping token by token gives
(tests/sim/test_fastforward.py compares every per-request and per-step number, bit for bit).

This module is the whole of the jump, and it uses only public contracts:

    scheduler.plain_decode_seqs()       is the next step a plain decode of exactly these sequences, and would
                                        nothing else (admission, swap-in, chunk, copy, beam) happen meanwhile?
    scheduler.advance_decodes(k)        apply as many of the next k such steps as memory allows without a copy
                                        (the KV contract's max_decode_steps / advance_decodes); sequences that
                                        reach output_len in the last one finish then; returns the pool's slot
                                        counts during each step applied and the requests finished

A run ends with the first step in which a sequence samples its output_len-th token (the simulator knows true
lengths), or before the first step that would start at or after the next arrival (stepping, that arrival is
seen first), or where memory runs out.
The loop books the run's steps (times, memory, token times) from the `DecodeRun` returned here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .cost import check_step_time
from .kv.base import as_seen
from .limits import MAX_TIME_S
from .plan import shared_context_tokens


@dataclass(slots=True)
class DecodeRun:
    """k plain decode steps of the same sequences, back to back."""

    starts: list[float]  # start time of each step
    durations: list[float]  # duration of each step
    counts: list[tuple[int, ...]]  # the pool's five raw slot counts during each step
    waiting: bool  # a request waited throughout (the breakdown then counts free slots as external waste)
    seq_ids: list[int]  # the decoding sequences, in plan order
    request_ids: list[int]  # their requests, each once, in plan order
    num_tokens_before: list[int]  # K/V entries of each sequence before the run
    num_running: int  # running requests
    num_waiting: int  # waiting requests
    finished_request_ids: list[int]  # requests whose last sequence finished in the last step
    frees: bool  # some sequence finished in the last step: its memory was freed after it
    shared_context_tokens: int = 0  # K/V reads of blocks another sequence of the step reads too (the same every step)

    @property
    def num_steps(self) -> int:
        return len(self.durations)

    @property
    def end(self) -> float:
        return self.starts[-1] + self.durations[-1]

    def seen_counts(self) -> list[tuple[int, ...]]:
        return [as_seen(c, self.waiting) for c in self.counts]

def price_steps(cost, now: float, next_arrival: float, max_steps: int, num_seqs: int, context: int,
                shared: int = 0) -> tuple[list[float], list[float]]:
    """Start times and durations of up to `max_steps` plain decode steps of `num_seqs` sequences holding `context`
    K/V tokens, the first starting at `now`, none at or after `next_arrival`: step j feeds one token per sequence, so
    it reads context + num_seqs * (j + 1) (the same float additions as stepping)."""
    starts: list[float] = []
    durations: list[float] = []
    t, context = now, context + num_seqs
    while len(durations) < max_steps and t < next_arrival:
        d = cost.step_time(0, num_seqs, context, 0, shared)
        if not d <= MAX_TIME_S:  # (NaN too) as Simulator._price refuses it
            check_step_time(d, (0, num_seqs, context, 0, shared))
        starts.append(t)
        durations.append(d)
        t += d
        context += num_seqs
    return starts, durations


def decode_run(scheduler, cost, now: float, next_arrival: float, shared_reads: bool = False) -> DecodeRun | None:
    """Apply the longest guaranteed run of plain decode steps starting at `now` and before `next_arrival`, and
    return it; None when the next step is not such a run (the loop then schedules it normally). `shared_reads`: price
    each step with its shared K/V reads (sim.plan.StepPlan.num_shared_context_tokens), which a run cannot change:
    a block that several sequences read is full (writing into a shared block copies it first, and a run has no
    copy), and every block a run fills is its sequence's own."""
    seqs = scheduler.plain_decode_seqs()
    if not seqs:
        return None
    # The simulator's rule: a sequence finishes in the step where it samples its output_len-th token.
    steps_left = min(s.output_len - s.num_generated for s in seqs)
    # Step j feeds one token per sequence: context = sum(n) + S * (j + 1) (n = the K/V it holds before the run).
    num_seqs = len(seqs)
    before = [s.num_computed_tokens for s in seqs]
    # the first step's shared reads, as StepPlan counts them: each sequence reads its K/V and the token it feeds
    kv = scheduler.kv
    shared = shared_context_tokens(((kv.block_table(s.seq_id), s.num_computed_tokens + 1) for s in seqs),
                                   kv.block_size) if shared_reads else 0  # fmt: skip
    starts, durations = price_steps(cost, now, next_arrival, steps_left, num_seqs, sum(before), shared)
    ids = [s.seq_id for s in seqs]
    num_running, num_waiting = scheduler.num_running, scheduler.num_waiting
    waiting = num_waiting + scheduler.num_swapped > 0
    counts, finished = scheduler.advance_decodes(len(durations))
    k = len(counts)
    if k < 1:
        return None
    del starts[k:], durations[k:]
    frees = k == steps_left
    request_ids = list(dict.fromkeys(s.request_id for s in seqs))
    return DecodeRun(starts, durations, counts, waiting, ids, request_ids, before, num_running, num_waiting, finished,
                     frees, shared)


@dataclass(slots=True)
class EpochRun:
    """A run of an open decode epoch (Scheduler.open_decode_epoch): the same steps as a DecodeRun, without the
    per-sequence lists (the epoch keeps them lazily)."""

    starts: list[float]  # start time of each step
    durations: list[float]  # duration of each step
    counts: list[tuple[int, ...]]  # the pool's five raw slot counts during each step
    num_seqs: int  # the decoding sequences
    finished_request_ids: list[int]  # requests whose last sequence finished in the last step
    preempted: list[int] = field(default_factory=list)  # requests preempted in its one step (then the only step)

    @property
    def end(self) -> float:
        return self.starts[-1] + self.durations[-1]


def epoch_run(scheduler, cost, now: float, next_arrival: float, stop: float = float("inf")) -> EpochRun | None:
    """decode_run for the scheduler's open decode epoch: the same steps, priced the same way, in O(steps + blocks
    opened). Where memory runs out for the next step, that step alone, preempting inside the epoch as stepping would
    (Scheduler.preempt_in_decode_epoch): then a run of one step, or of none if every member was preempted. None when
    the next step is not such a run (no epoch open, an admission, a preemption the epoch cannot make). The run stops
    before a step that would start at or after `next_arrival`, unless a request already waits that no step of the run
    can admit (the arrival queues behind it), and always before `stop`."""
    shape = scheduler.decode_epoch_run()
    if shape is None:
        return None
    num_seqs, context, steps_left, blocked = shape
    horizon = stop if blocked else min(next_arrival, stop)
    starts, durations = price_steps(cost, now, horizon, steps_left, num_seqs, context)
    counts, finished = scheduler.advance_decode_epoch(len(durations))
    k = len(counts)
    if k >= 1:
        del starts[k:], durations[k:]
        return EpochRun(starts, durations, counts, num_seqs, finished)
    preempted = scheduler.preempt_in_decode_epoch()
    if not preempted:
        return None
    if not scheduler.decode_epoch_open:  # every member was preempted: no step (stepping's plan is empty too)
        return EpochRun([], [], [], 0, [], preempted)
    num_seqs, context, _, _ = scheduler.decode_epoch_run(admission=False)
    starts, durations = price_steps(cost, now, next_arrival, 1, num_seqs, context)
    counts, finished = scheduler.advance_decode_epoch(1)
    return EpochRun(starts, durations, counts, num_seqs, finished, preempted)
