"""Sharing KV blocks: parallel sampling and beam search (paper Fig. 15) and a shared prompt prefix (Fig. 16).

Paged memory lets sequences point at the same physical blocks (section 4.4): the n samples of one prompt
share its blocks; beam candidates share their common history, copy-on-write on the first divergent write.
Fig. 15 measures the memory this saves: 1 - (blocks in use) / (blocks the sequences would hold without
sharing), on OPT-13B serving Alpaca; the paper reports 6.1%-9.8% for parallel sampling (n = 2..6) and
37.6%-55.2% for beam search (width 2..6).

Fig. 16 serves a translation workload whose prompts all start with the same few-shot examples (LLaMA-13B,
WMT16 En-De, a 1-shot prefix of 80 tokens and a 5-shot prefix of 341). Here the requests' own lengths are
Alpaca-shaped (a modelling approximation: short sentences in, short sentences out, like WMT16), and the
prefix is shared through vLLM's prefix caching (full blocks only, chained hashes: sim/kv/blocks.py).
"""
from __future__ import annotations

import numpy as np

from ..drivers.sweep import Task
from .probes import Sharing
from .style import SYSTEM_COLORS, caption, new_figure, percent_axis, save

# --- Fig. 15: memory saved by sharing ----------------------------------------------------------------
WIDTHS = (2, 4, 6)
SHARING_RATE = 6.0  # req/s of Alpaca-shaped requests: a busy pool for n = 6 without much preemption
SHARING_DURATION = {False: 120.0, True: 10.0}
PAPER_RANGE = {"n": (0.061, 0.098), "beam_width": (0.376, 0.552)}  # Fig. 15, OPT-13B on Alpaca
KIND_LABELS = {"n": "parallel sampling (n)", "beam_width": "beam search (width)"}
KIND_COLORS = {"n": "#1f77b4", "beam_width": "#2ca02c"}


def sharing_tasks(quick: bool) -> list[Task]:
    base = {"policy": "paged", "scheduler": "v0", "workload": "alpaca", "rate": SHARING_RATE, "duration": SHARING_DURATION[quick]}
    return [Task.of((Sharing(),), **base, **{kind: k}) for kind in ("n", "beam_width") for k in WIDTHS]


def draw_sharing(runs, outdir, quick: bool):
    fig, axes = new_figure(1, 2, size=(11, 4.4), sharey=True)
    rows = []
    for ax, kind in zip(axes, ("n", "beam_width")):
        mine = [(t, r) for t, r in runs if t.params.get(kind, 1) > 1]
        widths = [t.params[kind] for t, _ in mine]
        savings = [r.probes["sharing"]["saving"] for _, r in mine]
        x = np.arange(len(mine))
        ax.bar(x, savings, color=KIND_COLORS[kind], width=0.55, label="simulated")
        low, high = PAPER_RANGE[kind]
        ax.axhspan(low, high, color="black", alpha=0.12, label=f"paper: {low:.1%} - {high:.1%}")
        for xi, v in zip(x, savings):
            ax.text(xi, v, f"{v:.1%}", ha="center", va="bottom", fontsize=9)
        ax.set_xticks(x, [str(w) for w in widths])
        ax.set_xlabel(KIND_LABELS[kind])
        ax.set_title(KIND_LABELS[kind].split(" (")[0])
        ax.legend(loc="upper left", frameon=False)
        percent_axis(ax)
        for (_task, result), w, v in zip(mine, widths, savings):
            s = result.summary
            rows.append({"kind": kind, "width": w, "memory_saving": v, "paper_low": low, "paper_high": high,
                         "block_seconds_shared": result.probes["sharing"]["block_seconds_shared"],
                         "block_seconds_unshared": result.probes["sharing"]["block_seconds_unshared"],
                         "rate": SHARING_RATE, "trace_duration_s": SHARING_DURATION[quick],
                         "mean_batch_size": s["mean_batch_size"], "num_preemptions": s["num_preemptions"],
                         "normalized_latency_s_per_token": s["normalized_latency_s_per_token"]})
    axes[0].set_ylabel("memory saving")
    axes[0].set_ylim(0, 0.8)
    fig.suptitle("Memory saved by sharing KV blocks, the paper's Fig. 15 (OPT-13B, 1x A100-40GB, Alpaca, paged, "
                 "block size 16)", fontsize=11)
    caption(fig, f"Saving = 1 - (distinct blocks in use) / (sum over running sequences of their block-table lengths), "
                 f"time-weighted over the run; Alpaca-shaped requests at {SHARING_RATE:g} req/s, a "
                 f"{SHARING_DURATION[quick]:g} s trace. Shaded: the paper's range over widths 2-6.", width=130)
    return save(fig, rows, outdir, "sharing")


