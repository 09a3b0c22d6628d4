"""The KV pool as a picture: every token slot coloured by the request that owns it and by what it holds.

This is the vLLM paper's Fig. 3 (contiguous reservations waste memory three ways) and Fig. 6 (paged
blocks scattered anywhere in the pool), drawn from real simulator state. The pool is laid out row by row
like memory addresses (slot i at row i // row_slots, column i % row_slots). Slot kinds are the five of the
memory breakdown (sim/kv/base.py); waste is hatched:

    token states          solid, the owner's colour
    reservation           the owner's colour, pale                (a token that WILL come)
    internal frag.        the owner's colour, pale, hatched ////  (reserved beyond the true final length)
    external frag.        grey, cross-hatched                     (allocator slack, or free holes while a
                                                                   request waits that cannot use them)
    free                  white

`slot_map(kv, ...)` reads any KV manager through the KV contract (`slot_segments`: the breakdown slot by
slot) into a `SlotMap`; `draw_memory_map(kv, ax)` draws one on a matplotlib axes, so a notebook can show a
small pool after each call it makes. The counts of a SlotMap equal `kv.breakdown(waiting)` slot for slot
(tests/sim/test_figures.py checks this).
"""
from __future__ import annotations

import colorsys
import math
from dataclasses import dataclass

import numpy as np

from ..kv.base import SHARE_NAMES

TOKEN, RESERVATION, INTERNAL, EXTERNAL, FREE = range(5)  # kind codes, in SHARE_NAMES order
WHITE = np.array([1.0, 1.0, 1.0])
FREE_RGB, EXTERNAL_RGB, HATCH = np.array([0.93, 0.94, 0.96]), np.array([0.74, 0.74, 0.74]), "#3a3a3a"
HATCHES = {INTERNAL: "////", EXTERNAL: "xxxx"}  # the waste; a reservation is pale but plain (its token will come)
LABELS = {TOKEN: "token states (colour = request)", RESERVATION: "reservation (future tokens)",
          INTERNAL: "internal fragmentation", EXTERNAL: "external fragmentation", FREE: "free"}


@dataclass(slots=True)
class SlotMap:
    """Owner and kind of every slot of a KV pool at one moment."""

    policy: str
    block_size: int
    owner: np.ndarray  # int64 [num_slots]: owning request id (or seq id), -1 for none
    kind: np.ndarray  # int8 [num_slots]: TOKEN .. FREE
    time: float | None = None  # simulated time of the capture
    num_waiting: int = 0  # requests waiting (or swapped out) at the capture

    def counts(self) -> dict[str, int]:
        found = np.bincount(self.kind, minlength=len(SHARE_NAMES))
        return {name: int(found[i]) for i, name in enumerate(SHARE_NAMES)}

    @property
    def num_owners(self) -> int:
        return len(np.unique(self.owner[self.owner >= 0]))


def seq_owners(scheduler) -> dict[int, int]:
    """From a scheduler: running seq id -> its request id (to colour a pool by request)."""
    return {seq_id: request_id for request_id in scheduler.running_request_ids()
            for seq_id in scheduler.seq_ids(request_id)}


def slot_map(kv, *, owners: dict | None = None, waiting: bool = False, time: float | None = None,
             num_waiting: int = 0) -> SlotMap:
    """Classify every slot of `kv`'s pool. `owners`: seq id -> the id to colour by (default: the seq id).
    `waiting`: free slots count as external waste."""
    owners = owners or {}
    owner = np.full(kv.num_slots, -1, dtype=np.int64)
    kind = np.full(kv.num_slots, EXTERNAL if waiting else FREE, dtype=np.int8)
    for seq_id, lo, hi, code in kv.slot_segments():
        owner[lo:hi] = owners.get(seq_id, seq_id)
        kind[lo:hi] = code
    return SlotMap(kv.policy, kv.block_size, owner, kind, time, num_waiting)


def owner_colors(owner_ids: np.ndarray) -> np.ndarray:
    """A distinct, stable colour per id: golden-ratio hue steps, so consecutive requests never look alike."""
    rgb = np.empty((len(owner_ids), 3))
    for i, k in enumerate(owner_ids.tolist()):
        hue = (k * 0.61803398875 + 0.12) % 1.0
        rgb[i] = colorsys.hsv_to_rgb(hue, 0.62 + 0.2 * (k % 2), 0.88 - 0.16 * (k % 3 == 2))
    return rgb


def pale(rgb: np.ndarray) -> np.ndarray:
    """An owner's colour, pale: its reservations and its internal fragmentation (hatched too)."""
    return 0.45 * rgb + 0.55 * WHITE


def kind_colors(kind: np.ndarray, owner_rgb: np.ndarray) -> np.ndarray:
    """THE palette of the five kinds, defined here once: the RGB of slots of kind codes `kind` [n] whose owners
    have colours `owner_rgb` [n, 3] (`owner_colors`). Token states solid in the owner's colour, a reservation and
    internal fragmentation pale, external fragmentation grey, free near-white; hatches in KIND_HATCHES. The map,
    its legend and the pool viewer's share bar (sim/views/viewer_draw.py) all colour through this."""
    kind = np.asarray(kind)
    colour = np.where((kind == TOKEN)[:, None], owner_rgb, pale(np.asarray(owner_rgb, dtype=float)))
    colour[kind == EXTERNAL] = EXTERNAL_RGB
    colour[kind == FREE] = FREE_RGB
    return colour


KIND_HATCHES = {name: HATCHES.get(code, "") for code, name in enumerate(SHARE_NAMES)}


def auto_row_slots(num_slots: int, block_size: int) -> int:
    """A row width giving a pool about 4x wider than tall, a power of two and a whole number of blocks."""
    width = 2 ** max(0, round(math.log2(math.sqrt(4 * num_slots))))
    return max(width, block_size) // block_size * block_size


