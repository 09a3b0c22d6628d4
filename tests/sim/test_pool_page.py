"""The pool page (sim/views/pool_page.py): what it draws of a step is what the KV manager holds, under every policy (the
contiguous baselines' reservations included); a replay of a long run keeps evenly spread steps and loses no event;
`python -m sim run --pool-page` writes it whole or not at all; a browser draws it, and at any pool size the map, the
chart and the tables all lie inside a 1400x1000 window."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.api import run
from sim.drivers.cli import main
from sim.views.pool_page import CHART_TOPS, MAX_CELLS, WINDOW, ReplayRecorder, pool_html, snapshot_json
from sim.views.viewer import snapshot

SMALL = dict(
    workload="uniform",
    arrival="offline",
    prompt_len_range=(8, 80),
    output_len_range=(4, 60),
    max_num_batched_tokens=128,
    max_num_seqs=8,
)
# Each policy on a pool that runs short (the paged ones preempt), on a model it accepts.
POLICIES = {
    "paged": dict(kv_slots=512, block_size=8),
    "max": dict(kv_slots=3 * 2048),
    "pow2": dict(kv_slots=4096),
    "oracle": dict(kv_slots=800),
    "vattention": dict(kv_slots=512),
    "radix": dict(kv_slots=512, prefix_len=24),
    "hybrid": dict(kv_slots=1024, model="gemma3-270m"),
}


def _checked_run(policy: str, seed: int, n: int, **extra) -> int:
    """Run the policy's small workload; after every step the page's picture is checked against the KV manager."""
    steps = []

    def observe(sim, plan) -> None:
        kv = sim.kv
        page = snapshot_json(
            snapshot(
                sim.scheduler,
                step=len(steps),
                time=sim.now,
                num_prefills=len(plan.prefills),
                num_decodes=len(plan.decodes),
            )
        )
        assert page["used_blocks"] == kv.num_blocks - kv.num_free_blocks, (policy, len(steps))
        assert sum(blocks * (end - first) for first, end, _, _, blocks in page["runs"]) == page["used_blocks"]
        assert page["num_cells"] <= MAX_CELLS and all(0 <= r[0] < r[1] <= page["num_cells"] for r in page["runs"])
        owners = set(sim.scheduler.running_request_ids() + sim.scheduler.swapped_request_ids())
        assert {r[2] for r in page["runs"]} <= owners | {-1}
        for block, refs in page["refs"].items():  # a shared block is in that many running tables
            assert refs == sum(
                int(block) in kv.block_table(s)
                for r in sim.scheduler.running_request_ids()
                for s in sim.scheduler.seq_ids(r)
                if s in set(kv.seq_ids)
            )
        steps.append(page)

    settings_ = {**SMALL, "model": "opt-13b", **POLICIES[policy], **extra}
    run(**settings_, policy=policy, num_requests=6, seed=seed, n=n, jump=False, on_step=observe)
    return len(steps)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_what_is_drawn_is_what_the_kv_manager_holds(policy):
    assert _checked_run(policy, seed=3, n=2) > 10


@settings(max_examples=15, deadline=None)
@given(
    policy=st.sampled_from(sorted(POLICIES)),
    seed=st.integers(0, 10_000),
    n=st.integers(1, 3),
    preemption=st.sampled_from(["recompute", "swap"]),
)
def test_what_is_drawn_is_what_the_kv_manager_holds_on_random_runs(policy, seed, n, preemption):
    if preemption == "swap" and policy != "paged":
        preemption = "recompute"  # only the paged pool has swap space
    _checked_run(policy, seed=seed, n=n, preemption=preemption)


def _events(frames: list[dict]) -> tuple[list[int], list[int]]:
    return [r for f in frames for r in f["preempted"]], [r for f in frames for r in f["finished"]]


def test_a_long_run_keeps_evenly_spread_steps_and_every_event():
    every, few = ReplayRecorder(2000), ReplayRecorder(6)

    def both(sim, plan) -> None:
        every(sim, plan)
        few(sim, plan)

    run(**SMALL, model="opt-13b", kv_slots=256, block_size=8, num_requests=10, seed=1, jump=False, on_step=both)
    assert every.stride == 1 and len(every.frames) == every.num_steps > 40
    steps = [f["step"] for f in few.frames]
    assert few.stride >= 8 and 3 <= len(steps) < 6 and steps == list(range(0, every.num_steps, few.stride))
    kept = {f["step"]: f for f in every.frames}
    for frame in few.frames:  # a kept step is the step itself, but for the events folded into it
        assert {k: v for k, v in frame.items() if k not in ("preempted", "finished")} == {
            k: v for k, v in kept[frame["step"]].items() if k not in ("preempted", "finished")
        }
    preempted, finished = _events(every.frames)
    assert preempted  # the small pool preempts
    shown = few.page_frames()  # the steps kept, then the run's last step with an event (its last finish)
    assert shown[:-1] == few.frames and shown[-1]["step"] == every.num_steps - 1 == every.frames[-1]["step"]
    assert {k: v for k, v in shown[-1].items() if k not in ("preempted", "finished")} == {
        k: v for k, v in every.frames[-1].items() if k not in ("preempted", "finished")
    }
    kept_preempted, kept_finished = _events(shown)
    assert sorted(kept_preempted) == sorted(preempted)
    assert sorted(kept_finished) == sorted(finished) == list(range(10))


def test_the_command_writes_the_page_with_the_other_outputs(tmp_path, capsys):
    page, steps = tmp_path / "run.html", tmp_path / "steps.csv"
    args = [
        "run",
        "--policy",
        "max",
        "--workload",
        "uniform",
        "--prompt-len-range",
        "8,40",
        "--output-len-range",
        "4,30",
        "--num-requests",
        "5",
        "--arrival",
        "offline",
        "--kv-slots",
        "6144",
        "--pool-page",
        str(page),
        "--pool-page-steps",
        "20",
        "--steps-csv",
        str(steps),
    ]
    assert main(args) == 0
    html = page.read_text()
    assert "LIVE = false" in html  # a replay: no event stream, the slider and Play over the steps embedded
    frames = json.loads(re.search(r"^(\[.*\])\.forEach\(s => history", html, re.M).group(1))
    num_steps = sum(1 for line in steps.read_text().splitlines()[1:] if line and not line.startswith("#"))
    assert num_steps > 20 and 10 <= len(frames) < 20 and frames[0]["step"] == 0
    assert f"of {num_steps} steps" in html and {f["policy"] for f in frames} == {"max"}
    assert all(f["used_blocks"] > 0 for f in frames[:-1]) and frames[0]["cell_blocks"] == 3  # 6,144 one-slot blocks


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--pool-page-steps", "1"], "--pool-page-steps: got 1 (allowed: an integer from 2 to 2,000)"),
        (["--pool-page", "."], "--pool-page"),
    ],
)
def test_bad_page_flags_are_one_line_and_nothing_runs(tmp_path, capsys, flags, says):
    steps = tmp_path / "steps.csv"
    code = main(["run", "--num-requests", "3", "--steps-csv", str(steps), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and says in err[0] and not steps.exists()


def test_a_browser_draws_the_replayed_steps_blocks(tmp_path):
    from tests.browser import need_chromium

    need_chromium()
    from sim.views.pool_page import page_dom, screenshot

    page = tmp_path / "run.html"
    assert (
        main(
            [
                "run",
                "--workload",
                "uniform",
                "--prompt-len-range",
                "40,80",
                "--output-len-range",
                "8,20",
                "--num-requests",
                "4",
                "--arrival",
                "offline",
                "--kv-slots",
                "512",
                "--block-size",
                "8",
                "--n",
                "2",
                "--pool-page",
                str(page),
            ]
        )
        == 0
    )
    dom = page_dom(page.as_uri())
    body = re.search(r'<body data-step="(-?\d+)" data-used="(\d+)"', dom)
    assert body and body.group(1) == "0", dom[:500]
    drawn = sum(int(n) for n in re.findall(r'class="block used[^"]*"[^>]*data-blocks="(\d+)"', dom))
    assert drawn == int(body.group(2)) > 0
    assert re.search(r'class="block used[^"]*shared', dom)  # the two samples' prompt blocks, with their count
    png = tmp_path / "run.png"
    screenshot(page.as_uri(), str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


PANELS = ("map", "chart", "tables", "queues", "events")  # the page's panels (data-panel), each with its data-rect


def _replay_frames(html: str) -> list[dict]:
    return json.loads(re.search(r"^(\[.*\])\.forEach\(s => history", html, re.M).group(1))


def _layout(dom: str) -> tuple[tuple[int, int], tuple[int, int], dict[str, tuple[int, ...]]]:
    """What the page wrote down after its layout: the viewport's size, the document's scroll size, and the rectangle
    (left, top, right, bottom, in px) of each panel and of the grid of cells."""
    size = lambda name: tuple(int(v) for v in re.search(rf'data-{name}="(\d+)x(\d+)"', dom).groups())  # noqa: E731
    rects = {
        name: tuple(int(v) for v in rect.split(","))
        for name, rect in re.findall(r'data-panel="(\w+)" data-rect="(-?[\d,-]+)"', dom)
    }
    rects["grid"] = tuple(int(v) for v in re.search(r'id="grid" data-rect="(-?[\d,-]+)"', dom).group(1).split(","))
    return size("viewport"), size("scroll"), rects


def _inside(inner, outer) -> bool:
    return outer[0] <= inner[0] < inner[2] <= outer[2] and outer[1] <= inner[1] < inner[3] <= outer[3]


def _check_fits(dom: str, frame: dict | None, frames: list[dict]) -> None:
    """The page as Chromium laid it out in a WINDOW-sized window fits it: nothing to scroll, every panel inside the
    viewport (Chromium's window frame takes some of the 1000 px), no two panels overlapping, every cell inside the
    map; what the map draws of `frame` (the step shown) is its used blocks, and the chart's axis says its scale."""
    viewport, scroll, rects = _layout(dom)
    width, height = viewport
    assert width == WINDOW[0] and 800 <= height <= WINDOW[1] and scroll == viewport, (viewport, scroll)
    assert set(PANELS) <= set(rects), rects
    whole = (0, 0, width, height)
    for name in PANELS:
        assert _inside(rects[name], whole), (name, rects[name], viewport)
    for i, a in enumerate(PANELS):  # side by side, not on top of each other
        for b in PANELS[i + 1 :]:
            ra, rb = rects[a], rects[b]
            assert ra[2] <= rb[0] or rb[2] <= ra[0] or ra[3] <= rb[1] or rb[3] <= ra[1], (a, ra, b, rb)
    map_w, map_h = rects["map"][2] - rects["map"][0], rects["map"][3] - rects["map"][1]
    chart_w, chart_h = rects["chart"][2] - rects["chart"][0], rects["chart"][3] - rects["chart"][1]
    assert map_w >= 600 and map_h >= 600 and chart_w >= 300 and chart_h >= 150, rects
    assert rects["tables"][3] - rects["tables"][1] >= 100, rects
    if frame is None:
        return
    assert _inside(rects["grid"], rects["map"]), (rects["grid"], rects["map"])
    cell = int(re.search(r'id="grid"[^>]*--cell: (\d+)px', dom).group(1))
    assert len(re.findall(r"data-cell=", dom)) == frame["num_cells"] and cell >= 8, cell
    drawn = sum(int(n) for n in re.findall(r'class="block used[^"]*"[^>]*data-blocks="(\d+)"', dom))
    assert f'data-step="{frame["step"]}" data-used="{frame["used_blocks"]}"' in dom and drawn == frame["used_blocks"]
    per = frame["cell_blocks"]
    assert (f"{per} blocks a cell" if per > 1 else "one cell a block") in dom
    most = max(1 - f["counts"][-1] / sum(f["counts"]) for f in frames)  # the largest share not free
    top = next(t for t in CHART_TOPS if t >= most - 1e-9)
    assert f"y: share of the whole KV pool, 0 to {round(top * 100)}%" in dom


# pool size in blocks (of 16 slots) -> the workload that runs on it
POOL_SIZES = {
    64: ["--prompt-len-range", "8,60", "--output-len-range", "4,40", "--num-requests", "12"],
    2048: ["--prompt-len-range", "40,400", "--output-len-range", "20,200", "--num-requests", "30"],
    50_000: ["--prompt-len-range", "200,1600", "--output-len-range", "50,400", "--num-requests", "40"],
}


@pytest.mark.parametrize("num_blocks", sorted(POOL_SIZES))
def test_the_page_fits_a_window_at_any_pool_size(tmp_path, num_blocks):
    """The replay `sim run --pool-page` writes, and the live page the server serves (pool_html, live: the same
    function, here fed the run's steps from a file, no server), at 1400x1000: map, chart and tables in view."""
    from tests.browser import need_chromium

    need_chromium()
    from sim.views.pool_page import page_dom

    page = tmp_path / "run.html"
    assert (
        main(
            [
                "run",
                "--workload",
                "uniform",
                "--arrival",
                "offline",
                "--block-size",
                "16",
                "--kv-slots",
                str(16 * num_blocks),
                "--pool-page",
                str(page),
                "--pool-page-steps",
                "60",
                *POOL_SIZES[num_blocks],
            ]
        )
        == 0
    )
    frames = _replay_frames(page.read_text())
    first = frames[0]
    assert first["num_slots"] == 16 * num_blocks and first["num_cells"] == -(-num_blocks // first["cell_blocks"])
    _check_fits(page_dom(page.as_uri(), WINDOW), first, frames)  # a replay shows its first step
    live = tmp_path / "live.html"
    live.write_text(pool_html("live", 300, frames[-40:], live=True))
    _check_fits(page_dom(live.as_uri(), WINDOW), frames[-1], frames[-40:])  # the live page its latest
    if num_blocks == 2048:  # a narrow window: the panels go under the map, which fits the window's width
        dom = page_dom(page.as_uri(), (800, 1000))
        viewport, scroll, rects = _layout(dom)  # the page scrolls down: a scroll bar takes some of the 800 px
        assert 760 <= viewport[0] == scroll[0] <= 800 and rects["map"][2] <= viewport[0], (viewport, scroll, rects)
        assert _inside(rects["grid"], rects["map"]), rects
        assert rects["chart"][1] >= rects["map"][3], rects


def test_the_live_page_fits_the_window_before_the_first_step(tmp_path):
    from tests.browser import need_chromium

    need_chromium()
    from sim.views.pool_page import page_dom

    page = tmp_path / "live.html"
    page.write_text(pool_html("a server just started", 300, [], live=True))
    dom = page_dom(page.as_uri(), WINDOW)
    assert "waiting for the first step" in dom
    _check_fits(dom, None, [])
