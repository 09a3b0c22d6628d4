"""The pool viewer (sim/views/viewer.py): its snapshots say what the KV manager and the scheduler say, step by step;
a frame draws them; the slider redraws; the GIF has one frame per step; bad arguments get one line."""

from __future__ import annotations

import math

import pytest
from PIL import Image

from sim.api import run
from sim.drivers.cli import main
from sim.figures.memory_map import HATCHES, KIND_HATCHES, legend_handles
from sim.kv.base import SHARE_NAMES
from sim.views import viewer
from sim.views.viewer_draw import bar_segments, slot_map_of


@pytest.fixture(scope="module")
def demo():
    return viewer.record()


def _truth(**kwargs) -> list[dict]:
    """The same run, read straight from the KV manager after every step (not through the viewer)."""
    seen = []

    def observe(sim, plan) -> None:
        sched, kv = sim.scheduler, sim.kv
        short = sched.num_waiting + sched.num_swapped > 0
        running = [s for r in sched.running_request_ids() for s in sched.seq_ids(r) if s in set(kv.seq_ids)]
        seen.append(
            {
                "counts": kv.breakdown(short).counts(),
                "tables": {s: kv.block_table(s) for s in running},
                "free_slots": kv.num_free_blocks * kv.block_size,
                "time": sim.now,
            }
        )

    run(**{**viewer.DEMO_RUN, **kwargs}, jump=False, on_step=observe)
    return seen


