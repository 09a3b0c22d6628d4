"""The simulator benchmark of two trees side by side: `python tools/bench_sim_ab.py --before REV`.

Speed on these machines drifts by tens of percent between sessions and even minutes apart, so a before/after claim
is only worth the runs it alternates: each round runs every benchmark run once in the old tree (a `git worktree` of
REV) and once in this one, in fresh processes, the order flipping every round. Writes
figures/bench_sim_before_after.csv (one row per run and round, with the commit, machine and Python) and prints the
median wall times and their ratio per run, with the rounds' spread.

The runs are `python -m sim bench`'s paper-scale and 100k runs (its 1M run needs step_table=False, which older
trees lack). Each tree runs its own `sim.api.run`, so both simulate exactly the same requests; the row's num_steps
says whether they also took the same steps (speed work must not change results).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.base.outfiles import check_outputs, write_csv  # noqa: E402
from sim.drivers.bench_sim import RATE_100K, machine  # noqa: E402

DEFAULT_CSV = "figures/bench_sim_before_after.csv"
COLUMNS = ("round", "code", "commit", "run", "scheduler", "num_requests", "num_steps", "wall_time_s", "cpu", "python")
RUNS = {  # name -> sim.run keywords
    **{
        f"paper-scale {p}": dict(policy=p, scheduler="v0", rate=2.0, duration=3600.0)
        for p in ("max", "pow2", "oracle", "paged")
    },
    "paper-scale paged v1": dict(policy="paged", scheduler="v1", rate=2.0, duration=3600.0),
    "100k paged v0": dict(policy="paged", scheduler="v0", rate=RATE_100K, num_requests=100_000, duration=None),
    "100k paged v1": dict(policy="paged", scheduler="v1", rate=RATE_100K, num_requests=100_000, duration=None),
}
CODE = (
    "import json, sys, time; from sim.api import run; kwargs = json.load(sys.stdin); t = time.perf_counter(); "
    "s = run(**kwargs).summary; print(json.dumps({'wall': time.perf_counter() - t, 'steps': s['num_steps'], "
    "'requests': s['num_requests'], 'scheduler': s['scheduler']}))"
)


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def timed(tree: Path, kwargs: dict) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CODE], cwd=tree, input=json.dumps(kwargs), capture_output=True, text=True
    )
    if done.returncode:
        raise RuntimeError(f"{tree}: run {kwargs} failed (exit {done.returncode}):\n{done.stderr.strip()}")
    return json.loads(done.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tools/bench_sim_ab.py", description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, metavar="REV", help="the old tree's commit (any git revision)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every run in each tree (default 3)")
    p.add_argument(
        "--runs",
        nargs="+",
        default=list(RUNS),
        choices=list(RUNS),
        metavar="RUN",
        help=f"which runs (default: all): {', '.join(RUNS)}",
    )
    p.add_argument("--csv", default=DEFAULT_CSV, metavar="PATH", help=f"where to write (default: {DEFAULT_CSV})")
    args = p.parse_args(argv)
    if not 1 <= args.rounds <= 50:
        p.error(f"--rounds: got {args.rounds} (allowed: 1 to 50)")
    check_outputs({"--csv": args.csv}, make_parents=True)
    try:
        before = git("rev-parse", "--short", args.before)
    except subprocess.CalledProcessError:
        p.error(f"--before: {args.before!r} is not a revision of this repository")
    after = git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain", "--", "sim") else "")
    info = machine()
    rows, walls = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        git("worktree", "add", "--detach", str(old), before)
        try:
            for rnd in range(1, args.rounds + 1):
                trees = [("before", before, old), ("after", after, ROOT)]
                for code, commit, tree in trees if rnd % 2 else trees[::-1]:
                    for name in args.runs:
                        r = timed(tree, RUNS[name])
                        walls.setdefault((name, code), []).append(r["wall"])
                        rows.append(
                            {
                                "round": rnd,
                                "code": code,
                                "commit": commit,
                                "run": name,
                                "scheduler": r["scheduler"],
                                "num_requests": r["requests"],
                                "num_steps": r["steps"],
                                "wall_time_s": round(r["wall"], 3),
                                "cpu": info["cpu"],
                                "python": info["python"],
                            }
                        )
                        print(f"round {rnd} {code:6} {name:22} {r['wall']:7.3f} s  {r['steps']:,} steps", flush=True)
        finally:
            git("worktree", "remove", "--force", str(old))
    print(f"\n{'run':22} {'before s':>9} {'after s':>9} {'after/before':>13}  per-round ratios  ({info['cpu']})")
    for name in args.runs:
        b, a = walls[name, "before"], walls[name, "after"]
        per_round = [x / y for x, y in zip(a, b)]
        print(
            f"{name:22} {statistics.median(b):9.3f} {statistics.median(a):9.3f} "
            f"{statistics.median(a) / statistics.median(b):13.2f}  {', '.join(f'{x:.2f}' for x in per_round)}"
        )
    write_csv(args.csv, COLUMNS, rows, make_parents=True)
    print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
