"""A pool you can scrub through: snapshots of a small run, step by step, as frames, a slider and a GIF.

The memory map (sim/figures/memory_map.py) shows the pool at one moment; this module records that moment after
every step of a run and plays the steps back, so a reader watches PagedAttention work (paper section 4): blocks
handed out as tokens arrive, a block table growing one entry per `block_size` tokens, a victim preempted when the
pool runs dry (section 4.5) and admitted again later, the five shares of the memory breakdown moving.

    record(**run_kwargs)   sim.run(..., jump=False, on_step=...) -> [Snapshot, ...]   (the simulator)
    record_engine(llm)     llm.step() until done -> [Snapshot, ...]                   (the reference engine)
    draw(snapshot, fig)    one frame: memory map, block tables, queues, a bar of the five shares
    scrubber(snapshots)    an ipywidgets slider (+ Play) over the steps, redrawing the frame
    animate(snaps, path)   an animated GIF through Pillow (matplotlib's PillowWriter; no ffmpeg)
    to_jshtml(snapshots)   the same animation as HTML with its own player, for a notebook (at most
                           HTML_MAX_FRAMES frames sampled over the run, as 64-colour PNGs: ~0.4 MB, seconds)

A `Snapshot` is plain data (ints, floats, lists, dicts), taken through the KV contract (`slot_segments`,
`block_table`, `breakdown`) and the scheduler's views (its queues), so any policy can be recorded and a list of
snapshots can be pickled or compared. `python -m sim animate` writes the README's animation (sim/views/viewer_draw.py
draws the frames).

NOTE: the simulator is stepped token by token (`jump=False`): a fast-forwarded run of decodes would be one frame.
"""
from __future__ import annotations

import io
import os
from dataclasses import dataclass
from types import MappingProxyType

from ..base.outfiles import atomic_write, check_outputs
from ..config import RUN_DEFAULTS
from ..kv.base import SHARE_NAMES
from .viewer_draw import draw

# The README's animation: a pool of 48 blocks of 8 slots, eight requests at t = 0, a token budget of 64 per step:
# the pool fills, a few requests are preempted (recompute) and come back; about 100 steps.
DEMO_RUN = MappingProxyType(dict(
    model="opt-13b", kv_slots=384, block_size=8, workload="uniform", num_requests=8, arrival="offline",
    prompt_len_range=(24, 64), output_len_range=(24, 64), seed=1, max_num_seqs=8, max_num_batched_tokens=64,
))
FPS_RANGE, DPI_RANGE = (0.5, 50.0), (20.0, 200.0)  # what animate() and to_jshtml() accept
MAX_FRAMES = 2000  # record()'s default cap; `python -m sim animate --max-frames` at most
# to_jshtml()'s default cap on frames: a longer run is sampled (first, last, every preemption and finish, the rest
# evenly). With 64-colour PNG frames (~8 KB each at dpi 60) that is ~0.4 MB of HTML and a few seconds of drawing;
# every step embedded as a full-colour PNG was 4.35 MB and 25-67 s for the 102 steps of DEMO_RUN.
HTML_MAX_FRAMES = 32
HTML_COLORS = 64  # palette size of to_jshtml's PNG frames (a frame has ~20 flat colours plus anti-aliasing)


@dataclass(slots=True)
class Snapshot:
    """The pool and the queues after one step. Requests by the scheduler's request ids, sequences by seq id."""

    step: int  # 0-based count of recorded steps
    time: float  # end of the step: simulated seconds (simulator), wall seconds since the engine was built (engine)
    num_prefills: int  # prompt entries (whole prompts or chunks) in the step's plan
    num_decodes: int  # decode entries in the step's plan
    preempted: list[int]  # requests preempted while the plan was built
    finished: list[int]  # requests that finished with the step
    policy: str
    block_size: int
    num_slots: int
    segments: list[tuple[int, int, int, int]]  # kv.slot_segments(): (seq id, first slot, end slot, kind)
    owners: dict[int, int]  # seq id -> request id, for every sequence in `segments` and `block_tables`
    block_tables: dict[int, list[int]]  # seq id -> kv.block_table, for the running sequences
    waiting: list[int]  # request ids in the waiting queue (preempted ones come back here), in order
    running: list[int]
    swapped: list[int]
    short: bool  # a request waits (or is swapped out): free slots count as external fragmentation
    counts: tuple[int, int, int, int, int]  # kv.breakdown(short), slots of each kind in SHARE_NAMES order

    @property
    def shares(self) -> dict[str, float]:
        """The five kinds as fractions of the pool; they sum to 1."""
        total = sum(self.counts)
        return {name: count / total for name, count in zip(SHARE_NAMES, self.counts)}


