"""`python -m reference loadtest --trace FILE`: the server driven by a real HTTP client at a trace's arrival times, each
request's latencies measured at the client.

    python -m reference loadtest --trace trace.jsonl [--url http://127.0.0.1:8000] [--out figures/loadtest.csv]

Each request of the trace (sim.workloads.trace.read_trace: .jsonl or .csv, arrival_time / prompt_len / output_len / n) is sent
at its arrival time, measured from the run's start, to /v1/completions as `prompt_len` token ids (drawn per request
from a seeded generator, so a rerun sends the same prompts), `max_tokens` = output_len with `ignore_eos` (exactly
that many tokens), greedy, streamed. At the client: TTFT (send to the first chunk), the mean and the largest gap
between chunks (the server sends one chunk per engine step that gave the request a token, its text empty while a
character's bytes are incomplete, so these are inter-token latencies), and end to end. Without --url the server
runs in this process on SmolLM2 (the flags below are its settings); with --url, whatever serves there.

The CSV (one row per request, `# ` lines with the machine, the command, the server and what the server says of
itself: its version and settings, reference/validation/server_facts.describe) and a printed summary:
requests, errors, the largest number in flight, p50/p99 TTFT and inter-token latency, and the KV blocks still used
after the last request (the server's /metrics: 0 unless blocks leaked).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

COLUMNS = ("request_id", "arrival_time", "sent", "prompt_len", "output_len", "n", "status", "ttft", "itl_mean",
           "itl_max", "last_token", "e2e_latency", "num_chunks", "response_id", "sent_epoch")
TOKEN_IDS = (1000, 20000)  # prompt token ids are drawn from this range: ordinary tokens of SmolLM2's and Gemma 3's


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="the requests: a .jsonl or .csv trace (sim.workloads.trace)")
    p.add_argument("--url", help="a running server (default: start one here on --model)")
    p.add_argument("--model", default="smollm2", help="the model the server here serves (default: smollm2)")
    p.add_argument("--num-gpu-blocks", type=int, default=512, help="its KV pool in blocks (default: 512)")
    p.add_argument("--block-size", type=int, default=16, help="its block size (default: 16)")
    p.add_argument("--max-concurrency", type=int, default=256, help="requests in flight at most (default: 256)")
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds before the run is cut (default: 600)")
    p.add_argument("--seed", type=int, default=0, help="seeds the prompts' token ids (default: 0)")
    p.add_argument("--out", default="figures/loadtest.csv", help="per-request CSV (default: figures/loadtest.csv)")


def check_args(a: argparse.Namespace) -> None:
    """ValueError, one line, for a flag the run cannot use (before anything starts)."""
    from sim.base.outfiles import check_outputs

    if not Path(a.trace).is_file():
        raise ValueError(f"--trace {a.trace}: no such file (allowed: a .jsonl or .csv trace)")
    from sim.base.limits import MAX_COUNT, MAX_POOL_BLOCKS, MAX_SEED, MAX_TOKENS

    for name, low, high in (("num_gpu_blocks", 1, MAX_POOL_BLOCKS), ("block_size", 1, MAX_TOKENS),
                            ("max_concurrency", 1, MAX_COUNT), ("seed", 0, MAX_SEED)):
        if not low <= getattr(a, name) <= high:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(a, name)} (allowed: an integer from {low} to "
                             f"{high:,})")
    if not (math.isfinite(a.time_limit) and a.time_limit > 0):
        raise ValueError(f"--time-limit {a.time_limit} (allowed: a number of seconds > 0)")
    if a.url is not None and not a.url.startswith(("http://", "https://")):
        raise ValueError(f"--url {a.url!r} (allowed: http://host:port)")
    check_outputs({"--out": a.out}, {"--trace": a.trace}, make_parents=True)
    from sim.workloads.trace import read_trace

    try:
        a.requests = read_trace(a.trace)  # read once, here: a bad line is one line of error before anything starts
    except ValueError as exc:
        raise ValueError(" ".join(str(exc).split())) from None
    if not a.requests:
        raise ValueError(f"--trace {a.trace}: no requests in it")
    check_requests(a.requests, f"--trace {a.trace}")
    if a.url is not None:
        check_server(a.url)
    a.llm = None
    if a.url is None:  # the server's engine, built here: a pool this machine cannot hold is one line, not a traceback
        from reference import LLM

        try:
            a.llm = LLM(a.model, num_gpu_blocks=a.num_gpu_blocks, block_size=a.block_size)
        except (TypeError, ValueError) as exc:
            raise ValueError(" ".join(str(exc).split())) from None


def check_server(url: str) -> None:
    """ValueError, one line, unless `url` is a server answering GET /v1/models (checked before the run starts)."""
    import httpx

    try:
        response = httpx.get(url.rstrip("/") + "/v1/models", timeout=10)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:  # refused, unresolvable, a malformed URL
        raise ValueError(f"--url {url}: no server answers there ({type(exc).__name__}: {exc}) (allowed: the address "
                         f"of a running `python -m reference serve`, http://host:port)") from None
    if response.status_code != 200:
        raise ValueError(f"--url {url}: GET /v1/models answered HTTP {response.status_code}, not an OpenAI-compatible "
                         f"server's list (allowed: the address of a running `python -m reference serve`)")


def check_requests(requests: list, where: str) -> None:
    """ValueError, one line, for a request the completions API cannot send."""
    for r in requests:
        if r.beam_width > 1:
            raise ValueError(f"{where}: request {r.request_id} asks for beam search (beam_width {r.beam_width}), which "
                             "the completions API does not offer (allowed: beam_width 1; n > 1 samples are fine)")


@dataclass(slots=True)
class Measured:
    """One request at the client. Times in seconds: `sent` since the run's start, the others since it was sent."""

    status: str = "ok"  # "ok", or what went wrong ("HTTP 400: ...", "timeout", an exception's name)
    sent: float = math.nan
    ttft: float = math.nan
    itl_mean: float = math.nan
    itl_max: float = math.nan
    last_token: float = math.nan  # the last chunk
    e2e_latency: float = math.nan
    num_chunks: int = 0
    response_id: str = ""  # the server's id of the response ("cmpl-...")
    sent_epoch: float = math.nan  # the wall clock when it was sent (epoch seconds: comparable across processes)


