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
    sampling = [e for e in plan.prefills + plan.decodes if e.sample]
    finished = {e.seq_id for e in sampling if sched.num_generated(e.seq_id) + 1 >= sched.request(e.request_id).output_len}
    beams = {}
    for rid in {e.request_id for e in sampling}:
        ids = [e.seq_id for e in sampling if e.request_id == rid]
        if sched.request(rid).beam_width > 1 and not set(ids) & finished:  # keep every beam, or re-choose at random
            beams[rid] = ids if rng is None else [int(i) for i in rng.choice(ids, size=len(ids))]
    return StepOutcome(finished, beams)


def check_plan(sched: Scheduler, plan: StepPlan) -> None:
    """What an executor relies on: each table covers exactly the tokens the step leaves in the cache (sample-only
    siblings have none yet), `sample` is set exactly where an entry reaches the end of its sequence, every
    decode feeds one token, and the batch respects max_num_seqs and the token budget (a group that cannot be
    chunked may run alone over it; v0 decode steps have no budget)."""
    bs, cfg = sched.kv.block_size, sched.config
    for e in plan.prefills + plan.decodes:
        end = e.num_computed_tokens + e.num_new_tokens
        if e.num_new_tokens == 0:
            assert e.block_table == [] and e.sample
            continue
        assert len(e.block_table) == -(-end // bs) and sched.kv.num_tokens(e.seq_id) == end
        assert e.sample == (end == sched.request(e.request_id).prompt_len + sched.num_generated(e.seq_id))
    assert all(e.num_new_tokens == 1 for e in plan.decodes)
    if cfg.mode != "v1":
        assert not (plan.prefills and plan.decodes)  # the paper's v0: a step runs prefills only, or decodes only
    alone = len({e.request_id for e in plan.prefills + plan.decodes if e.num_new_tokens}) == 1
    if (cfg.mode == "v1" or plan.prefills) and not (alone and not cfg.chunked):
        assert plan.num_batched_tokens <= cfg.max_num_batched_tokens
    assert plan.num_seqs <= cfg.max_num_seqs


def step(sched: Scheduler, rng: np.random.Generator | None = None) -> tuple[StepPlan, list[int]]:
    plan = sched.schedule()
    check_plan(sched, plan)
    result = sched.finish_step(plan, outcome_for(sched, plan, rng))
    sched.kv.check_invariants()
    return plan, result.finished_request_ids


def run_length(sched: Scheduler) -> int:
    """How many plain decode steps the fast-forward may ask for now: 0 if none, else up to the first finish."""
    seqs = sched.plain_decode_seqs()
    return min(s.output_len - s.num_generated for s in seqs) if seqs else 0


def drive(sched: Scheduler, rng=None, use_runs: bool = False, max_steps: int = 20_000) -> int:
    """Run to completion; returns the number of iterations (a decode run of k counts k)."""
    steps = 0
    while sched.has_unfinished():
        k = len(sched.advance_decodes(run_length(sched))[0]) if use_runs and run_length(sched) else 0
        if k:
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
