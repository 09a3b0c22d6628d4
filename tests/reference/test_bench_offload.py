"""reference/bench/bench_offload.py (python -m reference offload-bench): the same conversation with and without the CPU
tier gives the same tokens, and the tier finds the prefixes the small GPU pool evicted. On the tiny random Llama
(its vocabulary of 256 ids): the sessions are token ids, as the command's are after the tokenizer."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from reference.bench.bench_offload import add_arguments, check_args, measure
from reference.models import random_model


def test_the_tier_finds_what_the_small_pool_evicted_and_changes_no_token():
    model = random_model(seed=0)
    rng = np.random.default_rng(0)
    openings = [rng.integers(17, 256, size=40).tolist() for _ in range(3)]  # 3 sessions, ~3 blocks each
    questions = [rng.integers(17, 256, size=6).tolist() for _ in range(3)]
    rows, identical = measure(model, None, openings, questions, turns=3, max_tokens=4, gpu_blocks=8, offload_blocks=64)
    plain, tier = rows
    assert identical and tier["identical"] is True
    assert plain["cpu_hit_share"] == 0 and plain["offloaded_blocks"] == 0
    assert tier["cpu_hit_share"] > 0 and tier["reloaded_blocks"] > 0 and tier["offloaded_blocks"] > 0
    assert tier["hit_share"] > plain["hit_share"]  # the evicted histories come back instead of being computed
    assert plain["prompt_tokens"] == tier["prompt_tokens"] == sum(40 + 6 for _ in range(3)) * 3 + 3 * (6 + 4) * 3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sessions", "1"], "--sessions 1 (allowed: an integer from 2 to 8)"),
        (["--turns", "9"], "--turns 9 (allowed: an integer from 2 to 6)"),
        (["--gpu-blocks", "2"], "--gpu-blocks 2 (allowed: an integer from 8 to 4096)"),
        (["--quick", "--turns", "3"], "--quick sets the sessions, turns and tokens itself"),
    ],
)
def test_bad_flags_are_refused_in_one_line(argv, message, tmp_path):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([*argv, "--out", str(tmp_path / "o.csv")])
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_args(args)


def test_the_readme_block_is_the_committed_csv():
    """The README's offload-engine block, recomputed by hand from figures/offload_engine.csv (python -m reference
    offload-bench), with its rounding; and the committed run found more with the tier, with the same tokens."""
    import csv
    from pathlib import Path

    from sim.figures.readme_numbers import Files, make_block

    figures = Path(__file__).resolve().parents[2] / "figures"
    with open(figures / "offload_engine.csv", newline="") as f:
        rows = {r["system"]: r for r in csv.DictReader(line for line in f if not line.startswith("#"))}
    block = make_block("offload-engine", Files(figures))
    for system, r in rows.items():
        row = block.row(system)
        assert row["hit in the CPU tier"] == f"{float(r['cpu_hit_share']):.1%}"
        assert row["mean time to first token, turns 2+"] == f"{1e3 * float(r['mean_ttft_later_turns_s']):.0f} ms"
    tier, plain = rows["gpu + cpu tier"], rows["gpu only"]
    assert tier["identical"] == "True" and float(tier["hit_share"]) > float(plain["hit_share"])
