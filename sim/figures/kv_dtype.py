"""An 8-bit KV cache at paper scale: the batch and the throughput that half the bytes per token buy.

vLLM's `--kv-cache-dtype fp8` (and int8 KV in TensorRT-LLM and LMDeploy) stores each cached key and value in one
byte instead of two. The pool has the same bytes (what vLLM's 90% rule leaves after the weights), so it holds about
twice the token slots, and a decode step reads half the K/V bytes (sim/clock/cost.py prices K/V traffic from
`ModelSpec.kv_bytes_per_token`, which follows `kv_dtype`, sim/base/specs.py). The 8-bit scheme drawn is the reference
engine's int8: 1 byte per element plus a float32 scale per token and KV head (OPT-13B: 130 bytes per token, head and
K/V against 256), so 1.94x the slots rather than 2x; its accuracy cost is measured on the engine
(figures/kv_accuracy.csv). The runs: the paper's Fig. 12 setup (OPT-13B, one A100-40GB, ShareGPT, the v0
scheduler, block size 16, 600 s traces); the 16-bit runs are the very runs of latency_vs_rate's paged curve.

Modelling approximation: quantizing on store and dequantizing in the kernel are taken as free (a few arithmetic
operations per byte in a memory-bound decode); the roofline's compute side is unchanged.
"""
from __future__ import annotations

from ..drivers.sweep import Task
from .style import SETUP, caption, new_figure, save

WORKLOAD = "sharegpt"
RATES = {False: (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0), True: (1.0, 3.0, 6.0)}
DURATION = {False: 600.0, True: 40.0}  # seconds of arrivals, as latency_vs_rate's ShareGPT traces
KV_DTYPES = {"auto": ("16-bit K/V (fp16)", "#1f77b4", "o"),
             "int8": ("8-bit K/V (int8 + a scale per token and head)", "#d62728", "s")}


def kv_dtype_tasks(quick: bool) -> list[Task]:
    # NOTE: the 16-bit runs pass no kv_dtype, so they merge with latency_vs_rate's paged runs (the same keywords)
    return [Task.of(workload=WORKLOAD, rate=rate, duration=DURATION[quick], policy="paged", scheduler="v0",
                    **({} if kv_dtype == "auto" else {"kv_dtype": kv_dtype}))
            for kv_dtype in KV_DTYPES for rate in RATES[quick]]


def draw_kv_dtype(runs, outdir, quick: bool):
    fig, (ax_lat, ax_batch, ax_tput) = new_figure(1, 3, size=(15, 4.6))
    rows = []
    for task, result in runs:
        s = result.summary
        rows.append({"kv_dtype": task.params.get("kv_dtype", "auto"), "rate": task.params["rate"],
                     "num_kv_slots": s["num_kv_slots"], "mean_batch_size": s["mean_batch_size"],
                     "normalized_latency_s_per_token": s["normalized_latency_s_per_token"],
                     "throughput_req_per_s": s["throughput_req_per_s"], "num_preemptions": s["num_preemptions"],
                     "num_requests": s["num_requests"], "trace_duration_s": DURATION[quick]})
    for kv_dtype, (label, color, marker) in KV_DTYPES.items():
        mine = sorted((r for r in rows if r["kv_dtype"] == kv_dtype), key=lambda r: r["rate"])
        label = f"{label}: {mine[0]['num_kv_slots']:,} token slots"
        x = [r["rate"] for r in mine]
        for ax, column in ((ax_lat, "normalized_latency_s_per_token"), (ax_batch, "mean_batch_size"),
                           (ax_tput, "throughput_req_per_s")):
            ax.plot(x, [r[column] for r in mine], marker=marker, color=color, label=label, markersize=5)
    for ax in (ax_lat, ax_batch, ax_tput):
        ax.set_xlabel("request rate (req/s)")
        ax.set_xlim(0, None)
        ax.set_ylim(0, None)
    ax_lat.set_ylim(0, 1.0)  # as the paper's Fig. 12 axes; the overloaded points are in the CSV
    ax_lat.set_title("(a) normalized latency")
    ax_lat.set_ylabel("s / token")
    ax_batch.set_title("(b) requests batched per iteration")
    ax_batch.set_ylabel("mean batched requests")
    ax_tput.set_title("(c) throughput")
    ax_tput.set_ylabel("finished requests / s")
    ax_tput.legend(loc="upper left", fontsize=8, frameon=False)
    top = max(RATES[quick])
    by = {(r["kv_dtype"], r["rate"]): r for r in rows}
    full, half = by["auto", top], by["int8", top]
    fig.suptitle(f"An 8-bit KV cache: the batch and throughput it buys ({SETUP}, ShareGPT, v0 scheduler)",
                 fontsize=12)
    caption(fig, f"Same KV bytes for both; {DURATION[quick]:g} s traces. 8-bit K/V holds {half['num_kv_slots']:,} "
                 f"token slots against {full['num_kv_slots']:,} ({half['num_kv_slots'] / full['num_kv_slots']:.2f}x) "
                 f"and each decode reads about half the K/V bytes. At {top:g} req/s offered (past both knees) it "
                 f"batches {half['mean_batch_size']:.1f} requests against {full['mean_batch_size']:.1f} and finishes "
                 f"{half['throughput_req_per_s']:.2f} req/s against {full['throughput_req_per_s']:.2f} "
                 f"({half['throughput_req_per_s'] / full['throughput_req_per_s']:.2f}x). Roofline cost model; "
                 "quantizing and dequantizing taken as free.")
    return save(fig, rows, outdir, "kv_dtype")
