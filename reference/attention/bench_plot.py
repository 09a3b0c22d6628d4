"""The figure of the kernel benchmark (``figures/kernel_bandwidth.png``), drawn from its saved CSV.

Left: the decode kernel's bandwidth as a fraction of a device-to-device copy's, against context length, one line
per batch size (shuffled block tables, block size 16). Right: the price of paging, the paged (shuffled) table's
time over the identity table's, against block size: the question of the vLLM paper's Figure 18a (Kwon et al.,
SOSP 2023, Section 7.1), whose kernel was 20-26% slower than FasterTransformer's contiguous one.

``python -m reference bench-kernels --plot figures/bench_attention_gpu.csv`` redraws it on any machine.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

from sim.base.outfiles import OutputPathError, atomic_write, check_outputs

DEFAULT_PNG = Path(__file__).resolve().parents[2] / "figures" / "kernel_bandwidth.png"
TARGET_FRACTION = 0.85  # issue target: decode moves >= 0.85 of a copy's bytes per second at long context
TARGET_PAGING = 1.03  # issue target: a shuffled table costs <= 3% over an identity table at block size >= 16


def read_commented_csv(path: Path) -> tuple[list[dict], dict[str, str]]:
    """A benchmark CSV's rows and its ``# key: value`` comment lines. ValueError if it cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    lines = text.splitlines()
    comments = dict(line[2:].split(": ", 1) for line in lines if line.startswith("# ") and ": " in line)
    return list(csv.DictReader(io.StringIO("\n".join(line for line in lines if not line.startswith("#"))))), comments


def read_table(path: Path) -> tuple[list[dict], dict[str, str]]:
    """The kernel benchmark's rows and comments (read_commented_csv). ValueError names what is wrong."""
    rows, comments = read_commented_csv(path)
    needed = {"experiment", "batch", "context", "block_size", "block_table", "time_us", "fraction_of_copy"}
    if not rows or not needed <= set(rows[0]):
        raise ValueError(f"{path} is not a table of `python -m reference bench-kernels` (needs the columns "
                         f"{', '.join(sorted(needed))})")
    return rows, comments


def paging_ratios(rows: list[dict]) -> list[tuple[int, float]]:
    """(block size, shuffled time / identity time) for each block size of the paging experiment."""
    times: dict[int, dict[str, float]] = {}
    for r in rows:
        if r["experiment"] == "paging":
            times.setdefault(int(r["block_size"]), {})[r["block_table"]] = float(r["time_us"])
    return [(bs, t["shuffled"] / t["identity"]) for bs, t in sorted(times.items())
            if "shuffled" in t and "identity" in t]


def plot(rows: list[dict], comments: dict[str, str], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    decode = [r for r in rows if r["experiment"] == "decode"]
    for batch in sorted({int(r["batch"]) for r in decode}):
        pts = sorted((int(r["context"]), float(r["fraction_of_copy"])) for r in decode if int(r["batch"]) == batch)
        left.plot(*zip(*pts), marker="o", label=f"batch {batch}")
    left.axhline(TARGET_FRACTION, color="grey", linestyle="--", linewidth=1, label=f"target {TARGET_FRACTION}")
    left.set_xscale("log", base=2)
    left.set_xlabel("context length (tokens)")
    left.set_ylabel("decode bandwidth / copy bandwidth")
    left.set_ylim(0, 1.1)
    left.set_title("(a) decode kernel vs a device copy")
    left.legend(fontsize=9, loc="lower right")

    ratios = paging_ratios(rows)
    if ratios:
        sizes, values = zip(*ratios)
        right.bar([str(s) for s in sizes], [v - 1.0 for v in values], bottom=1.0, color="tab:blue")
        for i, v in enumerate(values):
            right.text(i, max(v, 1.0), f"{v:.3f}", ha="center", va="bottom", fontsize=8)
        right.set_ylim(min(0.95, min(values) - 0.02), max(1.32, max(values) + 0.05))
    right.axhline(1.0, color="black", linewidth=0.8)
    right.axhline(TARGET_PAGING, color="grey", linestyle="--", linewidth=1, label=f"target {TARGET_PAGING}")
    right.axhspan(1.20, 1.26, color="tab:red", alpha=0.15,
                  label="vLLM paper: its paged kernel vs FasterTransformer's (1.20-1.26)")
    paging = [r for r in rows if r["experiment"] == "paging"]
    shape = f"batch {paging[0]['batch']} x context {paging[0]['context']}" if paging else ""
    right.set_xlabel("block size (tokens)")
    right.set_ylabel("time, shuffled / identity block table (1 = free)")
    right.set_title(f"(b) the price of paging ({shape})")
    right.legend(fontsize=9, loc="upper right")
    fig.suptitle(f"Paged decode attention (Triton) on {comments.get('device', 'an unnamed device')}", fontsize=11)
    fig.tight_layout()
    with atomic_write(png, "wb", make_parents=True) as f:  # whole or not at all
        fig.savefig(f, dpi=110, format="png")
    plt.close(fig)
    print(f"wrote {png}")


def main_plot(csv_path: Path, png: Path | None) -> int:
    """``--plot``: draw the figure of a saved table; one error line and exit 2 on a bad table or path."""
    png = png or DEFAULT_PNG
    try:
        check_outputs({"--figure": png}, inputs={"--plot": csv_path}, make_parents=png == DEFAULT_PNG)
        rows, comments = read_table(csv_path)
    except (OutputPathError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    plot(rows, comments, png)
    return 0
