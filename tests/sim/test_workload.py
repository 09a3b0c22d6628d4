"""Synthetic workloads: calibrated lengths, arrival processes, shared prefixes, seeding (sim/workloads/workload.py)."""

import numpy as np
import pytest

from sim.workloads.workload import LOGNORMAL_PARAMS, PUBLISHED_MEANS, generate_requests


def _lens(requests):
    return np.array([r.prompt_len for r in requests]), np.array([r.output_len for r in requests])


def test_same_seed_same_requests_other_seed_differs():
    a = generate_requests("sharegpt", 500, rate=2.0, seed=7)
    b = generate_requests("sharegpt", 500, rate=2.0, seed=7)
    c = generate_requests("sharegpt", 500, rate=2.0, seed=8)
    assert a == b
    assert a != c


def test_rate_changes_arrivals_but_not_lengths():
    # The paper's figures sweep the rate over one trace: the requests must stay the same.
    slow = generate_requests("alpaca", 300, rate=1.0, seed=3)
    fast = generate_requests("alpaca", 300, rate=10.0, seed=3)
    assert [(r.prompt_len, r.output_len) for r in slow] == [(r.prompt_len, r.output_len) for r in fast]
    assert slow[-1].arrival_time > fast[-1].arrival_time


@pytest.mark.parametrize("dataset", sorted(LOGNORMAL_PARAMS))
def test_means_after_truncation_match_the_paper(dataset):
    # Tolerance 5% (the brief): calibration error < 0.1% plus the sampling error of 20k log-normal draws
    # (standard error ~1.5% of the mean for ShareGPT prompts, sigma = 1.3).
    requests = generate_requests(dataset, 20_000, rate=1.0, seed=0)
    prompts, outputs = _lens(requests)
    want_prompt, want_output = PUBLISHED_MEANS[dataset]
    assert prompts.mean() == pytest.approx(want_prompt, rel=0.05)
    assert outputs.mean() == pytest.approx(want_output, rel=0.05)
    assert prompts.min() >= 1 and outputs.min() >= 1
    assert (prompts + outputs).max() <= 2048
    assert prompts.dtype.kind == "i"


def test_sharegpt_is_longer_and_heavier_tailed_than_alpaca():
    share_p, share_o = _lens(generate_requests("sharegpt", 5000, rate=1.0))
    alpaca_p, alpaca_o = _lens(generate_requests("alpaca", 5000, rate=1.0))
    assert share_p.mean() > 5 * alpaca_p.mean() and share_o.mean() > 4 * alpaca_o.mean()
    assert np.median(share_p) < share_p.mean()  # long right tail: the median sits well below the mean


def test_truncation_respects_a_small_context():
    requests = generate_requests("sharegpt", 2000, rate=1.0, max_seq_len=256)
    assert max(r.total_len for r in requests) <= 256


def test_poisson_mean_gap_is_one_over_rate():
    requests = generate_requests("alpaca", 20_000, rate=4.0, seed=1)
    gaps = np.diff([0.0] + [r.arrival_time for r in requests])
    # 20k exponential gaps: the standard error of the mean is 1/sqrt(20000) = 0.7%; allow 3%.
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV = 1
    assert all(g > 0 for g in gaps)


@pytest.mark.parametrize("shape", [0.25, 4.0])
def test_gamma_arrivals_have_the_requested_burstiness(shape):
    requests = generate_requests("alpaca", 40_000, rate=2.0, arrival="gamma", burstiness=shape, seed=2)
    gaps = np.diff([0.0] + [r.arrival_time for r in requests])
    # Mean 1/rate and CV 1/sqrt(shape); 40k draws keep both within ~2% (the CV of a very bursty gamma is
    # the noisier statistic), so allow 5%.
    assert gaps.mean() == pytest.approx(0.5, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(shape), rel=0.05)


def test_duration_decides_the_count():
    requests = generate_requests("sharegpt", rate=5.0, duration=200.0, seed=4)
    assert all(r.arrival_time < 200.0 for r in requests)
    # Poisson count with mean 1000: sd ~32, allow 5 sd.
    assert abs(len(requests) - 1000) < 160
    assert [r.request_id for r in requests] == list(range(len(requests)))


def test_offline_arrivals_are_all_at_zero():
    requests = generate_requests("alpaca", 50, arrival="offline", n=4)
    assert all(r.arrival_time == 0.0 and r.n == 4 for r in requests)


