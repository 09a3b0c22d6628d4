"""The GPU benchmarks' CPU side: the engine bench's smoke run and flags, the kernel figure redrawn from the committed
table, and the README's GPU numbers recomputed from the committed files (they were measured on a lent H100)."""

import json
import re
from pathlib import Path

import pytest
import torch

from reference.attention import bench as kernel_bench
from reference.attention.bench_plot import paging_ratios, read_commented_csv, read_table
from reference.bench import bench_gpu
from sim.figures.readme_numbers import Files, make_block

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "figures"


def rows_of(path: Path) -> list[dict]:
    return read_commented_csv(path)[0]


def test_smollm2_config_is_the_checkpoints():
    from reference.models.loader import smollm2_checkpoint_dir

    real = json.loads((smollm2_checkpoint_dir() / "config.json").read_text())
    real["rope_theta"] = real.get("rope_theta") or real["rope_parameters"]["rope_theta"]
    for key, value in bench_gpu.SMOLLM2_CONFIG.items():
        assert real[key] == pytest.approx(value, rel=1e-6), key


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU paths of the script")
def test_without_cuda_it_says_so_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "x.csv"
    assert bench_gpu.main(["--out", str(out)]) == 2  # asked for what cannot run here: one line, exit 2
    err = capsys.readouterr().err
    assert err.startswith("error: bench-gpu needs a CUDA GPU") and len(err.strip().splitlines()) == 1
    assert kernel_bench.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: bench-kernels needs a CUDA GPU") and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU paths of the script")
def test_cpu_smoke_run_writes_equality_and_throughput(tmp_path):
    out = tmp_path / "engine.csv"
    assert (
        bench_gpu.main(
            ["--cpu-smoke", "--num-requests", "6", "--equality-prompts", "3", "--hf-batch-size", "4", "--out", str(out)]
        )
        == 0
    )
    text = out.read_text()
    assert "# machine: CPU" in text and "# command: python -m reference bench-gpu --cpu-smoke" in text
    rows = rows_of(out)
    equality = {r["dtype"]: r for r in rows if r["section"] == "greedy_equality"}
    assert equality["float32"]["note"].startswith("3 of 3 sequences equal")  # float32: the same function, same ids
    systems = [r["system"] for r in rows if r["section"] == "throughput"]
    assert systems[0].startswith("engine") and len(systems) == 3  # engine, HF batches of 4, HF one batch of 6
    assert all(
        float(r["tokens_per_s"]) > 0 and int(r["output_tokens"]) > 0 for r in rows if r["section"] == "throughput"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num-requests", "0"], "--num-requests 0 (allowed: an integer from 1 to 100,000)"),
        (["--equality-prompts", "5000"], "--equality-prompts 5000 (allowed"),
        (["--seed", "-1"], "--seed -1 (allowed"),
        (["--out", "/no/such/folder/x.csv"], "--out"),
        (["--num-requests", "ten"], "invalid int value"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(argv, message, capsys):
    try:
        status = bench_gpu.main(argv)
    except SystemExit as exc:  # argparse's own refusals (a value that is no int) exit through Parser.error
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_kernel_figure_redraws_from_the_committed_table(tmp_path):
    png = tmp_path / "k.png"
    assert kernel_bench.main(["--plot", str(FIGURES / "bench_attention_gpu.csv"), "--figure", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_kernel_figure_refuses_a_table_of_something_else(tmp_path, capsys):
    assert (
        kernel_bench.main(["--plot", str(FIGURES / "bench_engine_gpu.csv"), "--figure", str(tmp_path / "k.png")]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not a table of" in err and not (tmp_path / "k.png").exists()


def test_committed_gpu_tables_name_the_device_and_the_command():
    _, comments = read_table(FIGURES / "bench_attention_gpu.csv")
    assert "H100" in comments["device"] and "triton" in comments["versions"] and "bench" in comments["command"]
    _, sweep = read_commented_csv(FIGURES / "bench_attention_sweep_gpu.csv")
    assert "H100" in sweep["device"] and "--sweep" in sweep["command"]
    engine = (FIGURES / "bench_engine_gpu.csv").read_text()
    assert "# machine: NVIDIA H100" in engine and "# command: python -m reference bench-gpu" in engine


def test_default_tuning_is_the_sweeps_first_choice():
    from reference.attention.triton_decode import DEFAULT_TUNING

    rows, _ = read_commented_csv(FIGURES / "bench_attention_sweep_gpu.csv")
    best = kernel_bench.best_tunings(rows)[0][2]
    assert {k: int(v) for k, v in best.items()} == {k: getattr(DEFAULT_TUNING, k) for k in best}


def test_readme_numbers_are_the_gpu_files():
    """The README's GPU table and the GPU rows of its benchmarks table (sim/figures/readme_numbers.py; the README
    holds exactly those blocks: tests/sim/test_readme_numbers.py) have the numbers of the committed files."""
    files = Files(FIGURES)
    gpu, bench = make_block("gpu", files), make_block("benchmarks", files)
    rows, _ = read_table(FIGURES / "bench_attention_gpu.csv")
    long = [
        float(r["fraction_of_copy"])
        for r in rows
        if r["experiment"] == "decode" and int(r["batch"]) * int(r["context"]) >= 64 * 2048
    ]
    paging = [ratio for size, ratio in paging_ratios(rows) if size >= 16]
    assert gpu.row("bandwidth")["result"] == f"{min(long):.2f} to {max(long):.2f}"
    assert gpu.row("paging")["result"] == f"{min(paging):.3f} to {max(paging):.3f}"
    assert bench.row("kernels")["result"] == (
        f"{min(long):.2f}-{max(long):.2f} of the copy at batch x context >= "
        f"64 x 2048; shuffled / identity {min(paging):.3f}-{max(paging):.3f} at "
        "block sizes 16-256"
    )

    engine = rows_of(FIGURES / "bench_engine_gpu.csv")
    equal = {r["dtype"]: r["note"].split(" sequences")[0] for r in engine if r["section"] == "greedy_equality"}
    assert gpu.row("greedy")["result"] == f"{equal['float32']} prompts; {equal['bfloat16']}"
    tps = {
        r["system"].split(" (")[0] if r["system"].startswith("engine") else r["system"]: float(r["tokens_per_s"])
        for r in engine
        if r["section"] == "throughput"
    }
    ours, hf16 = tps["engine"], tps["HF transformers generate (static batches of 16)"]
    hf_all = tps["HF transformers generate (static batches of 256)"]
    assert gpu.row("engine")["result"] == f"{ours:,.0f}"
    assert gpu.row("hf16")["result"] == f"{hf16:,.0f} ({ours / hf16:.1f}x)"
    assert gpu.row("hf_all")["result"] == f"{hf_all:,.0f} ({ours / hf_all:.2f}x)"
    table = f"{ours:,.0f} vs {hf16:,.0f} output tokens/s ({ours / hf16:.1f}x); HF in one batch of 256: {hf_all:,.0f}"
    assert bench.row("gpu")["result"] == table

    passed = re.search(r"(\d+) passed", (FIGURES / "gpu_tests.txt").read_text()).group(1)
    assert gpu.row("tests")["result"] == f"{passed} passed"
