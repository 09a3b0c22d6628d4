"""Speculative decoding: the scheduler's verify entries, the simulator's acceptance model and verify-step price.

The scheduler side is also driven by the random-workload property (tests/sim/test_scheduler_properties.py: k and every
acceptance drawn, the K/V model checks that no later step reads a rejected draft) and the KV side by the shared state
machine (sim/testing/kv.py's speculate rule, for every policy). Here: one request narrated step by step, the refusals,
and the simulator's numbers against the formulas they follow.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.base.request import Request
from sim.base.specs import get_gpu, get_model
from sim.clock.cost import RooflineCostModel
from sim.config import SchedulerConfig
from sim.drivers.cli import main
from sim.fast.epoch import DecodeEpochs
from sim.fast.runs import plain_decodes
from sim.kv.paged import PagedKVManager
from sim.scheduling.plan import StepOutcome
from sim.scheduling.scheduler import Scheduler
from sim.scheduling.speculative import AcceptanceModel, expected_tokens_per_step


def one_request(k: int, prompt_len: int = 6, output_len: int = 10) -> Scheduler:
    sched = Scheduler(PagedKVManager(16, 4), SchedulerConfig(num_speculative_tokens=k, max_num_batched_tokens=64))
    sched.add_request(Request(0, 0.0, prompt_len, output_len))
    return sched


def test_a_verify_step_feeds_the_last_token_and_k_drafts_then_keeps_the_accepted():
    sched = one_request(k=3)
    plan = sched.schedule()  # the prompt: 6 tokens, samples the first output token
    assert [e.num_new_tokens for e in plan.prefills] == [6] and plan.num_draft_tokens == 0
    sched.finish_step(plan, StepOutcome())
    plan = sched.schedule()  # a verify entry: token 6 (the sampled one) + 3 drafts in lookahead slots
    [entry] = plan.decodes
    assert (entry.num_computed_tokens, entry.num_new_tokens, entry.num_draft_tokens) == (6, 4, 3)
    assert plan.num_batched_tokens == 4 and sched.kv.num_tokens(entry.seq_id) == 10
    assert len(entry.block_table) == 3  # 10 slots: blocks of 4
    sched.finish_step(plan, StepOutcome(num_accepted={entry.seq_id: 1}))
    # one draft kept, plus the target's own token: 3 tokens sampled; the K/V holds 6 + 1 + 1 = 8 tokens, 2 blocks
    assert sched.num_generated(entry.seq_id) == 3 and sched.num_computed_tokens(entry.seq_id) == 8
    assert sched.kv.num_tokens(entry.seq_id) == 8 and len(sched.kv.block_table(entry.seq_id)) == 2
    assert sched.kv.num_free_blocks == 14


def test_drafts_never_run_past_the_output_and_the_request_ends_on_time():
    sched = one_request(k=8, output_len=5)
    sched.finish_step(sched.schedule(), StepOutcome())  # prompt, first token
    plan = sched.schedule()
    [entry] = plan.decodes
    assert entry.num_draft_tokens == 3  # 4 tokens left to sample: the last token + 3 drafts, all accepted at most
    result = sched.finish_step(plan, StepOutcome({entry.seq_id}, num_accepted={entry.seq_id: 3}))
    assert result.finished_request_ids == [0] and sched.kv.num_free_blocks == sched.kv.num_blocks


def test_a_missing_or_impossible_acceptance_is_refused_and_changes_nothing():
    sched = one_request(k=2)
    sched.finish_step(sched.schedule(), StepOutcome())
    plan = sched.schedule()
    [entry] = plan.decodes
    before = (sched.num_generated(entry.seq_id), sched.kv.num_tokens(entry.seq_id))
    for bad in ({}, {entry.seq_id: 3}, {entry.seq_id: -1}):
        with pytest.raises(ValueError, match=rf"num_accepted\[{entry.seq_id}\]: expected 0 to 2"):
            sched.finish_step(plan, StepOutcome(num_accepted=bad))
        assert (sched.num_generated(entry.seq_id), sched.kv.num_tokens(entry.seq_id)) == before


def test_speculation_off_is_the_default_and_opens_no_run_when_on():
    assert SchedulerConfig().num_speculative_tokens == 0
    sched = one_request(k=2)
    sched.finish_step(sched.schedule(), StepOutcome())
    assert plain_decodes(sched) is None and DecodeEpochs(sched).open() is None  # no fast-forward with drafts
    plain = one_request(k=0)
    plain.finish_step(plain.schedule(), StepOutcome())
    assert plain_decodes(plain) is not None


@pytest.mark.parametrize("k", [-1, 65, 1.5, True])
def test_bad_num_speculative_tokens_is_one_line(k):
    allowed = r"\(allowed: an integer from 0 \(off\) to 64\)"
    with pytest.raises(ValueError, match=rf"num_speculative_tokens: got .* {allowed}"):
        SchedulerConfig(num_speculative_tokens=k)


# ---- the simulator: the acceptance model, the verify step's price, whole runs ------------------------------------
@pytest.mark.parametrize("rate", [0.3, 0.7])
def test_accepted_counts_follow_the_iid_model(rate):
    """P(a = j) = rate^j (1 - rate) for j < k, P(a = k) = rate^k; each frequency of 20,000 draws within 5 standard
    deviations of its probability (a binomial count: the bound follows from the draws' number, not a fit)."""
    k, draws = 4, 20_000
    model = AcceptanceModel(rate, seed=1)
    counts = np.bincount([model.accepted(k) for _ in range(draws)], minlength=k + 1)
    probs = [rate**j * (1 - rate) for j in range(k)] + [rate**k]
    for j, p in enumerate(probs):
        assert abs(counts[j] / draws - p) <= 5 * np.sqrt(p * (1 - p) / draws), (j, counts[j] / draws, p)
    assert expected_tokens_per_step(rate, k) == pytest.approx(sum((1 + j) * p for j, p in enumerate(probs)))


def test_acceptance_edges_and_seeds():
    assert [AcceptanceModel(1.0).accepted(5) for _ in range(3)] == [5, 5, 5]
    assert [AcceptanceModel(0.0).accepted(5) for _ in range(3)] == [0, 0, 0]
    a, b = AcceptanceModel(0.6, seed=3), AcceptanceModel(0.6, seed=3)
    assert [a.accepted(8) for _ in range(50)] == [b.accepted(8) for _ in range(50)]
    with pytest.raises(ValueError, match=r"acceptance_rate: got 1.5 \(allowed: a number from 0 to 1\)"):
        AcceptanceModel(1.5)


def one_run(k: int, rate: float = 1.0, output_len: int = 13, **kw):
    requests = [Request(0, 0.0, 20, output_len)]
    return sim.run(requests=requests, num_speculative_tokens=k, **({"acceptance_rate": rate} if k else {}), **kw)


def test_a_verify_step_is_priced_as_a_decode_plus_a_chunk_of_its_drafts():
    """One request, every draft accepted, k = 3: the prompt step samples token 1, then 3 verify steps of 4 tokens each
    sample the other 12. Each verify step costs the roofline's step_time of 3 new prompt-like tokens + 1 decode over
    the K/V it reads, pairs included (the roofline ignores them)."""
    result = one_run(3)
    steps = result.steps
    assert list(steps["num_batched_tokens"]) == [20, 4, 4, 4]
    cost = RooflineCostModel(get_model("opt-13b"), get_gpu("a100-40gb"), 1, block_size=16)
    for i, computed in zip(range(1, 4), (20, 24, 28)):  # the K/V before each verify step: 20, then 4 more each
        expected = cost.step_time(3, 1, computed + 4, 3 * (computed + 1) + 6)
        assert steps["duration"][i] == pytest.approx(expected, rel=1e-12)
    assert result.summary["num_accepted_tokens"] == result.summary["num_draft_tokens"] == 9
    plain = one_run(0)
    assert len(plain.steps["duration"]) == 13
    assert result.requests["e2e_latency"][0] < plain.requests["e2e_latency"][0]


def test_every_draft_rejected_costs_more_than_no_speculation():
    """alpha = 0: the same steps as without speculation (one token each), each priced with its drafts: slower."""
    slow, plain = one_run(4, rate=0.0), one_run(0)
    assert len(slow.steps["duration"]) == len(plain.steps["duration"]) == 13
    assert slow.summary["num_accepted_tokens"] == 0
    assert slow.requests["e2e_latency"][0] > plain.requests["e2e_latency"][0]


@settings(max_examples=8, deadline=None)
@given(
    k=st.integers(1, 6),
    rate=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
    seed=st.integers(0, 100),
    policy=st.sampled_from(["paged", "radix", "oracle", "vattention"]),
)
def test_runs_with_speculation_serve_every_token_and_ignore_the_jump(k, rate, seed, policy):
    """Under load (a small pool: preemptions), every request finishes with its tokens counted (a verify step counts the
    tokens it kept), accepted drafts never exceed drafts, and jumping changes nothing (no run opens)."""
    kw = dict(
        workload="uniform",
        prompt_len_range=(10, 300),
        output_len_range=(2, 80),
        num_requests=12,
        rate=50,
        seed=seed,
        kv_slots=800,
        num_speculative_tokens=k,
        acceptance_rate=rate,
        policy=policy,
    )
    if policy == "vattention":
        kw["page_kib"] = 640  # pages of 64 tokens
    a, b = sim.run(**kw), sim.run(jump=False, **kw)
    s = a.summary
    assert s["num_finished"] == s["num_requests"] and s["num_accepted_tokens"] <= s["num_draft_tokens"]
    assert a.summary["normalized_latency_s_per_token"] == b.summary["normalized_latency_s_per_token"]
    assert list(a.steps["duration"]) == list(b.steps["duration"])
    assert 0 < s["mean_lookahead_slots"] and s["lookahead_share"] < 1


def test_the_cli_runs_with_speculation(capsys):
    assert (
        main(
            [
                "run",
                "--rate",
                "2",
                "--duration",
                "20",
                "--num-speculative-tokens",
                "4",
                "--acceptance-rate",
                "0.8",
                "--json",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_speculative_tokens"] == 4 and summary["acceptance_rate"] == 0.8
    assert 0 < summary["draft_acceptance"] < 1


@pytest.mark.slow
def test_the_quick_figure_speculation_serves_past_the_plain_knee(tmp_path):
    """speculative (quick): at the higher rate, plain decoding queues while k = 4 at alpha 0.8 keeps its latency low
    and its batch smaller; the drafts hold slots only when there are drafts; every request finishes."""
    from sim.figures import make_figures
    from sim.figures.speculative import RATES

    make_figures(["speculative"], outdir=tmp_path, quick=True, jobs=1, progress=False)
    rows = read_csv(tmp_path / "speculative.csv")
    top = {int(r["num_speculative_tokens"]): r for r in rows if float(r["rate"]) == max(RATES[True])}
    assert float(top[4]["normalized_latency_s_per_token"]) < 0.5 * float(top[0]["normalized_latency_s_per_token"])
    assert float(top[4]["mean_batch_size"]) < float(top[0]["mean_batch_size"])
    for r in rows:
        assert (float(r["lookahead_share"]) > 0) == (int(r["num_speculative_tokens"]) > 0)
        assert int(r["num_finished"]) == int(r["num_requests"]) > 0


def read_csv(path) -> list[dict]:
    import csv

    with open(path) as f:
        return list(csv.DictReader(f))
