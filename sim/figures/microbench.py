"""The paper's microbenchmarks (Kwon et al., SOSP 2023, section 7): the paged attention kernel's overhead (Fig. 18a)
and the cost of swapping against recomputing a sequence's KV cache per block size (Fig. 19a).

Neither simulates a workload, so both figures have no simulation points:

- `paged_kernel_overhead` (Fig. 18a) draws MEASUREMENTS from a committed file: the paging experiment of
  figures/bench_attention_gpu.csv, written by `python -m reference.attention.bench` on a GPU (reference/attention/
  bench.py: the project's Triton paged decode kernel at one batch and context, block sizes 1..256, with an identity
  block table, each sequence's blocks adjacent and in order as in a contiguous cache, and with a shuffled one, both
  timed against a device copy of the same bytes). `sim` never imports torch, so the figure reads the CSV; its caption
  names the device and the command from the CSV's comment lines. The paper compares its kernel with
  FasterTransformer's contiguous one (20-26% slower, section 7.1); no FasterTransformer kernel was measured here:
  the identity table is the same kernel over a contiguous layout, and the copy is the bandwidth bound. Beside them,
  the overhead sim/clock/cost.py's roofline ASSUMES (RooflineEfficiency.block_gather_tokens per block).
- `swap_recompute_cost` (Fig. 19a) draws the COST MODEL's numbers, not measurements: for one sequence's KV cache,
  the roofline's time to swap it out to CPU memory (or back in: the model prices both directions alike) against its
  time to recompute it (a prefill step of its tokens alone), per block size, on the paper's setup.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from matplotlib.ticker import FuncFormatter

from ..base.specs import get_model
from ..clock.cost import RooflineCostModel, RooflineEfficiency
from ..drivers.sweep import Task
from .style import SETUP, caption, new_figure, save

ROOT = Path(__file__).resolve().parents[2]
KERNEL_CSV = ROOT / "figures" / "bench_attention_gpu.csv"
PAPER_KERNEL_OVERHEAD = (0.20, 0.26)  # section 7.1: the paged kernel's latency over FasterTransformer's
MODEL, GPU = "opt-13b", "a100-40gb"  # the paper's Fig. 19a setup (its section 7 runs OPT-13B on one A100)
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SEQ_LENS = (256, 1024, 2048)  # tokens of the sequence swapped or recomputed; panel (a) draws the middle one


def no_tasks(quick: bool) -> list[Task]:
    """These figures simulate nothing (the list of their simulation points is empty)."""
    return []


# --- Fig. 18a: the paged kernel's overhead, measured ------------------------------------------------------
def read_kernel_csv(path: str | Path = KERNEL_CSV) -> tuple[list[dict], dict[str, str]]:
    """The paging rows of a `python -m reference.attention.bench` table and its `# key: value` comment lines."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (written on a GPU by `python -m reference.attention.bench`; "
                                "the committed one is figures/bench_attention_gpu.csv)")
    lines = path.read_text(encoding="utf-8").splitlines()
    comments = dict(line[2:].split(": ", 1) for line in lines if line.startswith("# ") and ": " in line)
    table = csv.DictReader(line for line in lines if not line.startswith("#"))
    rows = [r for r in table if r["experiment"] == "paging"]
    if not rows:
        raise ValueError(f"{path}: no rows of the paging experiment (experiment == 'paging')")
    return rows, comments


