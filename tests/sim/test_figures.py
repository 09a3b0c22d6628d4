"""sim.figures: every figure regenerates (reduced, --quick) into PNG + CSV with sensible values, and the memory
map draws exactly the memory breakdown the KV managers report."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

from sim.drivers.sweep import Task
from sim.figures import FIGURES, make_figures, merge_tasks
from sim.figures.memory_map import draw_memory_map, slot_map
from sim.figures.probes import Sharing, Timeline
from sim.figures.style import new_figure
from sim.kv import NewSequence, make_kv_manager
from sim.kv.base import SHARE_NAMES

ROOT = Path(__file__).resolve().parents[2]
SHARE_TOLERANCE = 1e-4  # CSV floats carry 6 significant digits; five of them summed are within this of 1


@pytest.fixture(scope="module")
def quick_figures(tmp_path_factory) -> Path:
    outdir = tmp_path_factory.mktemp("figures")
    written = make_figures(outdir=outdir, quick=True, jobs=2, progress=False)
    assert sorted(p.name for p in written) == sorted(f"{n}.{ext}" for n in FIGURES for ext in ("png", "csv"))
    return outdir


def read_rows(outdir: Path, name: str) -> list[dict]:
    with open(outdir / f"{name}.csv") as f:
        return list(csv.DictReader(f))


def test_every_figure_is_a_png_beside_its_csv(quick_figures):
    for name in FIGURES:
        image = matplotlib.image.imread(quick_figures / f"{name}.png")
        assert image.shape[0] > 300 and image.shape[1] > 600, name  # a real figure, not an empty canvas
        assert len(read_rows(quick_figures, name)) >= 3, name


def test_memory_waste_shares_sum_to_one_and_paged_holds_the_most_tokens(quick_figures):
    rows = read_rows(quick_figures, "memory_waste")
    for row in rows:
        shares = [float(row[n]) for n in SHARE_NAMES if row[n] != ""]
        assert sum(shares) == pytest.approx(1, abs=SHARE_TOLERANCE)
    busy = {r["policy"]: float(r["token_states"]) for r in rows if r["view"] == "memory in use"}
    assert busy["paged"] > busy["oracle"] > busy["max"]
    paper = {r["policy"]: float(r["paper_token_states"]) for r in rows if r["view"] == "memory in use"}
    assert paper == {"max": 0.204, "pow2": 0.268, "oracle": 0.382, "paged": 0.963}


def test_memory_timeline_and_map_cover_the_pool(quick_figures):
    for row in read_rows(quick_figures, "memory_timeline"):
        if row["token_states"] not in ("", "nan"):
            assert sum(float(row[n]) for n in SHARE_NAMES) == pytest.approx(1, abs=SHARE_TOLERANCE)
    for row in read_rows(quick_figures, "memory_map"):
        assert sum(int(row[n]) for n in SHARE_NAMES) == int(row["num_slots"])


def test_throughput_figures_rank_the_systems_as_the_paper(quick_figures):
    batch = {(r["workload"], r["system"]): float(r["mean_batch_size"]) for r in read_rows(quick_figures, "batch_size")}
    for workload in ("sharegpt", "alpaca"):
        assert batch[workload, "paged"] >= batch[workload, "oracle"] >= batch[workload, "max"]
    latency = read_rows(quick_figures, "latency_vs_rate")
    assert {r["system"] for r in latency} == {"static", "max", "pow2", "oracle", "paged"}
    assert all(float(r["normalized_latency_s_per_token"]) > 0 for r in latency)


def test_sharing_saves_more_with_beams_than_with_samples(quick_figures):
    saving = {(r["kind"], int(r["width"])): float(r["memory_saving"]) for r in read_rows(quick_figures, "sharing")}
    for width in (2, 4, 6):
        assert 0 < saving["n", width] < saving["beam_width", width] < 1


def test_block_size_and_preemption_figures_have_every_point(quick_figures):
    sizes = {(r["workload"], int(r["block_size"])) for r in read_rows(quick_figures, "block_size")}
    assert sizes == {(w, b) for w in ("sharegpt", "alpaca") for b in (4, 16, 64)}
    modes = {(r["preemption"], int(r["block_size"])) for r in read_rows(quick_figures, "recompute_vs_swap")}
    assert modes == {(m, b) for m in ("recompute", "swap") for b in (4, 16, 64)}
    prefix = read_rows(quick_figures, "shared_prefix")
    assert {(r["prefix"], r["system"]) for r in prefix} == {
        (p, s) for p in ("1-shot", "5-shot") for s in ("oracle", "paged", "paged+prefix")
    }


def test_chunked_prefill_shortens_the_stalls_of_decodes(quick_figures):
    """v1 with a 512-token budget bounds how long a decode waits behind prompts: its p99 largest gap is below
    the paper's scheduler's at every rate of the quick figure (the same traces), and it grows with the budget."""
    rows = read_rows(quick_figures, "chunked_prefill")
    stall = {(r["system"], float(r["rate"])): float(r["p99_itl_max_s"]) for r in rows}
    for rate in (0.5, 1.5):
        assert stall["v1-512", rate] < stall["v0", rate]
    assert stall["v1-128", 1.0] < stall["v1-512", 1.0] < stall["v1-2048", 1.0]
    assert all(int(r["num_finished"]) == int(r["num_requests"]) for r in rows)


def test_priority_serves_class_0_first_past_the_knee(quick_figures):
    """The same traces under FCFS and priority: at the rate past the knee class 0 waits far less for its first token
    under priority than under FCFS, and class 1 no less; every request finishes under both."""
    rows = read_rows(quick_figures, "priority")
    ttft = {(r["scheduling_policy"], float(r["rate"]), int(r["priority"])): float(r["mean_ttft_s"]) for r in rows}
    assert ttft["priority", 2.5, 0] < 0.5 * ttft["fcfs", 2.5, 0]
    assert ttft["priority", 2.5, 1] >= ttft["fcfs", 2.5, 1]
    assert all(int(r["num_finished"]) == int(r["num_requests"]) > 0 for r in rows)


def test_the_cpu_offload_tier_finds_more_and_serves_sooner(quick_figures):
    """cpu_offload: the same conversations with a bigger tier find more prompt tokens in the cache (none in CPU memory
    without one), the GPU's share about the same, and the mean time to first token does not grow."""
    rows = sorted(read_rows(quick_figures, "cpu_offload"), key=lambda r: float(r["cpu_offload_gib"]))
    assert float(rows[0]["cpu_offload_gib"]) == 0 and float(rows[0]["cpu_hit_rate_tokens"]) == 0
    hits = [float(r["hit_rate_tokens"]) for r in rows]
    assert hits == sorted(hits) and hits[-1] > hits[0] + 0.1
    for r in rows:
        split = float(r["gpu_hit_rate_tokens"]) + float(r["cpu_hit_rate_tokens"])
        assert split == pytest.approx(float(r["hit_rate_tokens"]))
    assert float(rows[-1]["mean_ttft_s"]) <= float(rows[0]["mean_ttft_s"])
    assert float(rows[-1]["reload_time_s"]) > 0 and int(rows[-1]["reloaded_blocks"]) > 0


