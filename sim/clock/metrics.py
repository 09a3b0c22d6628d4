"""What a simulated run measured: per-request and per-step tables, and the summary the paper reports.

vLLM paper, section 6: throughput is judged by the *normalized latency* (a request's end-to-end latency
divided by its output length, averaged over requests, Fig. 12) at a given request rate, and memory by
the breakdown of the KV pool (Fig. 2) and the number of requests batched per iteration (Fig. 13). Chunked
prefill (Sarathi-Serve, OSDI 2024) is judged by the latencies users see, per request:

    ttft              arrival -> end of the step that sampled its first token (time to first token)
    queueing_delay    arrival -> start of the first step that computed one of its tokens
    itl_mean          (last token - first token) / (token steps - 1): the mean inter-token latency (TPOT)
    itl_max           the largest gap between two consecutive token steps: a decode stalled behind a prompt
    e2e_latency       arrival -> its last token

and in the summary their mean, p50, p90 and p99 over finished requests, plus, for the targets given, SLO
attainment (the share of requests with ttft <= slo_ttft_s and itl_mean <= slo_tbt_s; unfinished ones fail)
and goodput (such requests per second). NOTE: the TBT target applies to the mean inter-token latency, as
vLLM's benchmark `--goodput tpot:` does; itl_max is reported to show stalls.

Tables are columns of numpy arrays, so a 100k-request run stays light; the event loop fills the step table
through `StepLog` (append-only compact arrays, turned into numpy arrays once at the end), or, for a run of
millions of steps whose table nobody reads (`run(step_table=False)`), keeps only its totals (`StepTotals`).

Definitions used in the summary (`python -m sim run --json`):

    sim_time_s                  first arrival -> end of the last step (the measured span)
    throughput_req_per_s        finished requests / sim_time_s
    normalized_latency_s_per_token   mean over finished requests of (finish - arrival) / output_len
    mean_batch_size             mean over iterations of the requests in the running state
    memory                      the five shares of the pool, weighted by simulated time over the span
    memory_busy                 the same without `free`, renormalised: the paper's view (shares of memory in use)
    prefix_cache_hit_rate_*     cached / looked-up prompt blocks (tokens) over admissions; None without lookups
"""
from __future__ import annotations

import csv
import math
from array import array
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np

from ..base.outfiles import atomic_write
from ..kv.base import SHARE_NAMES

LATENCY_METRICS = ("ttft", "queueing_delay", "itl_mean", "itl_max", "e2e_latency")  # seconds, per request
PERCENTILES = (50, 90, 99)
REQUEST_COLUMNS = (
    "request_id", "arrival_time", "prompt_len", "output_len", "priority", "first_scheduled_time", "first_token_time",
    "finish_time", "num_preemptions", *LATENCY_METRICS, "normalized_latency",
)
STEP_COLUMNS = (
    "time", "duration", "num_prefill_seqs", "num_decode_seqs", "num_running", "num_batched_tokens",
    "num_prefill_tokens", *SHARE_NAMES, "num_waiting", "num_preempted", "num_swapped_out_blocks",
    "num_swapped_in_blocks", "num_copied_blocks",
)
FLOAT_STEP_COLUMNS = ("time", "duration")
RLE_COLUMNS = (  # StepLog keeps them run-length encoded
    "num_prefill_seqs", "num_decode_seqs", "num_running", "num_batched_tokens", "num_prefill_tokens", "num_waiting",
    "num_preempted", "num_swapped_out_blocks", "num_swapped_in_blocks", "num_copied_blocks",
)
assert RLE_COLUMNS == tuple(c for c in STEP_COLUMNS if c not in FLOAT_STEP_COLUMNS + SHARE_NAMES)  # append's order
_SHARES = slice(STEP_COLUMNS.index(SHARE_NAMES[0]), STEP_COLUMNS.index(SHARE_NAMES[-1]) + 1)
_BEFORE_SHARES, _AFTER_SHARES = slice(2, _SHARES.start), slice(_SHARES.stop, None)
_RUNNING = STEP_COLUMNS.index("num_running")


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

    def to_csv(self, path: str | Path, files=None) -> None:
        """The table as CSV, written whole or not at all (sim.base.outfiles.atomic_write); with `files` (an
        sim.base.outfiles.atomic_files group), renamed into place with the rest of the group or not at all."""
        with (atomic_write(path, newline="") if files is None else files.open(path, "w", newline="")) as f:
            writer = csv.writer(f)
            writer.writerow(self.columns)
            writer.writerows(zip(*(col.tolist() for col in self.columns.values())))


