"""The scheduler (sim/scheduling/scheduler.py): FCFS iteration-level scheduling with preemption by recompute or swap,
static batching, the paper's prefill-only steps (v0) and vLLM v1's token budget, and the fast-forward's plain
decode runs. Small pools, so memory runs out often; the KV manager's invariants are checked after every step.
(Sequence groups: test_scheduler_groups.py; the v1 token budget and chunks: test_scheduler_v1.py.)"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.base.specs import get_model
from sim.fast.runs import advance, kv_runs, plain_decodes
from sim.kv import POLICIES, allocates_blocks_on_demand, make_kv_manager
from sim.scheduling.plan import StepOutcome, StepPlan
from sim.scheduling.scheduler import Scheduler, SchedulerConfig
from sim.testing.blocks import machine_settings
from sim.workloads.workload import generate_requests
from tests.sim.scheduler_driver import all_blocks_free, drive, paged, req, run_length, step

# The model the policies that need one are given (hybrid: sliding-window layers): Gemma 3's, a window these short
# requests slide past.
_WINDOWED = dataclasses.replace(get_model("gemma3-270m"), sliding_window=16, max_seq_len=256)

V0 = SchedulerConfig(mode="v0")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
        ({"mode": "continuous"}, "mode"),
        ({"preemption": "kill"}, "preemption"),
        ({"victim": "oldest"}, "victim"),
        ({"mode": "v0", "enable_chunked_prefill": True}, "enable_chunked_prefill"),
    ],
)
def test_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**kwargs)


@pytest.mark.parametrize(
    "kv, config, request_, message",
    [
        (paged(64), SchedulerConfig(max_num_batched_tokens=16, mode="v0"), req(0, 17, 1), "max_num_batched_tokens"),
        (
            paged(64),
            SchedulerConfig(max_num_batched_tokens=16, enable_chunked_prefill=False),
            req(0, 17, 1),
            "or any length with chunked prefill",
        ),
        (paged(64), SchedulerConfig(max_num_batched_tokens=2), req(0, 4, 1, beam_width=3), "beam_width 3"),
        (paged(4), SchedulerConfig(), req(0, 10, 10), "need 5 blocks"),  # final length 19 -> 5 blocks of 4
        (make_kv_manager("max", 64, block_size=1, max_seq_len=32), SchedulerConfig(), req(0, 30, 10), "max_seq_len"),
        (make_kv_manager("oracle", 16, block_size=1), SchedulerConfig(), req(0, 10, 4, n=2), "do not fit"),
        (paged(64), SchedulerConfig(max_num_seqs=2), req(0, 4, 4, n=3), "max_num_seqs"),
        (paged(10, watermark=0.3), SchedulerConfig(), req(0, 20, 10), "allowed: <= 7"),  # 8 blocks; 3 kept free
    ],
)
def test_add_request_rejects_impossible_requests(kv, config, request_, message):
    sched = Scheduler(kv, config)
    with pytest.raises(ValueError, match=message):
        sched.add_request(request_)
    assert not sched.has_unfinished()
    sched.add_request(req(1, 2, 2))
    with pytest.raises(ValueError, match="already added"):
        sched.add_request(req(1, 2, 2))


@pytest.mark.parametrize("mode", ["v0", "v1"])
def test_fcfs_no_overtaking(mode):
    sched = Scheduler(paged(8), SchedulerConfig(mode=mode))
    sched.add_request(req(0, 16, 3))  # 4 blocks
    sched.add_request(req(1, 20, 1))  # 5 blocks: does not fit beside request 0
    sched.add_request(req(2, 4, 1))  # 1 block: would fit, but must not overtake request 1
    plan, _ = step(sched)
    assert [e.request_id for e in plan.prefills] == [0]
    assert sched.waiting_request_ids() == [1, 2]
    drive(sched)
    assert all_blocks_free(sched.kv)


def test_watermark_holds_back_an_admission_that_would_leave_too_little_free():
    """Deliberate change: the watermark is the KV manager's (make_kv_manager(..., watermark=)), not the scheduler's."""
    for watermark, admitted in [(0.0, [0, 1]), (0.3, [0])]:  # 10 blocks; 0.3 keeps 3 free
        sched = Scheduler(paged(10, watermark=watermark), V0)
        sched.add_request(req(0, 16, 2))  # 4 blocks
        sched.add_request(req(1, 16, 2))  # 4 more would leave 2 free
        plan, _ = step(sched)
        assert [e.request_id for e in plan.prefills] == admitted
        drive(sched)
        assert all_blocks_free(sched.kv)


# --- preemption --------------------------------------------------------------------------------------
def three_growing_requests(preemption: str, mode: str = "v0", victim: str = "latest_arrival") -> Scheduler:
    # 6 blocks of 4 slots; three requests of prompt 4, output 8 each end with 11 tokens in 3 blocks: two fit, three
    # run out of memory mid-decode.
    kv = paged(6, num_cpu_blocks=8 if preemption == "swap" else 0)
    sched = Scheduler(kv, SchedulerConfig(preemption=preemption, mode=mode, victim=victim))
    for rid in range(3):
        sched.add_request(req(rid, 4, 8))
    return sched


def run_until_preemption(sched: Scheduler) -> StepPlan:
    while True:
        plan, _ = step(sched)
        if plan.preempted:
            return plan


@pytest.mark.parametrize("mode", ["v0", "v1"])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_latest_arrived_group_is_the_victim(preemption, mode):
    sched = three_growing_requests(preemption, mode)
    plan = run_until_preemption(sched)
    assert plan.preempted == [2] and sched.num_preemptions == 1
    assert sched.running_request_ids() == [0, 1]
    assert [e.request_id for e in plan.decodes] == [0, 1]  # the victim does not decode this step
    if preemption == "swap":  # its 2 blocks went to CPU memory
        assert sched.swapped_request_ids() == [2] and len(plan.blocks_to_swap_out) == 2
    else:  # back to the FRONT of the waiting queue
        assert sched.waiting_request_ids() == [2]


def test_recompute_refills_prompt_plus_generated_tokens():
    sched = three_growing_requests("recompute")
    run_until_preemption(sched)
    (victim,) = sched.seq_ids(2)
    generated = sched.num_generated(victim)
    assert generated > 1
    while True:  # the victim waits until requests 0 and 1 leave room
        plan, _ = step(sched)
        if plan.prefills:
            break
    (entry,) = plan.prefills
    assert (entry.seq_id, entry.num_computed_tokens, entry.num_new_tokens) == (victim, 0, 4 + generated)
    assert sched.num_generated(victim) == generated + 1  # the recompute prefill samples the next token
    drive(sched)
    assert sched.num_generated(victim) == 8 and all_blocks_free(sched.kv)


@pytest.mark.parametrize("mode", ["v0", "v1"])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preemption_returns_every_block(preemption, mode):
    sched = three_growing_requests(preemption, mode)
    swaps = 0
    while sched.has_unfinished():
        plan, _ = step(sched)
        swaps += len(plan.blocks_to_swap_in)
    assert sched.num_preemptions >= 1
    assert (swaps > 0) == (preemption == "swap")
    assert all_blocks_free(sched.kv)
    assert all(sched.num_generated(sched.seq_ids(rid)[0]) == 8 for rid in range(3))


# --- static vs iteration-level batching ----------------------------------------------------------------
@pytest.mark.parametrize("mode", ["static", "v0"])
def test_static_admits_nothing_while_a_batch_runs(mode):
    # Room for exactly requests 0 and 1 (oracle reserves final lengths 11 + 5 = 16 slots); 2 must wait.
    kv = make_kv_manager("oracle", 16, block_size=1, allocator="first_fit")
    sched = Scheduler(kv, SchedulerConfig(mode=mode))
    for rid, output_len in [(0, 8), (1, 2), (2, 2)]:
        sched.add_request(req(rid, 4, output_len))
    finished_at, prefilled_at, t = {}, {}, 0
    while sched.has_unfinished():
        plan, done = step(sched)
        prefilled_at.update({e.request_id: t for e in plan.prefills})
        finished_at.update({rid: t for rid in done})
        t += 1
    assert finished_at[1] == 1  # request 1 completes when it finishes, in both modes
    if mode == "v0":  # memory freed by request 1 is used at once
        assert prefilled_at[2] == finished_at[1] + 1
    else:  # nothing joins until the whole batch (request 0 too) is done
        assert prefilled_at[2] == finished_at[0] + 1


def test_iteration_level_batching_finishes_a_mixed_workload_in_fewer_steps():
    steps = {}
    for mode in ("static", "v0", "v1"):
        reqs = generate_requests(
            "uniform",
            30,
            arrival="offline",
            prompt_len_range=(4, 40),
            output_len_range=(1, 60),
            max_seq_len=128,
            seed=3,
        )
        sched = Scheduler(paged(64), SchedulerConfig(mode=mode, max_num_seqs=8))
        for r in reqs:
            sched.add_request(r)
        steps[mode] = drive(sched)
        assert all_blocks_free(sched.kv)
    assert steps["v0"] < steps["static"] and steps["v1"] < steps["static"]


# --- abort and the step protocol ------------------------------------------------------------------------
def test_abort_frees_memory_wherever_the_request_is():
    sched = three_growing_requests("swap")
    run_until_preemption(sched)
    sched.add_request(req(3, 4, 2))
    for rid in (2, 0, 3):  # swapped, running, waiting
        sched.abort(rid)
        sched.kv.check_invariants()
        assert sched.is_finished(rid)
    assert sched.running_request_ids() == [1] and not sched.swapped_request_ids() and not sched.waiting_request_ids()
    drive(sched)
    assert all_blocks_free(sched.kv)


def test_finish_step_wants_the_last_plan():
    sched = Scheduler(paged(8), V0)
    sched.add_request(req(0, 4, 3))
    plan = sched.schedule()
    with pytest.raises(RuntimeError, match="finish_step"):
        sched.schedule()
    with pytest.raises(ValueError, match="last schedule"):
        sched.finish_step(StepPlan(), StepOutcome())
    sched.finish_step(plan, StepOutcome())


# --- plain decode runs (the fast-forward's part of the scheduler) ---------------------------------------
def snapshot(sched: Scheduler) -> tuple:
    kv, seqs = sched.kv, {}
    for rid in sched.running_request_ids():
        for i in sched.seq_ids(rid):
            seqs[i] = (kv.block_table(i), kv.num_tokens(i), sched.num_generated(i))
    return seqs, kv.breakdown(), kv.num_free_blocks, sched.waiting_request_ids(), sched.running_request_ids()


def twin(policy: str, num_slots: int, mode: str) -> Scheduler:
    kv = make_kv_manager(policy, num_slots, block_size=4 if policy == "paged" else 1, max_seq_len=64)
    sched = Scheduler(kv, SchedulerConfig(mode=mode))
    for rid, (prompt_len, output_len) in enumerate([(5, 30), (3, 40), (9, 25), (30, 20)]):
        sched.add_request(req(rid, prompt_len, output_len))
    step(sched)  # the prefill step
    return sched


@pytest.mark.parametrize("mode", ["v0", "v1"])
@pytest.mark.parametrize(
    "policy, num_slots, bound", [("paged", 256, "length"), ("paged", 80, "memory"), ("oracle", 256, "length")]
)
def test_a_plain_decode_run_equals_stepping_token_by_token(policy, num_slots, bound, mode):
    stepped, jumped = twin(policy, num_slots, mode), twin(policy, num_slots, mode)
    assert jumped.num_running == 4
    # after the prefill each sequence has sampled 1 token; a run may go on until the step where the first one
    # samples its last (request 3: output 20), unless memory stops it first
    until_finish = run_length(jumped)
    assert until_finish == 20 - 1
    counts, finished = advance(jumped, plain_decodes(jumped), until_finish)
    k = len(counts)
    assert 0 < k and (k == until_finish if bound == "length" else k < until_finish)
    assert finished == ([3] if k == until_finish else [])  # request 3 finished in the run's last step
    before = stepped.running_request_ids()
    for j in range(k):
        plan, done = step(stepped)
        assert not (plan.prefills or plan.blocks_to_copy or plan.blocks_to_swap_in or plan.preempted)
        assert plan.request_ids() == before and done == (finished if j == k - 1 else [])
    jumped.kv.check_invariants()
    assert snapshot(jumped) == snapshot(stepped)
    assert drive(jumped, use_runs=True) == drive(stepped)  # and the rest of the run too
    assert all_blocks_free(jumped.kv)


def test_no_plain_decode_run_when_the_next_step_differs():
    sched = twin("paged", 256, "v0")
    sched.add_request(req(9, 4, 4))  # it fits: the next step is a prefill
    assert plain_decodes(sched) is None
    sched = Scheduler(paged(32), V0)
    sched.add_request(req(0, 6, 8, n=2))  # siblings share a half-full last block: the next decode copies it
    step(sched)
    decodes = plain_decodes(sched)
    assert decodes is not None and kv_runs(sched.kv).max_decode_steps([sched.seq_ids(0)], 100) == 0
    assert advance(sched, decodes, 7) == ([], [])  # nothing applied: memory allows no step without a copy
    step(sched)
    assert run_length(sched) == 8 - 2
    v1 = Scheduler(paged(32), SchedulerConfig(max_num_batched_tokens=4))
    v1.add_request(req(0, 10, 8))
    step(v1)  # a chunk of 4: the prompt is not computed yet, so the next step is not a plain decode
    assert plain_decodes(v1) is None


# --- whole runs: every policy, every feature ----------------------------------------------------------
@pytest.mark.parametrize(
    "policy, config, workload, num_slots",
    [(p, {"mode": m}, {}, 1024) for p in POLICIES for m in ("v0", "v1")]
    + [
        ("paged", {"preemption": "swap", "mode": "v0"}, {}, 1024),
        ("paged", {"preemption": "swap", "max_num_batched_tokens": 32}, {}, 1024),
        ("paged", {"mode": "static"}, {}, 1024),
        ("paged", {"mode": "v0"}, {"n": 2}, 1024),
        ("paged", {"max_num_batched_tokens": 16}, {"n": 2}, 1024),
        ("paged", {"preemption": "swap", "mode": "v0"}, {"beam_width": 3}, 512),
        ("paged", {"mode": "v0"}, {"beam_width": 2}, 512),
        ("paged", {"max_num_batched_tokens": 16}, {"beam_width": 2}, 512),
        ("paged", {"mode": "v0"}, {"prefix_len": 16, "num_prefixes": 2}, 1024),
        (
            "paged",
            {"max_num_batched_tokens": 24, "victim": "fewest_computed"},
            {"prefix_len": 16, "num_prefixes": 2},
            1024,
        ),
        ("oracle", {"mode": "v0"}, {"beam_width": 2}, 1024),
        ("oracle", {"max_num_batched_tokens": 16}, {"n": 3}, 1024),
    ],
)
def test_synthetic_workload_runs_to_completion(policy, config, workload, num_slots):
    """~50 requests to completion with invariants checked each step, stepping token by token and again
    jumping over decode runs: both give the same number of iterations and preemptions."""
    results = []
    for use_runs in (False, True):
        reqs = generate_requests(
            "uniform",
            50,
            rate=20.0,
            prompt_len_range=(2, 60),
            output_len_range=(1, 60),
            max_seq_len=256,
            seed=7,
            **workload,
        )
        kv = make_kv_manager(
            policy,
            num_slots,
            block_size=8 if allocates_blocks_on_demand(policy) else 1,
            max_seq_len=256,
            num_cpu_blocks=32,
            enable_prefix_caching="prefix_len" in workload,
            model=_WINDOWED,
        )
        sched = Scheduler(kv, SchedulerConfig(max_num_seqs=24, **config))
        for r in reqs:
            sched.add_request(r)
        results.append((drive(sched, rng=np.random.default_rng(0), use_runs=use_runs), sched.num_preemptions))
        assert all(sched.is_finished(r.request_id) for r in reqs)
        assert all(sched.num_generated(i) == r.output_len for r in reqs for i in sched.seq_ids(r.request_id))
        assert all_blocks_free(kv)
    assert results[0] == results[1]
    if not allocates_blocks_on_demand(policy):
        assert results[0][1] == 0  # contiguous policies reserve at admission and never preempt


@machine_settings(max_examples=150)
@given(
    shapes=st.lists(
        st.tuples(st.integers(1, 24), st.integers(1, 24), st.sampled_from([(1, 1), (2, 1), (3, 1), (1, 2), (1, 3)])),
        min_size=1,
        max_size=8,
    ),
    mode=st.sampled_from(["v0", "static", "v1"]),
    preemption=st.sampled_from(["recompute", "swap"]),
    watermark=st.sampled_from([0.0, 0.2]),
    num_blocks=st.integers(6, 24),
    seed=st.integers(0, 2**16),
)
def test_any_small_workload_completes_and_returns_every_block(shapes, mode, preemption, watermark, num_blocks, seed):
    """Random groups on a tiny pool (so preemption is frequent): everything finishes with its full output,
    every GPU and CPU block comes back, and jumping over decode runs changes nothing."""
    results = []
    for use_runs in (False, True):
        budget = 8 if mode == "v1" else None  # v1: prompts of up to 24 tokens in chunks of <= 8
        config = SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=budget, mode=mode, preemption=preemption)
        sched = Scheduler(paged(num_blocks, num_cpu_blocks=8, watermark=watermark), config)
        accepted = []
        for rid, (prompt_len, output_len, (n, beam)) in enumerate(shapes):
            try:
                sched.add_request(req(rid, prompt_len, output_len, n=n, beam_width=beam))
                accepted.append(rid)
            except ValueError:  # too big for this pool: rejected up front, nothing queued
                assert sched.num_waiting == len(accepted)
        results.append((drive(sched, rng=np.random.default_rng(seed), use_runs=use_runs), sched.num_preemptions))
        assert all(sched.is_finished(rid) for rid in accepted)
        for rid in accepted:
            assert [sched.num_generated(i) for i in sched.seq_ids(rid)] == [shapes[rid][1]] * len(sched.seq_ids(rid))
        assert all_blocks_free(sched.kv)
    assert results[0] == results[1]
