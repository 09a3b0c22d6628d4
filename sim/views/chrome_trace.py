"""A serving run's timeline as a Chrome trace: open the file in https://ui.perfetto.dev or chrome://tracing.

The Trace Event Format (Google, "Trace Event Format", the JSON that chrome://tracing and Perfetto read) is a list
of events with a phase, a time stamp and a duration in microseconds, grouped by process and thread ids. A run
becomes two "processes":

    scheduler   one row of steps: a span per step named by what it ran ("prefill 512 + decode 31"), its counts in
                the span's arguments; markers where a step preempted requests, swapped blocks out or in, or
                copied blocks (copy-on-write, beam forks); and counters: the step's prefill and decode tokens,
                running and waiting requests, and the KV pool's five shares (sim/kv/base.py, in slots)
    requests    one row per request: "waiting" (arrival -> its first step), "to first token" (-> the step that
                sampled its first token: queueing behind a budget, chunks, preemption), "decoding" (-> its last
                token); a request still unfinished at the end of the run has its open span cut there

Times are the run's own clock: simulated seconds for the simulator. `write_trace` takes plain rows, so any step
log can be drawn the same way; `simulator_rows` makes them from a run's step and request tables.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from ..base.outfiles import write_text
from ..kv.base import SHARE_NAMES

SCHEDULER_PID, REQUESTS_PID = 1, 2
STEP_KEYS = ("time", "duration", "num_prefill_seqs", "num_decode_seqs", "num_prefill_tokens", "num_batched_tokens",
             "num_running", "num_waiting", "num_preempted", "num_swapped_out_blocks", "num_swapped_in_blocks",
             "num_copied_blocks")
REQUEST_KEYS = ("request_id", "arrival_time", "first_scheduled_time", "first_token_time", "finish_time",
                "prompt_len", "output_len", "num_preemptions")


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _step_name(step: dict) -> str:
    decode_tokens = step["num_batched_tokens"] - step["num_prefill_tokens"]
    parts = [f"prefill {step['num_prefill_tokens']}"] * (step["num_prefill_tokens"] > 0)
    parts += [f"decode {decode_tokens}"] * (decode_tokens > 0)
    return " + ".join(parts) or "idle step"


def trace_events(steps: list[dict], requests: list[dict], *, title: str) -> dict:
    """The trace (a JSON-ready dict) of `steps` (dicts with STEP_KEYS, plus optional SHARE_NAMES slot counts) and
    `requests` (dicts with REQUEST_KEYS; NaN for what did not happen)."""
    events = [
        {"name": "process_name", "ph": "M", "pid": SCHEDULER_PID, "args": {"name": f"scheduler ({title})"}},
        {"name": "thread_name", "ph": "M", "pid": SCHEDULER_PID, "tid": 0, "args": {"name": "steps"}},
        {"name": "process_name", "ph": "M", "pid": REQUESTS_PID, "args": {"name": "requests"}},
    ]
    for i, step in enumerate(steps):
        ts = _us(step["time"])
        args = {"step": i, **{k: step[k] for k in STEP_KEYS[2:]}}
        events.append({"name": _step_name(step), "cat": "step", "ph": "X", "ts": ts, "dur": _us(step["duration"]),
                       "pid": SCHEDULER_PID, "tid": 0, "args": args})
        for key, label in (("num_preempted", "preempted {} requests"), ("num_swapped_out_blocks", "swap out {} blocks"),
                           ("num_swapped_in_blocks", "swap in {} blocks"), ("num_copied_blocks", "copy {} blocks")):
            if step[key]:
                events.append({"name": label.format(step[key]), "cat": key, "ph": "i", "s": "t", "ts": ts,
                               "pid": SCHEDULER_PID, "tid": 0})
        decode_tokens = step["num_batched_tokens"] - step["num_prefill_tokens"]
        counters = [("tokens in the step", {"prefill": step["num_prefill_tokens"], "decode": decode_tokens}),
                    ("requests", {"running": step["num_running"], "waiting": step["num_waiting"]})]
        if all(name in step for name in SHARE_NAMES):
            counters.append(("KV pool (slots)", {name: step[name] for name in SHARE_NAMES}))
        events += [{"name": name, "ph": "C", "ts": ts, "pid": SCHEDULER_PID, "args": values}
                   for name, values in counters]
    end = max((s["time"] + s["duration"] for s in steps), default=0.0)
    for r in requests:
        tid = r["request_id"]
        events.append({"name": "thread_name", "ph": "M", "pid": REQUESTS_PID, "tid": tid,
                       "args": {"name": f"request {tid}"}})
        marks = [r["arrival_time"], r["first_scheduled_time"], r["first_token_time"], r["finish_time"]]
        args = {k: r[k] for k in ("prompt_len", "output_len", "num_preemptions")}
        for name, start, stop in zip(("waiting", "to first token", "decoding"), marks, marks[1:]):
            if math.isnan(start):
                break
            stop = end if math.isnan(stop) else stop  # still open when the run ended
            events.append({"name": name, "cat": "request", "ph": "X", "ts": _us(start),
                           "dur": _us(max(stop - start, 0.0)), "pid": REQUESTS_PID, "tid": tid, "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"title": title}}


def simulator_rows(steps, requests) -> tuple[list[dict], list[dict]]:
    """Rows for trace_events from a simulated run's tables (sim.clock.metrics.Table: steps, requests)."""
    step_keys = [*STEP_KEYS, *SHARE_NAMES]
    columns = {k: steps[k].tolist() for k in step_keys}
    step_rows = [dict(zip(step_keys, values)) for values in zip(*(columns[k] for k in step_keys))]
    req_columns = {k: requests[k].tolist() for k in REQUEST_KEYS}
    request_rows = [dict(zip(REQUEST_KEYS, values)) for values in zip(*(req_columns[k] for k in REQUEST_KEYS))]
    return step_rows, request_rows


def write_trace(path: str | Path, steps: list[dict], requests: list[dict], *, title: str, files=None) -> None:
    """Write the trace of trace_events to `path` (atomically: a failed write leaves no half file; with `files`, an
    sim.base.outfiles.atomic_files group, together with the group's other files or not at all)."""
    text = json.dumps(trace_events(steps, requests, title=title), separators=(",", ":"))
    if files is None:
        write_text(path, text)
    else:
        with files.open(path) as f:
            f.write(text)
