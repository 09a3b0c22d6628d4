"""`python -m reference validate-sim --online --trace FILE`: does the simulator predict what a client of the server
sees? The trace is served by `python -m reference serve` (started in this process on SmolLM2, one engine thread, the
same pool and scheduler settings as validate-sim's --trace) to the load test's HTTP client (`python -m reference
loadtest --url`, in a process of its own as a user's client would be: each request sent at its arrival time,
streamed, exactly output_len tokens), and simulated with the calibrated cost model over the same requests, each
arriving when the client actually sent it.

Each request has three sets of latencies (TTFT, mean inter-token latency, end to end; sim.clock.metrics' definitions):
    client      measured by the HTTP client: from sending the request to the first and last chunk with text; ITL is
                (last - first) / (output_len - 1), tokens rather than chunks (a chunk may carry two tokens' text)
    engine      the engine's own RequestMetrics (reference/engine/outputs.py), from the moment it queued the request
    simulated   sim.run with the cost model, from the moment the client sent it
The summary gives the simulator's error against the client (what a user sees) and against the engine (the cost model
and the scheduler alone), and the HTTP overhead the client pays on top of the engine, client minus engine, as its
median and p90, split on the wall clock both processes share into the hand-over (from the client's send until the
engine queues the request: parsing, and the wait for the step in progress to end, since the engine thread adds
requests between steps; the simulator models that wait, as its arrivals wait for the step too) and the delivery (from
the engine's first token to the client reading it: detokenising, the server-sent event, the client's parsing).
The cost model priced on the engine's own steps (`*_step_error_*`, `*_step_bias`, as validate-sim's, over the steps the
server keeps: its last 1,000 to 2,000) says how much the server's other threads slowed the engine's steps: they share its interpreter lock (vLLM runs its engine core in a
process of its own for this reason).

Outputs (written together or not at all): a summary row (--out, default figures/validate_online.csv), a row per
request (--requests-csv) and the simulated latencies against the client's and the engine's (--figure).
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np

from reference.bench.loadtest import prompt_ids
from reference.validation.validate_sim import METRICS, figure, relative_errors
from sim.base.request import Request

SIDES = ("client", "engine", "simulated")
SUMMARY_COLUMNS = ("trace", "num_requests", "errors", "max_in_flight", "num_gpu_blocks", "max_num_batched_tokens",
                   *(f"{stat}_{m}_error" for m in METRICS for stat in ("median", "p90")),
                   *(f"{stat}_{m}_engine_error" for m in METRICS for stat in ("median", "p90")),
                   *(f"http_overhead_{m}_{stat}" for m in ("ttft", "e2e_latency") for stat in ("median", "p90")),
                   *(f"http_{part}_{stat}" for part in ("handover", "delivery") for stat in ("median", "p90")),
                   "send_lateness_p90", "measured_tokens_per_s", "simulated_tokens_per_s", "throughput_error",
                   "measured_preemptions", "simulated_preemptions", "kv_blocks_used_after",
                   *(f"{kind}_step_error_{stat}" for kind in ("all", "prefill", "decode") for stat in ("median", "p90")),
                   "prefill_step_bias", "decode_step_bias", "wall_s")
REQUEST_COLUMNS = ("trace", "request_id", "arrival_time", "sent", "prompt_len", "output_len", "status",
                   *(f"{side}_{m}" for m in METRICS for side in SIDES), "handover")
TIME_LIMIT_S = 3600.0  # the client gives up on the run after this long


def client_latencies(request: Request, measured: dict) -> dict[str, float]:
    """TTFT, mean ITL (per token) and E2E of one request as the client saw it (a row of the load test's CSV)."""
    ttft, last = measured["ttft"], measured["last_token"]
    itl = (last - ttft) / (request.output_len - 1) if request.output_len > 1 else math.nan
    return {"ttft": ttft, "itl_mean": itl, "e2e_latency": last}


def max_in_flight(starts: np.ndarray, ends: np.ndarray) -> int:
    """The most intervals [start, end) open at once (NaN ends: never finished, open to the last)."""
    ends = np.where(np.isfinite(ends), ends, np.inf)
    events = sorted([(t, 1) for t in starts if np.isfinite(t)] + [(t, -1) for t in ends if np.isfinite(t)],
                    key=lambda e: (e[0], e[1]))  # an end before a start at the same time
    open_, most = 0, 0
    for _, change in events:
        open_ += change
        most = max(most, open_)
    return most


def engine_latencies(metrics) -> dict[str, float]:
    def value(x) -> float:
        return math.nan if x is None else float(x)

    return {"ttft": value(metrics.ttft), "itl_mean": value(metrics.itl_mean), "e2e_latency": value(metrics.e2e_latency)}


def _stats(values: np.ndarray) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    return (float(np.median(values)), float(np.percentile(values, 90))) if len(values) else (math.nan, math.nan)


def validate_online(loaded, name: str, trace: str, requests: list[Request], cost_model, *, engine: dict, seed: int = 0,
                    block_size: int = 16) -> tuple[dict, list[dict]]:
    """Serve the trace's `requests` over HTTP to a load-test client in another process (as a user's client would be:
    not sharing this process's interpreter lock with the engine), and simulate them: the summary row and the
    per-request rows."""
    from reference import LLM
    from reference.bench.loadtest import blocks_used
    from reference.server.run import serve_in_thread
    from reference.validation.validate_sim import step_errors
    from reference.validation.validation_suite import DEFAULT_BLOCKS, simulate

    settings = {"num_gpu_blocks": DEFAULT_BLOCKS, **engine}
    llm = LLM.from_loaded(*loaded, block_size=block_size, **settings)
    finished: dict[str, object] = {}  # engine request id -> its RequestMetrics (written on the engine thread)
    server, base = serve_in_thread(llm, "smollm2", on_finished=lambda out: finished.__setitem__(out.request_id,
                                                                                                 out.metrics))
    started = time.perf_counter()
    try:
        measured = _client(base, trace, len(requests), seed)
        time.sleep(0.2)  # the engine loop's last step after the last response
        used = blocks_used(base)
    finally:
        server.should_exit = True
    wall = time.perf_counter() - started
    # the simulator gets each request when the client sent it (a late send is the client's, not the server's)
    sent = [Request(r.request_id, m["sent"] if math.isfinite(m["sent"]) else r.arrival_time, r.prompt_len,
                    r.output_len, r.n, r.beam_width, r.prefix_id, r.prefix_len, prompt_ids(r, seed))
            for r, m in ((r, measured[r.request_id]) for r in requests)]
    sim = simulate(sent, llm, cost_model, block_size, settings.get("watermark", 0.0))
    index = {int(i): k for k, i in enumerate(sim.requests.columns["request_id"])}
    rows = []
    for r in requests:
        m = measured[r.request_id]
        row = {"trace": name, "request_id": r.request_id, "arrival_time": r.arrival_time, "sent": m["sent"],
               "prompt_len": r.prompt_len, "output_len": r.output_len, "status": m["status"]}
        engine_id = m["response_id"].rsplit("-", 1)[-1]  # "cmpl-<hex>-<engine id>" (reference/server/app.py)
        sides = {"client": client_latencies(r, m) if m["status"] == "ok" else dict.fromkeys(METRICS, math.nan),
                 "engine": engine_latencies(finished[engine_id]) if engine_id in finished
                 else dict.fromkeys(METRICS, math.nan),
                 "simulated": {k: float(sim.requests.columns[k][index[r.request_id]]) for k in METRICS}}
        for side, values in sides.items():
            for k in METRICS:
                row[f"{side}_{k}"] = values[k]
        # from the client's send to the engine queueing it, on the wall clock both processes share
        row["handover"] = (llm.started_at + finished[engine_id].arrival_time - m["sent_epoch"]
                           if engine_id in finished else math.nan)
        rows.append(row)
    summary = _summary(name, requests, rows, sim, llm, used, wall)
    summary.update(step_errors(cost_model, llm.step_log))
    return summary, rows


def _client(base: str, trace: str, num_requests: int, seed: int) -> dict[int, dict]:
    """`python -m reference loadtest --url base` on the trace, in a process of its own; its CSV's rows by request id
    (status, sent, ttft, last_token, response_id as text or floats)."""
    import csv
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "client.csv"
        command = [sys.executable, "-m", "reference", "loadtest", "--url", base, "--trace", trace, "--seed", str(seed),
                   "--max-concurrency", str(num_requests), "--time-limit", str(TIME_LIMIT_S), "--out", str(out)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIME_LIMIT_S + 300)
        if not out.is_file():
            raise RuntimeError(f"the load test wrote nothing (exit {done.returncode}): {done.stderr.strip()[-500:]}")
        lines = [line for line in out.read_text().splitlines() if not line.startswith("#")]
    rows = {}
    for row in csv.DictReader(lines):
        rows[int(row["request_id"])] = {**row, **{k: float(row[k]) if row[k] else math.nan
                                                  for k in ("sent", "ttft", "last_token", "e2e_latency", "sent_epoch")}}
    return rows


def _summary(name, requests, rows, sim, llm, used, wall) -> dict:
    column = {key: np.array([row[key] for row in rows], dtype=float) for key in rows[0] if key not in ("trace", "status")}
    summary = {"trace": name, "num_requests": len(requests), "errors": sum(row["status"] != "ok" for row in rows),
               "max_in_flight": max_in_flight(column["sent"], column["sent"] + column["client_e2e_latency"]), "num_gpu_blocks": llm.scheduler.kv.num_blocks,
               "max_num_batched_tokens": llm.scheduler.config.max_num_batched_tokens,
               "measured_preemptions": llm.stats.num_preemptions,
               "simulated_preemptions": sim.summary["num_preemptions"],
               "kv_blocks_used_after": math.nan if used is None else int(used), "wall_s": round(wall, 1)}
    for m in METRICS:
        for suffix, side in (("error", "client"), ("engine_error", "engine")):
            err = relative_errors(column[f"{side}_{m}"], column[f"simulated_{m}"])
            summary[f"median_{m}_{suffix}"], summary[f"p90_{m}_{suffix}"] = _stats(err)
    for m in ("ttft", "e2e_latency"):
        overhead = column[f"client_{m}"] - column[f"engine_{m}"]
        summary[f"http_overhead_{m}_median"], summary[f"http_overhead_{m}_p90"] = _stats(overhead)
    handover = column["handover"]
    summary["http_handover_median"], summary["http_handover_p90"] = _stats(handover)
    summary["http_delivery_median"], summary["http_delivery_p90"] = _stats(column["client_ttft"] - column["engine_ttft"]
                                                                           - handover)
    summary["send_lateness_p90"] = _stats(column["sent"] - column["arrival_time"])[1]
    tokens, first = sum(r.output_len for r in requests), np.nanmin(column["sent"])
    summary["measured_tokens_per_s"] = tokens / (np.nanmax(column["sent"] + column["client_e2e_latency"]) - first)
    summary["simulated_tokens_per_s"] = tokens / (np.nanmax(column["sent"] + column["simulated_e2e_latency"]) - first)
    summary["throughput_error"] = abs(summary["simulated_tokens_per_s"] / summary["measured_tokens_per_s"] - 1)
    return summary


def summary_sentence(s: dict) -> str:
    """The summary in words (printed by the command; the README's "Serve it" numbers are made from the CSV)."""
    ms = 1000
    return (f"{s['num_requests']} requests over HTTP, {s['errors']} errors, at most {s['max_in_flight']} in flight; "
            f"the simulator against the client: TTFT median error {s['median_ttft_error']:.1%} (p90 "
            f"{s['p90_ttft_error']:.1%}), ITL {s['median_itl_mean_error']:.1%} ({s['p90_itl_mean_error']:.1%}), E2E "
            f"{s['median_e2e_latency_error']:.1%} ({s['p90_e2e_latency_error']:.1%}); against the engine's own: TTFT "
            f"{s['median_ttft_engine_error']:.1%}, E2E {s['median_e2e_latency_engine_error']:.1%}; HTTP overhead (client "
            f"minus engine) TTFT median {s['http_overhead_ttft_median'] * ms:.1f} ms (p90 "
            f"{s['http_overhead_ttft_p90'] * ms:.1f} ms; hand-over {s['http_handover_median'] * ms:.1f} ms, way back "
            f"{s['http_delivery_median'] * ms:.1f} ms), E2E median {s['http_overhead_e2e_latency_median'] * ms:.1f} "
            f"ms; KV blocks still used after: {s['kv_blocks_used_after']}")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """`python -m reference validate-sim --online [--trace FILE]` (flags checked by validate_sim.check_args)."""
    import tempfile
    from pathlib import Path

    from reference.bench.loadtest import machine_line
    from reference.validation.validate_sim import prepare, trace_cases
    from sim.base.outfiles import atomic_files, write_csv
    from sim.workloads.trace import jsonl_text

    ((name, requests, engine),) = trace_cases(args)
    cost_model, record, threads, loaded = prepare(args.cost_model)
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace[0] if args.trace else str(Path(tmp) / f"{name}.jsonl")
        if not args.trace:
            Path(trace).write_text(jsonl_text(requests))  # the client's copy; the committed one goes with the results
        print(f"serving {len(requests)} requests of {args.trace[0] if args.trace else name} over HTTP (arrivals over "
              f"{max(r.arrival_time for r in requests):.0f} s) ...", flush=True)
        summary, rows = validate_online(loaded, name, trace, requests, cost_model, engine=engine, seed=args.seed)
    comments = [f"command: {' '.join(argv)}", f"cost model: {args.cost_model} ({record.get('created', '?')})",
                f"engine threads: {threads}", machine_line()]
    with atomic_files(make_parents=True) as files:
        if not args.trace:
            with files.open(Path(args.traces_dir) / f"{name}.jsonl") as f:
                f.write(jsonl_text(requests))
        write_csv(args.out, SUMMARY_COLUMNS, [summary], comments=comments, files=files)
        write_csv(args.requests_csv, REQUEST_COLUMNS, rows, comments=comments, files=files)
        both = [{"trace": label, **{f"measured_{m}": row[f"{side}_{m}"] for m in METRICS},
                 **{f"simulated_{m}": row[f"simulated_{m}"] for m in METRICS}}
                for side, label in (("client", "at the HTTP client"), ("engine", "inside the engine")) for row in rows]
        figure(both, args.figure, files=files, xlabel="measured (s)",
               title=f"The simulator vs the server over HTTP, request by request ({name}; dashed: +-20%)")
    print(summary_sentence(summary))
    print(f"wrote {args.out}, {args.requests_csv} and {args.figure}")
    return 0 if summary["errors"] == 0 and summary["kv_blocks_used_after"] == 0 else 1
