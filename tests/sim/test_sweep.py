"""sim.drivers.sweep: a grid of sim.run points, run in parallel, gives the rows sequential calls give, in grid order."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.api import run
from sim.drivers.sweep import (
    RAY_MISSING,
    RAY_START_ATTEMPTS,
    SweepError,
    _start_ray,
    grid_points,
    parse_assignment,
    parse_value,
    summary_row,
    sweep,
)

ROOT = Path(__file__).resolve().parents[2]
GRID = {"policy": ["max", "paged"], "rate": [1.0, 3.0]}
FIXED = {"workload": "alpaca", "duration": 15.0}


def _deterministic(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "wall_time_s"}  # wall-clock time differs run to run


def sim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_grid_points_vary_the_first_name_slowest():
    points = grid_points(GRID, FIXED)
    assert [(p["policy"], p["rate"]) for p in points] == [("max", 1.0), ("max", 3.0), ("paged", 1.0), ("paged", 3.0)]
    assert all(p["duration"] == 15.0 for p in points)


def test_parallel_sweep_gives_the_rows_of_sequential_runs_in_grid_order():
    rows = sweep(GRID, FIXED, jobs=2, progress=False)
    expected = [summary_row(p, run(**p).summary) for p in grid_points(GRID, FIXED)]
    assert [_deterministic(r) for r in rows] == [_deterministic(r) for r in expected]
    # flattened memory shares: the five of the whole pool sum to 1 (float sums: 1e-9 is rounding only)
    for row in rows:
        assert sum(
            row[f"memory.{n}"]
            for n in ("token_states", "reservation", "internal_fragmentation", "external_fragmentation", "free")
        ) == pytest.approx(1, abs=1e-9)


def test_values_are_typed_from_run_signature():
    assert parse_assignment("rate=1,2.5") == ("rate", [1.0, 2.5])
    assert parse_assignment("block-size=8,16") == ("block_size", [8, 16])
    assert parse_value("enable_prefix_caching", "off") is False
    assert parse_value("enable_prefix_caching", "none") is None
    assert parse_value("prompt_len_range", "16:512") == (16, 512)
    assert parse_value("policy", "paged") == "paged"


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("colour=red", "unknown sweep parameter 'colour'"),
        ("rate=fast", "rate: cannot read 'fast'"),
        ("policy=lru", "policy: got 'lru' (allowed: paged, max, pow2, oracle"),  # then the newer policies
        ("block_size=1.5", "block_size: cannot read '1.5'"),
        ("rate", "expected NAME=VALUE"),
        ("on_step=x", "unknown sweep parameter 'on_step'"),
    ],
)
def test_bad_grid_input_is_a_clear_error(spec, needle):
    with pytest.raises(SweepError) as err:
        parse_assignment(spec)
    assert needle in str(err.value)


def test_cli_writes_one_row_per_point(tmp_path):
    out = tmp_path / "results.csv"
    done = sim(
        "sweep",
        "--grid",
        "policy=max,paged",
        "--grid",
        "rate=1,2",
        "--set",
        "duration=10",
        "--set",
        "workload=alpaca",
        "--jobs",
        "2",
        "--out",
        str(out),
        "--no-progress",
    )
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.open()))
    assert [(r["policy"], r["rate"]) for r in rows] == [
        ("max", "1.0"),
        ("max", "2.0"),
        ("paged", "1.0"),
        ("paged", "2.0"),
    ]
    assert {
        "normalized_latency_s_per_token",
        "mean_batch_size",
        "memory.token_states",
        "memory_busy.token_states",
    } <= set(rows[0])


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--grid", "colour=red"], "unknown sweep parameter 'colour'"),
        (["--grid", "rate=fast"], "rate: cannot read 'fast'"),
        (["--grid", "policy=lru"], "allowed: paged, max, pow2, oracle"),
        (["--grid", "rate=-1", "--set", "duration=5"], "rate: got -1.0"),
        (["--grid", "rate=1", "--set", "duration=5,6"], "expected exactly one value"),
        (["--grid", "rate=1", "--backend", "spark"], "allowed: local, ray"),
        ([], "give at least one --grid"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(args, needle):
    done = sim("sweep", *args, "--no-progress")
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and needle in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_cli_ray_backend_without_ray_says_how_to_install(tmp_path):
    # Ray is a dev dependency, so CI has it: hide it from the child process as an uninstalled package would be
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'ray'\", name='ray')\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim",
            "sweep",
            "--grid",
            "rate=1",
            "--set",
            "duration=5",
            "--backend",
            "ray",
            "--no-progress",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {RAY_MISSING}"


class SlowStartingRay:
    """Ray's start-up as a busy machine sees it: no cluster to join, then `failures` local starts whose node misses
    Ray's 30 s window (the exception Ray raises then), then a start that works."""

    def __init__(
        self,
        failures: int,
        message: str = "The current node timed out during startup. This could happen "
        "because some of the raylet failed to startup or the GCS has become overloaded.",
    ) -> None:
        self.failures, self.message, self.calls, self.shutdowns = failures, message, [], 0

    def init(self, address: str | None = None) -> None:
        self.calls.append(address)
        if address == "auto":
            raise ConnectionError("Could not find any running Ray instance.")
        if self.failures:
            self.failures -= 1
            raise Exception(self.message)

    def shutdown(self) -> None:
        self.shutdowns += 1


def test_a_local_ray_whose_start_times_out_is_started_again():
    busy = SlowStartingRay(failures=RAY_START_ATTEMPTS - 1)
    _start_ray(busy)
    assert busy.calls == ["auto"] + [None] * RAY_START_ATTEMPTS and busy.shutdowns == RAY_START_ATTEMPTS - 1
    with pytest.raises(SweepError, match=f"did not start in {RAY_START_ATTEMPTS} attempts .* use --backend local"):
        _start_ray(SlowStartingRay(failures=RAY_START_ATTEMPTS))
    with pytest.raises(Exception, match="^something else$"):  # another failure is not retried
        _start_ray(SlowStartingRay(failures=1, message="something else"))


@pytest.mark.slow
def test_ray_backend_gives_the_local_rows():
    """A local Ray instance (Ray is a dev dependency): the same rows as the process pool, in grid order."""
    ray = pytest.importorskip("ray")
    grid = {"policy": ["max", "paged"]}
    fixed = {"workload": "alpaca", "duration": 10.0}
    try:
        rows = sweep(grid, fixed, backend="ray", progress=False)
    finally:
        ray.shutdown()  # stop the local instance this test started
    local = sweep(grid, fixed, jobs=1, progress=False)
    assert [_deterministic(r) for r in rows] == [_deterministic(r) for r in local]