class StepLog:
    """Per-step rows, appended by the event loop, kept compact (8 bytes a value, not a Python object's 32) and turned
    into numpy arrays once at the end. `totals()`: what the summary needs.

    A fast-forwarded run's steps differ only in time, duration and slot counts, so the other columns are kept
    run-length encoded: one count and one value per column for each run (a lone step is a run of one), expanded
    with np.repeat in to_table. That makes booking a run a few array extends, whatever its length."""

    kept = True  # the loop's result holds the table

    def __init__(self) -> None:
        self.time, self.duration = array("d"), array("d")
        self.shares = array("q")  # SHARE_NAMES' counts, step after step (len(SHARE_NAMES) values a step)
        self.repeats = array("q")  # each run's steps
        self.values = array("q")  # each run's value of every column of RLE_COLUMNS
        self.running = 0  # the sum of num_running over the steps

    def append(self, row: tuple) -> None:
        """One step: its values in STEP_COLUMNS order."""
        self.time.append(row[0])
        self.duration.append(row[1])
        self.shares.extend(row[_SHARES])
        self.repeats.append(1)
        self.values.extend(row[_BEFORE_SHARES])
        self.values.extend(row[_AFTER_SHARES])
        self.running += row[_RUNNING]

    def extend_run(self, starts: list[float], durations: list[float], seen: list[tuple[int, ...]], num_seqs: int,
                   num_running: int, num_waiting: int | list[int], num_preempted: int = 0) -> None:
        """k plain decode steps of a fast-forwarded run: their starts, durations and slot counts (SHARE_NAMES order),
        the sequences each decodes, the running and waiting requests (a list of k where requests arrived and queued
        during the run: such a run is kept step by step) and the requests it preempted (a run of one step)."""
        k = len(durations)
        self.time.extend(starts)
        self.duration.extend(durations)
        self.shares.extend(chain.from_iterable(seen))
        self.running += num_running * k
        # RLE_COLUMNS: no prompt, one token a sequence, no swap or copy
        if not isinstance(num_waiting, list):
            self.repeats.append(k)
            self.values.extend((0, num_seqs, num_running, num_seqs, 0, num_waiting, num_preempted, 0, 0, 0))
            return
        for waiting in num_waiting:  # (rare: a run during which requests arrived and queued)
            self.repeats.append(1)
            self.values.extend((0, num_seqs, num_running, num_seqs, 0, waiting, num_preempted, 0, 0, 0))

    def totals(self) -> tuple[int, int, float | None]:
        """(steps, the sum of num_running over them, their simulated seconds; None: sum the table's column)."""
        return len(self.time), self.running, None

    def to_table(self) -> Table:
        repeats = np.frombuffer(self.repeats, dtype=np.int64) if self.repeats else np.zeros(0, np.int64)
        values = np.array(self.values, dtype=np.int64).reshape(-1, len(RLE_COLUMNS))
        shares = np.array(self.shares, dtype=np.int64).reshape(-1, len(SHARE_NAMES))
        columns = {"time": np.array(self.time, dtype=float), "duration": np.array(self.duration, dtype=float)}
        columns |= {name: shares[:, i].copy() for i, name in enumerate(SHARE_NAMES)}
        columns |= {name: np.repeat(values[:, i], repeats) for i, name in enumerate(RLE_COLUMNS)}
        return Table({name: columns[name] for name in STEP_COLUMNS})


