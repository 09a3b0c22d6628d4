"""The KV pool as a picture: every token slot coloured by the request that owns it and by what it holds.

This is the vLLM paper's Fig. 3 (contiguous reservations waste memory three ways) and Fig. 6 (paged
blocks scattered anywhere in the pool), drawn from real simulator state. The pool is laid out row by row
like memory addresses (slot i at row i // row_slots, column i % row_slots). Slot kinds are the five of the
memory breakdown (DESIGN.md); waste is hatched:

    token states          solid, the owner's colour
    reservation           the owner's colour, pale                (a token that WILL come)
    internal frag.        the owner's colour, pale, hatched ////  (reserved beyond the true final length)
    external frag.        grey, cross-hatched                     (allocator slack, or free holes while a
                                                                   request waits that cannot use them)
    free                  white

`slot_map(kv, ...)` reads any KV manager through its public surface (`seq_ids`, `block_table`,
`num_tokens`, the allocator) into a `SlotMap`; `draw_memory_map(kv, ax)` draws one on a matplotlib axes,
so a notebook can show a small pool after each call it makes. The counts of a SlotMap equal
`kv.breakdown(waiting)` slot for slot (tests/sim/test_figures.py checks this).
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
          INTERNAL: "internal fragmentation", EXTERNAL: "external fragmentation", FREE: "free"}  # fmt: skip


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


def seq_lengths(scheduler) -> tuple[dict[int, tuple[int, int]], dict[int, int]]:
    """From a scheduler: running seq id -> (prompt_len, final_len), and seq id -> its request id. final_len is
    prompt + output - 1, the tokens whose K/V a sequence ever holds (its last token is sampled, never fed)."""
    lengths, owners = {}, {}
    for request_id in scheduler.running_request_ids():
        request = scheduler.request(request_id)
        for seq_id in scheduler.seq_ids(request_id):
            lengths[seq_id] = (request.prompt_len, request.prompt_len + request.output_len - 1)
            owners[seq_id] = request_id
    return lengths, owners


def slot_map(kv, *, lengths: dict | None = None, owners: dict | None = None, waiting: bool = False,
             time: float | None = None, num_waiting: int = 0) -> SlotMap:  # fmt: skip
    """Classify every slot of `kv`'s pool. `lengths`: seq id -> (prompt_len, final_len); without a sequence's
    lengths its unwritten slots all count as reservation (the split needs the true final length). `owners`:
    seq id -> the id to colour by (default: the seq id). `waiting`: free slots count as external waste."""
    lengths, owners = lengths or {}, owners or {}
    size = kv.num_slots
    owner = np.full(size, -1, dtype=np.int64)
    kind = np.full(size, EXTERNAL if waiting else FREE, dtype=np.int8)
    fill = _fill_paged if kv.policy == "paged" else _fill_contiguous
    fill(kv, owner, kind, lengths, owners)
    return SlotMap(kv.policy, kv.block_size, owner, kind, time, num_waiting)


def _fill_contiguous(kv, owner, kind, lengths, owners) -> None:
    """One run per sequence:  | tokens | reservation | internal | external (allocator slack) |  (kv/contiguous.py)."""
    bs = kv.block_size
    for seq_id in kv.seq_ids:
        start = kv.block_table(seq_id)[0] * bs
        size = kv.allocator.allocated_size(start // bs) * bs
        tokens = kv.num_tokens(seq_id)
        if seq_id in lengths:
            prompt_len, final_len = lengths[seq_id]
            reach, reserved = max(final_len, tokens), kv.reserved_tokens(prompt_len, final_len)
        else:
            reach = reserved = size
        owner[start : start + size] = owners.get(seq_id, seq_id)
        for kind_code, lo, hi in ((TOKEN, 0, tokens), (RESERVATION, tokens, reach), (INTERNAL, reach, reserved),
                                  (EXTERNAL, reserved, size)):  # fmt: skip
            kind[start + lo : start + hi] = kind_code


def _fill_paged(kv, owner, kind, lengths, owners) -> None:
    """Every block but a sequence's last is full; a last block's empty slots are reservation up to the
    furthest any owner will write, internal fragmentation beyond (the rule of PagedKVManager.breakdown)."""
    bs = kv.block_size
    last: dict[int, list[int]] = {}  # partly filled last block -> [filled, reach]
    for seq_id in kv.seq_ids:
        if kv.is_swapped(seq_id):  # its blocks are in CPU memory
            continue
        table, tokens = kv.block_table(seq_id), kv.num_tokens(seq_id)
        who = owners.get(seq_id, seq_id)
        for b in table:
            if owner[b * bs] < 0:  # a shared block keeps its first owner's colour
                owner[b * bs : (b + 1) * bs] = who
            kind[b * bs : (b + 1) * bs] = TOKEN
        start = (len(table) - 1) * bs
        filled = tokens - start
        final_len = lengths[seq_id][1] if seq_id in lengths else start + bs
        reach = max(filled, min(bs, final_len - start))
        entry = last.setdefault(table[-1], [filled, reach])
        entry[1] = max(entry[1], reach)
    for b, (filled, reach) in last.items():
        kind[b * bs + filled : b * bs + reach] = RESERVATION
        kind[b * bs + reach : (b + 1) * bs] = INTERNAL


def owner_colors(owner_ids: np.ndarray) -> np.ndarray:
    """A distinct, stable colour per id: golden-ratio hue steps, so consecutive requests never look alike."""
    rgb = np.empty((len(owner_ids), 3))
    for i, k in enumerate(owner_ids.tolist()):
        hue = (k * 0.61803398875 + 0.12) % 1.0
        rgb[i] = colorsys.hsv_to_rgb(hue, 0.62 + 0.2 * (k % 2), 0.88 - 0.16 * (k % 3 == 2))
    return rgb


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


def draw_memory_map(kv, ax, *, lengths=None, owners=None, waiting: bool = False, **draw_kwargs) -> SlotMap:
    """Draw `kv`'s pool on `ax` (see `slot_map` for the arguments, `draw_slot_map` for the drawing ones)."""
    smap = slot_map(kv, lengths=lengths, owners=owners, waiting=waiting)
    draw_slot_map(smap, ax, **draw_kwargs)
    return smap


