"""Synthetic workloads: how long requests are and when they arrive (vLLM paper section 6.1).

The paper serves two traces, whose length statistics it publishes in Fig. 11 (tokens, OPT tokenizer):

    dataset    mean prompt   mean output   shape
    ShareGPT      161.31        337.99      long, heavy-tailed (real ChatGPT conversations)
    Alpaca         19.31         58.45      short (GPT-3.5-generated instructions)

We do not ship the datasets. Instead each length is drawn from a **log-normal** distribution
(`exp(mu + sigma * z)`, z ~ N(0, 1)), rounded to an integer >= 1, then **truncated** so that
prompt + output <= max_seq_len, as the paper's runs must (OPT's context is 2048 tokens):

    prompt = min(prompt, max_seq_len - prefix_len - 1) ; output = min(output, max_seq_len - prefix_len - prompt)

Fit (see `LOGNORMAL_PARAMS`): sigma is *chosen* by eye from the shape of Fig. 11 (the paper reports only the
means and histograms, so the spread is a modelling approximation); mu is then solved by bisection so that the
mean *after rounding and truncation at 2048* equals the published mean (calibrated on 2M samples; the
residual calibration error is < 0.1%). With another max_seq_len (e.g. 8192 for SmolLM2) fewer samples
are truncated and the means come out slightly higher (ShareGPT: ~2% of requests are truncated at 2048).

    dataset   length   sigma   mu       median   (mean after truncation at 2048)
    sharegpt  prompt   1.3     4.2796    72       161.3
    sharegpt  output   1.0     5.3731   214       338.0
    alpaca    prompt   0.6     2.7805    16        19.3
    alpaca    output   0.9     3.6628    39        58.5

Arrivals (paper section 6.1: "we generate request arrival times using Poisson distribution with different
request rates"): `poisson` (exponential gaps, mean 1/rate), `gamma` (gamma gaps with shape k = burstiness,
same mean, coefficient of variation 1/sqrt(k); k = 1 is Poisson, k < 1 is burstier), `offline` (all at t = 0,
the paper's beam-search/parallel-sampling style batch runs).
"""
from __future__ import annotations

import numpy as np

from sim.base.limits import (
    MAX_BURSTINESS,
    MAX_COUNT,
    MAX_NUM_REQUESTS,
    MAX_SEED,
    MAX_TIME_S,
    MAX_TOKENS,
    MIN_BURSTINESS,
    is_int,
    is_real,
)
from sim.base.request import Request

DATASETS = ("sharegpt", "alpaca", "fixed", "uniform", "conversation")  # conversation: sim/workloads/conversation.py
ARRIVALS = ("poisson", "gamma", "offline")

# (mu, sigma) of log(length), per dataset and length kind. See the module docstring for the fit.
LOGNORMAL_PARAMS = {
    "sharegpt": {"prompt": (4.2796, 1.3), "output": (5.3731, 1.0)},
    "alpaca": {"prompt": (2.7805, 0.6), "output": (3.6628, 0.9)},
}
# The published means the fit targets (paper Fig. 11), used by the tests.
PUBLISHED_MEANS = {"sharegpt": (161.31, 337.99), "alpaca": (19.31, 58.45)}


def generate_requests(
    dataset: str,
    num_requests: int | None = None,
    *,
    rate: float | None = None,
    duration: float | None = None,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    max_seq_len: int = 2048,
    n: int = 1,
    beam_width: int = 1,
    prefix_len: int = 0,
    num_prefixes: int = 1,
    seed: int = 0,
    prompt_len: int | None = None,
    output_len: int | None = None,
    prompt_len_range: tuple[int, int] | None = None,
    output_len_range: tuple[int, int] | None = None,
) -> list[Request]:
    """A seeded list of requests, sorted by arrival time, with request_id 0, 1, 2, ...

    The count is `num_requests`, or (with `duration`) every arrival of the process at `rate` before `duration`.
    `fixed` needs prompt_len and output_len; `uniform` needs prompt_len_range and output_len_range (inclusive).
    With `prefix_len > 0`, a shared prefix of that many tokens (a system prompt / few-shot examples) is
    *prepended* to each sampled prompt, so prompt_len = prefix_len + sampled length; request i uses prefix
    i % num_prefixes, and `prompt_token_ids` are synthetic (see `_prompt_token_ids`).
    """
    check_workload_args(dataset, num_requests, rate, duration, arrival, burstiness, max_seq_len, prefix_len,
                        num_prefixes)
    if not (is_int(seed) and 0 <= seed <= MAX_SEED):
        raise ValueError(f"seed must be an integer from 0 to {MAX_SEED:,}, got {seed}")
    # NOTE: lengths and arrivals use independent streams spawned from one seed, so sweeping the rate (as the
    # paper's figures do) keeps the very same requests and only moves their arrival times.
    length_rng, arrival_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    if num_requests is None:
        arrivals = _arrivals_until(arrival_rng, arrival, rate, burstiness, duration)
    else:
        arrivals = _arrivals(arrival_rng, arrival, rate, burstiness, num_requests)
    count = len(arrivals)
    budget = max_seq_len - prefix_len  # context left for the request's own prompt and its output
    prompts, outputs = _lengths(
        length_rng, dataset, count, budget, prompt_len, output_len, prompt_len_range, output_len_range
    )
    token_ids = _prompt_token_ids(prompts, prefix_len, num_prefixes) if prefix_len > 0 else None
    if count and not arrivals[-1] <= MAX_TIME_S:  # the expected span was checked; a rare draw may still pass it
        raise ValueError(f"the last of {count} arrivals at {rate:g} req/s comes at {arrivals[-1]:.3g} s, past the "
                         f"limit {MAX_TIME_S:g} s (allowed: a higher rate)")
    times = arrivals.tolist()
    prompt_list, output_list = (prompts + prefix_len).tolist(), outputs.tolist()
    return [
        Request(
            request_id=i,
            arrival_time=times[i],
            prompt_len=prompt_list[i],
            output_len=output_list[i],
            n=n,
            beam_width=beam_width,
            prefix_id=(i % num_prefixes) if prefix_len > 0 else None,
            prefix_len=prefix_len,
            prompt_token_ids=token_ids[i] if token_ids is not None else None,
        )
        for i in range(count)
    ]




