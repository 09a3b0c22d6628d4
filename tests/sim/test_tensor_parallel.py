"""Tensor parallelism in the roofline (sim/clock/cost.py): the all-reduce term, its GPU specs (sim/base/specs.py), and the
calibrated model's refusal of num_gpus > 1 (sim/clock/cost_file.py).

The perfect-division bound is built independently of the term: one imaginary GPU with n times the bandwidth and
n times the FLOP/s of the real one, on which nothing is all-reduced. n real GPUs never beat it, and beat it by
exactly the all-reduce formula written out here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.api
from sim.base.specs import GPUSpec, get_gpu, get_model
from sim.clock.cost import RooflineCostModel, RooflineEfficiency
from sim.drivers.cli import main

ROOT = Path(__file__).resolve().parents[2]
SETUPS = [
    ("opt-13b", "a100-40gb"),
    ("opt-66b", "a100-40gb"),
    ("opt-175b", "a100-80gb"),
    ("llama-13b", "h100"),
    ("gemma3-27b", "h200"),
]
steps = st.tuples(st.integers(0, 4096), st.integers(0, 256), st.integers(0, 400_000))  # prompt, decodes, context


def formula(model: str, gpu: str, n: int, tokens: int) -> float:
    """The term as the class docstring writes it, from the datasheet numbers."""
    m, g = get_model(model), get_gpu(gpu)
    one = g.interconnect_latency_s + 2 * (n - 1) / n * tokens * m.hidden_size * m.dtype_bytes / (
        g.interconnect_bandwidth * RooflineEfficiency().interconnect
    )
    return 2 * m.num_layers * one


def perfect_division(model: str, gpu: str, n: int) -> RooflineCostModel:
    """One GPU n times as fast in bytes and FLOP/s: tensor parallelism with free communication."""
    g = get_gpu(gpu)
    big = dataclasses.replace(g, mem_bandwidth=n * g.mem_bandwidth, peak_flops=n * g.peak_flops)
    return RooflineCostModel(model, big, num_gpus=1)


@settings(max_examples=60, deadline=None)
@given(setup=st.sampled_from(SETUPS), tokens=st.integers(0, 10**6))
def test_all_reduce_is_exactly_zero_on_one_gpu(setup, tokens):
    assert RooflineCostModel(*setup, num_gpus=1).all_reduce_time(tokens) == 0.0


def test_one_gpu_prices_are_the_single_gpu_roofline():
    # The term adds 0.0 on one GPU; the step price is the plain roofline, written out for a decode step of OPT-13B.
    cost = RooflineCostModel("opt-13b", "a100-40gb")
    m, bandwidth = get_model("opt-13b"), 1.555e12 * 0.8
    memory = (m.weight_bytes + 64 * 500 * m.kv_bytes_per_token + 64 * m.kv_bytes_per_token) / bandwidth
    assert cost.step_time(0, 64, 64 * 500) == pytest.approx(memory + 0.002, rel=1e-12)


@pytest.mark.parametrize(
    "model, gpu, n", [("opt-66b", "a100-40gb", 4), ("opt-175b", "a100-80gb", 8), ("opt-13b", "h100", 2)]
)
def test_all_reduce_matches_the_formula(model, gpu, n):
    cost = RooflineCostModel(model, gpu, num_gpus=n)
    for tokens in (0, 1, 37, 2048, 100_000):
        assert cost.all_reduce_time(tokens) == pytest.approx(formula(model, gpu, n, tokens), rel=1e-12)
    # OPT-175B on 8 A100s, a decode step of 100 sequences: 192 all-reduces of 4.3 MB moved, 5.4 ms
    if model == "opt-175b":
        assert cost.all_reduce_time(100) == pytest.approx(192 * (10e-6 + 7 / 4 * 100 * 12288 * 2 / 240e9), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(setup=st.sampled_from(SETUPS), n=st.integers(2, 16), a=st.integers(0, 10**6), b=st.integers(0, 10**6))
def test_all_reduce_grows_with_tokens(setup, n, a, b):
    cost = RooflineCostModel(*setup, num_gpus=n)
    low, high = sorted((a, b))
    assert cost.all_reduce_time(0) > 0  # the fixed latency of 2 * layers all-reduces
    assert (cost.all_reduce_time(low) < cost.all_reduce_time(high)) == (low < high)


@settings(max_examples=80, deadline=None)
@given(setup=st.sampled_from(SETUPS), n=st.integers(2, 16), step=steps)
def test_tensor_parallel_never_beats_perfect_division(setup, n, step):
    prompt, decodes, context = step
    tp, ideal = RooflineCostModel(*setup, num_gpus=n), perfect_division(*setup, n)
    t, bound = tp.step_time(prompt, decodes, context), ideal.step_time(prompt, decodes, context)
    assert t > bound
    assert t - bound == pytest.approx(formula(*setup, n, prompt + decodes), rel=1e-9)
    # and n GPUs are never more than n times faster than one (the overhead is paid once either way)
    one = RooflineCostModel(*setup).step_time(prompt, decodes, context)
    assert t - 0.002 >= (one - 0.002) / n


def test_a_faster_link_costs_less():
    slow = RooflineCostModel("opt-175b", "a100-80gb", num_gpus=8)
    fast = RooflineCostModel("opt-175b", "h200", num_gpus=8)  # 450 GB/s NVLink 4 against 300
    assert fast.all_reduce_time(4096) < slow.all_reduce_time(4096)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("interconnect_bandwidth", -300e9, "interconnect_bandwidth must be > 0, got -300000000000.0"),
        ("interconnect_bandwidth", 0.0, "interconnect_bandwidth must be > 0, got 0.0"),
        ("interconnect_bandwidth", float("nan"), "interconnect_bandwidth must be > 0, got nan"),
        ("interconnect_latency_s", -1e-6, "interconnect_latency_s must be >= 0 seconds, got -1e-06"),
        ("interconnect_latency_s", float("nan"), "interconnect_latency_s must be >= 0 seconds, got nan"),
    ],
)
def test_bad_interconnect_specs_are_refused(field, value, message):
    with pytest.raises(ValueError, match=f"GPUSpec a100-40gb: {message}"):
        dataclasses.replace(get_gpu("a100-40gb"), **{field: value})
    assert isinstance(get_gpu("a100-40gb"), GPUSpec)


@pytest.mark.parametrize("value", [0.0, -0.5, 1.5, float("nan")])
def test_bad_interconnect_efficiency_is_refused(value):
    with pytest.raises(ValueError, match=r"RooflineEfficiency.interconnect must be in \(0, 1\]"):
        RooflineEfficiency(interconnect=value)


def test_a_calibrated_model_refuses_more_than_one_gpu(capsys):
    cost_file = ROOT / "figures" / "cost_model_cpu.json"
    common = dict(model="smollm2-135m", gpu="h100", num_requests=4, cost_model=cost_file)
    with pytest.raises(
        ValueError,
        match=r"measured on one device and has no tensor-parallel terms: num_gpus 2 needs "
        r"the roofline",
    ):
        sim.api.run(**common, num_gpus=2)
    assert sim.api.run(**common, num_gpus=1).summary["num_requests"] == 4  # one GPU: the file prices the run
    argv = ["run", "--model", "smollm2-135m", "--gpu", "h100", "--num-gpus", "4", "--cost-model", str(cost_file)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cost model ") and err.count("\n") == 1 and "num_gpus 4" in err
