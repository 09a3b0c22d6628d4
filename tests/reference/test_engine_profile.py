"""tools/engine_profile.py: the split of each engine step (GEMMs, attention, the rest of the forward, the engine
around it) adds up to the step's wall time, counts what the steps fed, and leaves the model as it was; the totals and
the bound follow from the steps. A short run on SmolLM2 (3 small requests)."""

import csv
import sys
from pathlib import Path

import pytest

from reference.bench import bench

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import engine_profile  # noqa: E402


@pytest.fixture(scope="module")
def requests():
    return bench.workload("bench", 3, quick=True, vocab_size=49152)


@pytest.fixture(scope="module")
def loaded():
    import torch

    from reference.models import load_model

    return load_model("smollm2", dtype=torch.float32)[:2]


@pytest.fixture(scope="module")
def rows(requests, loaded):
    return engine_profile.profile(requests, threads=1, loaded=loaded)


def test_each_step_is_split_into_parts_that_add_up_to_its_wall_time(rows, requests, loaded):
    assert rows and all(r["section"] == "step" for r in rows)
    assert [r["step"] for r in rows] == list(range(len(rows)))
    for r in rows:
        parts = r["gemm_ms"] + r["attention_ms"] + r["other_ms"] + r["outside_ms"]
        assert parts == pytest.approx(r["wall_ms"], abs=0.01)  # (each part rounded to a microsecond)
        assert r["gemm_ms"] > 0 and r["attention_ms"] > 0 and r["outside_ms"] > 0 and r["gemm_gflops"] > 0
    # every prompt token is fed once as a prefill token; every later token once as a decode
    assert sum(r["prefill_tokens"] for r in rows) == sum(q.prompt_len for q in requests)
    assert sum(r["decodes"] for r in rows) == sum(q.output_len - 1 for q in requests)
    # the FLOPs counted: at least the layers' and LM head's products for every token fed
    fed = sum(q.prompt_len + q.output_len - 1 for q in requests)
    assert sum(r["_flop"] for r in rows) >= 2 * fed * 100e6  # SmolLM2: ~106M non-embedding weights
    # each step multiplies by every weight matrix once: the layers' four and the LM head
    weights = loaded[0].weights
    matrices = [
        w for layer in weights.layers for w in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)
    ] + [weights.lm_head]
    assert all(r["_weight_bytes"] == 4 * sum(w.numel() for w in matrices) for r in rows)
    # the decode attention read each decoding sequence's K and V (positions before the token it feeds, and that one)
    for r in rows:
        assert (r["decode_kv_gbps"] != "") == (r["decodes"] > 0) and r["weights_gbps"] > 0


def test_the_totals_and_the_bound_follow_from_the_steps(rows):
    out = engine_profile.summary(rows, peak=150.0, bandwidth=10.0)
    by = {r["section"]: r for r in out}
    total = by["total"]
    assert total["step"] == len(rows) == by["prefill_steps"]["step"] + by["decode_steps"]["step"]
    assert by["prefill_steps"]["wall_ms"] + by["decode_steps"]["wall_ms"] == pytest.approx(total["wall_ms"], abs=0.01)
    assert by["decode_steps"]["prefill_tokens"] == 0 < by["prefill_steps"]["prefill_tokens"]
    assert total["wall_ms"] == pytest.approx(sum(r["wall_ms"] for r in rows), abs=0.01)
    assert total["gemm_ms"] == pytest.approx(sum(r["gemm_ms"] for r in rows), abs=0.01)
    assert (
        by["bound"]["value"] == pytest.approx(total["wall_ms"] / total["gemm_ms"], rel=1e-3)
        and by["bound"]["value"] > 1
    )
    rest = total["wall_ms"] - total["gemm_ms"]
    assert by["needed_cut"]["value"] == pytest.approx((total["wall_ms"] * (1 - 1 / 1.25)) / rest, rel=1e-3)
    assert by["gemm_peak"]["value"] == 150.0 and by["read_bandwidth"]["value"] == 10.0


def test_the_model_is_left_as_it_was(rows, loaded):
    import reference.attention as attention
    from reference.models import llama
    from reference.models.matmul import PackedLinear

    model = loaded[0]  # (the rows fixture profiled it)
    assert rows and isinstance(model.linear, PackedLinear) and "forward" not in vars(model)
    assert llama.paged_decode_attention is attention.paged_decode_attention
    assert llama.paged_prefill_attention is attention.paged_prefill_attention


@pytest.mark.slow
def test_the_command_writes_its_csv_and_refuses_bad_flags(tmp_path, capsys):
    out = tmp_path / "profile.csv"
    assert engine_profile.main(["--num-requests", "2", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    comments = dict(line[2:].split(": ", 1) for line in lines if line.startswith("# "))
    assert {"machine", "command", "workload", "date", "total_s"} <= set(comments)
    table = list(csv.DictReader(line for line in lines if not line.startswith("# ")))
    assert [r["section"] for r in table if r["section"] != "step"] == [
        "total",
        "prefill_steps",
        "decode_steps",
        "gemm_peak",
        "read_bandwidth",
        "bound",
        "needed_cut",
    ]
    assert float(next(r for r in table if r["section"] == "read_bandwidth")["value"]) > 0
    assert "bound (wall / gemm)" in capsys.readouterr().out
    for bad in (
        ["--threads", "0"],
        ["--num-requests", "0"],
        ["--workload", "short"],
        ["--out", str(tmp_path / "missing" / "x.csv")],
    ):
        with pytest.raises(SystemExit) as exc:
            engine_profile.main(bad)
        assert exc.value.code == 2


@pytest.mark.slow
def test_an_output_that_cannot_be_written_is_one_line_after_the_numbers(tmp_path, monkeypatch, capsys):
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("sim.base.outfiles.write_csv", full_disk)
    out = tmp_path / "profile.csv"
    assert engine_profile.main(["--num-requests", "1", "--out", str(out)]) == 1
    printed = capsys.readouterr()
    assert "bound (wall / gemm)" in printed.out and not out.exists()
    assert printed.err.strip().splitlines() == [
        f"python tools/engine_profile.py: error: cannot write {out}: No space "
        "left on device (nothing was replaced; the numbers are printed above)"
    ]


def test_the_readme_block_is_the_committed_profiles_recomputed_by_hand():
    from sim.figures.readme_numbers import Files, make_block

    block = make_block("engine-profile", Files(ROOT / "figures"))
    for name, label in (("engine_profile_cpu", "bench"), ("engine_profile_cpu_long", "long")):
        lines = (ROOT / "figures" / f"{name}.csv").read_text().splitlines()
        table = list(csv.DictReader(line for line in lines if not line.startswith("# ")))
        steps = [r for r in table if r["section"] == "step"]
        wall = sum(float(r["wall_ms"]) for r in steps)
        gemm = sum(float(r["gemm_ms"]) for r in steps)
        row = block.row(label)
        assert row["wall"] == f"{wall / 1e3:.1f} s"
        assert row["GEMMs"].startswith(f"{gemm / wall:.0%} (")
        for column, key in (
            ("attention", "attention_ms"),
            ("rest of the forward", "other_ms"),
            ("outside the forward", "outside_ms"),
        ):
            assert row[column] == f"{sum(float(r[key]) for r in steps) / wall:.0%}"
        assert row["bound (wall / GEMMs)"] == f"{wall / gemm:.2f}x"
        assert row["a 1.25x speed-up must remove"] == f"{(wall - wall / 1.25) / (wall - gemm):.0%}"
