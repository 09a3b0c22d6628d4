"""Simulator speed: wall time and simulated requests per wall-clock second for the paper's runs.

Runs (vLLM paper section 6.1 setting: OPT-13B on one A100-40GB, ShareGPT-shaped requests, Poisson arrivals):

    paper-scale   2 req/s for 3600 s (~7.2k requests), once per policy: max, pow2, oracle, paged, under the
                  paper's scheduler (v0); and paged under vLLM v1's (token budget, chunked prefill)
    100k          paged (v0 and v1), 100,000 requests at RATE_100K req/s (busy: tens of running requests, with
                  some preemption; stable: latency does not grow with time)
    1M            paged (v0), 1,000,000 requests at the same rate, without the per-step table (step_table=False:
                  its tens of millions of rows would take gigabytes; the summary is the same)
    heapq         a bare heapq loop popping and pushing as many events as the paged paper-scale run handled:
                  the floor any heap-based event loop pays in this Python, timed in the same process

Each run is a fresh process (so that its peak resident memory, `peak_rss_mib`, is its own: the simulator's
imports included, about 100 MiB). Targets (benchmark only, never asserted in tests): paged paper-scale < 1 s (v0
and v1), 100k requests < 10 s, 1M requests < 60 s and < 2 GiB peak, one core. `--quick` shrinks every run (600 s of
arrivals, 10k and 20k requests) to check the command itself. Writes figures/bench_sim.csv (or --csv PATH) with a
description of the machine, and prints each row as it ends, then a table.

Builds: with a current compiled build in build/fast/ (`make fast`), every run is timed twice side by side, the .py
files (build "interpreted", LAB_FAST=0) and the compiled modules (build "compiled", LAB_FAST=require), each in its
own fresh process, the order flipping from run to run; the CSV's `build` column names each row's. `--builds
interpreted` times the .py files alone (the default without a current build).
"""
from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from ..api import run
from ..base.outfiles import check_outputs
from ..base.outfiles import write_csv as write_csv_file
from ..compiled import ENV, check_build

DEFAULT_CSV = "figures/bench_sim.csv"
RATE_100K = 1.5  # req/s: paged OPT-13B/A100-40GB serves ShareGPT-shaped requests at ~2 req/s before latency climbs
POLICY_ORDER = ("max", "pow2", "oracle", "paged")
TARGETS_S = {"paper-scale paged": 1.0, "paper-scale paged v1": 1.0, "100k paged v0": 10.0, "1M paged v0": 60.0}
TARGET_RSS_MIB = {"1M paged v0": 2048}
COLUMNS = ("run", "policy", "scheduler", "rate", "num_requests", "sim_time_s", "num_steps", "num_events", "wall_time_s",
           "cpu_time_s", "sim_requests_per_wall_s", "target_wall_s", "peak_rss_mib", "target_peak_rss_mib", "platform",
           "python", "cpu", "build")
BUILDS = ("interpreted", "compiled")  # the .py files; the optional mypyc build (`make fast`, sim/compiled.py)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small runs (600 s of arrivals, 10k requests)")
    parser.add_argument("--builds", nargs="+", choices=BUILDS, default=None, metavar="BUILD",
                        help="which builds to time: interpreted, compiled (default: both when `make fast` built a "
                             "current compiled build, else interpreted)")
    parser.add_argument("--csv", default=DEFAULT_CSV, metavar="PATH",
                        help=f"where to write the results (default: {DEFAULT_CSV})")


def machine() -> dict[str, str]:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"platform": platform.platform(), "python": platform.python_version(), "cpu": cpu or "unknown"}


def timed_run(name: str, **kwargs) -> dict:
    cpu = time.process_time()
    summary = run(**kwargs).summary
    cpu = time.process_time() - cpu
    wall = summary["wall_time_s"]
    return {
        "run": name, "policy": summary["policy"], "scheduler": summary["scheduler"], "rate": summary["rate"],
        "num_requests": summary["num_requests"],
        "sim_time_s": round(summary["sim_time_s"], 1), "num_steps": summary["num_steps"],
        "num_events": summary["num_events"], "wall_time_s": round(wall, 3), "cpu_time_s": round(cpu, 3),
        "sim_requests_per_wall_s": round(summary["num_requests"] / wall, 1),
        "target_wall_s": TARGETS_S.get(name, ""),
        # ru_maxrss: KiB on Linux, bytes on macOS
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 ** 2 if platform.system()
                                                                                   == "Darwin" else 1024), 1),
        "target_peak_rss_mib": TARGET_RSS_MIB.get(name, ""),
    }