def kernel_overheads(rows: list[dict]) -> list[dict]:
    """Per block size: kernel time with each block table, the time its bytes take at the copy's bandwidth
    (time * fraction_of_copy: the bound a contiguous read reaches), and the overheads over both."""
    times: dict[int, dict[str, dict]] = {}
    for r in rows:
        times.setdefault(int(r["block_size"]), {})[r["block_table"]] = r
    out = []
    for block_size, t in sorted(times.items()):
        if set(t) != {"identity", "shuffled"}:
            raise ValueError(f"block size {block_size}: expected an identity and a shuffled row, found {sorted(t)}")
        identity, shuffled = (float(t[k]["time_us"]) for k in ("identity", "shuffled"))
        bound = float(t["shuffled"]["time_us"]) * float(t["shuffled"]["fraction_of_copy"])
        gather = RooflineEfficiency().block_gather_tokens / block_size  # the roofline's assumed overhead
        out.append({"block_size": block_size, "batch": int(t["shuffled"]["batch"]),
                    "context": int(t["shuffled"]["context"]), "identity_us": identity, "shuffled_us": shuffled,
                    "copy_bound_us": bound, "paging_overhead": shuffled / identity - 1,
                    "overhead_over_copy": shuffled / bound - 1, "roofline_assumed_overhead": gather})
    return out


def draw_kernel(runs, outdir, quick: bool, source: str | Path = KERNEL_CSV):
    rows, comments = read_kernel_csv(source)
    table = kernel_overheads(rows)
    sizes = [r["block_size"] for r in table]
    x = np.arange(len(sizes))
    fig, (ax_t, ax_o) = new_figure(1, 2, size=(13, 4.8))
    curves = (("shuffled_us", "paged (shuffled block table)", "#1f77b4"),
              ("identity_us", "same kernel, contiguous layout (identity table)", "#9467bd"),
              ("copy_bound_us", "a device copy of the same bytes (bandwidth bound)", "#7f7f7f"))
    for key, label, color in curves:
        ax_t.plot(x, [r[key] for r in table], marker="o", color=color, label=label)
    ax_t.set_ylim(0, None)
    ax_t.set_ylabel("kernel time (us)")
    ax_t.set_title(f"(a) decode attention, batch {table[0]['batch']} x context {table[0]['context']}")
    for key, label, color in (("paging_overhead", "measured: shuffled over identity table", "#1f77b4"),
                              ("overhead_over_copy", "measured: shuffled over the copy bound", "#7f7f7f"),
                              ("roofline_assumed_overhead", "sim/clock/cost.py's roofline assumes (4 tokens' read a block)",
                               "#d62728")):
        ax_o.plot(x, [r[key] for r in table], marker="o", color=color, label=label)
    ax_o.axhspan(*PAPER_KERNEL_OVERHEAD, color="#d62728", alpha=0.12, label="the paper: its paged kernel over "
                 "FasterTransformer's (20-26%)")
    ax_o.set_yscale("symlog", linthresh=0.1)
    ax_o.set_ylabel("overhead (time / baseline - 1)")
    ax_o.set_title("(b) the price of paging")
    for ax, where in ((ax_t, "lower right"), (ax_o, "upper right")):
        ax.set_xticks(x, [str(s) for s in sizes])
        ax.set_xlabel("block size (tokens)")
        ax.legend(frameon=False, fontsize=8, loc=where)
    at16 = next(r for r in table if r["block_size"] == 16)
    fig.suptitle("The paged attention kernel's overhead, the paper's Fig. 18a (measured on a GPU, not simulated)",
                 fontsize=12)
    caption(fig, f"Measured on {comments.get('device', 'an unnamed device')} ({comments.get('date', 'undated')}) by "
                 f"`{comments.get('command', 'python -m reference.attention.bench')}`, read from "
                 f"figures/{Path(source).name}; {comments.get('timing', '')}. At block size 16 the shuffled table "
                 f"costs {at16['paging_overhead']:+.1%} over the identity one and {at16['overhead_over_copy']:+.1%} "
                 f"over the copy; the roofline charges {at16['roofline_assumed_overhead']:.0%} (set to the paper's "
                 "A100 measurement against FasterTransformer, which this GPU's kernel does not reproduce).",
            width=170)
    return save(fig, table, outdir, "paged_kernel_overhead")


