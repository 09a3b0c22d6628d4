"""Ablations: the block size (paper Fig. 18b) and recompute vs swap preemption across block sizes (Fig. 19).

Block size trades two costs. Small blocks waste little (only a sequence's last block is partly empty) but,
on a GPU, make the attention kernel gather many small pieces and swaps move many small copies; large blocks
waste more of each last block and share less. The paper finds 16 a good default.

NOTE (how the cost model prices blocks): the roofline (sim/clock/cost.py) charges the paged kernel's block gather
as 4 extra tokens' read per block (+25% attention at block size 16, the paper's measured kernel overhead;
its Fig. 18a) and every swap copy a fixed 5 us, one copy per block, layer and K/V (Fig. 19a: many small PCIe
transfers). Both are named approximations, not measurements; the captions say so.
"""
from __future__ import annotations

import numpy as np

from ..drivers.sweep import Task
from ..kv.base import SHARE_NAMES
from .style import SETUP, SHARE_COLORS, SHARE_LABELS, caption, new_figure, percent_axis, save

BLOCK_SIZES = {False: (1, 2, 4, 8, 16, 32, 64, 128, 256), True: (4, 16, 64)}
WORKLOADS = {"sharegpt": ("ShareGPT", 2.0, {False: 600.0, True: 40.0}),
             "alpaca": ("Alpaca", 30.0, {False: 60.0, True: 8.0})}  # name, rate (req/s), trace seconds
BLOCK_COST = ("Cost model (sim/clock/cost.py, stated approximations): the paged kernel's block gather costs 4 tokens' read "
              "per block (+25% attention at block 16, the paper's kernel overhead), each swap copy 5 us (one per "
              "block, layer and K/V): small blocks pay in kernel and copy time, large ones in fragmentation.")


# --- Fig. 18b: block size ------------------------------------------------------------------------------
def block_tasks(quick: bool) -> list[Task]:
    return [Task.of(policy="paged", scheduler="v0", workload=w, rate=rate, duration=durations[quick], block_size=b)
            for w, (_, rate, durations) in WORKLOADS.items() for b in BLOCK_SIZES[quick]]


def draw_block(runs, outdir, quick: bool):
    # NOTE: a 2 x 2 grid, the fourth cell holding the legend: three panels in a row made a 1980 x 552 image whose
    # text was too small to read.
    fig, grid = new_figure(2, 2, size=(12, 8.5))
    axes = [grid[0, 0], grid[0, 1], grid[1, 0]]
    grid[1, 1].axis("off")
    rows = []
    for i, (workload, (label, rate, durations)) in enumerate(WORKLOADS.items()):
        mine = [(t, r) for t, r in runs if t.params["workload"] == workload]
        sizes = [t.params["block_size"] for t, _ in mine]
        latency = [r.summary["normalized_latency_s_per_token"] for _, r in mine]
        axes[0].plot(sizes, latency, marker="o", label=f"{label}, {rate:g} req/s ({durations[quick]:g} s trace)")
        ax, bottom = axes[1 + i], np.zeros(len(mine))
        x = np.arange(len(mine))
        for name in SHARE_NAMES[:-1]:
            values = np.array([r.summary["memory_busy"][name] for _, r in mine])
            ax.bar(x, values, bottom=bottom, color=SHARE_COLORS[name], label=SHARE_LABELS[name], width=0.7)
            bottom += values
        ax.set_xticks(x, [str(b) for b in sizes])
        ax.set_xlabel("block size (tokens)")
        ax.set_ylim(0, 1)
        percent_axis(ax)
        ax.set_title(f"({'bc'[i]}) {label}: memory in use, time-weighted")
        for (_task, result), b in zip(mine, sizes):
            s = result.summary
            rows.append({"workload": workload, "rate": rate, "block_size": b, "trace_duration_s": durations[quick],
                         "normalized_latency_s_per_token": s["normalized_latency_s_per_token"],
                         "mean_batch_size": s["mean_batch_size"], "num_preemptions": s["num_preemptions"],
                         **{f"memory.{n}": s["memory"][n] for n in SHARE_NAMES},
                         **{f"memory_busy.{n}": s["memory_busy"][n] for n in SHARE_NAMES[:-1]}})
    axes[0].set_xscale("log", base=2)
    axes[0].set_xticks(BLOCK_SIZES[quick], [str(b) for b in BLOCK_SIZES[quick]])
    axes[0].set_xlabel("block size (tokens)")
    axes[0].set_ylabel("normalized latency (s/token)")
    axes[0].set_ylim(0, None)
    axes[0].set_title("(a) normalized latency")
    axes[0].legend(loc="upper right", frameon=False, fontsize=9)  # the curves start high on the left
    grid[1, 1].legend(*axes[2].get_legend_handles_labels(), loc="center left", frameon=False, fontsize=10,
                      title="(b), (c): memory in use")
    fig.suptitle(f"Block size, the paper's Fig. 18b ({SETUP.replace('block size 16, ', '')}, vLLM)", fontsize=12)
    caption(fig, BLOCK_COST + " The paper's 1-hour traces are shortened as stated.", width=140)
    return save(fig, rows, outdir, "block_size")