def snapshot(scheduler, *, step: int, time: float, num_prefills: int, num_decodes: int, preempted=(), finished=(),
             short: bool | None = None) -> Snapshot:
    """Read `scheduler` and its KV manager now. `short` (default: a request waits or is swapped out) decides
    whether free slots are seen as external fragmentation, as the simulator's step log books them."""
    kv = scheduler.kv
    if short is None:
        short = scheduler.num_waiting + scheduler.num_swapped > 0
    live = set(kv.seq_ids)
    owners = {seq_id: rid for rid in scheduler.running_request_ids() + scheduler.swapped_request_ids()
              for seq_id in scheduler.seq_ids(rid) if seq_id in live}
    tables = {seq_id: list(kv.block_table(seq_id)) for rid in scheduler.running_request_ids()
              for seq_id in scheduler.seq_ids(rid) if seq_id in live}
    return Snapshot(
        step=step, time=float(time), num_prefills=num_prefills, num_decodes=num_decodes, preempted=list(preempted),
        finished=list(finished), policy=kv.policy, block_size=kv.block_size, num_slots=kv.num_slots,
        segments=[tuple(int(x) for x in s) for s in kv.slot_segments()], owners=owners, block_tables=tables,
        waiting=scheduler.waiting_request_ids(), running=scheduler.running_request_ids(),
        swapped=scheduler.swapped_request_ids(), short=short, counts=tuple(kv.breakdown(short).counts()),
    )


class _Enough(Exception):
    """Raised by the observer to end a recording at max_steps (the rest of the run is not simulated)."""


def _check_max(max_steps: int) -> None:
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps: got {max_steps!r} (allowed: an integer >= 1)")


def record(*, max_steps: int = MAX_FRAMES, **run_kwargs) -> list[Snapshot]:
    """Simulate with `sim.run(**run_kwargs)` (DEMO_RUN where not given: its pool and scheduler settings, and its
    workload unless `requests`, `trace` or `workload` is given), stepping token by token, and return a snapshot after
    each of the first `max_steps` steps."""
    from ..api import run

    _check_max(max_steps)
    if run_kwargs.get("jump", False) is not False:
        raise ValueError("jump: got True (allowed: False; a fast-forwarded run of decodes would be one frame)")
    if "on_step" in run_kwargs:
        raise ValueError("on_step: the recorder is the observer (allowed: leave on_step out)")
    snapshots: list[Snapshot] = []

    def observe(sim, plan) -> None:
        snapshots.append(snapshot(
            sim.scheduler, step=len(snapshots), time=sim.now, num_prefills=len(plan.prefills),
            num_decodes=len(plan.decodes), preempted=plan.preempted,
            finished=[r for r in plan.request_ids() if sim.scheduler.is_finished(r)],
        ))
        if len(snapshots) >= max_steps:
            raise _Enough

    base = dict(DEMO_RUN)
    if run_kwargs.get("policy", RUN_DEFAULTS["policy"]) != RUN_DEFAULTS["policy"]:
        base.pop("block_size")  # DEMO_RUN's blocks are the default policy's pool; another takes its own default
    if {"requests", "trace", "workload"} & set(run_kwargs):  # the caller's own workload: none of DEMO_RUN's
        for key in ("workload", "num_requests", "arrival", "prompt_len_range", "output_len_range"):
            base.pop(key)
    try:
        run(**{**base, **run_kwargs, "jump": False, "on_step": observe})
    except _Enough:
        pass
    return snapshots