def draw_slot_map(smap: SlotMap, ax, *, row_slots: int | None = None, title: str | None = None,
                  legend: bool = True, tiles: bool | None = None) -> None:  # fmt: skip
    """Draw the pool on `ax`, waste hatched: rows of `row_slots` slots (auto: about 4:1), or, with `tiles`
    (default: paged pools with blocks of >= 4 slots), one square-ish tile per block, tiles in rows."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    tiles = (smap.policy == "paged" and smap.block_size >= 4) if tiles is None else tiles
    rows, cols, pixel, (h, w) = layout(smap, row_slots or auto_row_slots(len(smap.kind), smap.block_size), tiles)
    ids, inverse = np.unique(np.maximum(smap.owner, 0), return_inverse=True)
    base = owner_colors(ids)[inverse]
    colour = np.where((smap.kind == TOKEN)[:, None], base, 0.45 * base + 0.55 * WHITE)
    colour[smap.kind == EXTERNAL] = EXTERNAL_RGB
    colour[smap.kind == FREE] = FREE_RGB
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
    from matplotlib.patches import Patch

    token = owner_colors(np.arange(3))[1]
    pale = 0.45 * token + 0.55 * WHITE
    handles = [Patch(facecolor=token, label=LABELS[TOKEN]), Patch(facecolor=pale, label=LABELS[RESERVATION])]
    handles += [Patch(facecolor=pale if c == INTERNAL else EXTERNAL_RGB, edgecolor=HATCH, hatch=HATCHES[c],
                      linewidth=0, label=LABELS[c]) for c in (INTERNAL, EXTERNAL)]  # fmt: skip
    return handles + [Patch(facecolor=FREE_RGB, edgecolor="#999999", linewidth=0.5, label=LABELS[FREE])]


def _row_runs(mask: np.ndarray) -> list[tuple[int, int, int]]:
    """(row, start, end) of every horizontal run of True in a 2-D mask."""
    edges = np.diff(np.pad(mask.astype(np.int8), ((0, 0), (1, 1))), axis=1)
    starts, ends = np.nonzero(edges == 1), np.nonzero(edges == -1)
    return list(zip(starts[0].tolist(), starts[1].tolist(), ends[1].tolist()))
