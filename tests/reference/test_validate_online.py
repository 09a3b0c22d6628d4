"""`python -m reference validate-sim --online`: a trace served over HTTP to a load-test client in its own process,
each request's latencies taken three ways (the client, the engine's own metrics, the simulator with the calibrated cost
model). What must hold on any machine, however fast: every request comes back, no block leaks, and the client sees
each request start no later and end no sooner than the engine does (it sends before the engine queues the request,
and reads each token after the engine made it), so the HTTP overhead is positive request by request. How close the
simulator comes is measured, not asserted: the cost model is the calibrating machine's (README, "Serve it")."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from reference.validation.validate_online import max_in_flight  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ROWS = [(0.0, 40, 12, 1), (0.1, 120, 8, 1), (0.2, 16, 20, 2), (0.6, 200, 6, 1), (0.7, 24, 16, 1), (1.0, 60, 10, 1)]


def _csv(path: Path) -> list[dict]:
    return list(csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#")))


@pytest.mark.slow
def test_a_served_trace_is_measured_at_the_client_in_the_engine_and_simulated(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"request_id": i, "arrival_time": a, "prompt_len": p, "output_len": o, "n": n}) + "\n"
            for i, (a, p, o, n) in enumerate(ROWS)
        )
    )
    out, per_request, png = tmp_path / "s.csv", tmp_path / "r.csv", tmp_path / "f.png"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reference",
            "validate-sim",
            "--online",
            "--trace",
            str(trace),
            "--out",
            str(out),
            "--requests-csv",
            str(per_request),
            "--figure",
            str(png),
            "--num-gpu-blocks",
            "128",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{len(ROWS)} requests over HTTP, 0 errors" in done.stdout
    (summary,) = _csv(out)
    assert summary["errors"] == "0" and summary["kv_blocks_used_after"] == "0" and summary["num_gpu_blocks"] == "128"
    rows = _csv(per_request)
    assert [int(r["request_id"]) for r in rows] == list(range(len(ROWS)))
    for r, (_, _, _output_len, _) in zip(rows, ROWS):
        assert r["status"] == "ok"
        values = {k: float(v) for k, v in r.items() if k.split("_")[0] in ("client", "engine", "simulated")}
        assert all(np.isfinite(v) and v > 0 for v in values.values()), r
        for metric in ("ttft", "e2e_latency"):  # the client's view contains the engine's
            assert values[f"client_{metric}"] > values[f"engine_{metric}"], (r["request_id"], metric)
        handover = float(r["handover"])  # on the shared wall clock: the engine queues it after the client sent it
        assert 0 < handover < values["client_ttft"] - values["engine_ttft"], r["request_id"]
    overhead = float(summary["http_overhead_ttft_median"])
    assert 0 < overhead < 5 and float(summary["http_delivery_median"]) > 0 and float(summary["send_lateness_p90"]) >= 0
    assert 1 <= int(summary["max_in_flight"]) <= len(ROWS)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    comments = [line for line in out.read_text().splitlines() if line.startswith("#")]
    assert any(c.startswith("# machine:") for c in comments) and any("engine threads" in c for c in comments)


def test_max_in_flight_counts_overlapping_requests():
    assert max_in_flight(np.array([0.0, 1.0, 2.0]), np.array([1.0, 2.0, 3.0])) == 1  # back to back: never two
    assert max_in_flight(np.array([0.0, 0.5, 0.6]), np.array([1.0, 0.7, np.nan])) == 3  # NaN: never finished
    assert max_in_flight(np.array([]), np.array([])) == 0


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--online", "--trace", "T", "--trace", "T"], "--online serves one trace"),
        (["--online", "--quick"], "--online serves one trace"),
        (["--online", "--trace", "BEAM"], "asks for beam search (beam_width 2)"),
    ],
)
def test_bad_online_flags_are_one_line(tmp_path, flags, message):
    good, beam = tmp_path / "t.jsonl", tmp_path / "beam.jsonl"
    good.write_text(json.dumps({"request_id": 0, "arrival_time": 0, "prompt_len": 4, "output_len": 2}) + "\n")
    beam.write_text(
        json.dumps({"request_id": 0, "arrival_time": 0, "prompt_len": 4, "output_len": 2, "beam_width": 2}) + "\n"
    )
    flags = [{"T": str(good), "BEAM": str(beam)}.get(f, f) for f in flags]
    done = subprocess.run(
        [sys.executable, "-m", "reference", "validate-sim", *flags, "--out", str(tmp_path / "o.csv")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and message in done.stderr, done.stderr
    assert not (tmp_path / "o.csv").exists()
