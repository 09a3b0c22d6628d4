"""The event loop, metrics and `sim.run` on real scheduler/KV objects (no mocks).

Short runs (a minute or two of simulated arrivals) of the paper's setting: OPT-13B on one A100-40GB.
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from sim.api import run
from sim.base.request import Request
from sim.clock.cost import RooflineCostModel
from sim.kv.base import SHARE_NAMES
from sim.workloads.trace import write_jsonl

CONTRACT = {
    "policy": str,
    "num_requests": int,
    "num_finished": int,
    "throughput_req_per_s": float,
    "normalized_latency_s_per_token": float,
    "mean_batch_size": float,
    "num_preemptions": int,
    "wall_time_s": float,
    "memory": dict,
}


def test_summary_has_the_contract_keys_and_types():
    s = run(rate=2.0, duration=30.0).summary
    for key, kind in CONTRACT.items():
        assert isinstance(s[key], kind), (key, s[key])
    assert set(s["memory"]) == set(SHARE_NAMES)
    assert s["policy"] == "paged" and s["num_finished"] == s["num_requests"] > 0


@pytest.mark.parametrize("policy", ["paged", "max", "pow2", "oracle"])
def test_shares_sum_to_one(policy):
    s = run(policy=policy, rate=2.0, duration=30.0).summary
    # tolerance: five float ratios of the same total; rounding only
    assert sum(s["memory"].values()) == pytest.approx(1.0, abs=1e-12)
    assert sum(s["memory_busy"].values()) == pytest.approx(1.0, abs=1e-12)
    assert all(0.0 <= v <= 1.0 for v in s["memory"].values())


def test_one_paged_request_step_by_step():
    """Prompt 10, output 5, block_size 4, a pool of 16 blocks: 1 prefill + 4 decodes, final length 14.

    prefill   tokens 0-9 in 3 blocks; block 2 holds t8 t9 + 2 slots the output will fill     (10, 2, 0, 0, 52)
    decode 1  writes t10                                                                    (11, 1, 0, 0, 52)
    decode 2  writes t11: block 2 is full                                                   (12, 0, 0, 0, 52)
    decode 3  writes t12 into a new block 3; t13 is the last to come, 2 slots never used    (13, 1, 2, 0, 48)
    decode 4  writes t13 and samples the 5th token: done                                    (14, 0, 2, 0, 48)
    """
    expected = [(10, 2, 0, 0, 52), (11, 1, 0, 0, 52), (12, 0, 0, 0, 52), (13, 1, 2, 0, 48), (14, 0, 2, 0, 48)]
    cost = RooflineCostModel("opt-13b", "a100-40gb", block_size=4)  # the paged kernel at block size 4
    durations = [cost.step_time(10, 0, 10)] + [cost.step_time(0, 1, c) for c in (11, 12, 13, 14)]
    for jump in (False, True):
        result = run(requests=[Request(0, 1.0, 10, 5)], block_size=4, kv_slots=64, jump=jump, validate=jump)
        steps = result.steps
        assert [tuple(int(steps[n][i]) for n in SHARE_NAMES) for i in range(len(steps))] == expected
        assert steps["duration"].tolist() == durations
        assert result.requests["first_token_time"][0] == 1.0 + durations[0]
        finish = 1.0
        for d in durations:
            finish += d
        assert result.requests["finish_time"][0] == finish
        assert result.requests["normalized_latency"][0] == (finish - 1.0) / 5
        weighted = np.array([d * np.array(c, dtype=float) for d, c in zip(durations, expected)]).sum(axis=0)
        for name, value in zip(SHARE_NAMES, weighted / weighted.sum()):
            assert result.summary["memory"][name] == pytest.approx(value, rel=1e-12)  # summation order only


def test_one_oracle_request_reserves_its_exact_length():
    """Orca (Oracle) reserves prompt + output - 1 = 14 slots up front; buddy rounds the run to 16 (2 external)."""
    result = run(requests=[Request(0, 0.0, 10, 5)], policy="oracle", kv_slots=64)
    first = tuple(int(result.steps[n][0]) for n in SHARE_NAMES)
    last = tuple(int(result.steps[n][-1]) for n in SHARE_NAMES)
    assert first == (10, 4, 0, 2, 48)
    assert last == (14, 0, 0, 2, 48)


def test_paged_batches_more_requests_than_max():
    """Paper Fig. 13: at the same request rate, paged memory lets the engine batch several times more requests."""
    paged = run(policy="paged", rate=2.0, duration=120.0).summary
    orca_max = run(policy="max", rate=2.0, duration=120.0).summary
    assert paged["mean_batch_size"] > 1.5 * orca_max["mean_batch_size"]
    assert paged["normalized_latency_s_per_token"] < orca_max["normalized_latency_s_per_token"]


def test_underloaded_run_serves_everything_without_preemption():
    result = run(rate=0.5, duration=60.0)
    s, req = result.summary, result.requests
    assert s["num_finished"] == s["num_requests"] and s["num_preemptions"] == 0
    assert np.all(req["first_token_time"] > req["arrival_time"])
    assert np.all(req["finish_time"] >= req["first_token_time"])
    assert s["memory"]["free"] > 0.5  # light load: most of the pool sits idle


def test_preemptions_are_counted_under_memory_pressure():
    result = run(rate=4.0, num_requests=40, kv_slots=4096, seed=3)
    s = result.summary
    assert s["num_preemptions"] > 0
    assert (
        s["num_preemptions"]
        == int(result.requests["num_preemptions"].sum())
        == int(result.steps["num_preempted"].sum())
    )
    assert s["num_finished"] == s["num_requests"]


def test_static_batching_has_higher_latency_than_continuous():
    continuous = run(rate=1.0, duration=60.0).summary
    static = run(rate=1.0, duration=60.0, scheduler="static").summary
    assert static["normalized_latency_s_per_token"] > 2 * continuous["normalized_latency_s_per_token"]


def test_same_seed_same_summary_and_other_seed_differs():
    a, b = (run(rate=2.0, duration=30.0, seed=5).summary for _ in range(2))
    a.pop("wall_time_s"), b.pop("wall_time_s")
    assert a == b
    c = run(rate=2.0, duration=30.0, seed=6).summary
    assert c["num_requests"] != a["num_requests"] or c["sim_time_s"] != a["sim_time_s"]


@pytest.mark.parametrize("extra", [{"n": 2}, {"beam_width": 3}, {"prefix_len": 64, "num_prefixes": 2}])
def test_sampling_beams_and_prefixes_finish(extra):
    s = run(workload="alpaca", rate=4.0, duration=20.0, **extra).summary
    assert s["num_finished"] == s["num_requests"] > 0


def test_idle_gaps_count_as_free():
    """Two short requests 100 s apart: the pool is idle almost the whole span, and that idle time is counted."""
    requests = [Request(0, 0.0, 16, 4), Request(1, 100.0, 16, 4)]
    s = run(requests=requests, kv_slots=1024).summary
    assert s["sim_time_s"] > 100.0
    assert s["memory"]["free"] > 0.99


def test_trace_run_and_csv_tables(tmp_path):
    requests = [Request(i, 0.5 * i, 20 + i, 10 + i) for i in range(8)]
    trace = tmp_path / "trace.jsonl"
    write_jsonl(requests, trace)
    result = run(trace=trace, kv_slots=2048)
    assert result.summary["num_finished"] == 8 and result.summary["rate"] is None
    result.requests.to_csv(tmp_path / "requests.csv")
    result.steps.to_csv(tmp_path / "steps.csv")
    with open(tmp_path / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["output_len"]) for r in rows] == [10 + i for i in range(8)]
    with open(tmp_path / "steps.csv") as f:
        assert sum(1 for _ in f) == result.summary["num_steps"] + 1


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"rate": 0.0}, "rate"),
        ({"rate": -1.0}, "rate"),
        ({"rate": math.inf}, "rate"),
        ({"duration": 0.0}, "duration"),
        ({"block_size": 0}, "block_size"),
        ({"policy": "lru"}, "policy"),
        ({"model": "nope"}, "model"),
        ({"gpu": "nope"}, "gpu"),
        ({"model": "opt-175b"}, "do not fit"),
        ({"n": 2, "beam_width": 2}, "n and beam_width"),
        ({"preemption": "drop"}, "preemption"),
        ({"arrival": "offline"}, "num_requests"),
        ({"workload": "fixed"}, "prompt_len"),
        ({"kv_slots": 0}, "kv_slots"),
    ],
)
def test_bad_arguments_raise_naming_them(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        run(**{"duration": 10.0, **kwargs})


def test_request_longer_than_the_pool_is_named():
    with pytest.raises(ValueError, match="request 7"):
        run(requests=[Request(3, 0.0, 100, 10), Request(7, 1.0, 1000, 500)], kv_slots=1024)
    with pytest.raises(ValueError, match="request 9.*context"):
        run(requests=[Request(9, 0.0, 1500, 600)])


@pytest.mark.parametrize(
    "settings",
    [
        {"scheduler": "v0", "rate": 3.0, "duration": 60.0},  # preemptions
        {"scheduler": "v1", "rate": 2.0, "duration": 40.0, "n": 2},
        {"policy": "max", "rate": 1.0, "duration": 30.0, "jump": False},
        {"scheduler": "static", "rate": 1.0, "duration": 30.0, "preemption": "swap", "beam_width": 2},
    ],
)
def test_a_run_without_its_step_table_has_the_same_summary_and_requests(settings):
    """step_table=False keeps only the steps' totals: the summary (num_steps, mean batch size included) and the
    per-request table are those of the run that kept the table, bit for bit."""
    kept, totals = run(**settings), run(**settings, step_table=False)
    assert totals.steps is None and len(kept.steps) == kept.summary["num_steps"] > 0
    assert kept.summary["mean_batch_size"] == float(kept.steps["num_running"].mean())  # numpy's mean of the column
    drop = ("wall_time_s",)
    assert {k: v for k, v in kept.summary.items() if k not in drop} == {
        k: v for k, v in totals.summary.items() if k not in drop
    }
    for name in kept.requests.columns:
        np.testing.assert_array_equal(kept.requests[name], totals.requests[name])


def test_the_cli_keeps_the_step_table_only_for_the_outputs_that_read_it(tmp_path, capsys):
    from sim.drivers.cli import main

    args = ["run", "--rate", "2", "--duration", "20", "--json"]
    assert main(args) == 0
    without = json.loads(capsys.readouterr().out)
    assert main([*args, "--steps-csv", str(tmp_path / "steps.csv")]) == 0
    with_table = json.loads(capsys.readouterr().out)
    rows = list(csv.DictReader(open(tmp_path / "steps.csv")))
    assert len(rows) == with_table["num_steps"] == without["num_steps"] > 0
    without.pop("wall_time_s"), with_table.pop("wall_time_s")
    assert without == with_table