def prompt_ids(request, seed: int) -> list[int]:
    """The prompt sent for `request`: its own token ids if the trace has them, else prompt_len ids drawn per request
    from a seeded generator (a rerun sends the same)."""
    if request.prompt_token_ids is not None:
        return list(request.prompt_token_ids)
    return np.random.default_rng([seed, request.request_id]).integers(*TOKEN_IDS, request.prompt_len).tolist()


async def _one(http, base: str, request, seed: int, start: float, gate: asyncio.Semaphore, busy: list[int]) -> Measured:
    ids = prompt_ids(request, seed)
    body = {"prompt": ids, "max_tokens": request.output_len, "n": request.n, "temperature": 0, "ignore_eos": True,
            "stream": True}
    await asyncio.sleep(max(0.0, start + request.arrival_time - time.perf_counter()))
    async with gate:
        busy[0] += 1
        busy[1] = max(busy[1], busy[0])
        sent, sent_epoch, chunks, response_id = time.perf_counter(), time.time(), [], ""
        try:
            async with http.stream("POST", base + "/v1/completions", json=body) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    return Measured(status=f"HTTP {response.status_code}: {' '.join(text.split())[:200]}")
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    response_id = response_id or chunk.get("id", "")
                    choice = chunk.get("choices", [{}])
                    # NOTE: every chunk of sample 0, its text empty or not: the server sends one per step that gave it
                    # a token, with empty text while a character's bytes are incomplete (random prompts' outputs)
                    if choice and choice[0].get("index", 0) == 0:
                        chunks.append(time.perf_counter())
            end = time.perf_counter()
        except Exception as exc:  # noqa: BLE001  (a failed request is a row of the result, not a crash)
            return Measured(status=f"{type(exc).__name__}: {exc}"[:200], sent=sent - start, sent_epoch=sent_epoch)
        finally:
            busy[0] -= 1
    if not chunks:
        return Measured(status="no text streamed", sent=sent - start, e2e_latency=end - sent, response_id=response_id,
                        sent_epoch=sent_epoch)
    gaps = np.diff(chunks)
    return Measured(sent=sent - start, ttft=chunks[0] - sent, itl_mean=float(gaps.mean()) if len(gaps) else math.nan,
                    itl_max=float(gaps.max()) if len(gaps) else math.nan, last_token=chunks[-1] - sent,
                    e2e_latency=end - sent, num_chunks=len(chunks), response_id=response_id,
                    sent_epoch=sent_epoch)


