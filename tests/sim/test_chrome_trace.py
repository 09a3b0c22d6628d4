"""`python -m sim run --chrome-trace FILE` (sim/views/chrome_trace.py): the step and request timeline in the Trace Event
Format, checked against the run's own step and request tables, and the committed example under figures/."""

import json
import math
from pathlib import Path

import pytest

from sim.drivers.cli import main
from sim.kv.base import SHARE_NAMES
from sim.views.chrome_trace import REQUESTS_PID, SCHEDULER_PID, trace_events

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "figures" / "chrome_trace_sim.json"
# The command that wrote the committed example (README.md quotes it): parallel sampling (copy-on-write) on a pool
# small enough to preempt by swapping.
EXAMPLE_ARGS = ["run", "--num-requests", "16", "--rate", "6", "--n", "2", "--preemption", "swap", "--kv-slots", "4000"]


def run_with_trace(tmp_path, args=EXAMPLE_ARGS):
    trace, steps, requests = tmp_path / "t.json", tmp_path / "steps.csv", tmp_path / "requests.csv"
    assert main([*args, "--chrome-trace", str(trace), "--steps-csv", str(steps), "--requests-csv", str(requests)]) == 0
    import csv

    def table(path):
        with open(path) as f:
            return list(csv.DictReader(f))

    return json.loads(trace.read_text()), table(steps), table(requests)


def test_every_step_is_a_span_with_its_counts_and_markers(tmp_path, capsys):
    trace, steps, _ = run_with_trace(tmp_path)
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X" and e["pid"] == SCHEDULER_PID]
    assert len(spans) == len(steps) and [e["args"]["step"] for e in spans] == list(range(len(steps)))
    for span, row in zip(spans, steps):
        assert span["ts"] == pytest.approx(float(row["time"]) * 1e6, abs=1e-3)
        assert span["dur"] == pytest.approx(float(row["duration"]) * 1e6, abs=1e-3) and span["dur"] > 0
        assert span["args"]["num_prefill_tokens"] == int(row["num_prefill_tokens"])
    for key in ("num_preempted", "num_swapped_out_blocks", "num_swapped_in_blocks", "num_copied_blocks"):
        total = sum(int(r[key]) for r in steps)
        assert total > 0, key  # the example run exercises every kind of marker
        marked = [e for e in events if e["ph"] == "i" and e["cat"] == key]
        assert sum(int(e["name"].split()[-2]) for e in marked) == total
    pools = [e for e in events if e["ph"] == "C" and e["name"] == "KV pool (slots)"]
    assert len(pools) == len(steps) and set(pools[0]["args"]) == set(SHARE_NAMES)
    assert sum(pools[0]["args"].values()) == 4000  # every slot of the pool is one of the five kinds


def test_each_request_has_contiguous_spans_from_arrival_to_its_last_token(tmp_path):
    trace, _, requests = run_with_trace(tmp_path)
    spans = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["pid"] == REQUESTS_PID:
            spans.setdefault(e["tid"], []).append(e)
    assert sorted(spans) == sorted(int(r["request_id"]) for r in requests)
    for r in requests:
        mine = spans[int(r["request_id"])]
        assert [e["name"] for e in mine] == ["waiting", "to first token", "decoding"]
        assert mine[0]["ts"] == pytest.approx(float(r["arrival_time"]) * 1e6, abs=1e-3)
        for a, b in zip(mine, mine[1:]):
            assert a["ts"] + a["dur"] == pytest.approx(b["ts"], abs=1e-2)
        assert mine[-1]["ts"] + mine[-1]["dur"] == pytest.approx(float(r["finish_time"]) * 1e6, abs=1e-2)


def test_an_unfinished_request_is_cut_at_the_end_of_the_run():
    steps = [
        dict(
            time=0.0,
            duration=1.0,
            num_prefill_seqs=1,
            num_decode_seqs=0,
            num_prefill_tokens=5,
            num_batched_tokens=5,
            num_running=1,
            num_waiting=1,
            num_preempted=0,
            num_swapped_out_blocks=0,
            num_swapped_in_blocks=0,
            num_copied_blocks=0,
        )
    ]
    nan = math.nan
    requests = [
        dict(
            request_id=0,
            arrival_time=0.0,
            first_scheduled_time=0.0,
            first_token_time=1.0,
            finish_time=nan,
            prompt_len=5,
            output_len=9,
            num_preemptions=0,
        ),
        dict(
            request_id=1,
            arrival_time=0.5,
            first_scheduled_time=nan,
            first_token_time=nan,
            finish_time=nan,
            prompt_len=3,
            output_len=2,
            num_preemptions=0,
        ),
    ]
    events = trace_events(steps, requests, title="t")["traceEvents"]
    spans = [(e["tid"], e["name"], e["ts"], e["dur"]) for e in events if e["ph"] == "X" and e["pid"] == REQUESTS_PID]
    assert spans == [
        (0, "waiting", 0.0, 0.0),
        (0, "to first token", 0.0, 1e6),
        (0, "decoding", 1e6, 0.0),
        (1, "waiting", 5e5, 5e5),
    ]


def test_a_bad_trace_path_is_refused_before_the_run(tmp_path, capsys):
    assert main([*EXAMPLE_ARGS, "--chrome-trace", str(tmp_path)]) == 2  # a folder
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--chrome-trace" in err[0]


def test_the_committed_example_is_a_trace_of_that_command():
    trace = json.loads(EXAMPLE.read_text())
    assert trace["otherData"]["title"].startswith("sim run: paged, v1 scheduler")
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"waiting", "to first token", "decoding", "KV pool (slots)"} <= names
    assert any(n.startswith("swap out") for n in names) and any(n.startswith("copy ") for n in names)
    readme = " ".join((ROOT / "docs" / "schedulers.md").read_text().split())  # README's section, now its page
    assert "python -m sim " + " ".join(EXAMPLE_ARGS) + " --chrome-trace figures/chrome_trace_sim.json" in readme
