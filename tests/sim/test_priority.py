"""Priority scheduling (SchedulerConfig(scheduling_policy="priority"), vLLM's --scheduling-policy priority): every
queue ordered by (request.priority, arrival), the lower value first; the latest arrival of the highest value
preempted first. The invariants over random systems (nobody overtakes, victims from the end of the order) are in
test_scheduler_properties.py; the fast-forward's equality with stepping under priority in test_fastforward.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.api import run
from sim.base.request import Request
from sim.clock.metrics import REQUEST_COLUMNS, STEP_COLUMNS
from sim.kv import make_kv_manager
from sim.scheduling.plan import StepOutcome
from sim.scheduling.scheduler import Scheduler, SchedulerConfig
from sim.workloads.trace import read_trace, write_csv, write_jsonl
from sim.workloads.workload import assign_priorities, generate_requests


def _same_run(a, b) -> None:
    for name in REQUEST_COLUMNS:
        np.testing.assert_array_equal(a.requests[name], b.requests[name], err_msg=name)
    for name in STEP_COLUMNS:
        np.testing.assert_array_equal(a.steps[name], b.steps[name], err_msg=name)


@settings(deadline=None, max_examples=25)
@given(
    scheduler=st.sampled_from(["v0", "v1", "static"]),
    kv_slots=st.sampled_from([2400, 4096, 20_000]),
    seed=st.integers(0, 5),
    share=st.sampled_from([0.0, 1.0]),
)
def test_one_class_is_fcfs(scheduler, kv_slots, seed, share):
    """With every request of one priority, priority scheduling is FCFS: the same run, bit for bit (with memory short
    enough to preempt, where the victim is the latest arrival either way)."""
    args = dict(workload="sharegpt", rate=6.0, num_requests=40, seed=seed, scheduler=scheduler, kv_slots=kv_slots)
    fcfs = run(**args)
    by_priority = run(scheduling_policy="priority", priority_share=share, **args)
    _same_run(by_priority, fcfs)
    assert "by_priority" not in by_priority.summary  # one class: no per-class summary


def _step(sched: Scheduler):
    """One step with the simulator's outcome rule (a sequence finishes at its output_len)."""
    plan = sched.schedule()
    done = {
        e.seq_id
        for e in plan.entries
        if e.sample and sched.num_generated(e.seq_id) + 1 >= sched.request(e.request_id).output_len
    }
    sched.finish_step(plan, StepOutcome(done))
    return plan


@pytest.mark.parametrize("mode", ["v0", "v1"])
def test_a_better_class_heads_the_queue_and_loses_last(mode):
    """Four 8-block requests in a 20-block pool. Two of class 1 run; a class-1 and then a class-0 request arrive: the
    class-0 one is admitted first although it came last (FCFS would admit the earlier). When memory runs out, the
    class-1 requests go before the class-0 one, the latest arrival of them first."""
    block = 4
    for policy, first in (("priority", 3), ("fcfs", 2)):
        sched = Scheduler(
            make_kv_manager("paged", 20 * block, block_size=block),
            SchedulerConfig(mode=mode, scheduling_policy=policy, max_num_batched_tokens=64),
        )
        for rid, priority in ((0, 1), (1, 1)):
            sched.add_request(Request(rid, 0.0, 24, 16, priority=priority))
        _step(sched)
        assert sorted(sched.running_request_ids()) == [0, 1]
        sched.add_request(Request(2, 1.0, 24, 16, priority=1))
        sched.add_request(Request(3, 2.0, 24, 16, priority=0))
        assert sched.waiting_request_ids() == ([3, 2] if policy == "priority" else [2, 3])
        admitted, preempted = [], []
        while sched.has_unfinished():
            waiting, running = set(sched.waiting_request_ids()), sorted(sched.running_request_ids())
            plan = _step(sched)
            admitted += [rid for rid in dict.fromkeys(e.request_id for e in plan.prefills) if rid in waiting]
            if plan.preempted and not preempted:  # the first victim: the latest class-1 arrival then running
                assert plan.preempted[0] == max(r for r in running if r != 3 or policy == "fcfs"), (running, plan)
            preempted += plan.preempted
        assert admitted[0] == first
        assert preempted, "the pool is too small for all four: someone is preempted"
        if policy == "priority":
            assert 3 not in preempted, preempted


def test_the_better_class_waits_less_under_load():
    """ShareGPT at twice what the pool sustains, a fifth of the requests of class 0: under priority scheduling class 0's
    time to first token drops far below FCFS's, class 1's rises; FCFS treats both alike."""
    args = dict(workload="sharegpt", rate=4.0, duration=200.0, seed=1, scheduler="v1", priority_share=0.2)
    fcfs = run(**args).summary["by_priority"]
    prio = run(scheduling_policy="priority", **args).summary["by_priority"]
    assert fcfs["0"]["num_requests"] == prio["0"]["num_requests"] > 0
    assert prio["0"]["mean_ttft_s"] < 0.25 * fcfs["0"]["mean_ttft_s"]
    assert prio["1"]["mean_ttft_s"] > fcfs["1"]["mean_ttft_s"]
    assert fcfs["0"]["mean_ttft_s"] == pytest.approx(fcfs["1"]["mean_ttft_s"], rel=0.5)


def test_priorities_are_drawn_beside_the_workload():
    """priority_share marks that share of the requests priority 0 (the rest 1) from a stream of its own: the lengths
    and arrivals are the same seed's without priorities."""
    plain = generate_requests("sharegpt", 5000, rate=2.0, seed=7)
    marked = generate_requests("sharegpt", 5000, rate=2.0, seed=7)
    assign_priorities(marked, 0.3, seed=7)
    assert [(r.arrival_time, r.prompt_len, r.output_len) for r in plain] == [
        (r.arrival_time, r.prompt_len, r.output_len) for r in marked
    ]
    share = np.mean([r.priority == 0 for r in marked])
    assert abs(share - 0.3) < 0.03 and {r.priority for r in marked} == {0, 1}
    for edge, expected in ((0.0, {1}), (1.0, {0})):
        assign_priorities(marked, edge, seed=7)
        assert {r.priority for r in marked} == expected
    with pytest.raises(ValueError, match=r"priority_share: got 1.5 \(allowed: a finite number >= 0 and <= 1"):
        assign_priorities(marked, 1.5, seed=7)


def test_a_trace_carries_priorities_and_leaves_them_out_when_all_are_0(tmp_path):
    requests = [Request(0, 0.0, 5, 3), Request(1, 0.5, 6, 2, priority=-2), Request(2, 1.0, 7, 4, priority=3)]
    for write, name in ((write_jsonl, "t.jsonl"), (write_csv, "t.csv")):
        write(requests, tmp_path / name)
        back = read_trace(tmp_path / name)
        assert [r.priority for r in back] == [0, -2, 3]
        plain = [Request(0, 0.0, 5, 3)]
        write(plain, tmp_path / name)
        assert "priority" not in (tmp_path / name).read_text()  # the format of a trace without classes is unchanged
    with pytest.raises(ValueError, match="priority must be an integer, got 0.5"):
        Request(0, 0.0, 5, 3, priority=0.5)
    with pytest.raises(ValueError, match=r"scheduling_policy: got 'lifo' \(allowed: fcfs, priority\)"):
        SchedulerConfig(scheduling_policy="lifo")