def test_snapshots_agree_with_the_kv_manager_at_every_step(demo):
    truth = _truth()
    assert 60 <= len(demo) == len(truth) <= 120  # the README's animation: one frame per step of the whole run
    for snap, want in zip(demo, truth):
        assert snap.counts == want["counts"] and snap.time == want["time"]
        assert math.isclose(sum(snap.shares.values()), 1.0)
        # the segments tile exactly the held slots: no overlap, and every slot not free is in one
        spans = sorted((lo, hi) for _, lo, hi, _ in snap.segments)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), f"step {snap.step}: segments overlap"
        assert sum(hi - lo for lo, hi in spans) == snap.num_slots - want["free_slots"]
        # ... and slot for slot they are the breakdown (what the frame draws)
        assert tuple(slot_map_of(snap).counts().values()) == snap.counts
        assert snap.block_tables == want["tables"]
        for seq_id, table in snap.block_tables.items():  # a running sequence's blocks are held, by its request
            held = {lo // snap.block_size for s, lo, _, _ in snap.segments if snap.owners[s] == snap.owners[seq_id]}
            assert set(table) <= held
        assert set(snap.owners.values()) <= set(snap.running + snap.swapped)


@pytest.mark.parametrize("preemption, queue", [("recompute", "waiting"), ("swap", "swapped")])
def test_a_preempted_request_leaves_the_pool_for_its_queue(demo, preemption, queue):
    snaps = demo if preemption == "recompute" else viewer.record(preemption=preemption)
    steps = [s for s in snaps if s.preempted]
    assert steps, "expected the demo run to preempt"
    for snap in steps:
        before = snaps[snap.step - 1]
        for victim in snap.preempted:
            assert victim in before.running  # it ran in the step before ...
            assert victim in getattr(snap, queue) and victim not in snap.running  # ... and is queued now
            gone = [s for s, r in snap.owners.items() if r == victim and s in snap.block_tables]
            assert not gone and victim not in {snap.owners.get(s) for s, *_ in snap.segments}  # no GPU slot
    assert not snaps[-1].waiting and not snaps[-1].swapped  # after the last step: everyone served


def test_record_stops_at_max_steps():
    snaps = viewer.record(max_steps=7)
    assert [s.step for s in snaps] == list(range(7))


def test_the_engine_recorder_on_the_tiny_model():
    torch = pytest.importorskip("torch")
    from reference import LLM, SamplingParams
    from reference.models import random_model

    llm = LLM.from_loaded(random_model(seed=1), block_size=4, num_gpu_blocks=12, max_model_len=64)
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    for n in (10, 14, 9, 12):
        llm.add_request(torch.randint(3, 256, (n,), generator=gen).tolist(), params)
    tables, step = [], llm.step

    def step_and_look():  # the KV manager's own block tables after each executed step
        before, out = len(llm.step_log), step()
        if len(llm.step_log) > before:
            sched = llm.scheduler
            tables.append(
                {
                    s: sched.kv.block_table(s)
                    for r in sched.running_request_ids()
                    for s in sched.seq_ids(r)
                    if s in set(sched.kv.seq_ids)
                }
            )
        return out

    llm.step = step_and_look
    snaps = viewer.record_engine(llm)
    assert len(snaps) == len(llm.step_log) == len(tables) and not llm.has_unfinished_requests()
    for snap, rec, table in zip(snaps, llm.step_log, tables):
        assert snap.counts == rec.memory.counts() and snap.block_tables == table
        assert (snap.num_prefills, snap.num_decodes, snap.preempted) == (
            len(rec.prefills),
            len(rec.decodes),
            rec.preempted,
        )
        assert snap.time == pytest.approx(rec.start_s + rec.step_time_s)
    assert any(s.preempted for s in snaps), "12 blocks of 4 for four requests of up to 26 tokens: one is preempted"
    assert sorted(r for s in snaps for r in s.finished) == [0, 1, 2, 3]


def _texts(fig) -> str:
    return "\n".join(t.get_text() for t in fig.texts + [t for ax in fig.axes for t in ax.texts])


def test_draw_renders_a_frame(demo):
    fig = viewer.new_frame_figure()
    snap = next(s for s in demo if s.preempted)
    viewer.draw(snap, fig)
    assert len(fig.axes) == 3  # the map, the tables and queues, the bar
    text = _texts(fig)
    assert f"step {snap.step} " in text and f"preempted: request {snap.preempted[0]}" in text
    assert all(f"req {r}:" in text for r in snap.running)  # a block table line per running request
    image = fig.axes[0].images[0].get_array()
    assert image.shape[0] * image.shape[1] >= snap.num_slots  # one pixel per slot
    bar, widths = fig.axes[2].patches, dict.fromkeys(SHARE_NAMES, 0.0)
    for (kind, _, _), patch in zip(bar_segments(snap), bar, strict=True):
        widths[kind] += patch.get_width()
    assert widths == pytest.approx(snap.shares)  # the five shares, each split by request where the map colours so
    png = viewer.render_png(snap, fig)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png != viewer.render_png(demo[0], fig)


def test_the_scrubber_redraws_when_the_slider_moves(demo):
    ipywidgets = pytest.importorskip("ipywidgets")
    box = viewer.scrubber(demo[:6])
    (play, slider), image = box.children[0].children, box.children[1]
    assert isinstance(slider, ipywidgets.IntSlider) and isinstance(play, ipywidgets.Play)
    assert (slider.min, slider.max, play.max) == (0, 5, 5)
    first = image.value
    slider.value = 4
    assert image.value != first and image.value == viewer.render_png(demo[4], viewer.new_frame_figure())
    slider.value = 0
    assert image.value == first


def test_animate_writes_one_gif_frame_per_step(demo, tmp_path):
    path = tmp_path / "pool.gif"
    size = viewer.animate(demo[:6], path, fps=5)
    with Image.open(path) as gif:
        assert (gif.format, gif.n_frames, gif.info["duration"]) == ("GIF", 6, 200)
    assert size == path.stat().st_size and [p.name for p in tmp_path.iterdir()] == ["pool.gif"]  # no temporary left


def _colours(rgb) -> set[tuple[float, ...]]:
    return {tuple(round(float(c), 6) for c in x[:3]) for x in rgb}


@pytest.mark.parametrize("pick", ["preempted", "short", "last"])
def test_the_share_bar_has_the_memory_maps_colours(demo, pick):
    """One palette (memory_map.kind_colors): the bar's segments are coloured and hatched as the map's slots of the
    same kind and request, so the set of colours in the bar is the set of colours in the map, and the legend's
    five patches are the palette's too."""
    snap = {
        "preempted": next(s for s in demo if s.preempted),
        "short": next(s for s in demo if s.short and not s.preempted),
        "last": demo[-1],
    }[pick]
    fig = viewer.new_frame_figure()
    viewer.draw(snap, fig)
    image = fig.axes[0].images[0].get_array().reshape(-1, 4)
    in_map = _colours(image[image[:, 3] > 0])  # the slots' pixels (not the transparent ones past the pool's end)
    bar = [p for p in fig.axes[2].patches if p.get_width() > 0]
    assert _colours(p.get_facecolor() for p in bar) == in_map
    for (kind, _, slots), patch in zip(bar_segments(snap), fig.axes[2].patches, strict=True):
        assert (patch.get_hatch() or "") == KIND_HATCHES[kind]
        assert patch.get_width() == pytest.approx(slots / snap.num_slots)
    assert KIND_HATCHES == {name: HATCHES.get(code, "") for code, name in enumerate(SHARE_NAMES)}
    legend = legend_handles()
    assert [(h.get_hatch() or "") for h in legend] == list(KIND_HATCHES.values())
    kinds = {
        name: _colours(
            p.get_facecolor()
            for (k, _, _), p in zip(bar_segments(snap), fig.axes[2].patches)
            if k == name and p.get_width() > 0
        )
        for name in SHARE_NAMES
    }
    for name, handle in zip(SHARE_NAMES, legend):  # the legend's grey and white are the map's
        if name in ("external_fragmentation", "free") and kinds[name]:
            assert kinds[name] == _colours([handle.get_facecolor()])


def test_to_jshtml_embeds_every_step_of_a_short_run(demo):
    html = viewer.to_jshtml(demo[:3])
    assert "<script" in html and html.count("data:image/png;base64") == 3


def test_sample_steps_keeps_the_events_and_the_cap(demo):
    assert viewer.sample_steps(demo[:20], 32) == list(range(20))  # a short run: every step
    picked = viewer.sample_steps(demo)
    assert len(picked) == viewer.HTML_MAX_FRAMES < len(demo) and picked == sorted(set(picked))
    assert picked[0] == 0 and picked[-1] == len(demo) - 1
    assert {s.step for s in demo if s.preempted or s.finished} <= set(picked)  # every preemption and finish
    assert max(b - a for a, b in zip(picked, picked[1:])) <= 4  # the rest spread over the run
    assert viewer.sample_steps(demo, 1) == [0] and viewer.sample_steps(demo, 2) == [0, len(demo) - 1]


def test_to_jshtml_is_small(demo):
    """The issue: every step of DEMO_RUN as a full-colour PNG was 4.35 MB of HTML (and 25-67 s). Now at most
    HTML_MAX_FRAMES frames as 64-colour PNGs; a frame is ~8 KB (11 KB as base64 in the HTML): 8 frames are drawn
    here and the bytes per frame bound the default's whole (HTML_MAX_FRAMES frames) well under 0.6 MB."""
    base = len(viewer.to_jshtml(demo[:1]))
    html = viewer.to_jshtml(demo, max_frames=9)
    assert html.count("data:image/png;base64") == 9
    per_frame = (len(html) - base) / 8
    assert per_frame < 16_000 and base + viewer.HTML_MAX_FRAMES * per_frame < 600_000


def test_the_animate_command(tmp_path, capsys):
    out = tmp_path / "a.gif"
    assert main(["animate", "--out", str(out), "--max-frames", "4", "--dpi", "30"]) == 0
    with Image.open(out) as gif:
        assert gif.n_frames == 4


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda tmp: viewer.animate([], tmp / "a.gif"), "snapshots: got none"),
        (lambda tmp: viewer.scrubber([]), "snapshots: got none"),
        (lambda tmp: viewer.to_jshtml(["step 1"]), "snapshots: expected Snapshot objects"),
        (lambda tmp: viewer.to_jshtml(viewer.record(max_steps=1), max_frames=0), "max_frames: got 0"),
        (lambda tmp: viewer.animate(viewer.record(max_steps=1), tmp / "missing" / "a.gif"), "does not exist"),
        (lambda tmp: viewer.animate(viewer.record(max_steps=1), tmp / "a.png"), "allowed: a .gif file"),
        (lambda tmp: viewer.animate(viewer.record(max_steps=1), tmp / "a.gif", fps=0), "fps: got 0"),
        (lambda tmp: viewer.record(max_steps=0), "max_steps: got 0"),
        (lambda tmp: viewer.record(jump=True), "jump: got True"),
        (lambda tmp: viewer.record_engine(_IdleEngine()), "no unfinished requests"),
    ],
)
def test_bad_arguments_are_refused_with_one_line(tmp_path, call, message):
    with pytest.raises(ValueError, match=message) as err:
        call(tmp_path)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "a.gif").exists()


