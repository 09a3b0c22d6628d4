"""The benchmarks' two workloads (reference/bench/bench.py): the ShareGPT-shaped bench one and the long-prompt one, how
`python -m reference bench --workload` and `tools/peer_vllm.py --workload` pick them, the bench's --threads, and
their refusals. No model runs and no vLLM starts here: the timed runs take minutes."""

import csv
import os
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from reference.bench import bench
from reference.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import peer_vllm  # noqa: E402

VOCAB = 49152  # SmolLM2's


def comments(path: Path) -> dict[str, str]:
    lines = [line[2:] for line in path.read_text().splitlines() if line.startswith("# ")]
    return dict(line.split(": ", 1) for line in lines)


def test_the_long_workload_has_long_prompts_in_its_ranges():
    requests = bench.workload("long", vocab_size=VOCAB)
    assert len(requests) == bench.LONG_REQUESTS == 8
    assert [r.request_id for r in requests] == list(range(8))
    for r in requests:
        assert bench.LONG_PROMPT[0] <= r.prompt_len <= bench.LONG_PROMPT[1] == 2048
        assert bench.LONG_OUTPUT[0] <= r.output_len <= bench.LONG_OUTPUT[1] == 256
        assert len(r.prompt_token_ids) == r.prompt_len and r.arrival_time == 0.0
        assert bench.FIRST_TOKEN_ID <= min(r.prompt_token_ids) and max(r.prompt_token_ids) < VOCAB
    # the lengths spread over the range (not one length repeated), and the seed decides everything
    assert len({r.prompt_len for r in requests}) > 4 and max(r.prompt_len for r in requests) > 1500
    again, other = bench.workload("long", vocab_size=VOCAB), bench.workload("long", seed=1, vocab_size=VOCAB)
    assert [r.prompt_token_ids for r in again] == [r.prompt_token_ids for r in requests]
    assert [r.prompt_len for r in other] != [r.prompt_len for r in requests]


def test_both_workloads_draw_prompt_ids_from_the_same_generator():
    """One drawing (bench._with_prompt_ids): with the same seed, the first prompt's ids of either workload start the
    same way (the same generator, first draw); the longer prompt continues where the shorter stops."""
    short, long = bench.workload("bench", vocab_size=VOCAB)[0], bench.workload("long", vocab_size=VOCAB)[0]
    assert long.prompt_token_ids[: short.prompt_len] == short.prompt_token_ids


def test_the_bench_workload_is_the_one_the_committed_bench_ran():
    """Sharing the drawing changed no request of the bench workload: the committed run's `workload:` line (64
    requests, seed 0) is what describe_workload says of it now."""
    line = comments(ROOT / bench.DEFAULT_OUT)["workload"]
    assert line == bench.describe_workload("bench", bench.workload("bench", vocab_size=VOCAB))
    assert line.startswith("64 ShareGPT-shaped requests")


def test_the_bench_flags_pick_the_workload_threads_and_csv():
    parse = build_parser().parse_args
    for flags, out in (
        ([], bench.DEFAULT_OUT),
        (["--workload", "long"], "figures/bench_engine_cpu_long.csv"),
        (["--workload", "long", "--dtype", "bfloat16"], "figures/bench_engine_cpu_long_bf16.csv"),
        (["--workload", "long", "--out", "x.csv"], "x.csv"),
        (["--threads", "2"], "figures/bench_engine_cpu_2threads.csv"),
        (["--workload", "long", "--threads", "2"], "figures/bench_engine_cpu_long_2threads.csv"),
    ):
        args = parse(["bench", *flags])
        bench.check_args(args)
        assert bench.out_path(args) == out
    assert len(bench.workload("long", 3, vocab_size=VOCAB)) == 3  # --num-requests counts for either workload


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--workload", "longer"], "--workload longer (allowed: bench, long)"),
        (
            ["--workload", "long", "--quick"],
            "--quick goes with --workload bench (--workload long has its own lengths and no concurrency runs)",
        ),
        (["--workload", "long", "--kv-blocks", "64"], "--kv-blocks goes with --workload bench"),
        (["--threads", "0"], f"--threads 0 (allowed: an integer from 1 to {os.cpu_count()}, the cores)"),
        (["--threads", str(os.cpu_count() + 1)], f"--threads {os.cpu_count() + 1} (allowed: an integer from 1 to "),
    ],
)
def test_bench_refuses_a_bad_workload_in_one_line(flags, message, capsys, monkeypatch):
    monkeypatch.setattr(bench, "run", lambda *a, **k: pytest.fail("the benchmark ran before its flags were checked"))
    assert main(["bench", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1


def test_the_peer_tool_runs_the_long_workload_with_a_context_that_holds_it():
    task = peer_vllm.task(Namespace(workload="long"))
    requests = bench.workload("long", vocab_size=VOCAB)
    assert task["workload"] == [[r.prompt_token_ids, r.output_len] for r in requests]  # both systems run these
    assert task["max_model_len"] == max(r.total_len for r in requests) > 2048
    assert task["workload_description"].startswith("8 long-prompt requests")
    assert peer_vllm.task(Namespace(workload="bench"))["max_model_len"] == peer_vllm.MAX_MODEL_LEN


def test_the_peer_tool_writes_each_workload_to_its_own_csv():
    assert [peer_vllm.default_out(w, d) for w in ("bench", "long") for d in ("float32", "bfloat16", "both")] == [
        "figures/peer_vllm.csv",
        "figures/peer_vllm_bf16.csv",
        "figures/peer_vllm.csv",
        "figures/peer_vllm_long.csv",
        "figures/peer_vllm_long_bf16.csv",
        "figures/peer_vllm_long.csv",
    ]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--workload", "longer"], "--workload longer (allowed: bench, long)"),
        (["--workload", "long", "--api-only"], "--workload long times a workload; the API checks do not depend on it"),
    ],
)
def test_the_peer_tool_refuses_a_bad_workload_in_one_line(flags, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        peer_vllm.main([*flags, "--out", str(tmp_path / "x.csv")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.splitlines()[-1].split(": error: ", 1)[1].startswith(message)


def test_the_committed_long_run_compares_the_same_tokens():
    """`tools/peer_vllm.py --workload long` (figures/peer_vllm_long.csv, when committed): its header names the
    workload, and it has the speed rows and both equality checks."""
    path = ROOT / peer_vllm.default_out("long", "float32")
    if not path.exists():
        pytest.skip("no long-workload run committed")
    assert comments(path)["workload"].startswith("long (reference/bench/bench.py, seed 0): 8 long-prompt requests")
    with open(path) as f:
        sections = {r["section"] for r in csv.DictReader(line for line in f if not line.startswith("#"))}
    assert {"greedy_equality", "workload_equality", "throughput", "throughput_ratio"} <= sections