async def drive(base: str, requests: list, a: argparse.Namespace) -> tuple[list[Measured], int]:
    """Send every request at its arrival time (a.seed, a.max_concurrency, a.time_limit); (what each measured, the
    most in flight at once)."""
    import httpx

    gate, busy = asyncio.Semaphore(a.max_concurrency), [0, 0]
    async with httpx.AsyncClient(timeout=a.time_limit) as http:
        start = time.perf_counter()
        tasks = [asyncio.ensure_future(_one(http, base, r, a.seed, start, gate, busy)) for r in requests]
        done, pending = await asyncio.wait(tasks, timeout=a.time_limit)
        for task in pending:
            task.cancel()
        results = [t.result() if t in done and not t.cancelled() else Measured(status="timeout") for t in tasks]
    return results, busy[1]


def _start_server(a: argparse.Namespace):
    from reference.server.run import serve_in_thread

    return serve_in_thread(a.llm, a.model)


def blocks_used(base: str) -> float | None:
    import httpx

    try:
        text = httpx.get(base + "/metrics", timeout=30).text
    except httpx.HTTPError:  # the server went away during the run: the blocks it holds are unknown
        return None
    for line in text.splitlines():
        if line.startswith("lab:kv_cache_blocks_used{"):  # (reference/server/metrics.py)
            return float(line.rsplit(" ", 1)[1])
    return None


def run(a: argparse.Namespace, argv: list[str] | None = None) -> int:
    from reference.validation.server_facts import describe
    from sim.base.outfiles import write_csv

    requests = a.requests if getattr(a, "requests", None) is not None else []
    server, base = (None, a.url.rstrip("/")) if a.url else _start_server(a)
    try:
        told = describe(base)  # the server's version and settings, for the CSV (before the run: it is up now)
        results, peak = asyncio.run(drive(base, requests, a))
        time.sleep(0.2)  # the engine loop's last step after the last response
        used = blocks_used(base)
    finally:
        if server is not None:
            server.should_exit = True
    rows = [{"request_id": r.request_id, "arrival_time": r.arrival_time, "prompt_len": r.prompt_len,
             "output_len": r.output_len, "n": r.n, **{name: getattr(m, name) for name in Measured.__slots__}}
            for r, m in zip(requests, results)]
    comments = [machine_line(),
                f"command: {' '.join(argv or ['python -m reference loadtest'])}",
                f"server: {a.url or f'in-process {a.model}, {a.num_gpu_blocks} blocks of {a.block_size}'}",
                f"server says: {told}"]
    write_csv(a.out, COLUMNS, rows, comments=comments, make_parents=True)
    ok = [m for m in results if m.status == "ok"]
    print(summary_line(len(results), len(results) - len(ok), peak, ok, used))
    print(f"wrote {a.out}")
    return 0 if len(ok) == len(results) and not used else 1


def machine_line() -> str:
    """The machine, for a results file's `# ` lines."""
    from sim.drivers.bench_sim import machine

    m = machine()
    return f"machine: {m['platform']}, {m['cpu']}, {os.cpu_count()} cores, python {m['python']}"


def summary_line(num: int, errors: int, peak: int, ok: list[Measured], used: float | None) -> str:
    def pct(values: list[float], q: int) -> str:
        values = [v for v in values if not math.isnan(v)]
        return f"{np.percentile(values, q) * 1000:.0f} ms" if values else "-"

    ttft, itl = [m.ttft for m in ok], [m.itl_mean for m in ok]
    return (f"{num} requests, {errors} errors, at most {peak} in flight; TTFT p50 {pct(ttft, 50)}, p99 {pct(ttft, 99)}; "
            f"inter-token p50 {pct(itl, 50)}, p99 {pct(itl, 99)}; KV blocks still used after: "
            f"{'unknown' if used is None else int(used)}")
