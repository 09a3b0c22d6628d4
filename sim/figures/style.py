"""One look for every figure, and one way to save it: the PNG beside the CSV of exactly what it draws.

Names and colours follow the vLLM paper's figures (Kwon et al., SOSP 2023): the Orca baselines by their
reservation rule, vLLM for the paged KV cache, FasterTransformer-style static batching; the five memory
kinds of Fig. 2 (sim/kv/base.py, the memory breakdown).
"""
from __future__ import annotations

import csv
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt

from ..base.outfiles import atomic_files, save_figure

DPI = 120
# The paper's default setup for section 6 (OPT-13B on one A100-40GB, Table 1), the same as sim.run's defaults.
SETUP = "OPT-13B, 1x A100-40GB, block size 16, Poisson arrivals"

SYSTEM_LABELS = {
    "static": "FasterTransformer-style (static batching)",
    "max": "Orca (Max)",
    "pow2": "Orca (Pow2)",
    "oracle": "Orca (Oracle)",
    "paged": "vLLM (paged)",
}
SYSTEM_COLORS = {"static": "#7f7f7f", "max": "#d62728", "pow2": "#ff7f0e", "oracle": "#9467bd", "paged": "#1f77b4"}
SYSTEM_MARKERS = {"static": "v", "max": "s", "pow2": "^", "oracle": "D", "paged": "o"}

SHARE_LABELS = {
    "token_states": "token states",
    "reservation": "reservation",
    "internal_fragmentation": "internal fragmentation",
    "external_fragmentation": "external fragmentation & others",
    "free": "free (idle)",
}
SHARE_COLORS = {
    "token_states": "#2ca02c",
    "reservation": "#fdd835",
    "internal_fragmentation": "#ef6c00",
    "external_fragmentation": "#c62828",
    "free": "#e0e0e0",
}


def apply_style() -> None:
    plt.rcParams.update({
        "figure.dpi": DPI, "savefig.dpi": DPI, "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10,
        "legend.fontsize": 9, "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
        "grid.alpha": 0.3, "hatch.linewidth": 0.6,
    })


def new_figure(nrows: int = 1, ncols: int = 1, *, size: tuple[float, float] = (11, 4.5), **kwargs):
    apply_style()
    fig, axes = plt.subplots(nrows, ncols, figsize=size, **kwargs)
    return fig, axes


def caption(fig, text: str, *, width: int = 150) -> None:
    """A small caption under the axes (setup, trace lengths, the paper's numbers); room is made for it."""
    lines = textwrap.fill(text, width)
    fig.text(0.01, 0.005, lines, ha="left", va="bottom", fontsize=8, color="#444444")
    fig.tight_layout(rect=(0, 0.035 + 0.028 * lines.count("\n"), 1, 1))


def save(fig, rows: list[dict], outdir: str | Path, name: str) -> list[Path]:
    """Write `name`.png and `name`.csv (the rows drawn; columns in first-seen order) into `outdir`: both to
    temporary files first, then renamed into place together, so a failure or a kill leaves the old pair."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    png, table = outdir / f"{name}.png", outdir / f"{name}.csv"
    columns = list(dict.fromkeys(key for row in rows for key in row))
    try:
        with atomic_files() as files:
            save_figure(fig, png, format="png", dpi=DPI, files=files)
            with files.open(table, "w", newline="") as f:
                writer = csv.DictWriter(f, columns)
                writer.writeheader()
                writer.writerows({k: _cell(v) for k, v in row.items()} for row in rows)
    finally:
        plt.close(fig)
    return [png, table]


def _cell(value):
    """Floats rounded to 6 significant digits: readable CSVs, far finer than any figure shows."""
    return f"{value:.6g}" if isinstance(value, float) else value


def percent_axis(ax, axis: str = "y") -> None:
    from matplotlib.ticker import PercentFormatter

    (ax.yaxis if axis == "y" else ax.xaxis).set_major_formatter(PercentFormatter(1.0))