def test_equal_runs_merge_and_keep_every_probe():
    a = Task.of((Timeline(),), policy="paged", rate=2.0)
    b = Task.of((Sharing(),), rate=2.0, policy="paged")  # the same keywords in another order
    c = Task.of(policy="max", rate=2.0)
    merged, where = merge_tasks([a, b, c])
    assert where == [0, 0, 1]
    assert {p.name for p in merged[0].probes} == {"timeline", "sharing"} and merged[1].probes == ()


def test_memory_map_counts_equal_the_paged_breakdown():
    kv = make_kv_manager("paged", 64, block_size=4)  # 16 blocks of 4 slots
    kv.allocate_slots([0], [6], [NewSequence(6, 9)])  # one prompt of 6 tokens (blocks 0, 1) ...
    kv.fork(0, 1, 7)  # ... shared by two samples
    kv.allocate_slots([0], [1])  # seq 0 writes token 7 into shared block 1: copy-on-write gives it its own copy
    kv.allocate_slots([2], [3], [NewSequence(3, 3)])  # ends with its prompt: its block's last slot is internal
    for waiting in (False, True):
        smap = slot_map(kv, owners={0: 10, 1: 10, 2: 11}, waiting=waiting)
        breakdown = kv.breakdown(waiting)
        assert smap.counts() == {n: getattr(breakdown, n) for n in SHARE_NAMES}
    assert smap.num_owners == 2