def check_workload_args(dataset, num_requests, rate, duration, arrival, burstiness, max_seq_len, prefix_len,
                        num_prefixes) -> None:
    """Everything numpy would choke on, refused before it draws: types, the limits of sim.base.limits, and the size of
    the workload (at most MAX_NUM_REQUESTS requests expected, arriving by MAX_TIME_S). sim.workloads.conversation checks its
    sessions' arrivals with it too."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r} (allowed: {', '.join(DATASETS)})")
    if dataset == "conversation":
        raise ValueError("the conversation workload is made of sessions: sim.workloads.conversation.generate_conversations")
    if arrival not in ARRIVALS:
        raise ValueError(f"unknown arrival process {arrival!r} (allowed: {', '.join(ARRIVALS)})")
    if arrival != "offline" and not (is_real(rate) and rate > 0):
        raise ValueError(f"rate must be a finite number > 0 requests/s for {arrival} arrivals, got {rate}")
    if not (is_real(burstiness) and MIN_BURSTINESS <= burstiness <= MAX_BURSTINESS):
        raise ValueError(f"burstiness (gamma shape) must be from {MIN_BURSTINESS:g} to {MAX_BURSTINESS:g}, "
                         f"got {burstiness}")
    if (num_requests is None) == (duration is None):
        raise ValueError("give exactly one of num_requests or duration (with a rate)")
    if num_requests is not None and not (is_int(num_requests) and 0 <= num_requests <= MAX_NUM_REQUESTS):
        raise ValueError(f"num_requests must be an integer from 0 to {MAX_NUM_REQUESTS:,}, got {num_requests}")
    if duration is not None and (arrival == "offline" or not (is_real(duration) and 0 < duration <= MAX_TIME_S)):
        raise ValueError(f"duration must be > 0 seconds (at most {MAX_TIME_S:g}) and needs poisson or gamma arrivals, "
                         f"got {duration} ({arrival})")
    if duration is not None and rate * duration > MAX_NUM_REQUESTS:
        raise ValueError(f"rate x duration = {rate:g} x {duration:g} = {rate * duration:.3g} expected requests, more "
                         f"than the limit {MAX_NUM_REQUESTS:,}")
    if num_requests is not None and arrival != "offline" and num_requests / rate > MAX_TIME_S:
        raise ValueError(f"num_requests / rate = {num_requests / rate:.3g} s of arrivals, more than the limit "
                         f"{MAX_TIME_S:g} s")
    if not (is_int(max_seq_len) and 2 <= max_seq_len <= MAX_TOKENS):
        raise ValueError(f"max_seq_len must be an integer from 2 to {MAX_TOKENS:,}, got {max_seq_len}")
    if not (is_int(prefix_len) and 0 <= prefix_len <= max_seq_len - 2):
        raise ValueError(f"prefix_len must be in [0, max_seq_len - 2] = [0, {max_seq_len - 2}], got {prefix_len}")
    if not (is_int(num_prefixes) and 1 <= num_prefixes <= MAX_COUNT):
        raise ValueError(f"num_prefixes must be an integer from 1 to {MAX_COUNT:,}, got {num_prefixes}")


def arrival_gaps(rng: np.random.Generator, arrival: str, rate: float, burstiness: float, size: int) -> np.ndarray:
    """`size` gaps between arrivals of the `poisson` or `gamma` process at `rate` (module docstring)."""
    if arrival == "poisson":
        return rng.exponential(1.0 / rate, size)
    # Gamma with shape k and scale 1/(rate k): mean 1/rate, CV 1/sqrt(k).
    return rng.gamma(burstiness, 1.0 / (rate * burstiness), size)


def _arrivals(rng, arrival, rate, burstiness, count) -> np.ndarray:
    if arrival == "offline":
        return np.zeros(count)
    # NOTE: the process starts at t = 0 and the first request arrives after one gap (a true renewal process).
    return np.cumsum(arrival_gaps(rng, arrival, rate, burstiness, count))


def _arrivals_until(rng, arrival, rate, burstiness, duration) -> np.ndarray:
    """Every arrival before `duration`: draw gaps in chunks (vectorized) until the clock passes it."""
    expected = rate * duration
    chunk = int(expected + 6 * np.sqrt(expected / min(burstiness, 1.0)) + 16)
    times, clock = [], 0.0
    while clock < duration:
        part = clock + np.cumsum(arrival_gaps(rng, arrival, rate, burstiness, chunk))
        times.append(part)
        clock = part[-1]
    all_times = np.concatenate(times)
    return all_times[all_times < duration]


def _lengths(rng, dataset, count, budget, prompt_len, output_len, prompt_range, output_range):
    """(prompt, output) int64 arrays of the request's own tokens, prompt + output <= budget."""
    if dataset in LOGNORMAL_PARAMS:
        params = LOGNORMAL_PARAMS[dataset]
        prompts = lognormal_lengths(rng, *params["prompt"], count)
        outputs = lognormal_lengths(rng, *params["output"], count)
        # Modelling approximation: prompt and output lengths are drawn independently (the real traces show a
        # weak correlation that we ignore), and over-long pairs are truncated rather than re-drawn.
        prompts = np.minimum(prompts, budget - 1)
        outputs = np.minimum(outputs, budget - prompts)
        return prompts, outputs
    if dataset == "fixed":
        if prompt_len is None or output_len is None:
            raise ValueError("the fixed dataset needs prompt_len and output_len")
        _check_range("prompt_len", (prompt_len, prompt_len), "output_len", (output_len, output_len), budget)
        return np.full(count, prompt_len, np.int64), np.full(count, output_len, np.int64)
    if prompt_range is None or output_range is None:
        raise ValueError("the uniform dataset needs prompt_len_range and output_len_range, e.g. (16, 512)")
    _check_range("prompt_len_range", prompt_range, "output_len_range", output_range, budget)
    prompts = rng.integers(prompt_range[0], prompt_range[1], count, endpoint=True)
    outputs = rng.integers(output_range[0], output_range[1], count, endpoint=True)
    return prompts, outputs


