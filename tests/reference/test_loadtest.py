"""`python -m reference loadtest --trace FILE`: the server driven at a trace's arrival times by an HTTP client. On a
small trace (samples included) every request comes back, with the client's own TTFT <= end to end and inter-token
gaps between them, as many chunks as tokens asked; no block leaked; the CSV names the machine, command and server;
bad flags are one line and exit 2 before anything starts."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

ROOT = Path(__file__).resolve().parents[2]
ROWS = [
    (0.0, 12, 6, 1),
    (0.05, 30, 4, 1),
    (0.1, 8, 8, 2),
    (0.15, 20, 5, 1),
    (0.3, 16, 7, 1),
    (0.35, 40, 3, 1),
    (0.4, 9, 2, 1),
    (0.45, 25, 6, 1),
]  # (arrival s, prompt, output, n)


@pytest.mark.slow
def test_every_request_comes_back_measured(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"request_id": i, "arrival_time": a, "prompt_len": p, "output_len": o, "n": n}) + "\n"
            for i, (a, p, o, n) in enumerate(ROWS)
        )
    )
    out = tmp_path / "loadtest.csv"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reference",
            "loadtest",
            "--trace",
            str(trace),
            "--out",
            str(out),
            "--num-gpu-blocks",
            "128",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{len(ROWS)} requests, 0 errors" in done.stdout and "KV blocks still used after: 0" in done.stdout
    lines = out.read_text().splitlines()
    assert [line.split(":")[0] for line in lines[:4]] == ["# machine", "# command", "# server", "# server says"]
    assert "model smollm2; vllm:cache_config_info block_size=16 num_gpu_blocks=128" in lines[3]  # what it told
    rows = list(csv.DictReader(lines[4:]))
    assert [int(r["request_id"]) for r in rows] == list(range(len(ROWS)))
    for r, (_, _, output_len, _) in zip(rows, ROWS):
        assert r["status"] == "ok" and int(r["num_chunks"]) == output_len
        ttft, e2e = float(r["ttft"]), float(r["e2e_latency"])
        assert 0 < ttft <= float(r["last_token"]) <= e2e and r["response_id"].startswith("cmpl-")
        assert float(r["sent"]) >= float(r["arrival_time"])  # never early
        if output_len > 1:
            assert 0 < float(r["itl_mean"]) <= float(r["itl_max"]) <= e2e - ttft + 1e-6


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--trace", "nope.jsonl"], "error: --trace nope.jsonl: no such file (allowed: a .jsonl or .csv trace)"),
        (
            ["--trace", "TRACE", "--max-concurrency", "0"],
            "error: --max-concurrency 0 (allowed: an integer from 1 to 10,000,000)",
        ),
        (
            ["--trace", "TRACE", "--num-gpu-blocks", "9" * 29],
            "error: --num-gpu-blocks 99999999999999999999999999999 (allowed",
        ),
        (["--trace", "TRACE", "--num-gpu-blocks", "2000000"], "is more than the cpu memory"),
        (["--trace", "TRACE", "--url", "localhost:8000"], "error: --url 'localhost:8000' (allowed: http://host:port)"),
        (
            ["--trace", "TRACE", "--url", "http://127.0.0.1:1"],
            "error: --url http://127.0.0.1:1: no server answers there",
        ),
        (["--trace", "TRACE", "--url", "http://[::1"], "error: --url http://[::1: no server answers there"),
        (["--trace", "BAD"], "line 1: request_id: missing"),
        (
            ["--trace", "BEAM"],
            "request 0 asks for beam search (beam_width 2), which the completions API does not offer",
        ),
    ],
)
def test_a_bad_flag_is_one_line_before_anything_starts(tmp_path, flags, message):
    good, bad = tmp_path / "t.jsonl", tmp_path / "bad.jsonl"
    good.write_text(json.dumps({"request_id": 0, "arrival_time": 0, "prompt_len": 4, "output_len": 2}) + "\n")
    bad.write_text(json.dumps({"arrival_time": 0, "prompt_len": 4, "output_len": 2}) + "\n")
    beam = tmp_path / "beam.jsonl"
    beam.write_text(
        json.dumps({"request_id": 0, "arrival_time": 0, "prompt_len": 4, "output_len": 2, "beam_width": 2}) + "\n"
    )
    flags = [{"TRACE": str(good), "BAD": str(bad), "BEAM": str(beam)}.get(f, f) for f in flags]
    done = subprocess.run(
        [sys.executable, "-m", "reference", "loadtest", *flags, "--out", str(tmp_path / "o.csv")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and message in done.stderr, done.stderr
    assert not (tmp_path / "o.csv").exists()