def test_memory_map_counts_equal_the_contiguous_breakdown_and_draw():
    kv = make_kv_manager("pow2", 64, block_size=1, max_seq_len=32)  # buddy allocator over 64 slots
    kv.allocate_slots([0], [5], [NewSequence(5, 12)])  # reserves 5 + 8 = 13 slots, the buddy hands out 16
    kv.allocate_slots([1], [3], [NewSequence(3, 4, fork_final_lens=(4,))])  # reserves 3 + 1 = 4, twice
    kv.allocate_slots([0], [2])
    smap = slot_map(kv)
    breakdown = kv.breakdown()
    assert smap.counts() == {n: getattr(breakdown, n) for n in SHARE_NAMES}
    fig, ax = new_figure(size=(6, 2))
    drawn = draw_memory_map(kv, ax, title="a small pool")  # what a notebook does
    assert drawn.counts() == smap.counts() and ax.get_title(loc="left") == "a small pool"
    fig.clf()


def test_cli_rejects_an_unknown_figure():
    done = subprocess.run(
        [sys.executable, "-m", "sim", "figures", "--only", "nope", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.startswith("error: unknown figure 'nope' (allowed: memory_waste")
    assert "Traceback" not in done.stderr


def test_sampling_latency_has_every_panel_and_paged_lasts_longest(quick_figures):
    rows = read_rows(quick_figures, "sampling_latency")
    panels = {(r["kind"], int(r["width"])) for r in rows}
    assert panels == {(kind, width) for kind in ("n", "beam_width") for width in (2, 4, 6)}
    for kind, width in panels:
        mine = [r for r in rows if (r["kind"], int(r["width"])) == (kind, width)]
        top = max(float(r["rate"]) for r in mine)
        at_top = {r["system"]: float(r["normalized_latency_s_per_token"]) for r in mine if float(r["rate"]) == top}
        assert at_top["paged"] <= at_top["oracle"] <= at_top["max"], (kind, width, at_top)


def test_the_sustained_rate_is_read_off_as_on_the_papers_plots():
    from sim.figures.sampling import knee

    assert knee([1, 2, 4, 8], [0.1, 0.2, 0.9, 3.0]) == 4
    assert knee([4, 1, 2], [0.5, 0.1, 2.0]) == 1  # sorted by rate; a lower rate over the limit ends it
    assert knee([1, 2], [1.5, 0.1]) is None and knee([1, 2], [None, 0.1]) is None


def test_vattention_moves_from_paging_to_reservation(quick_figures):
    rows = [r for r in read_rows(quick_figures, "vattention_pages") if r["system"] == "vattention"]
    used = [float(r["token_states_of_used"]) for r in sorted(rows, key=lambda r: int(r["page_tokens"]))]
    assert used == sorted(used, reverse=True) and used[0] > 0.95 and used[-1] < 0.4


def test_hybrid_batches_more_as_prompts_outgrow_the_window(quick_figures):
    rows = {(r["system"], int(r["prompt_len"])): r for r in read_rows(quick_figures, "hybrid_memory")}
    longest = max(p for _, p in rows)
    assert float(rows["hybrid", longest]["mean_batch_size"]) > 2 * float(rows["paged", longest]["mean_batch_size"])
    for _system, prompt in rows:  # never fewer: the same bytes, and the hybrid pool frees what paged keeps
        assert float(rows["hybrid", prompt]["mean_batch_size"]) >= float(rows["paged", prompt]["mean_batch_size"])


def test_the_docs_count_the_figures():
    words = {
        11: "eleven",
        12: "twelve",
        13: "thirteen",
        14: "fourteen",
        15: "fifteen",
        16: "sixteen",
        17: "seventeen",
        18: "eighteen",
        19: "nineteen",
        20: "twenty",
        21: "twenty-one",
        22: "twenty-two",
        23: "twenty-three",
        24: "twenty-four",
    }
    page = (ROOT / "docs" / "figures.md").read_text()  # "The figures", moved out of README.md
    assert f"regenerates all {words[len(FIGURES)]} figures" in page
    book = "\n".join(path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    for name in FIGURES:  # each figure is named on the page of its section
        assert f"`{name}`" in book, name
