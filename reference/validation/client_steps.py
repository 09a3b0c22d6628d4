"""A server's steps seen from the outside: the step times and shapes of an OpenAI-compatible server, recovered from
when each streamed token reaches the client, so that the simulator's cost model can be fitted to a server nobody
instruments (vLLM's, or this project's, from a client's seat).

    arrivals = run_burst(url, model, prompts, max_tokens)        # every token's arrival, per request
    steps = steps_from_arrivals([len(p) for p in prompts], arrivals)   # one row per server step

A burst is `len(prompts)` requests sent at once, each streamed with `max_tokens` tokens exactly (`ignore_eos`), greedy,
with `stream_options.continuous_usage_stats`, so that every chunk says how many tokens the request has so far (vLLM's
and this project's server both honour it). A server that batches continuously (vLLM's and this one) runs steps; each
step gives every request in it one token, and the server streams them when the step ends. So, reading the tokens in
the order they arrive, a step is closed by the first token of a request that already has one in it, or by a silence
longer than half the shortest gap any request sees between two of its tokens (max_tokens >= 2, so that there is
one); a step ends when its first token arrives, and a step's time is the span from the previous step's end (the first
step's: from the last request sent). This recovers every step as long as (1) the requests of a burst all reach the
server while the first of them still runs, so that every step shares a request with the one before (else ValueError:
nothing but time would tell two steps apart), and (2) the tokens of one step reach the client within a third of the
shortest step of each other (the test's random schedules hold to both; on one machine the spread is a millisecond or
two, a CPU step of SmolLM2 tens of milliseconds).

A step's shape follows from who got a token in it (sim.scheduling.step_shape's quantities): a request's first token
comes from the step that computed its whole prompt of P tokens (P prompt tokens, P K/V read, P (P + 1) / 2 query-key
pairs); its token k >= 1 from a decode that read P + k K/V tokens. This holds when every prompt is computed in one
step and nothing is preempted: the caller keeps a burst's prompts within one step's token budget and its tokens
within the KV pool (design_fits). A chunk that carries more than one token (a server that streams every few steps,
or speculative decoding) hides the steps between: ValueError, one line.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Arrivals:
    """One request of a burst as the client saw it: when it was sent and when each of its tokens arrived
    (time.perf_counter() seconds)."""

    sent: float
    tokens: tuple[float, ...]


def design_fits(num_requests: int, prompt_len: int, max_tokens: int, *, max_num_batched_tokens: int,
                max_num_seqs: int, num_gpu_blocks: int, block_size: int) -> str | None:
    """None if a burst of `num_requests` prompts of `prompt_len` tokens, `max_tokens` each, is computed in one step
    per prompt and without preemption on such a server; else why not (one line)."""
    if num_requests > max_num_seqs:
        return f"{num_requests} requests are more than max_num_seqs {max_num_seqs}"
    if num_requests * prompt_len > max_num_batched_tokens:
        return f"{num_requests} x {prompt_len} prompt tokens are more than a step's budget {max_num_batched_tokens}"
    blocks = num_requests * -(-(prompt_len + max_tokens) // block_size)
    if blocks > num_gpu_blocks:
        return f"the burst needs {blocks} KV blocks, the pool has {num_gpu_blocks}"
    return None


async def _one(client, url: str, body: dict) -> Arrivals:
    sent = time.perf_counter()
    tokens: list[float] = []
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            raise ValueError(f"POST {url} answered HTTP {response.status_code}: {' '.join(text.split())[:300]}")
        async for line in response.aiter_lines():
            now = time.perf_counter()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            usage = json.loads(line[6:]).get("usage") or {}
            count = usage.get("completion_tokens")
            if count is None or count == len(tokens):
                continue
            if count != len(tokens) + 1:
                raise ValueError(f"a chunk carried {count - len(tokens)} tokens at once: the server's steps between "
                                 "them cannot be told apart (allowed: a server that streams every step's token)")
            tokens.append(now)
    return Arrivals(sent, tuple(tokens))


def run_burst(url: str, model: str, prompts: list[list[int]], max_tokens: int, timeout: float = 600.0) -> list[Arrivals]:
    """Send every prompt (token ids) at once to `url`'s /v1/completions, streamed, `max_tokens` tokens each; the
    arrivals of every request's tokens, in the prompts' order. ValueError, one line, for a request that fails or
    a response without exactly `max_tokens` tokens."""
    import httpx

    endpoint = url.rstrip("/") + "/v1/completions"
    bodies = [{"model": model, "prompt": p, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0,
               "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
              for p in prompts]

    async def burst() -> list[Arrivals]:
        limits = httpx.Limits(max_connections=len(prompts) + 1)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            return list(await asyncio.gather(*(_one(client, endpoint, b) for b in bodies)))

    out = asyncio.run(burst())
    for i, a in enumerate(out):
        if len(a.tokens) != max_tokens:
            raise ValueError(f"request {i} got {len(a.tokens)} tokens, not max_tokens={max_tokens} (allowed: a server "
                             "that honours ignore_eos and stream_options.continuous_usage_stats)")
    return out


def steps_from_arrivals(prompt_lens: list[int], arrivals: list[Arrivals]) -> list[dict]:
    """The server's steps of one burst (module doc): one dict per step, in order, with the step's shape
    (num_prefill_tokens, num_decode_seqs, num_context_tokens, num_prefill_pairs, num_shared_context_tokens: 0, the
    prompts being distinct), `step_time_s`, `end_s` (the first token's arrival) and `requests` (who got a token)."""
    events = sorted((t, r, k) for r, a in enumerate(arrivals) for k, t in enumerate(a.tokens))
    gaps = [np.min(np.diff(a.tokens)) for a in arrivals if len(a.tokens) > 1]
    if not gaps:
        raise ValueError("no request of the burst has two tokens, so no step's length shows (allowed: max_tokens >= 2)")
    silence = 0.5 * min(gaps)
    groups: list[list[tuple[float, int, int]]] = []
    for event in events:
        current = groups[-1] if groups else None
        if current is None or event[1] in {r for _, r, _ in current} or event[0] - current[-1][0] > silence:
            groups.append([event])
        else:
            current.append(event)
    for before, after in zip(groups, groups[1:]):
        if not {r for _, r, _ in before} & {r for _, r, _ in after}:  # a burst's steps overlap (module doc)
            raise ValueError(f"two steps of the burst share no request (tokens at {before[0][0]:.6f} and "
                             f"{after[0][0]:.6f} s): a request reached the server after the others had finished, so "
                             "its steps cannot be told apart (allowed: a burst sent at once, max_tokens >= 2)")
    steps, previous_end = [], max(a.sent for a in arrivals)
    for group in groups:
        shape = dict(num_prefill_tokens=0, num_decode_seqs=0, num_context_tokens=0, num_prefill_pairs=0)
        for _, r, k in group:
            p = prompt_lens[r]
            if k == 0:  # the prompt, computed whole in this step
                shape["num_prefill_tokens"] += p
                shape["num_context_tokens"] += p
                shape["num_prefill_pairs"] += p * (p + 1) // 2
            else:  # a decode feeding token k - 1 after p + k - 1 computed tokens
                shape["num_decode_seqs"] += 1
                shape["num_context_tokens"] += p + k
        end = group[0][0]
        steps.append({**shape, "num_shared_context_tokens": 0, "step_time_s": end - previous_end, "end_s": end,
                      "requests": sorted(r for _, r, _ in group)})
        previous_end = end
    return steps


# (num_requests, prompt_len, max_tokens) of the bursts: prompts alone across the budget (g), decode batches (the
# cost per sequence), long contexts (per K/V token read) and a mixed batch; each kept only where design_fits.
BURSTS = ((1, 16, 4), (1, 64, 4), (1, 256, 4), (1, 1024, 4), (1, 2048, 4), (2, 32, 16), (4, 32, 16), (8, 32, 16),
          (16, 32, 16), (32, 32, 16), (64, 32, 16), (4, 512, 16), (8, 256, 8), (2, 1024, 16))
QUICK_BURSTS = ((1, 16, 3), (2, 32, 4), (4, 64, 3), (1, 128, 2))

STEP_FIELDS = ("num_prefill_tokens", "num_decode_seqs", "num_context_tokens", "num_prefill_pairs",
               "num_shared_context_tokens", "step_time_s")  # a step row's shape and time (calibrate.fit's columns)


def measure_server(facts, *, quick: bool = False, passes: int = 2, seed: int = 0,
                   progress: bool = True) -> tuple[list[dict], list[str]]:
    """Every burst of the design that fits the server (design_fits), `passes` times, as step rows (scenario, pass,
    step, the shape, step_time_s) for reference.validation.calibrate.fit; and one line per burst left out."""
    rng = np.random.default_rng(seed)
    limits = dict(max_num_batched_tokens=facts.max_num_batched_tokens, max_num_seqs=facts.max_num_seqs,
                  num_gpu_blocks=facts.num_gpu_blocks, block_size=facts.block_size)
    rows, skipped = [], []
    run_burst(facts.url, facts.model, [[1000 + i for i in range(16)]], 2)  # warm-up, not measured: a server's first
    # request pays for what it sets up once (measured on this project's server: its first step 1.6x the engine's)
    for num, prompt_len, max_tokens in QUICK_BURSTS if quick else BURSTS:
        name = f"burst-{num}x{prompt_len}+{max_tokens}"
        why = design_fits(num, prompt_len, max_tokens, **limits)
        if why:
            skipped.append(f"{name}: {why}")
            continue
        for k in range(passes):
            # distinct prompts (a different first token each), so no prefix cache shares a block between them
            prompts = [[1000 + i] + [int(x) for x in rng.integers(1000, 20000, prompt_len - 1)] for i in range(num)]
            arrivals = run_burst(facts.url, facts.model, prompts, max_tokens)
            steps = steps_from_arrivals([prompt_len] * num, arrivals)
            rows += [{"scenario": name, "pass": k, "step": i, **{c: s[c] for c in STEP_FIELDS}}
                     for i, s in enumerate(steps)]
            if progress:
                print(f"  {name} pass {k + 1}/{passes}: {len(steps)} steps, {sum(s['step_time_s'] for s in steps):.2f} s",
                      flush=True)
    return rows, skipped
