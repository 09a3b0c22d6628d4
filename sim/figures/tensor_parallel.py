"""The paper's Fig. 12 for the bigger models: normalized latency against request rate for OPT-66B on 4 A100-40GB
and OPT-175B on 8 A100-80GB (Kwon et al., SOSP 2023, section 6.1 and Table 1), ShareGPT and Alpaca.

The same systems, traces and metric as `latency_vs_rate` (sim/figures/throughput.py, which draws the OPT-13B
panels): static batching, Orca Max/Pow2/Oracle and vLLM (paged), the paper's scheduler. Both setups run tensor
parallelism: the roofline divides each step's work over the GPUs and adds each layer's two all-reduces over
NVLink (sim/clock/cost.py's docstring), and the KV pool is what the GPUs' memory leaves after the weights
(sim.base.specs.kv_capacity_tokens: 9.8K token slots for OPT-66B, 57K for OPT-175B, against Table 1's 9.7K and 60.1K).

NOTE (rates): each panel's rates span every system's knee in this simulator, as the OPT-13B figure's do; each
system is run up to a little past its knee (RATE_CAP). The paper's x-axes are not restated here.
"""
from __future__ import annotations

import numpy as np

from ..drivers.sweep import Task
from .paper import PAPER
from .sampling import knee
from .style import SYSTEM_COLORS, SYSTEM_LABELS, SYSTEM_MARKERS, caption, new_figure, save
from .throughput import DURATION, SYSTEMS, WORKLOAD_LABELS, WORKLOADS, Y_LIMIT, latency_row, system_kwargs

SETUPS = {"opt-66b": ("a100-40gb", 4), "opt-175b": ("a100-80gb", 8)}  # model -> (gpu, num_gpus): paper Table 1
MODEL_LABELS = {"opt-66b": "OPT-66B, 4x A100-40GB", "opt-175b": "OPT-175B, 8x A100-80GB"}
RATES = {  # (model, workload) -> {quick: rates (req/s)}
    ("opt-66b", "sharegpt"): {False: (0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0), True: (0.25, 0.75, 1.5)},
    ("opt-66b", "alpaca"): {False: (1.0, 2.0, 3.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0),
                           True: (2.0, 15.0, 40.0)},
    ("opt-175b", "sharegpt"): {False: (0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0),
                             True: (0.5, 2.5, 4.5)},
    ("opt-175b", "alpaca"): {False: (1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0),
                            True: (5.0, 20.0, 50.0)},
}
RATE_CAP = {  # the highest rate each system runs at (full mode): a little past its knee
    ("opt-66b", "sharegpt"): {"static": 0.5, "max": 0.75, "pow2": 0.75, "oracle": 1.25, "paged": 2.0},
    ("opt-66b", "alpaca"): {"static": 2.0, "max": 5.0, "pow2": 25.0, "oracle": 40.0, "paged": 60.0},
    ("opt-175b", "sharegpt"): {"static": 0.5, "max": 2.5, "pow2": 2.5, "oracle": 4.0, "paged": 6.0},
    ("opt-175b", "alpaca"): {"static": 10.0, "max": 20.0, "pow2": 70.0, "oracle": 70.0, "paged": 70.0},
}
NAME = "latency_vs_rate_tp"


def tp_tasks(quick: bool) -> list[Task]:
    return [Task.of(model=model, gpu=gpu, num_gpus=n, workload=w, rate=r, duration=DURATION[w][quick],
                    **system_kwargs(s))
            for model, (gpu, n) in SETUPS.items() for w in WORKLOADS for s in SYSTEMS for r in RATES[model, w][quick]
            if quick or r <= RATE_CAP[model, w][s]]


def _system(task: Task) -> str:
    return "static" if task.params.get("scheduler") == "static" else task.params["policy"]


def _panel(runs, model: str, workload: str) -> list:
    return [(t, r) for t, r in runs if t.params["model"] == model and t.params["workload"] == workload]


