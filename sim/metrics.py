"""What a simulated run measured: per-request and per-step tables, and the summary the paper reports.

vLLM paper, section 6: throughput is judged by the *normalized latency* (a request's end-to-end latency
divided by its output length, averaged over requests, Fig. 12) at a given request rate, and memory by
the breakdown of the KV pool (Fig. 2) and the number of requests batched per iteration (Fig. 13).

Tables are columns of numpy arrays, so a 100k-request run stays light; the event loop fills them
through `StepLog` (append-only Python lists, turned into arrays once at the end).

Definitions used in the summary (DESIGN.md contract, `python -m sim run --json`):

    sim_time_s                  first arrival -> end of the last step (the measured span)
    throughput_req_per_s        finished requests / sim_time_s
    normalized_latency_s_per_token   mean over finished requests of (finish - arrival) / output_len
    mean_batch_size             mean over iterations of the requests in the running state
    memory                      the five shares of the pool, weighted by simulated time over the span
    memory_busy                 the same without `free`, renormalised: the paper's view (shares of memory in use)
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .kv.base import SHARE_NAMES

REQUEST_COLUMNS = (
    "request_id", "arrival_time", "prompt_len", "output_len", "first_token_time", "finish_time",
    "num_preemptions", "normalized_latency",
)  # fmt: skip
STEP_COLUMNS = (
    "time", "duration", "num_prefill_seqs", "num_decode_seqs", "num_running", "num_batched_tokens",
    *SHARE_NAMES, "num_waiting", "num_preempted",
)  # fmt: skip


@dataclass(slots=True)
class Table:
    """Named columns of equal length (numpy arrays)."""

    columns: dict[str, np.ndarray]

    def __post_init__(self) -> None:
        lengths = {len(col) for col in self.columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"table columns must have equal lengths, found {sorted(lengths)}")

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def to_csv(self, path: str | Path) -> None:
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(self.columns)
            writer.writerows(zip(*(col.tolist() for col in self.columns.values())))


@dataclass(slots=True)
class StepLog:
    """Per-step rows, appended by the event loop; one list per column of `STEP_COLUMNS`."""

    rows: dict[str, list] = field(default_factory=lambda: {name: [] for name in STEP_COLUMNS})

    def to_table(self) -> Table:
        floats = ("time", "duration")
        return Table({k: np.asarray(v, dtype=float if k in floats else np.int64) for k, v in self.rows.items()})


def request_table(
    requests: list, first_token_time: np.ndarray, finish_time: np.ndarray, num_preemptions: np.ndarray
) -> Table:
    """Per-request results; unfinished requests keep NaN times (and NaN normalized latency)."""
    arrival = np.array([r.arrival_time for r in requests], dtype=float)
    output_len = np.array([r.output_len for r in requests], dtype=np.int64)
    return Table(
        {
            "request_id": np.array([r.request_id for r in requests], dtype=np.int64),
            "arrival_time": arrival,
            "prompt_len": np.array([r.prompt_len for r in requests], dtype=np.int64),
            "output_len": output_len,
            "first_token_time": first_token_time,
            "finish_time": finish_time,
            "num_preemptions": num_preemptions,
            "normalized_latency": (finish_time - arrival) / output_len,
        }
    )


def memory_shares(integral: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """(shares of the whole pool, shares of the non-free pool) from time-integrated slot counts."""
    total = sum(integral.values())
    if total <= 0:  # nothing was simulated: the whole pool was free
        return {name: float(name == "free") for name in SHARE_NAMES}, {n: 0.0 for n in SHARE_NAMES if n != "free"}
    shares = {name: integral[name] / total for name in SHARE_NAMES}
    busy_total = total - integral["free"]
    busy = {n: (integral[n] / busy_total if busy_total > 0 else 0.0) for n in SHARE_NAMES if n != "free"}
    return shares, busy


def summarize(
    *, policy: str, requests: Table, steps: Table, integral: dict[str, float], span: float, wall_time_s: float,
    extras: dict,
) -> dict:
    """The summary dict of the `python -m sim run --json` contract (DESIGN.md), plus `extras` and derived stats."""
    finished = ~np.isnan(requests["finish_time"])
    num_finished = int(finished.sum())
    norm = requests["normalized_latency"][finished]
    ttft = (requests["first_token_time"] - requests["arrival_time"])[~np.isnan(requests["first_token_time"])]
    shares, busy = memory_shares(integral)
    summary = {
        "policy": policy,
        "num_requests": len(requests),
        "num_finished": num_finished,
        "throughput_req_per_s": num_finished / span if span > 0 else 0.0,
        "normalized_latency_s_per_token": float(norm.mean()) if num_finished else None,
        "mean_batch_size": float(steps["num_running"].mean()) if len(steps) else 0.0,
        "num_preemptions": int(requests["num_preemptions"].sum()),
        "wall_time_s": wall_time_s,
        "memory": shares,
    }
    summary.update(extras)
    summary.update(
        {
            "sim_time_s": span,
            "num_steps": len(steps),
            "p50_normalized_latency_s_per_token": float(np.percentile(norm, 50)) if num_finished else None,
            "p90_normalized_latency_s_per_token": float(np.percentile(norm, 90)) if num_finished else None,
            "mean_ttft_s": float(ttft.mean()) if len(ttft) else None,
            "memory_busy": busy,
        }
    )
    return summary
