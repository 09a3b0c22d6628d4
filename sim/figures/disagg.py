"""Disaggregated prefill and decode against the same GPUs colocated: SLO attainment and goodput (not the paper's).

DistServe (Zhong et al., OSDI 2024) puts prompts and decodes on different GPUs and judges a serving system by its
goodput: the request rate it serves with at least 90% of requests meeting both a time-to-first-token (TTFT) and a
time-per-output-token (TBT) target, per GPU. Here four GPUs serve ShareGPT-shaped requests for OPT-13B (the vLLM
paper's setup) as four colocated instances (vLLM v1 with chunked prefill, and the paper's v0 scheduler, which runs
prompts in steps of their own, as the vLLM DistServe compared with) or split 1P3D, 2P2D, 3P1D (sim.disagg: K/V over
a 25 GB/s link). SLOs: DistServe's chatbot targets for OPT-13B, TTFT 0.25 s and TBT 0.1 s. Two GPUs: the paper's
A100-40GB and the A100-80GB of DistServe's testbed.

    left     SLO attainment against the cluster's request rate (the 90% line: DistServe's target)
    middle   p90 time to first token
    right    p90 of each request's mean time between tokens
"""
from __future__ import annotations

import math

from ..disagg import DISTSERVE_ATTAINMENT, DISTSERVE_SLO_TBT, DISTSERVE_SLO_TTFT, ClusterConfig, run_cluster
from ..drivers.sweep import Task
from .style import caption, new_figure, percent_axis, save

NAME = "disagg_goodput"
MODEL = "opt-13b"
GPUS = {"a100-40gb": "A100-40GB (the vLLM paper's)", "a100-80gb": "A100-80GB (DistServe's)"}
NUM_GPUS = 4
SYSTEMS = {  # name -> (cluster, scheduler, label, colour, marker)
    "colocated": (ClusterConfig(num_prefill=2, num_decode=2, colocated=True), "v1",
                  "4 colocated, v1 (chunked prefill)", "#1f77b4", "o"),
    "colocated-v0": (ClusterConfig(num_prefill=2, num_decode=2, colocated=True), "v0",
                     "4 colocated, v0 (prefill-only steps)", "#7f7f7f", "v"),
    "1P3D": (ClusterConfig(num_prefill=1, num_decode=3), "v1", "disaggregated 1P3D", "#2ca02c", "s"),
    "2P2D": (ClusterConfig(num_prefill=2, num_decode=2), "v1", "disaggregated 2P2D", "#ff7f0e", "^"),
    "3P1D": (ClusterConfig(num_prefill=3, num_decode=1), "v1", "disaggregated 3P1D", "#d62728", "D"),
}
RATES = {  # req/s, the whole cluster's, per GPU: past every system's knee
    False: {"a100-40gb": (2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0),
            "a100-80gb": (4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 28.0, 32.0)},
    True: {"a100-40gb": (4.0, 8.0), "a100-80gb": (4.0, 8.0)},
}
DURATION = {False: 240.0, True: 40.0}  # seconds of arrivals
SEED = 0


def disagg_tasks(quick: bool) -> list[Task]:
    return [Task.of(runner=run_cluster, cluster=cluster, scheduler=scheduler, model=MODEL, gpu=gpu,
                    workload="sharegpt", rate=rate, duration=DURATION[quick], seed=SEED, slo_ttft=DISTSERVE_SLO_TTFT,
                    slo_tbt=DISTSERVE_SLO_TBT)
            for gpu in GPUS for cluster, scheduler, *_ in SYSTEMS.values() for rate in RATES[quick][gpu]]


def _system(params: dict) -> str:
    cluster = params["cluster"]
    if cluster.colocated:
        return "colocated" if params["scheduler"] == "v1" else "colocated-v0"
    return cluster.name


def goodput_per_gpu(rows: list[dict], gpu: str, system: str) -> str:
    """DistServe's goodput: the highest swept rate at which at least 90% of requests met both SLOs (every lower
    rate too), per GPU, as text: '>= x' where even the highest swept rate met them, '< x' where the lowest missed."""
    mine = sorted((r for r in rows if r["gpu"] == gpu and r["system"] == system), key=lambda r: float(r["rate"]))
    best = None
    for row in mine:
        if float(row["slo_attainment"]) < DISTSERVE_ATTAINMENT:
            break
        best = float(row["rate"])
    if best is None:
        return f"< {float(mine[0]['rate']) / NUM_GPUS:g}"
    return f"{'>= ' if best == float(mine[-1]['rate']) else ''}{best / NUM_GPUS:g}"