class _IdleEngine:
    def has_unfinished_requests(self) -> bool:
        return False


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--out", "{tmp}/missing/a.gif"], "error: --out {tmp}/missing/a.gif: folder {tmp}/missing does not exist"),
        (["--out", "{tmp}/a.png"], "error: --out: got '{tmp}/a.png' (allowed: a .gif file"),
        (["--fps", "0"], "error: --fps: got 0.0 (allowed: 0.5 to 50)"),
        (["--max-frames", "0"], "error: --max-frames: got 0 (allowed: 1 to 2000)"),
        (["--max-frames", "9" * 30], "error: --max-frames: got 9999"),
    ],
)
def test_the_animate_command_refuses_bad_flags_with_one_line(tmp_path, capsys, argv, message):
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(["animate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message.format(tmp=tmp_path)) and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_another_policy_is_recorded_on_its_own_block_size():
    """DEMO_RUN's block size is the paged pool's: a contiguous policy recorded with the other DEMO_RUN settings takes
    its own (one slot), rather than being refused for a flag that does not apply to it."""
    snaps = viewer.record(policy="max", kv_slots=4 * 2048, max_steps=5)
    assert len(snaps) == 5 and {s.policy for s in snaps} == {"max"} and snaps[0].block_size == 1


def test_the_callers_own_requests_replace_the_demo_workload():
    from sim.base.request import Request

    snaps = viewer.record(requests=[Request(0, 0.0, 5, 12), Request(1, 0.0, 3, 12)])
    assert len(snaps) == 12 and snaps[0].running == [0, 1] and snaps[-1].finished == [0, 1]
