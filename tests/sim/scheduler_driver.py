"""A tiny executor for scheduler tests: the simulator's rule (a sequence finishes at its request's
output_len), plan checks after every step, and small constructors. Shared by the scheduler test modules."""

from __future__ import annotations

import numpy as np

from sim.base.request import Request
from sim.fast.runs import advance, kv_runs, plain_decodes
from sim.kv.paged import PagedKVManager
from sim.scheduling.plan import StepOutcome, StepPlan
from sim.scheduling.scheduler import Scheduler


# --- a tiny executor: the simulator's rule (a sequence finishes at its request's output_len) -------------
def outcome_for(sched: Scheduler, plan: StepPlan, rng: np.random.Generator | None = None) -> StepOutcome:
    sampling = [e for e in plan.entries if e.sample]
    finished = {
        e.seq_id for e in sampling if sched.num_generated(e.seq_id) + 1 >= sched.request(e.request_id).output_len
    }
    beams = {}
    for rid in {e.request_id for e in sampling}:
        ids = [e.seq_id for e in sampling if e.request_id == rid]
        if sched.request(rid).beam_width > 1 and not set(ids) & finished:  # keep every beam, or re-choose at random
            beams[rid] = ids if rng is None else [int(i) for i in rng.choice(ids, size=len(ids))]
    return StepOutcome(finished, beams)


def check_plan(sched: Scheduler, plan: StepPlan) -> None:
    """What an executor relies on, checked before the step is reported (so num_generated is the count before it).

    Every mode: each fed entry's table covers exactly num_computed + num_new tokens (sample-only siblings have
    none yet, and follow their leader's sampling entry), `sample` is set exactly where an entry reaches the end
    of its sequence, decodes feed one token, a sequence appears once, max_num_seqs holds, and the token budget
    holds unless a single group runs alone over it because it cannot be chunked (Scheduler._admission's `first`).
    v0 / static: a step runs prefills or decodes, never both; decode steps have no budget. Without chunking
    every fed entry samples (whole prompts only)."""
    bs, cfg = sched.kv.block_size, sched.config
    entries = plan.entries
    assert len({e.seq_id for e in entries}) == len(entries)
    for i, e in enumerate(plan.prefills):
        if e.num_new_tokens == 0:  # a sibling samples from the logits of its leader's entry, just before it
            leader = next((p for p in reversed(plan.prefills[:i]) if p.num_new_tokens), None)
            assert leader is not None and (leader.request_id, leader.sample) == (e.request_id, True)
            assert e.num_computed_tokens == leader.num_computed_tokens + leader.num_new_tokens
            assert e.block_table == [] and e.sample
    for e in entries:
        if e.num_new_tokens == 0:  # a sample-only sibling: checked above
            continue
        end = e.num_computed_tokens + e.num_new_tokens
        assert len(e.block_table) == -(-end // bs) and sched.kv.num_tokens(e.seq_id) == end
        assert e.sample == (end == sched.request(e.request_id).prompt_len + sched.num_generated(e.seq_id))
        assert e.sample or cfg.chunked  # a chunk that stops short of the end exists only with chunked prefill
    assert all(e.num_new_tokens == 1 for e in plan.decodes)
    if cfg.mode != "v1":
        assert not (plan.prefills and plan.decodes)  # the paper's v0: a step runs prefills only, or decodes only
    alone = len({e.request_id for e in entries if e.num_new_tokens}) == 1
    budgeted = cfg.mode == "v1" or plan.prefills  # v0 / static decode steps run every running sequence
    if budgeted and not (alone and not cfg.chunked):
        assert plan.num_batched_tokens <= cfg.max_num_batched_tokens
    assert plan.num_seqs <= cfg.max_num_seqs


def step(sched: Scheduler, rng: np.random.Generator | None = None) -> tuple[StepPlan, list[int]]:
    plan = sched.schedule()
    check_plan(sched, plan)
    result = sched.finish_step(plan, outcome_for(sched, plan, rng))
    sched.kv.check_invariants()
    return plan, result.finished_request_ids


def run_length(sched: Scheduler) -> int:
    """How many plain decode steps the fast-forward may ask for now: 0 if none, else up to the step in which the
    first sequence samples its last token (a run may end with that step: it finishes there)."""
    decodes = plain_decodes(sched)
    return decodes.steps_left if decodes else 0


def advance_run(sched: Scheduler) -> int:
    """Jump over the plain decode run that starts now, as the simulator's fast plane does, and return its length
    (0: no run; take a normal step). The pool's arithmetic (max_decode_steps) says how long memory lets it last, and
    the fast plane must apply exactly that many steps."""
    decodes = plain_decodes(sched)
    if not decodes:
        return 0
    seqs, limit = decodes.seqs, decodes.steps_left
    # asked as the scheduler's step allocates (one call per request) and, while a request waits, only for steps after
    # which no more blocks are free than now (the scheduler would admit it after such a step's decodes)
    groups = [[s.seq_id for s in seqs if s.request_id == r] for r in dict.fromkeys(s.request_id for s in seqs)]
    k = kv_runs(sched.kv).max_decode_steps(groups, limit, waiting=bool(sched.num_waiting))
    if k == 0:
        return 0
    counts, _ = advance(sched, decodes, k)
    assert len(counts) == k, f"the scheduler applied {len(counts)} of the {k} steps memory allows"
    sched.kv.check_invariants()
    return k


def drive(sched: Scheduler, rng=None, use_runs: bool = False, max_steps: int = 20_000) -> int:
    """Run to completion; returns the number of iterations (a decode run of k counts k)."""
    steps = 0
    while sched.has_unfinished():
        k = advance_run(sched) if use_runs else 0
        if not k:
            step(sched, rng)
        steps += max(k, 1)
        assert steps < max_steps, "no progress"
    return steps


def req(rid, prompt_len, output_len, **kw) -> Request:
    return Request(request_id=rid, arrival_time=float(rid), prompt_len=prompt_len, output_len=output_len, **kw)


def paged(num_blocks, block_size=4, **kw) -> PagedKVManager:
    return PagedKVManager(num_blocks, block_size, **kw)


def all_blocks_free(kv) -> bool:
    cpu = getattr(kv, "cpu_allocator", None)
    return kv.num_free_blocks == kv.num_blocks and (cpu is None or cpu.num_free_blocks == cpu.num_blocks)
