"""The engine's timeline as a Chrome trace (reference/engine/timeline.py, `python -m reference generate --chrome-trace`),
checked against the engine's own step log: every step a span at its wall-clock start, markers for preemption,
swaps and copies, and per request contiguous spans from arrival to the step it finished in."""

import json

import pytest

from reference import LLM, SamplingParams
from reference.cli import main
from reference.engine.timeline import engine_rows, write_chrome_trace
from reference.models import load_model
from sim.views.chrome_trace import REQUESTS_PID, SCHEDULER_PID

PROMPTS = [[5, 17, 99, 3, 42, 8, 11, 12, 13], [7, 7, 200, 31], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 12], [1, 2]]


@pytest.fixture(scope="module")
def swapping_run(tmp_path_factory):
    """Parallel sampling (copy-on-write) on a pool small enough to preempt by swapping."""
    llm = LLM.from_loaded(
        *load_model("random"), block_size=4, max_model_len=64, num_gpu_blocks=14, preemption="swap", num_cpu_blocks=32
    )
    llm.generate(PROMPTS, SamplingParams(n=2, temperature=1.0, max_tokens=10, seed=3, ignore_eos=True))
    path = tmp_path_factory.mktemp("trace") / "engine.json"
    write_chrome_trace(llm, path)
    return llm, json.loads(path.read_text())


def test_every_step_is_a_span_at_its_start_and_the_steps_do_not_overlap(swapping_run):
    llm, trace = swapping_run
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == SCHEDULER_PID]
    assert len(spans) == len(llm.step_log) == llm.stats.num_steps
    for span, record in zip(spans, llm.step_log):
        assert span["ts"] == pytest.approx(record.start_s * 1e6, abs=1e-3)
        assert span["args"]["num_batched_tokens"] == record.num_batched_tokens
    for a, b in zip(spans, spans[1:]):
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-3


def test_preemptions_swaps_and_copies_are_marked_as_the_stats_count_them(swapping_run):
    llm, trace = swapping_run
    marked = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "i":
            marked[e["cat"]] = marked.get(e["cat"], 0) + int(e["name"].split()[-2])
    stats = llm.stats
    assert stats.num_preemptions > 0 and stats.num_swapped_out_blocks > 0 and stats.num_copied_blocks > 0
    assert marked == {
        "num_preempted": sum(len(r.preempted) for r in llm.step_log),
        "num_swapped_out_blocks": stats.num_swapped_out_blocks,
        "num_swapped_in_blocks": stats.num_swapped_in_blocks,
        "num_copied_blocks": stats.num_copied_blocks,
    }


def test_each_request_runs_from_arrival_to_the_end_of_the_step_it_finished_in(swapping_run):
    llm, trace = swapping_run
    spans = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["pid"] == REQUESTS_PID:
            spans.setdefault(e["tid"], []).append(e)
    assert sorted(spans) == sorted(llm.arrivals) and len(spans) == len(PROMPTS)
    ends = {rid: r.start_s + r.step_time_s for r in llm.step_log for rid in r.finished_request_ids}
    for rid, mine in spans.items():
        assert [e["name"] for e in mine] == ["waiting", "to first token", "decoding"]
        assert mine[0]["ts"] == pytest.approx(llm.arrivals[rid][0] * 1e6, abs=1e-3)
        for a, b in zip(mine, mine[1:]):
            assert a["ts"] + a["dur"] == pytest.approx(b["ts"], abs=1e-2)
        assert mine[-1]["ts"] + mine[-1]["dur"] == pytest.approx(ends[rid] * 1e6, abs=1e-2)
    _, rows = engine_rows(llm)
    assert sum(r["num_preemptions"] for r in rows) == sum(len(r.preempted) for r in llm.step_log)


def test_generate_writes_the_trace_and_refuses_a_bad_path_before_loading(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["generate", "3 4 5", "--model", "random", "--max-tokens", "3", "--chrome-trace", str(out)]) == 0
    trace = json.loads(out.read_text())
    assert trace["otherData"]["title"] == "python -m reference generate: random, policy paged"
    assert sum(e["ph"] == "X" and e["pid"] == SCHEDULER_PID for e in trace["traceEvents"]) == 3  # prefill, 2 decodes
    capsys.readouterr()
    assert main(["generate", "3 4 5", "--model", "random", "--chrome-trace", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --chrome-trace {tmp_path}: is a folder (expected a file path)"]
