"""Throughput: normalized latency against request rate (paper Fig. 12) and requests batched (Fig. 13).

Normalized latency is a request's end-to-end latency divided by its output length, averaged over requests
(section 6.1). Below a system's capacity it stays flat; past it the queue grows for as long as requests keep
arriving, so latency explodes: the knee is the highest rate the system sustains. The paper ran 1-hour
traces; shorter traces here give the same knees (past a knee, a longer trace only makes latency higher).
Static batching is FasterTransformer-style: a batch is admitted only when nothing runs, Max reservation.
"""
from __future__ import annotations

import numpy as np
from matplotlib.patches import Patch

from ..drivers.sweep import Task
from .style import SETUP, SYSTEM_COLORS, SYSTEM_LABELS, SYSTEM_MARKERS, caption, new_figure, save

SYSTEMS = ("static", "max", "pow2", "oracle", "paged")
WORKLOADS = ("sharegpt", "alpaca")
WORKLOAD_LABELS = {"sharegpt": "ShareGPT", "alpaca": "Alpaca"}
# Rates (req/s) spanning every system's knee for OPT-13B on one A100-40GB; quick: three of them. A system is
# run only up to its cap: past it its latency is far above the axis (the knee is already drawn), and
# overloaded runs are the costly ones.
RATES = {
    "sharegpt": {False: (0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0), True: (0.5, 2.0, 3.0)},
    "alpaca": {False: (2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0), True: (5.0, 30.0, 50.0)},
}
RATE_CAP = {"sharegpt": {"static": 0.75, "max": 1.5, "pow2": 1.5, "oracle": 2.5, "paged": 3.0},
            "alpaca": {"static": 10.0, "max": 20.0, "pow2": 60.0, "oracle": 70.0, "paged": 80.0}}
DURATION = {"sharegpt": {False: 600.0, True: 40.0}, "alpaca": {False: 90.0, True: 20.0}}  # seconds of arrivals (quick: long enough to fill the pool)
BATCH_RATE = {"sharegpt": 2.0, "alpaca": 30.0}  # the paper's Fig. 13 rates
# Paper Fig. 13 (OPT-13B): mean batched requests at those rates (13a: vLLM 2.2x Oracle, 4.3x Max, as its text says).
PAPER_BATCH = {"sharegpt": {"max": 7.00, "pow2": 9.81, "oracle": 13.62, "paged": 30.42},
               "alpaca": {"max": 7.00, "pow2": 43.24, "oracle": 72.75, "paged": 132.44}}
Y_LIMIT = {"sharegpt": 1.0, "alpaca": 1.0}  # s/token, as the paper's Fig. 12 axes


def system_kwargs(system: str) -> dict:
    return {"policy": "max", "scheduler": "static"} if system == "static" else {"policy": system, "scheduler": "v0"}


def _task(system: str, workload: str, rate: float, quick: bool) -> Task:
    return Task.of(workload=workload, rate=rate, duration=DURATION[workload][quick], **system_kwargs(system))


def _system(task: Task) -> str:
    return "static" if task.params.get("scheduler") == "static" else task.params["policy"]


def latency_tasks(quick: bool) -> list[Task]:
    return [_task(s, w, r, quick) for w in WORKLOADS for s in SYSTEMS for r in RATES[w][quick]
            if quick or r <= RATE_CAP[w][s]]