# --- Fig. 19: recompute vs swap --------------------------------------------------------------------------
PRESSURE_RATE = 2.5  # ShareGPT req/s: past the paged pool's comfort, so requests are preempted often
PRESSURE_DURATION = {False: 300.0, True: 40.0}
MODES = ("recompute", "swap")
MODE_COLORS = {"recompute": "#1f77b4", "swap": "#d62728"}


def preemption_tasks(quick: bool) -> list[Task]:
    return [Task.of(policy="paged", scheduler="v0", workload="sharegpt", rate=PRESSURE_RATE, duration=PRESSURE_DURATION[quick],
                    block_size=b, preemption=mode)
            for mode in MODES for b in BLOCK_SIZES[quick]]


def draw_preemption(runs, outdir, quick: bool):
    fig, (lat, pre) = new_figure(1, 2, size=(12, 4.5))
    rows = []
    for mode in MODES:
        mine = [(t, r) for t, r in runs if t.params["preemption"] == mode]
        sizes = [t.params["block_size"] for t, _ in mine]
        latency = [r.summary["normalized_latency_s_per_token"] for _, r in mine]
        preemptions = [r.summary["num_preemptions"] / r.summary["num_requests"] for _, r in mine]
        lat.plot(sizes, latency, marker="o", color=MODE_COLORS[mode], label=mode)
        pre.plot(sizes, preemptions, marker="o", color=MODE_COLORS[mode], label=mode)
        for (_task, result), b in zip(mine, sizes):
            s = result.summary
            rows.append({"preemption": mode, "block_size": b, "rate": PRESSURE_RATE,
                         "trace_duration_s": PRESSURE_DURATION[quick],
                         "normalized_latency_s_per_token": s["normalized_latency_s_per_token"],
                         "num_preemptions": s["num_preemptions"], "num_requests": s["num_requests"],
                         "mean_batch_size": s["mean_batch_size"], "throughput_req_per_s": s["throughput_req_per_s"]})
    for ax in (lat, pre):
        ax.set_xscale("log", base=2)
        ax.set_xticks(BLOCK_SIZES[quick], [str(b) for b in BLOCK_SIZES[quick]])
        ax.set_xlabel("block size (tokens)")
        ax.legend(frameon=False)
    lat.set_ylim(0, None)
    pre.set_ylim(0, None)
    lat.set_ylabel("normalized latency (s/token)")
    lat.set_title("(a) end-to-end normalized latency")
    pre.set_ylabel("preemptions per request")
    pre.set_title("(b) how often requests were preempted")
    fig.suptitle(f"Recompute vs swap under memory pressure, the paper's Fig. 19 ({SETUP.replace('block size 16, ', '')})",
                 fontsize=12)
    caption(fig, f"ShareGPT-shaped requests at {PRESSURE_RATE:g} req/s, a {PRESSURE_DURATION[quick]:g} s trace; "
                 "swap: 4 GiB CPU swap space, falling back to recompute when it is full. " + BLOCK_COST, width=160)
    return save(fig, rows, outdir, "recompute_vs_swap")
