"""One frame of the pool viewer (sim/views/viewer.py): a `Snapshot` drawn on a matplotlib figure.

    +------------------------------------------------+---------------------------+
    | step 12 | t = 0.311 s | 1 prefill, 6 decodes | preempted: request 7        |
    +------------------------------------------------+---------------------------+
    | the pool, one tile per block, coloured by the   | block tables (running)    |
    | request that owns it; the five kinds as in the  |  req 3: 5 9 12 ...        |
    | memory map (sim/figures/memory_map.py)          | queues                    |
    |                                                 |  running / waiting / swap |
    +------------------------------------------------+---------------------------+
    | the five shares of the pool, one stacked bar in the map's colours (memory_map.kind_colors)   |
    +----------------------------------------------------------------------------------------------+

A request keeps its colour in every frame (the memory map's golden-ratio hues by request id), in the pool, in
its block table's line and in the queues, so a reader can follow one request from admission to preemption to
its return. Pure drawing: nothing here reads a scheduler.
"""
from __future__ import annotations

import numpy as np

from ..figures.memory_map import (
    EXTERNAL,
    FREE,
    HATCH,
    INTERNAL,
    KIND_HATCHES,
    SlotMap,
    draw_slot_map,
    kind_colors,
    legend_handles,
    owner_colors,
)
from ..figures.style import SHARE_LABELS
from ..kv.base import SHARE_NAMES

MAX_TABLE_LINES = 14  # block tables listed; more running sequences end in "... and N more"
MAX_TABLE_BLOCKS = 12  # block ids shown per table; a longer one ends in "... (N blocks)"
PREEMPTED_RGB = "#c62828"
SHORT_LABELS = {"token_states": "tokens", "reservation": "reserved", "internal_fragmentation": "internal",
                "external_fragmentation": "external", "free": "free"}


def slot_map_of(snap) -> SlotMap:
    """The snapshot's pool as the memory map's SlotMap: owner = request id (seq id where no request is known)."""
    owner = np.full(snap.num_slots, -1, dtype=np.int64)
    kind = np.full(snap.num_slots, EXTERNAL if snap.short else FREE, dtype=np.int8)
    for seq_id, lo, hi, code in snap.segments:
        owner[lo:hi] = snap.owners.get(seq_id, seq_id)
        kind[lo:hi] = code
    return SlotMap(snap.policy, snap.block_size, owner, kind, snap.time, len(snap.waiting) + len(snap.swapped))


def request_color(request_id: int):
    """The colour the memory map gives a request's token slots, darkened a little for text."""
    return tuple(0.8 * owner_colors(np.array([request_id]))[0])


def draw(snap, fig) -> None:
    """Draw `snap` (a sim.views.viewer.Snapshot) on `fig`, replacing whatever it showed."""
    fig.clear()
    grid = fig.add_gridspec(2, 2, width_ratios=(2.6, 1), height_ratios=(5, 1), left=0.04, right=0.99,
                            bottom=0.06, top=0.9, wspace=0.04, hspace=0.35)
    ax_map, ax_text, ax_bar = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])
    draw_slot_map(slot_map_of(snap), ax_map, legend=False)
    ax_map.set_xlabel(ax_map.get_xlabel(), fontsize=8)
    ax_map.set_ylabel(ax_map.get_ylabel(), fontsize=8)
    _title(snap, fig)
    _tables_and_queues(snap, ax_text)
    _shares_bar(snap, ax_bar)
    ax_text.legend(handles=legend_handles(), loc="lower left", bbox_to_anchor=(0.0, -0.02), frameon=False,
                   fontsize=7, handlelength=1.5, title="the pool's slots", title_fontsize=8)


def _title(snap, fig) -> None:
    prefills = f"{snap.num_prefills} prefill{'s' * (snap.num_prefills != 1)}"
    decodes = f"{snap.num_decodes} decode{'s' * (snap.num_decodes != 1)}"
    head = (f"{snap.policy} pool, {snap.num_slots // snap.block_size} blocks of {snap.block_size}  |  "
            f"step {snap.step}  |  t = {snap.time:.3f} s  |  {prefills}, {decodes}")
    fig.text(0.04, 0.955, head, fontsize=11, weight="bold", va="center")
    events = []
    if snap.preempted:
        events.append("preempted: request " + ", ".join(map(str, snap.preempted)))
    if snap.finished:
        events.append("finished: request " + ", ".join(map(str, snap.finished)))
    if events:
        fig.text(0.99, 0.955, "   ".join(events), fontsize=10, ha="right", va="center",
                 color=PREEMPTED_RGB if snap.preempted else "#2e7d32", weight="bold")