class StepTotals:
    """The same calls as StepLog, keeping only the totals the summary needs: for runs of millions of steps, whose
    table would take gigabytes (`run(step_table=False)`)."""

    kept = False

    def __init__(self) -> None:
        self.num_steps, self.running, self.busy = 0, 0, 0.0
        self._running_at = STEP_COLUMNS.index("num_running")

    def append(self, row: tuple) -> None:
        self.num_steps += 1
        self.running += row[self._running_at]
        self.busy += row[1]

    def extend_run(self, starts: list[float], durations: list[float], seen: list[tuple[int, ...]], num_seqs: int,
                   num_running: int, num_waiting: int | list[int], num_preempted: int = 0) -> None:
        self.num_steps += len(durations)
        self.running += num_running * len(durations)
        for duration in durations:
            self.busy += duration

    def totals(self) -> tuple[int, int, float | None]:
        return self.num_steps, self.running, self.busy

    def to_table(self) -> None:
        return None


class RequestTimes:
    """Per request (by index): the times the latency metrics are made of; NaN until they happen. NOTE: plain
    Python lists, not numpy arrays: the loop touches single items millions of times (arrays() at the end)."""

    def __init__(self, count: int) -> None:
        nan = math.nan
        self.first_scheduled = [nan] * count  # start of the first step that feeds one of its tokens
        self.first_token = [nan] * count  # end of the first step that samples for it
        self.last_token = [nan] * count
        self.max_gap = [0.0] * count  # the largest time between two of its consecutive token steps
        self.token_steps = [0] * count  # steps that sampled at least one token for it (a verify step: its tokens kept)
        self.finish = [nan] * count
        self.preemptions = [0] * count

    def sampled(self, i: int, now: float, tokens: int = 1) -> None:
        if self.token_steps[i]:
            gap = now - self.last_token[i]
            if gap > self.max_gap[i]:
                self.max_gap[i] = gap
        else:
            self.first_token[i] = now
        self.last_token[i] = now
        self.token_steps[i] += tokens

    def arrays(self) -> dict[str, np.ndarray]:
        ints = ("token_steps", "preemptions")
        return {name: np.array(getattr(self, name), dtype=np.int64 if name in ints else float)
                for name in ("first_scheduled", "first_token", "last_token", "max_gap", *ints, "finish")}


def request_table(requests: list, times: dict[str, np.ndarray]) -> Table:
    """Per-request results from the loop's record of `times` (RequestTimes.arrays()); unfinished requests
    keep NaN times and latencies. A request with one token step has no inter-token latency (NaN)."""
    arrival = np.array([r.arrival_time for r in requests], dtype=float)
    output_len = np.array([r.output_len for r in requests], dtype=np.int64)
    finish, first, steps = times["finish"], times["first_token"], times["token_steps"]
    several = steps > 1
    with np.errstate(invalid="ignore", divide="ignore"):
        itl_mean = np.where(several, (finish - first) / np.maximum(steps - 1, 1), np.nan)
    itl_max = np.where(several & ~np.isnan(finish), times["max_gap"], np.nan)
    return Table(
        {
            "request_id": np.array([r.request_id for r in requests], dtype=np.int64),
            "arrival_time": arrival,
            "prompt_len": np.array([r.prompt_len for r in requests], dtype=np.int64),
            "output_len": output_len,
            "priority": np.array([r.priority for r in requests], dtype=np.int64),
            "first_scheduled_time": times["first_scheduled"],
            "first_token_time": first,
            "finish_time": finish,
            "num_preemptions": times["preemptions"],
            "ttft": first - arrival,
            "queueing_delay": times["first_scheduled"] - arrival,
            "itl_mean": np.where(np.isnan(finish), np.nan, itl_mean),
            "itl_max": itl_max,
            "e2e_latency": finish - arrival,
            "normalized_latency": (finish - arrival) / output_len,
        }
    )


def latency_summary(requests: Table) -> dict[str, float | None]:
    """mean / p50 / p90 / p99 of every latency metric over the requests that have it: `p99_itl_max_s`, ..."""
    out: dict[str, float | None] = {}
    for metric in LATENCY_METRICS:
        values = requests[metric][~np.isnan(requests[metric])]
        out[f"mean_{metric}_s"] = float(values.mean()) if len(values) else None
        for p in PERCENTILES:
            out[f"p{p}_{metric}_s"] = float(np.percentile(values, p)) if len(values) else None
    return out


