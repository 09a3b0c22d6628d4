"""The simulator's KV cache dtype (`kv_dtype`, sim/base/specs.py): bytes per token, and what follows from them.

- bytes per token: 2 * layers * kv_heads * (head_dim * element bytes + scale bytes); "auto" is the model's dtype,
  so the default is what it always was;
- the pool: the same bytes hold 2x the token slots at 1 byte per element without scales (fp8), and
  2 * head_dim / (head_dim + 4) times them with int8's 4-byte scales, for every model and GPU that fits;
- the roofline: a decode step's K/V term (reads and writes) scales with the bytes per token, nothing else does;
- a run: the default summary is unchanged (no kv_dtype key, the same slots), a bad name is refused in one line;
- the figure (quick): the 8-bit pool batches more and finishes at least as many requests per second.
"""

import dataclasses
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.base.specs import GPUS, KV_CACHE_DTYPES, MODELS, kv_capacity_tokens
from sim.clock.cost import RooflineCostModel
from sim.config import RunConfig


def with_kv(model: str, kv_dtype: str):
    return dataclasses.replace(MODELS[model], kv_dtype=kv_dtype)


def slots(model: str, kv_dtype: str) -> int:
    """A paged pool's token slots on one A100-40GB: vLLM's rule, in whole blocks of 16."""
    return kv_capacity_tokens(with_kv(model, kv_dtype), "a100-40gb") // 16 * 16


@pytest.mark.parametrize("model", list(MODELS))
def test_bytes_per_token_follow_the_dtype(model):
    m = MODELS[model]
    per_head = {"auto": m.head_dim * m.dtype_bytes, "fp16": 2 * m.head_dim, "fp8": m.head_dim, "int8": m.head_dim + 4}
    for name, head_bytes in per_head.items():
        assert with_kv(model, name).kv_bytes_per_token == 2 * m.num_layers * m.num_kv_heads * head_bytes, name
    assert m.kv_dtype == "auto" and with_kv(model, "auto").kv_bytes_per_token == m.kv_bytes_per_token
    with pytest.raises(ValueError, match="kv_dtype 'int4' \\(allowed: auto: .*fp8: .*int8: "):
        with_kv(model, "int4")


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(list(MODELS)), gpu=st.sampled_from(list(GPUS)), num_gpus=st.sampled_from([1, 2, 4, 8]))
def test_the_pool_doubles_as_bytes_per_token_halve(model, gpu, num_gpus):
    try:
        full = kv_capacity_tokens(MODELS[model], gpu, num_gpus)
    except ValueError:  # the weights do not fit: no pool at any dtype
        return
    fp8 = kv_capacity_tokens(with_kv(model, "fp8"), gpu, num_gpus)
    int8 = kv_capacity_tokens(with_kv(model, "int8"), gpu, num_gpus)
    assert fp8 in (2 * full, 2 * full + 1)  # floor(2x / b) is 2 floor(x / b) or one more
    head_dim = MODELS[model].head_dim
    assert full < int8 <= fp8 and abs(int8 - full * 2 * head_dim / (head_dim + 4)) <= 2 * head_dim / (head_dim + 4)


def test_the_roofline_reads_half_the_kv_bytes_and_nothing_else_changes():
    full, half = (RooflineCostModel(with_kv("opt-13b", d), "a100-40gb", block_size=16) for d in ("auto", "fp8"))
    # a decode batch of 8 over 4,000 context tokens is memory-bound: the K/V part of its time halves exactly
    weights_only = full.step_time(0, 8, 0) - full._kv_token_s * 8
    kv_full = full.step_time(0, 8, 4000) - weights_only
    kv_half = half.step_time(0, 8, 4000) - weights_only
    assert kv_half == pytest.approx(kv_full / 2, rel=1e-12)
    # a long prompt is compute-bound: the same time whatever the K/V bytes
    assert half.step_time(2048, 0, 2048) == full.step_time(2048, 0, 2048)


