"""The memory_managers figure (sim/figures/managers.py) on its quick data: what its panels and caption claim holds
in the CSV it writes (the figure's quick mode also runs through the registry test, tests/sim/test_figures.py)."""

from __future__ import annotations

import csv

import pytest

from sim.figures import make_figures
from sim.figures.managers import BLOCK_SIZES, CACHES, SYSTEMS
from sim.kv.base import SHARE_NAMES

SHARE_TOLERANCE = 1e-4  # CSV floats carry 6 significant digits; five of them summed are within this of 1


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[dict]:
    outdir = tmp_path_factory.mktemp("managers")
    written = make_figures(["memory_managers"], outdir=outdir, quick=True, jobs=1, progress=False)
    assert sorted(p.name for p in written) == ["memory_managers.csv", "memory_managers.png"]
    with open(outdir / "memory_managers.csv") as f:
        return list(csv.DictReader(f))


def test_panel_a_has_every_system_and_its_shares_sum_to_one(rows):
    systems = [r for r in rows if r["panel"] == "a"]
    assert [r["policy"] for r in systems] == [p for p, _ in SYSTEMS]
    for row in systems:
        assert sum(float(row[n]) for n in SHARE_NAMES) == pytest.approx(1, abs=SHARE_TOLERANCE), row["system"]
        assert float(row["mean_batch_size"]) > 0
    pages = {float(r["page_kib"]): int(r["block_size_tokens"]) for r in systems if r["policy"] == "vattention"}
    assert pages == {640.0: 64, 2560.0: 256}  # 10 KiB per OPT-13B token per layer per K/V buffer


def test_contiguous_baselines_batch_fewer_requests_and_waste_more_than_paged(rows):
    systems = {r["policy"]: r for r in rows if r["panel"] == "a" and r["policy"] != "vattention"}
    paged = systems["paged"]
    for baseline in ("max", "pow2", "oracle"):
        row = systems[baseline]
        assert float(row["mean_batch_size"]) < float(paged["mean_batch_size"]), baseline
        waste = sum(float(row[n]) for n in ("reservation", "internal_fragmentation", "external_fragmentation"))
        assert waste > 0.3 > float(paged["reservation"]) + float(paged["internal_fragmentation"]), baseline
    # pages of one token leave no internal fragmentation and no reservation at all
    assert float(systems["radix"]["internal_fragmentation"]) == float(systems["radix"]["reservation"]) == 0


def test_panel_b_the_tree_hits_at_least_as_much_as_hashed_blocks_at_every_size(rows):
    caches = {(r["policy"], int(r["block_size_tokens"])): r for r in rows if r["panel"] == "b"}
    assert set(caches) == {(p, b) for p in CACHES for b in BLOCK_SIZES}
    hit = {key: float(r["prefix_hit_rate_tokens"]) for key, r in caches.items()}
    for size in BLOCK_SIZES:  # the same matching at a size; the tree keeps a history's prefix when it evicts
        assert hit["radix", size] >= hit["paged", size] > 0.3, size  # conversations resend their history
    # on this short, light trace, unaligned matching at page 1 beats blocks of 16 (on the full trace, busier, it
    # does not: see the caption), and pages of 64 match less than 16
    assert hit["radix", 1] >= hit["paged", 16]
    for policy in CACHES:
        assert hit[policy, 16] >= hit[policy, 64], policy
    for row in caches.values():  # the CSV's counts are the hit rate's
        prompt, hits, computed = int(row["prompt_tokens"]), int(row["hit_tokens"]), int(row["computed_prompt_tokens"])
        assert computed == prompt - hits and hits / prompt == pytest.approx(
            float(row["prefix_hit_rate_tokens"]), rel=1e-5
        )
    assert len({int(r["prompt_tokens"]) for r in caches.values()}) == 1  # one trace, and no preemption re-admits