def priority_summary(requests: Table) -> dict:
    """With requests of more than one priority: {"by_priority": {priority: its requests' count, finished count, mean
    normalized latency, mean and p99 TTFT, mean end-to-end latency}} (priority as a string: a JSON key); else {}."""
    priority = requests["priority"]
    levels = np.unique(priority)
    if len(levels) < 2:
        return {}
    out = {}
    for level in levels.tolist():
        mine = priority == level
        done = mine & ~np.isnan(requests["finish_time"])
        ttft = requests["ttft"][mine & ~np.isnan(requests["ttft"])]
        out[str(level)] = {
            "num_requests": int(mine.sum()), "num_finished": int(done.sum()),
            "normalized_latency_s_per_token": float(requests["normalized_latency"][done].mean()) if done.any() else None,
            "mean_ttft_s": float(ttft.mean()) if len(ttft) else None,
            "p99_ttft_s": float(np.percentile(ttft, 99)) if len(ttft) else None,
            "mean_e2e_latency_s": float(requests["e2e_latency"][done].mean()) if done.any() else None,
        }
    return {"by_priority": out}


def slo_summary(requests: Table, span: float, slo_ttft_s: float | None, slo_tbt_s: float | None) -> dict:
    """SLO attainment and goodput for the targets given (None: that target is not checked)."""
    met = ~np.isnan(requests["finish_time"])
    if slo_ttft_s is not None:
        met &= requests["ttft"] <= slo_ttft_s
    if slo_tbt_s is not None:
        met &= np.nan_to_num(requests["itl_mean"], nan=0.0) <= slo_tbt_s  # one token: no gap to miss
    count = int(met.sum())
    return {"slo_ttft_s": slo_ttft_s, "slo_tbt_s": slo_tbt_s,
            "slo_attainment": count / len(requests) if len(requests) else None,
            "goodput_req_per_s": count / span if span > 0 else 0.0}


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
    *, policy: str, requests: Table, step_totals: tuple[int, int, float | None], integral: dict[str, float], span: float, wall_time_s: float,
    extras: dict, slo_ttft_s: float | None = None, slo_tbt_s: float | None = None, prefix_cache=None,
) -> dict:
    """The summary dict of the `python -m sim run --json` contract (docs/ARCHITECTURE.md, "Metrics"), plus `extras` and
    derived stats. `step_totals`: (steps, the sum of their running requests, ...) from StepLog/StepTotals.totals()."""
    num_steps, running = step_totals[:2]
    finished = ~np.isnan(requests["finish_time"])
    num_finished = int(finished.sum())
    norm = requests["normalized_latency"][finished]
    shares, busy = memory_shares(integral)
    summary = {
        "policy": policy,
        "num_requests": len(requests),
        "num_finished": num_finished,
        "throughput_req_per_s": num_finished / span if span > 0 else 0.0,
        "normalized_latency_s_per_token": float(norm.mean()) if num_finished else None,
        "mean_batch_size": running / num_steps if num_steps else 0.0,  # (exact integers: as numpy's mean of the column)
        "num_preemptions": int(requests["num_preemptions"].sum()),
        "wall_time_s": wall_time_s,
        "memory": shares,
    }
    summary.update(extras)
    summary.update(
        {
            "sim_time_s": span,
            "num_steps": num_steps,
            "p50_normalized_latency_s_per_token": float(np.percentile(norm, 50)) if num_finished else None,
            "p90_normalized_latency_s_per_token": float(np.percentile(norm, 90)) if num_finished else None,
            "memory_busy": busy,
        }
    )
    summary.update(latency_summary(requests))
    summary.update(priority_summary(requests))
    summary.update(slo_summary(requests, span, slo_ttft_s, slo_tbt_s))
    stats = prefix_cache
    summary["prefix_cache_hit_rate_blocks"] = stats.hit_blocks / stats.queried_blocks if stats and stats.queried_blocks else None
    summary["prefix_cache_hit_rate_tokens"] = stats.hit_tokens / stats.queried_tokens if stats and stats.queried_tokens else None
    return summary
