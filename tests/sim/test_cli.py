"""`python -m sim` as a user runs it: in a subprocess, reading stdout, stderr and the exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.base.request import Request
from sim.kv.base import SHARE_NAMES
from sim.workloads.trace import write_jsonl

ROOT = Path(__file__).resolve().parents[2]
CONTRACT_KEYS = {
    "policy",
    "num_requests",
    "num_finished",
    "throughput_req_per_s",
    "normalized_latency_s_per_token",
    "mean_batch_size",
    "num_preemptions",
    "wall_time_s",
    "memory",
}


def sim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_run_json_prints_one_object_with_the_contract():
    out = sim(
        "run",
        "--model",
        "opt-13b",
        "--gpu",
        "a100-40gb",
        "--workload",
        "sharegpt",
        "--rate",
        "2",
        "--duration",
        "30",
        "--policy",
        "paged",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)  # the whole of stdout is one JSON object
    assert CONTRACT_KEYS <= set(summary)
    assert set(summary["memory"]) == set(SHARE_NAMES)
    assert summary["policy"] == "paged" and summary["num_finished"] == summary["num_requests"]


def test_run_prints_a_readable_table():
    out = sim("run", "--policy", "max", "--workload", "alpaca", "--duration", "20")
    assert out.returncode == 0, out.stderr
    assert "normalized latency" in out.stdout and "internal_fragmentation" in out.stdout and "#" in out.stdout


def test_help_explains_every_flag():
    top = sim("--help")
    assert top.returncode == 0 and "run" in top.stdout and "bench" in top.stdout
    out = sim("run", "--help")
    assert out.returncode == 0
    for flag in (
        "--model",
        "--gpu",
        "--num-gpus",
        "--workload",
        "--rate",
        "--duration",
        "--num-requests",
        "--policy",
        "--block-size",
        "--seed",
        "--n",
        "--beam-width",
        "--prefix-len",
        "--preemption",
        "--swap-space",
        "--trace",
        "--scheduler",
        "--arrival",
        "--burstiness",
        "--allocator",
        "--json",
    ):
        assert flag in out.stdout, flag


def test_figures_help_lists_the_names_only_takes():
    from sim.figures import FIGURES  # the registry `figures` reads: every name it knows, and no other

    out = sim("figures", "--help")
    assert out.returncode == 0
    listed = " ".join(out.stdout.split()).split("NAME (for --only), one of: ")[1]
    assert listed.split(", ") == list(FIGURES)


def _trace(tmp_path: Path, requests: list[Request]) -> str:
    path = tmp_path / "trace.jsonl"
    write_jsonl(requests, path)
    return str(path)


BAD_INPUTS = {
    "rate-zero": (["--rate", "0"], "rate"),
    "rate-negative": (["--rate", "-1"], "rate"),
    "rate-not-a-number": (["--rate", "fast"], "--rate"),
    "unknown-model": (["--model", "nope"], "allowed"),
    "unknown-gpu": (["--gpu", "nope"], "allowed"),
    "weights-do-not-fit": (["--model", "opt-175b", "--gpu", "a100-40gb"], "do not fit"),
    "block-size-zero": (["--block-size", "0"], "block_size"),
    "unknown-policy": (["--policy", "lru"], "allowed"),
    "unknown-flag": (["--bogus"], "--bogus"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2(case):
    args, fragment = BAD_INPUTS[case]
    out = sim("run", "--duration", "10", *args)
    assert out.returncode == 2
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
    assert fragment in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""


def test_trace_longer_than_the_pool_names_the_request(tmp_path):
    trace = _trace(tmp_path, [Request(0, 0.0, 100, 10), Request(1, 0.5, 1000, 500)])
    out = sim("run", "--trace", trace, "--kv-slots", "1024")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    # the file and the line that holds the request, then the request
    assert out.stderr.startswith(f"error: {trace} line 2: request 1") and "Traceback" not in out.stderr


def test_malformed_trace_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"request_id": 0, "arrival_time": 0, "prompt_len": 5, "output_len": 3}\n{"request_id": 1, "arriv\n'
    )
    out = sim("run", "--trace", str(path))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "line 2" in out.stderr and str(path) in out.stderr and "Traceback" not in out.stderr


def test_trace_run_succeeds(tmp_path):
    trace = _trace(tmp_path, [Request(i, 0.1 * i, 50, 20) for i in range(5)])
    out = sim("run", "--trace", trace, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["num_finished"] == 5


def test_bench_pieces_write_a_csv_with_the_machine(tmp_path):
    """The benchmark's parts on a tiny input (the real runs take minutes: `python -m sim bench`)."""
    from sim.drivers import bench_sim

    row = {name: "" for name in bench_sim.COLUMNS} | bench_sim.heapq_yardstick(1000) | bench_sim.machine()
    path = tmp_path / "out" / "bench.csv"
    bench_sim.write_csv([row], path)
    text = path.read_text()
    assert text.splitlines()[0] == ",".join(bench_sim.COLUMNS) and "heapq" in text
    assert "heapq" in bench_sim.format_table([row])


def test_outputs_are_written_together_or_not_at_all(tmp_path):
    """--requests-csv A.csv with --steps-csv /dev/full: the second fails at its write (a full disk), so A.csv keeps
    its old content and nothing else appears."""
    a = tmp_path / "A.csv"
    a.write_text("old")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim",
            "run",
            "--workload",
            "fixed",
            "--prompt-len",
            "8",
            "--output-len",
            "4",
            "--num-requests",
            "2",
            "--requests-csv",
            str(a),
            "--steps-csv",
            "/dev/full",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "none was replaced" in lines[0], out.stderr
    assert a.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["A.csv"]


def test_a_closed_pipe_is_not_bad_input():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sim",
            "run",
            "--workload",
            "fixed",
            "--prompt-len",
            "8",
            "--output-len",
            "4",
            "--num-requests",
            "2",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == "", err