def _check_range(prompt_name, prompt_range, output_name, output_range, budget):
    for name, (lo, hi) in ((prompt_name, prompt_range), (output_name, output_range)):
        if not (is_int(lo) and is_int(hi) and 1 <= lo <= hi):
            raise ValueError(f"{name} must be integers with 1 <= low <= high, got ({lo}, {hi})")
    if prompt_range[1] + output_range[1] > budget:
        raise ValueError(
            f"{prompt_name} + {output_name} can reach {prompt_range[1] + output_range[1]} tokens; "
            f"allowed: <= {budget} (max_seq_len minus prefix_len)"
        )


def lognormal_lengths(rng: np.random.Generator, mu: float, sigma: float, count: int) -> np.ndarray:
    """`count` lengths exp(mu + sigma * z), rounded to integers >= 1 (int64; not yet truncated to a context)."""
    return np.maximum(np.rint(rng.lognormal(mu, sigma, count)), 1).astype(np.int64)


def _prompt_token_ids(own_lens: np.ndarray, prefix_len: int, num_prefixes: int) -> list[list[int]]:
    """Synthetic token ids: the prefix's tokens, then tokens no other request uses.

        prefix p:   [p*prefix_len, ..., p*prefix_len + prefix_len - 1]   identical for every request using p
        own part:   a running counter starting after all prefix ids       unique across the whole workload

    NOTE: the ids are labels for prefix caching (equal ids -> equal block hashes), not a real vocabulary:
    they are unique by construction, so no two requests ever share a block by accident.
    """
    used = min(num_prefixes, len(own_lens))  # request i uses prefix i % num_prefixes: build only those
    prefixes = [list(range(p * prefix_len, (p + 1) * prefix_len)) for p in range(used)]
    starts = num_prefixes * prefix_len + np.concatenate(([0], np.cumsum(own_lens)[:-1]))
    return [
        prefixes[i % num_prefixes] + list(range(start, start + own))
        for i, (start, own) in enumerate(zip(starts.tolist(), own_lens.tolist()))
    ]


def assign_priorities(requests: list[Request], share: float, seed: int) -> None:
    """Mark `share` of the requests, drawn independently with `seed` (a stream of its own: the lengths and arrivals
    stay those of the same seed without priorities), priority 0, and the rest priority 1: two classes, such as
    interactive chat before batch jobs, for scheduling_policy="priority" (vLLM serves the lower value first)."""
    if not (is_real(share) and 0 <= share <= 1):
        raise ValueError(f"priority_share: got {share!r} (allowed: a finite number >= 0 and <= 1, a share of the "
                         f"requests)")
    draws = np.random.default_rng([seed, PRIORITY_STREAM]).random(len(requests))
    for request, u in zip(requests, draws.tolist()):
        request.priority = 0 if u < share else 1


PRIORITY_STREAM = 0x5052494F  # "PRIO": assign_priorities' seed entropy beside the run's seed