def sustained_rates(runs, model: str, workload: str) -> dict[str, tuple[float | None, bool]]:
    """system -> (the highest rate it sustains under Y_LIMIT[workload] s/token, whether that is only a lower bound:
    the system never crossed the limit at the rates run)."""
    out = {}
    for system in SYSTEMS:
        mine = [(t.params["rate"], r.summary["normalized_latency_s_per_token"]) for t, r in _panel(runs, model, workload)
                if _system(t) == system]
        rates, latency = [r for r, _ in mine], [v for _, v in mine]
        best = knee(rates, latency, Y_LIMIT[workload])
        out[system] = best, best is not None and best >= max(rates)
    return out


def gain(paged: tuple[float | None, bool], other: tuple[float | None, bool]) -> str:
    """vLLM's sustained rate over another system's, each (rate, is_lower_bound) as sustained_rates gives them: "-"
    where either sustains no rate run, ">= " where only vLLM's is a lower bound (both bounds: the ratio of the two)."""
    (mine, mine_bound), (theirs, theirs_bound) = paged, other
    if mine is None or theirs is None:
        return "-"
    return f"{'>= ' if mine_bound and not theirs_bound else ''}{mine / theirs:.2g}x"


def draw_tp(runs, outdir, quick: bool):
    fig, axes = new_figure(2, 2, size=(13, 8.8))
    rows, gains = [], []
    for col, (model, (gpu, n)) in enumerate(SETUPS.items()):
        for row, workload in enumerate(WORKLOADS):
            ax = axes[row, col]
            sustained = sustained_rates(runs, model, workload)
            for system in SYSTEMS:
                mine = sorted(((t, r) for t, r in _panel(runs, model, workload) if _system(t) == system),
                              key=lambda tr: tr[0].params["rate"])
                rates = [t.params["rate"] for t, _ in mine]
                latency = [r.summary["normalized_latency_s_per_token"] for _, r in mine]
                best, bound = sustained[system]
                shown = "-" if best is None else (">= " if bound else "") + f"{best:g}"
                ax.plot(rates, [np.nan if v is None else v for v in latency], marker=SYSTEM_MARKERS[system],
                        color=SYSTEM_COLORS[system], markersize=5, label=f"{SYSTEM_LABELS[system]}: {shown} req/s")
                for task, result in mine:
                    rows.append({"model": model, "gpu": gpu, "num_gpus": n, "workload": workload, "system": system,
                                 **latency_row(task, result), "num_kv_slots": result.summary["num_kv_slots"],
                                 "sustained_rate": best, "sustained_is_lower_bound": bound,
                                 "trace_duration_s": DURATION[workload][quick]})
            ax.set_ylim(0, Y_LIMIT[workload])
            ax.set_xlim(0, None)
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel("normalized latency (s/token)")
            ax.set_title(f"({'ab'[col]}{row + 1}) {MODEL_LABELS[model]}, {WORKLOAD_LABELS[workload]} "
                         f"({DURATION[workload][quick]:g} s traces)", fontsize=10)
            ax.legend(loc="upper left", frameon=False, fontsize=7, title="sustained (under 1 s/token)",
                      title_fontsize=7)
            over = {s: gain(sustained["paged"], sustained[s]) for s in ("oracle", "max")}
            gains.append(f"{MODEL_LABELS[model].split(',')[0]} {WORKLOAD_LABELS[workload]} {over['oracle']} / "
                         f"{over['max']}")
    fig.suptitle("Normalized latency vs request rate with tensor parallelism, the paper's Fig. 12 (OPT-66B, "
                 "OPT-175B; block size 16, Poisson arrivals)", fontsize=12)
    oracle, most = (PAPER[f"fig12.sharegpt.{s}"].value for s in ("oracle", "max"))
    caption(fig, "Mean over requests of end-to-end latency / output length; the paper's scheduler; the roofline with "
                 "tensor parallelism's all-reduces (sim/clock/cost.py). vLLM's sustained rate over Orca (Oracle)'s / "
                 f"Orca (Max)'s: {'; '.join(gains)} (the paper, ShareGPT over OPT-13B, 66B and 175B: "
                 f"{oracle[0]:g}-{oracle[1]:g}x / {most[0]:g}-{most[1]:g}x). Traces are shorter than the paper's "
                 "1 hour; each system is run up to a little past its knee, points above the axis are in the CSV.",
            width=165)
    return save(fig, rows, outdir, NAME)