def test_a_run_takes_kv_dtype_and_the_default_is_unchanged():
    base = dict(rate=2.0, num_requests=40, scheduler="v0")
    default = sim.run(**base).summary
    assert "kv_dtype" not in default and default["num_kv_slots"] == slots("opt-13b", "auto")
    same = sim.run(**base, kv_dtype="auto").summary
    assert {k: v for k, v in same.items() if k != "wall_time_s"} == {
        k: v for k, v in default.items() if k != "wall_time_s"
    }
    int8 = sim.run(**base, kv_dtype="int8").summary
    assert int8["kv_dtype"] == "int8" and int8["num_kv_slots"] == slots("opt-13b", "int8")
    with pytest.raises(ValueError, match=r"kv_dtype: got 'int4' \(allowed: auto, fp16, fp8, int8\)"):
        RunConfig(kv_dtype="int4")
    assert tuple(KV_CACHE_DTYPES) == ("auto", "fp16", "fp8", "int8")


def test_cli_refuses_a_bad_kv_dtype_in_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "sim", "run", "--kv-dtype", "int4", "--num-requests", "3"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "error: kv_dtype: got 'int4' (allowed: auto, fp16, fp8, int8)\n"


def test_quick_figure_batches_more_with_8_bit_kv(tmp_path):
    import csv

    from sim.figures import make_figures

    written = make_figures(["kv_dtype"], outdir=tmp_path, quick=True, jobs=1, progress=False)
    assert sorted(p.name for p in written) == ["kv_dtype.csv", "kv_dtype.png"]
    with open(tmp_path / "kv_dtype.csv") as f:
        rows = {(r["kv_dtype"], float(r["rate"])): r for r in csv.DictReader(f)}
    top = max(rate for _, rate in rows)
    full, half = rows["auto", top], rows["int8", top]
    assert int(half["num_kv_slots"]) == slots("opt-13b", "int8")
    assert float(half["mean_batch_size"]) > float(full["mean_batch_size"])
    assert float(half["throughput_req_per_s"]) >= float(full["throughput_req_per_s"])
    assert int(half["num_preemptions"]) < int(full["num_preemptions"])


def _committed(name: str) -> list[dict]:
    import csv
    from pathlib import Path

    with open(Path(__file__).resolve().parents[2] / "figures" / f"{name}.csv", newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def test_readme_blocks_quote_the_committed_csvs():
    from sim.figures.readme_numbers import KV_DTYPE_LATENCY_RATE, Files, make_block

    at = {(r["kv_dtype"], float(r["rate"])): r for r in _committed("kv_dtype")}
    top = max(rate for _, rate in at)
    block = make_block("kv-dtype", Files())
    assert block.row("slots")["16-bit K/V"] == f"{int(at['auto', top]['num_kv_slots']):,}"
    assert block.row("slots")["8-bit K/V (int8 + scales)"] == f"{int(at['int8', top]['num_kv_slots']):,}"
    latency = [float(at[d, KV_DTYPE_LATENCY_RATE]["normalized_latency_s_per_token"]) for d in ("auto", "int8")]
    assert block.row("latency")["8-bit / 16-bit"] == f"{latency[1] / latency[0]:.2f}x"
    tput = [float(at[d, top]["throughput_req_per_s"]) for d in ("auto", "int8")]
    assert block.row("throughput")["8-bit K/V (int8 + scales)"] == f"{tput[1]:.2f}"
    accuracy = make_block("kv-accuracy", Files())
    for r in (r for r in _committed("kv_accuracy") if r["prompt"] == "all"):
        row = accuracy.row(r["model"])
        assert row["greedy tokens identical"] == r["identical"]
        assert row["same argmax (teacher-forced)"] == f"{float(r['argmax_agreement']):.1%}"
        assert row["blocks of 16 per GiB, float32 -> int8"].startswith(f"{int(r['blocks_per_gib_float32']):,} -> ")