def tile_shape(block_size: int) -> tuple[int, int]:
    """(height, width) of a block drawn as a tile: 16 -> 4x4, 8 -> 2x4, 32 -> 4x8; 1 row if not a power of two."""
    if block_size & (block_size - 1):
        return 1, block_size
    height = 2 ** (block_size.bit_length() // 2 - (block_size.bit_length() % 2 == 0))
    return height, block_size // height


def layout(smap: SlotMap, row_slots: int, tiles: bool) -> tuple[int, int, np.ndarray, tuple[int, int]]:
    """(rows, cols, pixel of every slot, tile shape). Rows: slot i at row i // row_slots (addresses read like
    text). Tiles: block b is an h x w tile, row_slots // w tiles per row, its slots filling the tile row by row.

        rows (contiguous)                      tiles (paged, block size 16 -> 4x4)
        | s0 s1 s2 ... s255 |                  | b0  | b1  | ... | b63  |
        | s256 ...          |                  | b64 | b65 | ... | b127 |
    """
    slots = np.arange(len(smap.kind))
    if not tiles:
        return -(-len(slots) // row_slots), row_slots, slots, (1, row_slots)
    h, w = tile_shape(smap.block_size)
    per_row = max(1, row_slots // w)
    block, offset = np.divmod(slots, smap.block_size)
    tile_row, tile_col = np.divmod(block, per_row)
    rows, cols = -(-(len(slots) // smap.block_size) // per_row) * h, per_row * w
    return rows, cols, (tile_row * h + offset // w) * cols + tile_col * w + offset % w, (h, w)


def draw_memory_map(kv, ax, *, owners=None, waiting: bool = False, **draw_kwargs) -> SlotMap:
    """Draw `kv`'s pool on `ax` (see `slot_map` for the arguments, `draw_slot_map` for the drawing ones)."""
    smap = slot_map(kv, owners=owners, waiting=waiting)
    draw_slot_map(smap, ax, **draw_kwargs)
    return smap


def draw_slot_map(smap: SlotMap, ax, *, row_slots: int | None = None, title: str | None = None,
                  legend: bool = True, tiles: bool | None = None) -> None:
    """Draw the pool on `ax`, waste hatched: rows of `row_slots` slots (auto: about 4:1), or, with `tiles`
    (default: pools of blocks of >= 4 slots), one square-ish tile per block, tiles in rows."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    tiles = smap.block_size >= 4 if tiles is None else tiles
    rows, cols, pixel, (h, w) = layout(smap, row_slots or auto_row_slots(len(smap.kind), smap.block_size), tiles)
    ids, inverse = np.unique(np.maximum(smap.owner, 0), return_inverse=True)
    base = owner_colors(ids)[inverse]
    colour = kind_colors(smap.kind, base)
    rgba = np.zeros((rows * cols, 4))  # pixels that are no slot (past the pool's end) stay transparent
    rgba[pixel, :3], rgba[pixel, 3] = colour, 1.0
    kind = np.full(rows * cols, -1, dtype=np.int8)
    kind[pixel] = smap.kind
    ax.imshow(rgba.reshape(rows, cols, 4), aspect="auto", interpolation="nearest", extent=(0, cols, rows, 0))
    for code, hatch in HATCHES.items():
        rects = [Rectangle((x0, r), x1 - x0, 1) for r, x0, x1 in _row_runs(kind.reshape(rows, cols) == code)]
        if rects:
            ax.add_collection(PatchCollection(rects, facecolor="none", edgecolor=HATCH, linewidth=0, hatch=hatch))
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.grid(False)
    if tiles:  # white gaps between tiles make every block visible as one unit
        ax.vlines(np.arange(w, cols, w), 0, rows, colors="white", linewidth=0.7)
        ax.hlines(np.arange(h, rows, h), 0, cols, colors="white", linewidth=0.7)
        ax.set_xticks([]), ax.set_yticks([])
        ax.set_xlabel(f"{cols // w} blocks per row; each tile is one block of {smap.block_size} slots ({h}x{w})")
        ax.set_ylabel(f"{rows // h} rows of blocks")
    else:
        ax.set_xlabel(f"slot within a row of {cols}")
        ax.set_ylabel(f"row (address / {cols})")
    if title:
        ax.set_title(title, loc="left")
    if legend:
        ax.legend(handles=legend_handles(), loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)


def legend_handles() -> list:
    """The five kinds as legend patches, in the palette (`kind_colors`, KIND_HATCHES), owned ones in the colour of
    an example request (request 1)."""
    from matplotlib.patches import Patch

    codes = np.arange(len(SHARE_NAMES))
    colours = kind_colors(codes, owner_colors(np.ones(len(codes), dtype=np.int64)))
    handles = []
    for code, name in enumerate(SHARE_NAMES):
        hatched = dict(edgecolor=HATCH, hatch=KIND_HATCHES[name], linewidth=0) if KIND_HATCHES[name] else {}
        outline = dict(edgecolor="#999999", linewidth=0.5) if code == FREE else {}
        handles.append(Patch(facecolor=colours[code], label=LABELS[code], **hatched, **outline))
    return handles


def _row_runs(mask: np.ndarray) -> list[tuple[int, int, int]]:
    """(row, start, end) of every horizontal run of True in a 2-D mask."""
    edges = np.diff(np.pad(mask.astype(np.int8), ((0, 0), (1, 1))), axis=1)
    starts, ends = np.nonzero(edges == 1), np.nonzero(edges == -1)
    return list(zip(starts[0].tolist(), starts[1].tolist(), ends[1].tolist()))
