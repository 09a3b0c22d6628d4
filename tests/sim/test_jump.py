"""Jumping over runs of identical decode steps gives the same run as stepping token by token (DESIGN.md 6).

Each case simulates one workload twice, `jump=False` (one schedule()/finish_step() per token) and `jump=True`
(with `validate=True`: after every run the loop checks its booked memory against the KV manager). Everything
per request and per step must be identical: times are the same float sums in the same order, and the memory
counts are integers. The time-weighted memory shares may differ only by summation order: rel 1e-9.
"""
from __future__ import annotations

import numpy as np
import pytest

from sim.api import run
from sim.kv.base import SHARE_NAMES
from sim.metrics import REQUEST_COLUMNS, STEP_COLUMNS

# (policy, extra arguments). Small pools (kv_slots) make memory run out: preemption for paged, long waits
# for the contiguous policies. 4096 slots still hold the longest request (2048 tokens) twice.
CASES = {
    "paged": ("paged", {}),
    "paged-small-pool": ("paged", {"kv_slots": 4096}),
    "paged-swap": ("paged", {"kv_slots": 4096, "preemption": "swap", "swap_space_gib": 1.0}),
    "paged-block-1": ("paged", {"kv_slots": 4096, "block_size": 1}),
    "paged-parallel-sampling": ("paged", {"n": 2}),
    "paged-parallel-sampling-preempt": ("paged", {"n": 3}),
    "paged-beam": ("paged", {"beam_width": 3, "kv_slots": 8192, "workload": "alpaca"}),
    "paged-prefix": ("paged", {"prefix_len": 40, "num_prefixes": 2, "kv_slots": 4096}),
    "paged-static": ("paged", {"scheduler": "static", "kv_slots": 4096}),
    "max": ("max", {}),
    "max-small-pool": ("max", {"kv_slots": 4096}),
    "pow2": ("pow2", {"kv_slots": 4096}),
    "oracle": ("oracle", {"kv_slots": 4096}),
    "oracle-parallel-sampling": ("oracle", {"n": 2, "kv_slots": 8192, "allocator": "first_fit"}),
}


def _simulate(policy: str, jump: bool, **extra):
    args = {"workload": "sharegpt", "rate": 4.0, "num_requests": 40, "seed": 3, **extra}
    return run(policy=policy, jump=jump, validate=jump, **args)


@pytest.mark.parametrize("case", sorted(CASES))
def test_jump_equals_stepping(case):
    policy, extra = CASES[case]
    stepped, jumped = _simulate(policy, False, **extra), _simulate(policy, True, **extra)
    assert jumped.summary["num_finished"] == stepped.summary["num_finished"] == stepped.summary["num_requests"]
    for name in REQUEST_COLUMNS:  # arrival, first token, finish, preemptions, normalized latency: bit-identical
        np.testing.assert_array_equal(jumped.requests[name], stepped.requests[name], err_msg=name)
    for name in STEP_COLUMNS:  # step count, start times, durations, batch sizes, slot counts: bit-identical
        np.testing.assert_array_equal(jumped.steps[name], stepped.steps[name], err_msg=name)
    for key in ("num_steps", "mean_batch_size", "num_preemptions", "throughput_req_per_s", "sim_time_s"):
        assert jumped.summary[key] == stepped.summary[key], key
    for name in SHARE_NAMES:  # only the order of a float sum may differ
        assert jumped.summary["memory"][name] == pytest.approx(stepped.summary["memory"][name], rel=1e-9, abs=1e-12)


def test_jumps_happen_and_matter():
    """The fast path is really taken: far fewer events than steps (a run of K steps is one event)."""
    jumped = _simulate("paged", True)
    stepped = _simulate("paged", False)
    assert jumped.summary["num_events"] < stepped.summary["num_events"] / 2
    assert jumped.summary["num_steps"] == stepped.summary["num_steps"]


def test_preemption_heavy_cases_preempt():
    """The small-pool paged cases above really exercise preemption (else they would test less than they claim)."""
    for case in ("paged-small-pool", "paged-swap", "paged-block-1"):
        policy, extra = CASES[case]
        assert _simulate(policy, True, **extra).summary["num_preemptions"] > 0, case