def record_engine(llm, *, max_steps: int = MAX_FRAMES) -> list[Snapshot]:
    """Drive the reference engine `llm` (reference.LLM, requests already added with `llm.add_request`) with
    `llm.step()` until it has nothing left or `max_steps` steps ran; a snapshot after each executed step.
    Counts and times come from the engine's own `llm.step_log` record of the step. NOTE: the engine books free
    slots as external fragmentation while a request waits (not while one is only swapped out); so does this."""
    _check_max(max_steps)
    if not llm.has_unfinished_requests():
        raise ValueError("llm has no unfinished requests (allowed: add some with llm.add_request(...) first)")
    snapshots: list[Snapshot] = []
    while llm.has_unfinished_requests() and len(snapshots) < max_steps:
        before = len(llm.step_log)
        llm.step()
        if len(llm.step_log) == before:  # an empty plan (nothing could run): no step executed
            continue
        rec = llm.step_log[-1]
        snapshots.append(snapshot(
            llm.scheduler, step=len(snapshots), time=rec.start_s + rec.step_time_s, num_prefills=len(rec.prefills),
            num_decodes=len(rec.decodes), preempted=rec.preempted, finished=rec.finished_request_ids,
            short=llm.scheduler.num_waiting > 0,
        ))
    return snapshots


def _check_snapshots(snapshots) -> list[Snapshot]:
    snapshots = list(snapshots)
    if not snapshots:
        raise ValueError("snapshots: got none (allowed: a non-empty list from record() or record_engine())")
    if not all(isinstance(s, Snapshot) for s in snapshots):
        raise ValueError("snapshots: expected Snapshot objects (from record() or record_engine())")
    return snapshots