# --- Fig. 19a: swap vs recompute, from the cost model ------------------------------------------------------
def swap_recompute_rows(model: str = MODEL, gpu: str = GPU) -> list[dict]:
    """Per sequence length and block size: the roofline's seconds to swap the sequence's blocks one way over PCIe,
    and to recompute its K/V (one prefill step of its tokens, the paged kernel reading blocks of that size)."""
    kv_bytes = get_model(model).kv_bytes_per_token
    rows = []
    for seq_len in SEQ_LENS:
        for block_size in BLOCK_SIZES:
            cost = RooflineCostModel(model, gpu, block_size=block_size)
            num_blocks = -(-seq_len // block_size)
            swap = cost.swap_time(num_blocks * block_size * kv_bytes, num_blocks)  # whole blocks move
            recompute = cost.step_time(seq_len, 0, seq_len)
            rows.append({"model": model, "gpu": gpu, "seq_len": seq_len, "block_size": block_size,
                         "num_blocks": num_blocks, "swap_bytes": num_blocks * block_size * kv_bytes,
                         "swap_ms": 1e3 * swap, "recompute_ms": 1e3 * recompute,
                         "swap_over_recompute": swap / recompute})
    return rows


def crossover(rows: list[dict]) -> int | None:
    """The smallest block size from which swapping is cheaper than recomputing at every larger one (None: never)."""
    best = None
    for r in sorted(rows, key=lambda r: -r["block_size"]):
        if r["swap_over_recompute"] >= 1:
            break
        best = r["block_size"]
    return best


def draw_swap(runs, outdir, quick: bool):
    rows = swap_recompute_rows()
    fig, (ax_t, ax_r) = new_figure(1, 2, size=(13, 4.8))
    middle = SEQ_LENS[len(SEQ_LENS) // 2]
    mine = [r for r in rows if r["seq_len"] == middle]
    x = np.arange(len(BLOCK_SIZES))
    ax_t.bar(x - 0.2, [r["swap_ms"] for r in mine], width=0.4, color="#d62728", label="swap out (= swap in)")
    ax_t.bar(x + 0.2, [r["recompute_ms"] for r in mine], width=0.4, color="#1f77b4", label="recompute")
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time (ms, log scale)")
    ax_t.set_title(f"(a) one sequence of {middle:,} tokens")
    for seq_len, marker in zip(SEQ_LENS, "os^"):
        ratio = [r["swap_over_recompute"] for r in rows if r["seq_len"] == seq_len]
        ax_r.plot(x, ratio, marker=marker, label=f"{seq_len:,} tokens")
    ax_r.axhline(1.0, color="black", linewidth=0.8)
    ax_r.set_yscale("log")
    ax_r.set_ylabel("swap time / recompute time (log scale)")
    ax_r.set_title("(b) above 1: recomputing is faster")
    for ax in (ax_t, ax_r):
        ax.set_xticks(x, [str(b) for b in BLOCK_SIZES])
        ax.set_xlabel("block size (tokens)")
        ax.legend(frameon=False, fontsize=9)
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
    e = RooflineEfficiency()
    cheaper = {s: crossover([r for r in rows if r["seq_len"] == s]) for s in SEQ_LENS}
    fig.suptitle(f"Swap vs recompute per block size, the paper's Fig. 19a: the cost model's numbers "
                 f"({SETUP.split(', block')[0]})", fontsize=12)
    caption(fig, "Not measured: sim/clock/cost.py's roofline prices a swap at the KV bytes of the sequence's whole blocks "
                 f"over PCIe ({e.pcie:.0%} of 32 GB/s) plus {1e6 * e.copy_overhead_s:g} us per copy (one per block, "
                 "layer and K/V, as vLLM v0's cudaMemcpyAsync per block), and recomputation as one prefill step of "
                 "the sequence's tokens. Swapping is the cheaper from block size "
                 + ", ".join(f"{'-' if cheaper[s] is None else cheaper[s]} ({s:,} tokens)" for s in SEQ_LENS)
                 + " on. The paper (section 7.3): recomputation wins at small blocks, swapping at large ones, the two "
                 "comparable from 16 to 64.", width=170)
    return save(fig, rows, outdir, "swap_recompute_cost")