def test_fixed_and_uniform_lengths():
    fixed = generate_requests("fixed", 10, rate=1.0, prompt_len=100, output_len=20)
    assert {(r.prompt_len, r.output_len) for r in fixed} == {(100, 20)}
    uniform = generate_requests("uniform", 2000, rate=1.0, prompt_len_range=(5, 9), output_len_range=(1, 3))
    prompts, outputs = _lens(uniform)
    assert set(prompts) == {5, 6, 7, 8, 9} and set(outputs) == {1, 2, 3}


def test_shared_prefix_token_ids():
    requests = generate_requests("alpaca", 40, rate=1.0, prefix_len=32, num_prefixes=3, beam_width=2)
    for r in requests:
        assert r.prefix_id == r.request_id % 3 and r.prefix_len == 32
        assert len(r.prompt_token_ids) == r.prompt_len > 32  # the prefix is prepended to the own prompt
    by_prefix = {}
    for r in requests:
        by_prefix.setdefault(r.prefix_id, []).append(r)
    heads = {pid: rs[0].prompt_token_ids[:32] for pid, rs in by_prefix.items()}
    assert all(r.prompt_token_ids[:32] == heads[r.prefix_id] for r in requests)
    assert len({tuple(h) for h in heads.values()}) == 3  # different prefixes, different tokens
    tails = [t for r in requests for t in r.prompt_token_ids[32:]]
    assert len(tails) == len(set(tails))  # the rest is unique to each request
    assert not set(tails) & {t for h in heads.values() for t in h}


def test_no_prefix_means_no_token_ids():
    r = generate_requests("sharegpt", 3, rate=1.0)[0]
    assert r.prefix_id is None and r.prompt_token_ids is None and r.prefix_len == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dataset="wikitext", num_requests=5, rate=1.0), "allowed: sharegpt, alpaca, fixed, uniform"),
        (dict(dataset="alpaca", num_requests=5, rate=0.0), "rate must be"),
        (dict(dataset="alpaca", num_requests=5, rate=-1.0), "rate must be"),
        (dict(dataset="alpaca", num_requests=5), "rate must be"),
        (dict(dataset="alpaca", num_requests=5, rate=1.0, arrival="uniform"), "allowed: poisson, gamma, offline"),
        (dict(dataset="alpaca", rate=1.0), "exactly one of num_requests or duration"),
        (dict(dataset="alpaca", num_requests=5, rate=1.0, duration=9.0), "exactly one of"),
        (dict(dataset="alpaca", num_requests=5, rate=1.0, arrival="gamma", burstiness=0), "burstiness"),
        (dict(dataset="alpaca", num_requests=5, rate=1.0, prefix_len=2047), "prefix_len"),
        (dict(dataset="fixed", num_requests=5, rate=1.0, prompt_len=2000, output_len=100), "allowed: <= 2048"),
        (dict(dataset="fixed", num_requests=5, rate=1.0), "needs prompt_len and output_len"),
        (
            dict(dataset="uniform", num_requests=5, rate=1.0, prompt_len_range=(9, 5), output_len_range=(1, 2)),
            "low <= high",
        ),
        # past the limits of sim.base.limits: refused before numpy draws anything
        (dict(dataset="alpaca", rate=1e9, duration=3600.0), "rate x duration = 1e\\+09 x 3600 = 3.6e\\+12 expected"),
        (dict(dataset="alpaca", rate=1.0, duration=1e12), "duration must be > 0 seconds .at most 1e.09"),
        (dict(dataset="alpaca", num_requests=100_000, rate=1e-5), "num_requests / rate = 1e\\+10 s"),
        (dict(dataset="alpaca", num_requests=10**8, rate=1.0), "num_requests must be an integer from 0 to 10,000,000"),
        (dict(dataset="alpaca", num_requests=5, rate=1.0, arrival="gamma", burstiness=1e300), "burstiness"),
        (dict(dataset="alpaca", num_requests=5, rate=1.0, prefix_len=4, num_prefixes=10**30), "num_prefixes"),
        (dict(dataset="alpaca", num_requests=5, rate=1.0, seed=-1), "seed must be an integer from 0"),
        (dict(dataset="alpaca", num_requests=5.0, rate=1.0), "num_requests must be an integer"),
    ],
)
def test_bad_arguments_raise_a_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        generate_requests(**kwargs)