def check_range(name: str, value: float, allowed: tuple[float, float]) -> None:
    """Refuse a number outside `allowed` (both ends included), NaN and booleans, naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not allowed[0] <= value <= allowed[1]:
        raise ValueError(f"{name}: got {value!r} (allowed: {allowed[0]:g} to {allowed[1]:g})")


def new_frame_figure(dpi: float = 80):
    """A figure for frames, outside pyplot (so a notebook shows only what the viewer shows)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 6), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def render_png(snapshot_: Snapshot, fig) -> bytes:
    """One frame as PNG bytes."""
    draw(snapshot_, fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def scrubber(snapshots, *, dpi: float = 80):
    """An ipywidgets box: Play and a slider over the steps, and the frame of the chosen step below them (an Image
    widget of PNG bytes: no interactive matplotlib backend needed). Returns the VBox; `box.children[0].children[1]`
    is the slider (set its `.value` to move), `box.children[1]` the image."""
    import ipywidgets as widgets

    snapshots = _check_snapshots(snapshots)
    fig = new_frame_figure(dpi)
    last = len(snapshots) - 1
    slider = widgets.IntSlider(value=0, min=0, max=last, description="step", continuous_update=True,
                               layout=widgets.Layout(width="70%"))
    play = widgets.Play(value=0, min=0, max=last, interval=250, description="play")
    widgets.jslink((play, "value"), (slider, "value"))  # the browser moves the slider as it plays
    image = widgets.Image(value=render_png(snapshots[0], fig), format="png")

    def redraw(change) -> None:
        image.value = render_png(snapshots[change["new"]], fig)

    slider.observe(redraw, names="value")
    return widgets.VBox([widgets.HBox([play, slider]), image])


def _gif_writer(fps: float):
    """matplotlib's PillowWriter, saving through sim.base.outfiles.atomic_write: a failure leaves any old file whole.
    NOTE: PillowWriter saves to its path and lets Pillow guess the format from the name; the temporary file has no
    .gif name, so the format is given here; frames share one adaptive palette per frame (Pillow's GIF default)."""
    from matplotlib.animation import PillowWriter

    class AtomicGifWriter(PillowWriter):
        def finish(self) -> None:
            with atomic_write(self.outfile, "wb") as f:
                self._frames[0].save(f, format="GIF", save_all=True, append_images=self._frames[1:],
                                     duration=int(1000 / self.fps), loop=0, optimize=True)

    return AtomicGifWriter(fps=fps)


def check_gif_path(path: str | os.PathLike, name: str = "path") -> None:
    """Refuse, before any work, an output that is not a .gif or cannot be written (sim.base.outfiles.check_outputs)."""
    if not os.fspath(path).lower().endswith(".gif"):
        raise ValueError(f"{name}: got {os.fspath(path)!r} (allowed: a .gif file; for a notebook use to_jshtml)")
    check_outputs({name: path})


def animate(snapshots, path: str | os.PathLike, *, fps: float = 8, dpi: float = 80) -> int:
    """Write the steps as an animated GIF at `path` (one frame per snapshot); returns the file's size in bytes."""
    snapshots = _check_snapshots(snapshots)
    check_range("fps", fps, FPS_RANGE)
    check_range("dpi", dpi, DPI_RANGE)
    check_gif_path(path)
    fig = new_frame_figure(dpi)
    writer = _gif_writer(fps)
    writer.setup(fig, os.fspath(path), dpi=dpi)
    for snap in snapshots:
        draw(snap, fig)
        writer.grab_frame()
    writer.finish()
    return os.path.getsize(path)


def sample_steps(snapshots, max_frames: int = HTML_MAX_FRAMES) -> list[int]:
    """Indices into `snapshots` of at most `max_frames` frames, in order: all of them if they fit; otherwise the
    first and the last, then steps that preempt or finish a request (evenly among them if too many), then evenly
    spaced steps to fill the cap."""
    n = len(snapshots)
    if n <= max_frames:
        return list(range(n))

    def evenly(pool: list[int], k: int) -> list[int]:  # k of `pool`, spread from its first to its last
        if k >= len(pool):
            return pool
        return [pool[round(i * (len(pool) - 1) / (k - 1))] for i in range(k)] if k > 1 else pool[:k]

    chosen = {0, n - 1} if max_frames > 1 else {0}
    events = [i for i, s in enumerate(snapshots) if (s.preempted or s.finished) and i not in chosen]
    chosen |= set(evenly(events, max_frames - len(chosen)))
    while len(chosen) < max_frames:  # fill the largest gaps first, so the slider moves through the run evenly
        ordered = sorted(chosen)
        gap, lo = max((b - a, -a) for a, b in zip(ordered, ordered[1:]))  # ties: the earlier gap
        if gap < 2:
            break
        chosen.add(-lo + gap // 2)
    return sorted(chosen)


def palette_png(fig, colors: int = HTML_COLORS) -> bytes:
    """The figure as it is drawn now, as a PNG of an adaptive palette of `colors` colours (no dithering: flat
    tiles stay flat); a frame is ~4x smaller than matplotlib's RGBA PNG and encodes faster."""
    import numpy as np
    from PIL import Image

    fig.canvas.draw()
    rgb = Image.fromarray(np.asarray(fig.canvas.buffer_rgba())[..., :3])
    buf = io.BytesIO()
    frame = rgb.quantize(colors, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    frame.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def to_jshtml(snapshots, *, fps: float = 8, dpi: float = 60, max_frames: int = HTML_MAX_FRAMES) -> str:
    """The steps as HTML with matplotlib's JavaScript player (`IPython.display.HTML(to_jshtml(snaps))`): frames
    embedded as palette PNGs (`palette_png`), nothing to install, plays in any notebook viewer, also a static one.
    At most `max_frames` frames (`sample_steps`: the first, the last, preemptions and finishes, the rest evenly);
    every frame's title says its step. Pass max_frames=len(snapshots) for every step (~11 KB of HTML a frame)."""
    import base64
    import tempfile
    from pathlib import Path

    from matplotlib.animation import HTMLWriter

    snapshots = _check_snapshots(snapshots)
    check_range("fps", fps, FPS_RANGE)
    check_range("dpi", dpi, DPI_RANGE)
    if isinstance(max_frames, bool) or not isinstance(max_frames, int) or not 1 <= max_frames <= MAX_FRAMES:
        raise ValueError(f"max_frames: got {max_frames!r} (allowed: an integer from 1 to {MAX_FRAMES})")

    class PaletteHTMLWriter(HTMLWriter):
        # NOTE: HTMLWriter.grab_frame saves a full-colour PNG through savefig (a second render of the frame);
        # this one appends the palette PNG to the base64 frames that HTMLWriter.finish() writes into its player.
        def grab_frame(self, **savefig_kwargs) -> None:
            self._saved_frames.append(base64.encodebytes(palette_png(self.fig)).decode("ascii"))

    fig = new_frame_figure(dpi)
    writer = PaletteHTMLWriter(fps=fps, embed_frames=True, default_mode="once")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "frames.html")
        writer.setup(fig, path, dpi=dpi)
        for i in sample_steps(snapshots, max_frames):
            draw(snapshots[i], fig)
            writer.grab_frame()
        writer.finish()
        return path.read_text()


__all__ = ["DEMO_RUN", "HTML_MAX_FRAMES", "Snapshot", "animate", "check_gif_path", "check_range", "draw",
           "palette_png", "record", "record_engine", "render_png", "sample_steps", "scrubber", "snapshot",
           "to_jshtml"]
