"""Runs of plain decode steps, one run at a time: the fast plane jumps over them with exactly the result of stepping.

Between events (an arrival, a finish, a preemption) a busy server mostly repeats one step: every running
sequence feeds its last token and samples the next. Such steps are deterministic, so the event loop may
apply a whole run of them at once, provided the result is what stepping token by token gives
(tests/sim/test_fastforward.py compares every per-request and per-step number, bit for bit).

Two questions, answered through the scheduler's and the KV managers' public calls only (docs/ARCHITECTURE.md,
"The fast plane"):

    plain_decodes(scheduler)      is the next step a plain decode of exactly the running sequences, and would
                                  nothing else (admission, swap-in, chunk, copy, beam) happen meanwhile?
    advance(scheduler, decodes, k)  apply as many of the next k such steps as memory allows without a copy (the
                                  pool's arithmetic: `kv_runs`), add their tokens to the sequences, and finish
                                  those that reach output_len in the last one; the pool's slot counts during each
                                  step applied, and the requests finished

A run ends with the first step in which a sequence samples its output_len-th token (the simulator knows true
lengths), or before the first step that would start at or after the next arrival (stepping, that arrival is
seen first), or where memory runs out. The loop (sim/fast/loop.py) books the run's steps from the `DecodeRun`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..base.limits import MAX_TIME_S
from ..clock.cost import check_step_time
from ..kv.base import as_seen
from ..scheduling.step_shape import StepShape, shared_tokens
from .contiguous import ContiguousKVManager, ContiguousRuns
from .hybrid import HybridKVManager, HybridRuns
from .paged import PagedKVManager, PagedRuns
from .vattention import VAttentionKVManager, VAttentionRuns

# NOTE: the fast plane knows each policy's arithmetic (its closed forms need the pool's shape), so it names the
# managers' classes; it reads them through their public records only (docs/ARCHITECTURE.md, "The fast plane")
_RUNS = ((PagedKVManager, PagedRuns), (ContiguousKVManager, ContiguousRuns), (VAttentionKVManager, VAttentionRuns),
         (HybridKVManager, HybridRuns))


def kv_runs(kv):
    """The arithmetic of plain decode runs for this manager: `max_decode_steps(seq_groups, limit, waiting)` and
    `advance_decodes(seq_groups, k, checked)`, each equal to stepping, one allocate_slots(group, [1, ...]) per group
    and step (the paged pool's also serves the radix pool, built on it). None for a manager the fast plane does not
    know: the simulator then steps it one step at a time."""
    for kind, runs in _RUNS:
        if isinstance(kv, kind):
            return runs(kv)
    return None


@dataclass(slots=True)
class PlainDecodes:
    """The running sequences when the next steps are plain decodes of exactly them (plain_decodes)."""

    runs: Any  # the pool's arithmetic of runs (kv_runs)
    groups: list  # the running groups, in queue order
    seqs: list  # their sequences, in plan order
    seq_groups: list[list[int]]  # the sequence ids of each group, as a step allocates them
    steps_left: int  # the fewest tokens a sequence has still to sample


def plain_decodes(scheduler, runs=None) -> PlainDecodes | None:
    """The running sequences, if the next schedule() is certain to be a plain decode of exactly them and stays so
    while memory lasts and none finishes: every running group decodes all its sequences (no prompt chunk, beam search
    or copy waiting), nothing is swapped out, the budget holds them all, and the first waiting group could not be
    admitted now (advance stops a run before free memory grows). Else None. `runs`: kv_runs(scheduler.kv), if known."""
    running, config = scheduler.running, scheduler.config
    if scheduler.in_flight is not None or not running or scheduler.num_swapped or config.num_speculative_tokens:
        return None  # (speculative decoding: a step samples a random number of tokens, no run is plain)
    runs = kv_runs(scheduler.kv) if runs is None else runs
    if runs is None:
        return None
    seqs: list = []
    seq_groups: list[list[int]] = []
    steps_left = None
    for group in running:
        if group.is_beam_search or group.pending_copies or not group.forked:
            return None
        ids = []
        for seq in group.live:
            if seq.prefilling or seq.num_computed_tokens != seq.num_tokens - 1:
                return None
            seqs.append(seq)
            ids.append(seq.seq_id)
            left = seq.output_len - seq.num_generated
            if steps_left is None or left < steps_left:
                steps_left = left
        seq_groups.append(ids)
    budget = config.max_num_batched_tokens
    if config.mode == "v1":
        budget -= len(seqs)
        if budget < 0:
            return None
    if scheduler.num_waiting and scheduler.may_admit() and scheduler.head_may_be_admitted(
            budget, len(seqs), nothing_fed=config.mode != "v1"):
        return None
    return PlainDecodes(runs, list(running), seqs, seq_groups, steps_left)


def room(scheduler, decodes: PlainDecodes, max_steps: int) -> int:
    """How many of the next `max_steps` plain decode steps memory allows (the pool's arithmetic, kv_runs). A waiting
    group refused now stays refused while free memory does not grow (in a paged pool it only shrinks during a run; a
    hybrid pool's sliding groups give blocks back): the run stops before it grows."""
    waiting = bool(scheduler.num_waiting) and scheduler.may_admit()
    return decodes.runs.max_decode_steps(decodes.seq_groups, max_steps, waiting)


def advance(scheduler, decodes: PlainDecodes, max_steps: int,
            allowed: int | None = None) -> tuple[list[tuple[int, ...]], list[int]]:
    """Apply as many plain decode steps as memory allows, at most `max_steps`, at once: the state as many rounds of
    schedule() and finish_step() with nothing reported would leave, with the same block ids. No sequence may reach
    its output_len before step `max_steps`; those that reach it in the last step applied finish then (finish_step's
    rule). `allowed`: what room() answered just before, for at least `max_steps` (not asked again). Returns the pool's
    five raw slot counts during each step applied (none if memory allows no step) and the requests finished."""
    if not 1 <= max_steps <= decodes.steps_left:
        raise ValueError(f"advance({max_steps}): expected a plain decode state and no sequence finishing before the "
                         "last step")
    num_steps = room(scheduler, decodes, max_steps) if allowed is None else min(allowed, max_steps)
    if num_steps < 1:
        return [], []
    counts = decodes.runs.advance_decodes(decodes.seq_groups, num_steps, checked=True)
    for seq in decodes.seqs:  # the tokens finish_step would have added, step by step
        seq.num_generated += num_steps
        seq.num_computed_tokens += num_steps
    if num_steps < decodes.steps_left:  # none reached its output_len
        return counts, []
    ending = [g for g in decodes.groups if any(s.num_generated >= s.output_len for s in g.live)]
    return counts, scheduler.finish_sampled(ending)


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
        if not d <= MAX_TIME_S:  # (NaN too) as Simulator.price refuses it
            check_step_time(d, tuple(StepShape(0, num_seqs, context, 0, shared)))
        starts.append(t)
        durations.append(d)
        t += d
        context += num_seqs
    return starts, durations


def decode_run(scheduler, cost, now: float, next_arrival: float, shared_reads: bool = False,
               runs=None) -> DecodeRun | None:
    """Apply the longest guaranteed run of plain decode steps starting at `now` and before `next_arrival`, and
    return it; None when the next step is not such a run (the loop then schedules it normally). `shared_reads`: price
    each step with its shared K/V reads (sim.scheduling.step_shape.shared_context_tokens), which a run cannot change:
    a block that several sequences read is full (writing into a shared block copies it first, and a run has no
    copy), and every block a run fills is its sequence's own. `runs`: kv_runs(scheduler.kv), if known."""
    decodes = plain_decodes(scheduler, runs)
    if decodes is None:
        return None
    seqs = decodes.seqs
    # The simulator's rule: a sequence finishes in the step where it samples its output_len-th token.
    steps_left = decodes.steps_left
    # Step j feeds one token per sequence: context = sum(n) + S * (j + 1) (n = the K/V it holds before the run).
    num_seqs = len(seqs)
    before = [s.num_computed_tokens for s in seqs]
    # the first step's shared reads, as StepPlan counts them: each sequence reads its K/V and the token it feeds
    kv = scheduler.kv
    shared = shared_tokens(((kv.block_table(s.seq_id), s.num_computed_tokens + 1) for s in seqs),
                                   kv.block_size) if shared_reads else 0
    allowed = room(scheduler, decodes, steps_left)  # (asked first: no step is priced that memory does not allow)
    if allowed < 1:
        return None
    starts, durations = price_steps(cost, now, next_arrival, allowed, num_seqs, sum(before), shared)
    ids = [s.seq_id for s in seqs]
    num_running, num_waiting = scheduler.num_running, scheduler.num_waiting
    waiting = num_waiting + scheduler.num_swapped > 0
    counts, finished = advance(scheduler, decodes, len(durations), allowed)
    k = len(counts)
    frees = k == steps_left
    request_ids = list(dict.fromkeys(s.request_id for s in seqs))
    return DecodeRun(starts, durations, counts, waiting, ids, request_ids, before, num_running, num_waiting, finished,
                     frees, shared)
