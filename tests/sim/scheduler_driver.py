"""A tiny executor for scheduler tests: the simulator's rule (a sequence finishes at its request's
output_len), plan checks after every step, and small constructors. Shared by the scheduler test modules."""
from __future__ import annotations

import numpy as np

from sim.kv.paged import PagedKVManager
from sim.plan import StepOutcome, StepPlan
from sim.request import Request
from sim.scheduler import Scheduler

# --- a tiny executor: the simulator's rule (a sequence finishes at its request's output_len) -------------
def outcome_for(sched: Scheduler, plan: StepPlan, rng: np.random.Generator | None = None) -> StepOutcome:
    finished = {
        e.seq_id
        for e in plan.prefills + plan.decodes
        if sched.num_generated(e.seq_id) + 1 >= sched.request(e.request_id).output_len
    }
    beams = {}
    for rid in plan.request_ids():
        if sched.request(rid).beam_width > 1:  # keep every beam, or (with rng) re-choose parents at random
            ids = sched.seq_ids(rid)
            beams[rid] = ids if rng is None else [int(i) for i in rng.choice(ids, size=len(ids))]
    return StepOutcome(finished, beams)


def check_plan(sched: Scheduler, plan: StepPlan) -> None:
    """What an executor relies on: each table covers exactly the tokens the step leaves in the cache, every
    decode feeds one token after its cached ones, and the batch respects max_num_seqs."""
    bs = sched.kv.block_size
    for e in plan.prefills + plan.decodes:
        assert len(e.block_table) == -(-(e.num_computed_tokens + e.num_new_tokens) // bs)
        assert sched.kv.num_tokens(e.seq_id) == e.num_computed_tokens + e.num_new_tokens
    assert all(e.num_new_tokens == 1 for e in plan.decodes)
    assert not (plan.prefills and plan.decodes)  # vLLM v0: a step runs prefills only, or decodes only
    assert plan.num_seqs <= sched.config.max_num_seqs


def step(sched: Scheduler, rng: np.random.Generator | None = None) -> tuple[StepPlan, list[int]]:
    plan = sched.schedule()
    check_plan(sched, plan)
    result = sched.finish_step(plan, outcome_for(sched, plan, rng))
    sched.kv.check_invariants()
    return plan, result.finished_request_ids


def drive(sched: Scheduler, rng=None, use_runs: bool = False, max_steps: int = 20_000) -> int:
    """Run to completion; returns the number of iterations (a decode run of k counts k)."""
    steps = 0
    while sched.has_unfinished():
        k = sched.decode_run_length(10_000) if use_runs else 0
        if k:
            sched.advance_decode_run(k)
            sched.kv.check_invariants()
        else:
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


# --- configuration and admission control -------------------------------------------------------------
