"""Grade every lab's solution as the autograder does, on a quiet machine and with every core kept busy beside it.

    .venv/bin/python tools/grade_under_load.py [--hogs 0 2] [--lab NAME ...] [--warm] [--out figures/grader_load.csv]

Each lab's solution (notebooks/solutions/) is graded by `python -m reference.exercises grade ... --results` in a
fresh process, with the default time limits (sim/exercises/limits.py), once per entry of `--hogs`: that many
processes spinning a busy loop beside the grader (2 on a 2-core machine: each core shared). The engine's compiled
kernels are cleared before each capstone grade (numba's cache next to reference/: a fresh clone compiles them)
unless `--warm`. Prints a line per grade and saves the table: seconds, score, the checks that failed, and the
slowness the grader measured (how much longer its reference workload took than on the reference machine).

A probe, not a test: it takes minutes. Every solution must get full marks on every row.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.base.outfiles import check_outputs, write_csv  # noqa: E402
from tools.busy import hogs as busy  # noqa: E402

COLUMNS = ("lab", "hogs", "seconds", "score", "max_score", "failed", "slowness")
SLOWNESS = "from sim.exercises.limits import machine_slowness; print(round(machine_slowness(), 2))"


def labs() -> list[str]:
    from reference.exercises import EXERCISES

    return list(EXERCISES)


def clear_kernel_cache() -> int:
    """Delete numba's cached machine code of the engine's kernels (as a fresh clone has none); how many files."""
    found = [p for pattern in ("*.nbi", "*.nbc") for p in (ROOT / "reference").rglob(pattern)]
    for p in found:
        p.unlink()
    return len(found)


def grade_once(lab: str, results: Path) -> tuple[float, dict]:
    start = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reference.exercises",
            "grade",
            f"notebooks/solutions/{lab}.py",
            "--exercise",
            lab,
            "--results",
            str(results),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - start
    if done.returncode != 0 or not results.is_file():
        raise RuntimeError(f"grading {lab} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return seconds, json.loads(results.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hogs",
        type=int,
        nargs="+",
        default=[0, 2],
        metavar="N",
        help="busy processes beside the grader, one run per value (default: 0 2)",
    )
    parser.add_argument("--lab", action="append", help="a lab (repeatable; default: all)")
    parser.add_argument("--warm", action="store_true", help="keep numba's compiled kernels between grades")
    parser.add_argument("--out", default="figures/grader_load.csv", help="where the table goes")
    args = parser.parse_args(argv)
    known = labs()
    for lab in args.lab or ():
        if lab not in known:
            parser.error(f"unknown --lab {lab!r} (allowed: {', '.join(known)})")
    if any(n < 0 or n > 64 for n in args.hogs):
        parser.error(f"--hogs takes counts from 0 to 64, got {' '.join(map(str, args.hogs))}")
    try:
        check_outputs([("--out", args.out)], make_parents=True)
    except ValueError as exc:
        parser.error(str(exc))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for hogs in args.hogs:
            for lab in args.lab or known:
                if lab == "capstone" and not args.warm:
                    clear_kernel_cache()
                with busy(hogs):
                    time.sleep(0.5 if hogs else 0)  # the hogs running before the grader starts
                    slowness = subprocess.run(
                        [sys.executable, "-c", SLOWNESS], cwd=ROOT, capture_output=True, text=True
                    ).stdout.strip()
                    seconds, found = grade_once(lab, Path(tmp) / f"{lab}-{hogs}.json")
                failed = [t["name"] for t in found["tests"] if t["status"] != "passed"]
                rows.append(
                    {
                        "lab": lab,
                        "hogs": hogs,
                        "seconds": round(seconds, 1),
                        "score": found["score"],
                        "max_score": found["max_score"],
                        "failed": "; ".join(failed),
                        "slowness": slowness,
                    }
                )
                print(
                    f"{lab:24s} hogs {hogs}: {seconds:6.1f} s  {found['score']:g}/{found['max_score']:g}"
                    f"  slowness {slowness}{'  FAILED: ' + '; '.join(failed) if failed else ''}",
                    flush=True,
                )
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").is_file()
        else platform.processor()
    )
    command = shlex.join(["python", "tools/grade_under_load.py", *(argv if argv is not None else sys.argv[1:])])
    write_csv(
        args.out,
        COLUMNS,
        rows,
        comments=[f"machine: {cpu}, {os.cpu_count()} cores", f"command: {command}"],
        make_parents=True,
    )
    bad = [r for r in rows if r["score"] != r["max_score"]]
    print(f"{len(rows)} grades, {len(bad)} short of full marks; saved {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
