"""Priority scheduling: latency per class, FCFS vs priority (not a figure of the paper; vLLM's
`--scheduling-policy priority`).

The paper's scheduler, and vLLM's default, serve requests first come, first served: under load every request
queues alike. vLLM also offers a priority policy (vllm/v1/core/sched/request_queue.py and scheduler.py): each
request carries an integer priority, the queues are ordered by (priority, arrival), the lower value first, and
when memory runs out the latest arrival of the highest value is preempted first (sim/scheduling/scheduler.py). Here a fifth of
the ShareGPT requests are of class 0 (interactive, say) and the rest of class 1 (batch), drawn with the seed; the
same traces run under both policies on vLLM v1's scheduler:

    left    mean time to first token per class against the request rate (log scale)
    right   normalized latency (end-to-end seconds per output token) per class against the request rate

Below the knee (~1.5 req/s for these 30-minute traces) nothing queues and the policies agree; past it FCFS makes
every class wait, while priority keeps class 0 near its unloaded latency and class 1 pays for it.
"""
from __future__ import annotations

from ..drivers.sweep import Task
from .style import SETUP, caption, new_figure, save

POLICIES = ("fcfs", "priority")
CLASSES = (0, 1)
SHARE = 0.2  # of the requests in class 0
RATES = {False: (1.0, 1.5, 1.75, 2.0, 2.25, 2.5), True: (1.5, 2.5)}  # req/s: below, at and past the knee
DURATION = {False: 1800.0, True: 120.0}  # seconds of arrivals
SEED = 0
CLASS_COLORS = {0: "#1f77b4", 1: "#ff7f0e"}
POLICY_STYLES = {"fcfs": dict(ls="--", marker="s", mfc="white"), "priority": dict(ls="-", marker="o")}
POLICY_LABELS = {"fcfs": "FCFS", "priority": "priority"}


def priority_tasks(quick: bool) -> list[Task]:
    base = {"policy": "paged", "workload": "sharegpt", "scheduler": "v1", "duration": DURATION[quick], "seed": SEED,
            "priority_share": SHARE}
    return [Task.of(**base, rate=r, scheduling_policy=p) for p in POLICIES for r in RATES[quick]]


def draw_priority(runs, outdir, quick: bool):
    rows = []
    for task, result in runs:
        s = result.summary
        for level in CLASSES:
            c = s["by_priority"][str(level)]
            rows.append({"scheduling_policy": task.params["scheduling_policy"], "rate": task.params["rate"],
                         "priority": level, "num_requests": c["num_requests"], "num_finished": c["num_finished"],
                         "mean_ttft_s": c["mean_ttft_s"], "p99_ttft_s": c["p99_ttft_s"],
                         "normalized_latency_s_per_token": c["normalized_latency_s_per_token"],
                         "mean_e2e_latency_s": c["mean_e2e_latency_s"], "run_num_preemptions": s["num_preemptions"],
                         "priority_share": SHARE, "trace_duration_s": DURATION[quick], "seed": SEED})
    rows.sort(key=lambda r: (POLICIES.index(r["scheduling_policy"]), r["rate"], r["priority"]))
    fig, (ttft, norm) = new_figure(1, 2, size=(12, 4.6))
    for policy in POLICIES:
        for level in CLASSES:
            mine = [r for r in rows if r["scheduling_policy"] == policy and r["priority"] == level]
            rates = [r["rate"] for r in mine]
            label = f"{POLICY_LABELS[policy]}, class {level}"
            style = {**POLICY_STYLES[policy], "color": CLASS_COLORS[level]}
            ttft.plot(rates, [r["mean_ttft_s"] for r in mine], label=label, **style)
            norm.plot(rates, [r["normalized_latency_s_per_token"] for r in mine], label=label, **style)
    ttft.set_yscale("log")
    ttft.set_ylabel("mean time to first token (s, log scale)")
    ttft.set_title("Waiting for the first token")
    norm.set_yscale("log")
    norm.set_ylabel("normalized latency (s/token, log scale)")
    norm.set_title("End to end, per output token")
    for ax in (ttft, norm):
        ax.set_xlabel("request rate (req/s)")
        ax.legend(loc="upper left", frameon=False, fontsize=8)
    fig.suptitle(f"Priority scheduling: two classes, FCFS vs priority ({SETUP}, ShareGPT, vLLM v1 scheduler)",
                 fontsize=12)
    top = max(RATES[quick])
    at = {(r["scheduling_policy"], r["priority"]): r["mean_ttft_s"] for r in rows if r["rate"] == top}
    caption(fig, "Class 0: %d%% of the requests, drawn with seed %d; class 1: the rest. Priority orders the queues by "
                 "(priority, arrival): class 0 is admitted first and preempted last; a class-0 arrival does not "
                 "preempt running class-1 requests (vLLM's rule). Same %g s traces for both policies at each rate. "
                 "At %g req/s the mean time to first token of class 0 is %.2f s under priority against %.1f s under "
                 "FCFS; class 1's %.1f s against %.1f s. Numbers in the CSV."
                 % (100 * SHARE, SEED, DURATION[quick], top, at["priority", 0], at["fcfs", 0], at["priority", 1],
                    at["fcfs", 1]))
    return save(fig, rows, outdir, "priority")
