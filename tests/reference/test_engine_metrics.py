"""Every RequestOutput carries vLLM-shaped metrics (reference.engine.outputs.RequestMetrics), and `LLM.latency_summary`
reports them under the simulator's names (sim.clock.metrics.latency_summary).

What must hold whatever the workload: arrival <= first scheduled <= first token <= last token = finished; one token
step per generated token without preemption (a request's samples get theirs in the same step); TTFT, queueing delay,
mean / max inter-token latency and end-to-end latency by the simulator's definitions; a preemption counted; an output
returned mid-stream carries the times so far and never changes afterwards; the summary's keys are the simulator's and
its values the percentiles of the outputs' own numbers."""

from __future__ import annotations

import numpy as np
import pytest

import sim
from reference import LLM
from reference.engine.sampling import BeamSearchParams, SamplingParams
from reference.models import random_model
from sim.clock.metrics import LATENCY_METRICS

PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7], [4, 4, 4, 4, 4, 4, 4], [11, 12]]


@pytest.fixture(scope="module")
def model():
    return random_model(seed=5)


def run(llm, params):
    ids = [llm.add_request(p, params) for p in PROMPTS]
    done, streamed, seen = {}, [], []
    while llm.has_unfinished_requests():
        for out in llm.step():
            streamed.append(out)
            seen.append((out.metrics.num_token_steps, out.metrics.last_token_time, out.metrics.finished_time))
            if out.finished:
                done[out.request_id] = out
    # each output's metrics are a copy as of its step: the steps after it changed none of them
    assert [(o.metrics.num_token_steps, o.metrics.last_token_time, o.metrics.finished_time) for o in streamed] == seen
    return [done[i] for i in ids], streamed


def check_times(m, tokens: int | None) -> None:
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.last_token_time == m.finished_time
    if tokens is not None:
        assert m.num_token_steps == tokens
    assert m.ttft == m.first_token_time - m.arrival_time and m.queueing_delay == m.time_in_queue
    assert m.e2e_latency == m.finished_time - m.arrival_time
    if m.num_token_steps >= 2:
        assert m.itl_mean == pytest.approx((m.finished_time - m.first_token_time) / (m.num_token_steps - 1))
        assert m.itl_mean <= m.itl_max <= m.e2e_latency
    else:
        assert m.itl_mean is None and m.itl_max is None


@pytest.mark.parametrize(
    "params, settings",
    [
        (SamplingParams(max_tokens=9, temperature=0, ignore_eos=True), {"num_gpu_blocks": 64}),
        (SamplingParams(max_tokens=6, temperature=1.0, n=3, seed=1, ignore_eos=True), {"num_gpu_blocks": 64}),
        (BeamSearchParams(beam_width=2, max_tokens=5), {"num_gpu_blocks": 64}),
        (SamplingParams(max_tokens=1, temperature=0, ignore_eos=True), {"num_gpu_blocks": 64}),
    ],
    ids=["greedy", "n3", "beams", "one-token"],
)
def test_every_output_carries_its_times(model, params, settings):
    llm = LLM.from_loaded(model, block_size=4, **settings)
    outputs, streamed = run(llm, params)
    beam = isinstance(params, BeamSearchParams)
    for out in outputs:
        check_times(out.metrics, None if beam else len(out.outputs[0].token_ids))
        assert out.metrics.num_preemptions == 0
    for out in streamed:  # a copy as of its step: the later steps did not finish it
        if not out.finished:
            assert out.metrics.finished_time is None and out.metrics.e2e_latency is None
    assert len(llm.finished_metrics) == len(PROMPTS)


def test_a_preempted_request_counts_it_and_keeps_its_times_in_order(model):
    llm = LLM.from_loaded(model, block_size=4, num_gpu_blocks=10)
    outputs, _ = run(llm, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    assert sum(o.metrics.num_preemptions for o in outputs) == llm.stats.num_preemptions > 0
    for out in outputs:
        check_times(out.metrics, None)  # recompute regenerates nothing, but a preempted prompt may take longer
        assert out.metrics.num_token_steps == 16


def test_the_summary_speaks_the_simulators_names(model):
    llm = LLM.from_loaded(model, block_size=4, num_gpu_blocks=64)
    outputs, _ = run(llm, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    summary = llm.latency_summary()
    simulated = sim.run(num_requests=3, rate=1.0).summary
    names = {
        k
        for k in simulated
        if any(k.endswith(f"_{m}_s") and k.split("_")[0] in ("mean", "p50", "p90", "p99") for m in LATENCY_METRICS)
    }
    assert set(summary) == names and len(names) == 4 * len(LATENCY_METRICS)
    ttfts = [o.metrics.ttft for o in outputs]
    assert summary["p50_ttft_s"] == pytest.approx(np.percentile(ttfts, 50))
    assert summary["mean_e2e_latency_s"] == pytest.approx(np.mean([o.metrics.e2e_latency for o in outputs]))
    assert llm.latency_summary(outputs[:2])["p99_ttft_s"] == pytest.approx(np.percentile(ttfts[:2], 99))
    assert all(v is None for v in LLM.from_loaded(model, num_gpu_blocks=8).latency_summary().values())