# --- Fig. 16: a shared few-shot prefix ---------------------------------------------------------------
PREFIXES = {"1-shot": 80, "5-shot": 341}
PREFIX_SYSTEMS = {
    "oracle": ({"policy": "oracle"}, "Orca (Oracle)"),
    "paged": ({"policy": "paged", "enable_prefix_caching": False}, "vLLM, prefix not shared"),
    "paged+prefix": ({"policy": "paged", "enable_prefix_caching": True}, "vLLM, prefix shared (prefix caching)"),
}
PREFIX_COLORS = {"oracle": SYSTEM_COLORS["oracle"], "paged": "#8fb9dc", "paged+prefix": SYSTEM_COLORS["paged"]}
# Rates (req/s) per prefix and system, each a little past the system's knee (quick: two points).
PREFIX_RATES = {
    "1-shot": {"oracle": (4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 32.0), "paged": (4.0, 8.0, 16.0, 24.0, 32.0, 40.0),
               "paged+prefix": (4.0, 8.0, 16.0, 24.0, 32.0, 40.0, 48.0, 56.0, 64.0, 72.0)},
    "5-shot": {"oracle": (2.0, 4.0, 8.0, 12.0, 16.0), "paged": (2.0, 4.0, 8.0, 12.0, 16.0, 20.0),
               "paged+prefix": (2.0, 4.0, 8.0, 16.0, 24.0, 32.0, 40.0, 48.0, 56.0, 64.0)},
}
QUICK_PREFIX_RATES = (4.0, 16.0)
PREFIX_DURATION = {False: 45.0, True: 6.0}


def prefix_tasks(quick: bool) -> list[Task]:
    return [Task.of(model="llama-13b", scheduler="v0", workload="alpaca", rate=rate, duration=PREFIX_DURATION[quick],
                    prefix_len=prefix, **kwargs)
            for shot, prefix in PREFIXES.items() for system, (kwargs, _) in PREFIX_SYSTEMS.items()
            for rate in (QUICK_PREFIX_RATES if quick else PREFIX_RATES[shot][system])]


def _prefix_system(task: Task) -> str:
    params = task.params
    return "oracle" if params["policy"] == "oracle" else ("paged+prefix" if params["enable_prefix_caching"] else "paged")


def draw_prefix(runs, outdir, quick: bool):
    fig, axes = new_figure(1, 2, size=(12, 4.6))
    rows = []
    for ax, (shot, prefix) in zip(axes, PREFIXES.items()):
        for system, (_, label) in PREFIX_SYSTEMS.items():
            mine = [(t, r) for t, r in runs if t.params["prefix_len"] == prefix and _prefix_system(t) == system]
            rates = [t.params["rate"] for t, _ in mine]
            latency = [r.summary["normalized_latency_s_per_token"] for _, r in mine]
            ax.plot(rates, [np.nan if v is None else v for v in latency], marker="o", markersize=5,
                    color=PREFIX_COLORS[system], label=label)
            for (task, result), value in zip(mine, latency):
                s = result.summary
                rows.append({"prefix": shot, "prefix_len": prefix, "system": system, "rate": task.params["rate"],
                             "normalized_latency_s_per_token": value, "throughput_req_per_s": s["throughput_req_per_s"],
                             "mean_batch_size": s["mean_batch_size"], "num_preemptions": s["num_preemptions"],
                             "trace_duration_s": PREFIX_DURATION[quick]})
        ax.set_ylim(0, 1.0)
        ax.set_xlim(0, None)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("normalized latency (s/token)")
        ax.set_title(f"({'ab'[prefix == 341]}) {shot} prefix, {prefix} tokens")
    axes[0].legend(loc="upper left", frameon=False)
    fig.suptitle("Shared few-shot prefix, the paper's Fig. 16 (LLaMA-13B, 1x A100-40GB, block size 16)", fontsize=12)
    caption(fig, f"Requests: the prefix + Alpaca-shaped own prompt and output (standing in for WMT16 En-De "
                 f"sentences), Poisson arrivals, {PREFIX_DURATION[quick]:g} s traces (the paper: 1 hour). The paper "
                 "reports vLLM at 1.67x (1-shot) and 3.58x (5-shot) Orca (Oracle)'s throughput.")
    return save(fig, rows, outdir, "shared_prefix")