def _run_apart(name: str, build: str = "interpreted", **kwargs) -> dict:
    """timed_run in a fresh Python process: its peak memory is the run's alone, not an earlier run's. `build`:
    "interpreted" (the .py files) or "compiled" (build/fast/; the process refuses to start without a current one)."""
    code = ("import json, sys; from sim.drivers.bench_sim import timed_run; "
            "name, kwargs = json.load(sys.stdin); print(json.dumps(timed_run(name, **kwargs)))")
    env = {**os.environ, ENV: "require" if build == "compiled" else "0"}
    done = subprocess.run([sys.executable, "-c", code], input=json.dumps([name, kwargs]), capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[2], env=env)
    if done.returncode:
        raise RuntimeError(f"bench run {name!r} ({build}) failed (exit {done.returncode}):\n{done.stderr.strip()}")
    row = json.loads(done.stdout.splitlines()[-1]) | {"build": build}
    print(f"  {name} ({build}): {row['wall_time_s']} s wall, peak {row['peak_rss_mib']} MiB", flush=True)
    return row


def _side_by_side(builds: tuple[str, ...], runs: list[tuple[str, dict]]) -> list[dict]:
    """Every run once per build, in fresh processes, the builds' order flipping from one run to the next."""
    rows = []
    for i, (name, kwargs) in enumerate(runs):
        for build in builds if i % 2 == 0 else builds[::-1]:
            rows.append(_run_apart(name, build, **kwargs))
    return rows


def default_builds() -> tuple[str, ...]:
    """Both builds when build/fast/ holds a compiled build of today's sources, else the .py files alone."""
    return BUILDS if check_build()[0] is not None else ("interpreted",)


def heapq_yardstick(num_events: int) -> dict:
    """Pop and push `num_events` (time, kind, seq, payload) events, the loop's own event shape."""
    start = time.perf_counter()
    heap = [(0.0, 0, 0, None), (0.5, 2, 1, None)]
    for i in range(num_events):
        now, kind, _, _ = heapq.heappop(heap)
        heapq.heappush(heap, (now + 0.01, kind, i + 2, None))
    wall = time.perf_counter() - start
    return {"run": "heapq", "num_events": num_events, "wall_time_s": round(wall, 4), "cpu_time_s": "",
            "target_wall_s": ""}


def bench(quick: bool = False, builds: tuple[str, ...] | None = None) -> list[dict]:
    duration, count, million = (600.0, 10_000, 20_000) if quick else (3600.0, 100_000, 1_000_000)
    builds = tuple(builds) if builds else default_builds()
    runs = [(f"paper-scale {p}", dict(policy=p, scheduler="v0", rate=2.0, duration=duration)) for p in POLICY_ORDER]
    runs.append(("paper-scale paged v1", dict(policy="paged", scheduler="v1", rate=2.0, duration=duration)))
    for scheduler in ("v0", "v1"):
        runs.append((f"100k paged {scheduler}", dict(policy="paged", scheduler=scheduler, rate=RATE_100K,
                                                     num_requests=count, duration=None)))
    runs.append(("1M paged v0", dict(policy="paged", scheduler="v0", rate=RATE_100K, num_requests=million,
                                     duration=None, step_table=False)))
    rows = _side_by_side(builds, runs)
    paged = next(r for r in rows if r["run"] == "paper-scale paged")
    rows.append(heapq_yardstick(paged["num_events"]) | {"build": "interpreted"})
    info = machine()
    return [{name: {**row, **info}.get(name, "") for name in COLUMNS} for row in rows]


def write_csv(rows: list[dict], path: str | Path) -> None:
    """The rows as CSV, written whole or not at all; missing folders are created."""
    write_csv_file(path, COLUMNS, rows, make_parents=True)


def format_table(rows: list[dict]) -> str:
    shown = ("run", "build", "num_requests", "num_steps", "num_events", "wall_time_s", "cpu_time_s",
             "sim_requests_per_wall_s", "target_wall_s", "peak_rss_mib", "target_peak_rss_mib")
    widths = [max(len(name), *(len(str(r[name])) for r in rows)) for name in shown]
    lines = ["  ".join(name.ljust(w) for name, w in zip(shown, widths))]
    lines += ["  ".join(str(r[name]).ljust(w) for name, w in zip(shown, widths)) for r in rows]
    info = rows[0]
    lines.append(f"machine: {info['cpu']}, {info['platform']}, Python {info['python']}")
    return "\n".join(lines)


def run_from_args(args: argparse.Namespace) -> int:
    # the output is checked before minutes of runs; a folder is created only for the default path
    check_outputs({"--csv": args.csv}, make_parents=args.csv == DEFAULT_CSV)
    builds = tuple(dict.fromkeys(args.builds)) if args.builds else None
    if builds and "compiled" in builds and check_build()[0] is None:
        print(f"error: --builds compiled: {check_build()[1]}", file=sys.stderr)
        return 2
    rows = bench(quick=args.quick, builds=builds)
    print(format_table(rows))  # first: a disk that fails the write below does not lose the numbers
    write_csv(rows, args.csv)
    print(f"wrote {args.csv}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