def _tables_and_queues(snap, ax) -> None:
    """Block tables of the running sequences, one line each in the request's colour, then the three queues."""
    ax.axis("off")
    y, step = 1.0, 0.052
    ax.text(0.0, y, "block tables (running sequences)", fontsize=9, weight="bold", va="top", transform=ax.transAxes)
    items = list(snap.block_tables.items())
    for seq_id, table in items[:MAX_TABLE_LINES]:
        y -= step
        rid = snap.owners.get(seq_id, seq_id)
        blocks = " ".join(map(str, table[:MAX_TABLE_BLOCKS]))
        more = f" ... ({len(table)} blocks)" if len(table) > MAX_TABLE_BLOCKS else ""
        name = f"req {rid}" if rid == seq_id else f"req {rid}/seq {seq_id}"
        ax.text(0.0, y, f"{name}: [{blocks}{more}]", fontsize=7.5, family="monospace", va="top",
                color=request_color(rid), transform=ax.transAxes)
    if len(items) > MAX_TABLE_LINES:
        y -= step
        ax.text(0.0, y, f"... and {len(items) - MAX_TABLE_LINES} more", fontsize=7.5, va="top", transform=ax.transAxes)
    if not items:
        y -= step
        ax.text(0.0, y, "(none)", fontsize=7.5, va="top", transform=ax.transAxes)
    y -= 1.6 * step
    ax.text(0.0, y, "queues (request ids, in order)", fontsize=9, weight="bold", va="top", transform=ax.transAxes)
    for name, ids in (("running", snap.running), ("waiting", snap.waiting), ("swapped", snap.swapped)):
        y -= step
        _id_line(ax, y, f"{name:<8}", ids, snap.preempted)


def _id_line(ax, y: float, label: str, ids: list[int], preempted: list[int]) -> None:
    """`label: 3 5 8`, each id in its request's colour; one preempted this step is boxed in red."""
    text = ax.text(0.0, y, label, fontsize=7.5, family="monospace", va="top", transform=ax.transAxes)
    if not ids:
        ax.annotate(" -", xycoords=text, xy=(1, 1), va="top", fontsize=7.5, family="monospace")
        return
    for rid in ids[:20]:
        box = dict(boxstyle="square,pad=0.1", fc="none", ec=PREEMPTED_RGB, lw=1.2) if rid in preempted else None
        text = ax.annotate(f" {rid}", xycoords=text, xy=(1, 1), va="top", fontsize=7.5, family="monospace",
                           color=request_color(rid), weight="bold", bbox=box)
    if len(ids) > 20:
        ax.annotate(f" ... +{len(ids) - 20}", xycoords=text, xy=(1, 1), va="top", fontsize=7.5)


def bar_segments(snap) -> list[tuple[str, int, int]]:
    """The share bar's segments, left to right: (kind, owner, slots). The five kinds in SHARE_NAMES order; within
    token states, reservation and internal fragmentation one segment per request (by id, as the map colours
    them); external fragmentation and free one segment each (owner -1). Slots sum to the pool's."""
    smap = slot_map_of(snap)
    segments = []
    for code, name in enumerate(SHARE_NAMES):
        mine = smap.kind == code
        if code > INTERNAL:
            segments.append((name, -1, int(mine.sum())))
            continue
        owners, counts = np.unique(smap.owner[mine], return_counts=True)
        segments += [(name, int(o), int(c)) for o, c in zip(owners.tolist(), counts.tolist())]
    return segments


def _shares_bar(snap, ax) -> None:
    """The five shares of the pool as one stacked horizontal bar in the memory map's colours and hatches (one
    palette, sim/figures/memory_map.py `kind_colors`): a request's token states in its colour, its reservation and
    internal fragmentation pale; each kind labelled with its share when wide enough."""
    segments = bar_segments(snap)
    codes = np.array([SHARE_NAMES.index(name) for name, _, _ in segments])
    colours = kind_colors(codes, owner_colors(np.array([max(o, 0) for _, o, _ in segments], dtype=np.int64)))
    left = 0.0
    for (name, _, slots), colour in zip(segments, colours):
        width = slots / snap.num_slots
        ax.barh(0, width, left=left, color=colour, hatch=KIND_HATCHES[name] or None, edgecolor=HATCH, linewidth=0)
        left += width
    left = 0.0
    for name, share in snap.shares.items():
        if share >= 0.07:
            ax.text(left + share / 2, 0, f"{SHORT_LABELS[name]}\n{share:.0%}", ha="center", va="center", fontsize=7,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))
        left += share
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.5, 0.5)
    ax.set_yticks([])
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0], ["0%", "25%", "50%", "75%", "100%"], fontsize=7)
    ax.grid(False)
    ax.set_title("the pool's five kinds of slot (sim/kv/base.py), in slots: " + ", ".join(
        f"{SHARE_LABELS[n]} {c}" for n, c in zip(SHARE_NAMES, snap.counts)), fontsize=8, loc="left")