def draw_latency(runs, outdir, quick: bool):
    fig, axes = new_figure(1, 2, size=(14.5, 4.8))
    rows = []
    for ax, workload in zip(axes, WORKLOADS):
        for system in SYSTEMS:
            mine = [(t, r) for t, r in runs if t.params["workload"] == workload and _system(t) == system]
            rates = [t.params["rate"] for t, _ in mine]
            latency = [r.summary["normalized_latency_s_per_token"] for _, r in mine]
            ax.plot(rates, [np.nan if v is None else v for v in latency], marker=SYSTEM_MARKERS[system],
                    color=SYSTEM_COLORS[system], label=SYSTEM_LABELS[system], markersize=5)
            for task, result in mine:
                rows.append({"workload": workload, "system": system, **latency_row(task, result), "trace_duration_s":
                             DURATION[workload][quick]})
        ax.set_ylim(0, Y_LIMIT[workload])
        ax.set_xlim(0, None)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("normalized latency (s/token)")
        ax.set_title(f"{WORKLOAD_LABELS[workload]} ({DURATION[workload][quick]:g} s traces)")
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)  # outside: inside, it covered curves
    fig.suptitle(f"Normalized latency vs request rate, the paper's Fig. 12 ({SETUP})", fontsize=12)
    caption(fig, "Mean over requests of end-to-end latency / output length. Traces are shorter than the paper's "
                 "1 hour (ShareGPT %g s, Alpaca %g s of arrivals): the knees are where they are, but past a knee "
                 "a longer trace climbs higher. Each system is run up to a little past its knee; points above the "
                 "axis are in the CSV."
                 % (DURATION["sharegpt"][quick], DURATION["alpaca"][quick]))
    return save(fig, rows, outdir, "latency_vs_rate")


def latency_row(task: Task, result) -> dict:
    s = result.summary
    return {"policy": task.params["policy"], "scheduler": s["scheduler"], "rate": task.params["rate"],
            "normalized_latency_s_per_token": s["normalized_latency_s_per_token"],
            "throughput_req_per_s": s["throughput_req_per_s"], "mean_batch_size": s["mean_batch_size"],
            "num_requests": s["num_requests"], "num_preemptions": s["num_preemptions"]}


def batch_tasks(quick: bool) -> list[Task]:
    return [_task(s, w, BATCH_RATE[w], quick) for w in WORKLOADS for s in SYSTEMS if s != "static"]


def draw_batch(runs, outdir, quick: bool):
    fig, axes = new_figure(1, 2, size=(12, 4.6))
    rows = []
    for ax, workload in zip(axes, WORKLOADS):
        mine = [(t, r) for t, r in runs if t.params["workload"] == workload]
        systems = [_system(t) for t, _ in mine]
        values = [r.summary["mean_batch_size"] for _, r in mine]
        paper = [PAPER_BATCH[workload][s] for s in systems]
        x = np.arange(len(mine))
        ax.bar(x - 0.2, values, width=0.4, color=[SYSTEM_COLORS[s] for s in systems])
        ax.bar(x + 0.2, paper, width=0.4, color="white", edgecolor=[SYSTEM_COLORS[s] for s in systems], hatch="///")
        for xi, v, p in zip(x, values, paper):
            ax.text(xi - 0.2, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
            ax.text(xi + 0.2, p, f"{p:.1f}", ha="center", va="bottom", fontsize=8, color="#555555")
        ax.set_xticks(x, [SYSTEM_LABELS[s] for s in systems], fontsize=9)
        ax.set_ylabel("mean batched requests")
        rate, duration = BATCH_RATE[workload], DURATION[workload][quick]
        ax.set_title(f"{WORKLOAD_LABELS[workload]}, {rate:g} req/s ({duration:g} s trace)")
        ax.legend(handles=[Patch(color="#777777", label="simulated"),
                           Patch(facecolor="white", edgecolor="#777777", hatch="///", label="paper (Fig. 13)")],
                  loc="upper left", frameon=False)
        for (task, result), s, p in zip(mine, systems, paper):
            rows.append({"workload": workload, "system": s, **latency_row(task, result), "paper_mean_batch_size": p,
                         "trace_duration_s": duration})
    fig.suptitle(f"Requests batched per iteration, the paper's Fig. 13 ({SETUP})", fontsize=12)
    caption(fig, "Mean over iterations of the requests in the running state. Hatched: the paper's numbers "
                 "(1-hour traces). A system below its capacity batches what arrives; memory caps it above.")
    return save(fig, rows, outdir, "batch_size")