def draw_disagg(runs, outdir, quick: bool):
    rows = []
    for task, result in runs:
        s = result.summary
        rows.append({"gpu": s["gpu"], "system": _system(task.params), "cluster": s["cluster"],
                     "scheduler": s["scheduler"], "rate": s["rate"], "num_requests": s["num_requests"],
                     "slo_ttft_s": s["slo_ttft_s"], "slo_tbt_s": s["slo_tbt_s"], "slo_attainment": s["slo_attainment"],
                     "goodput_req_per_s": s["goodput_req_per_s"], "p50_ttft_s": s["p50_ttft_s"],
                     "p90_ttft_s": s["p90_ttft_s"], "p90_itl_mean_s": s["p90_itl_mean_s"],
                     "mean_itl_mean_s": s["mean_itl_mean_s"], "num_preemptions": s["num_preemptions"],
                     "mean_transfer_s": s["mean_transfer_s"], "link_bandwidth_gb_s": s["link_bandwidth_gb_s"],
                     "duration_s": DURATION[quick]})
    fig, axes = new_figure(len(GPUS), 3, size=(15, 4.2 * len(GPUS)), squeeze=False)
    for (gpu, gpu_label), (attain, ttft, tbt) in zip(GPUS.items(), axes):
        for system, (_, _, label, color, marker) in SYSTEMS.items():
            mine = sorted((r for r in rows if r["gpu"] == gpu and r["system"] == system), key=lambda r: r["rate"])
            x = [r["rate"] for r in mine]
            style = {"color": color, "marker": marker, "label": label}
            attain.plot(x, [r["slo_attainment"] for r in mine], **style)
            ttft.plot(x, [_finite(r["p90_ttft_s"]) for r in mine], **style)
            tbt.plot(x, [_finite(r["p90_itl_mean_s"]) for r in mine], **style)
        attain.axhline(DISTSERVE_ATTAINMENT, color="black", lw=0.8, ls="--")
        ttft.axhline(DISTSERVE_SLO_TTFT, color="black", lw=0.8, ls="--")
        tbt.axhline(DISTSERVE_SLO_TBT, color="black", lw=0.8, ls="--")
        attain.set_ylim(0, 1.02)
        percent_axis(attain)
        attain.set_title(f"(a) {gpu_label}: both SLOs met")
        ttft.set_title("(b) p90 time to first token (SLO dashed)")
        tbt.set_title("(c) p90 mean time between tokens (SLO dashed)")
        attain.set_ylabel("requests meeting both SLOs")
        for ax in (ttft, tbt):
            ax.set_yscale("log")
            ax.set_ylabel("seconds")
        for ax in (attain, ttft, tbt):
            ax.set_xlabel(f"request rate of the {NUM_GPUS}-GPU cluster (req/s)")
        attain.legend(loc="lower left", fontsize=8, frameon=False)
    fig.suptitle(f"Disaggregated prefill/decode vs colocated on {NUM_GPUS} GPUs: OPT-13B, ShareGPT, SLOs TTFT "
                 f"{DISTSERVE_SLO_TTFT} s and TBT {DISTSERVE_SLO_TBT} s (DistServe's chatbot)", fontsize=12)
    per_gpu = "; ".join(f"{gpu}: " + ", ".join(f"{system} {goodput_per_gpu(rows, gpu, system)}" for system in SYSTEMS)
                        for gpu in GPUS)
    preempted = "; ".join(f"{gpu} at {max(RATES[quick][gpu]):g} req/s: " + ", ".join(
        f"{r['system']} {r['num_preemptions']}" for r in rows
        if r["gpu"] == gpu and r["rate"] == max(RATES[quick][gpu])) for gpu in GPUS)
    caption(fig, f"Goodput per GPU (DistServe: the highest swept rate with >= 90% of requests meeting both SLOs, / "
                 f"{NUM_GPUS}), req/s: {per_gpu}. {DURATION[quick]:g} s of Poisson arrivals per point, roofline cost "
                 "model, K/V moved over 25 GB/s + 100 us per request, routing by least prompt tokens assigned. "
                 f"Preemptions, {preempted}.")
    return save(fig, rows, outdir, NAME)


def _finite(value):
    """None (no request had the metric) as NaN, so matplotlib leaves a gap."""
    return math.nan if value is None else value
