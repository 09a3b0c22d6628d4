"""Sliding-window layers: vLLM's hybrid KV cache manager against keeping every layer as full attention (Gemma 3).

Gemma 3 interleaves five sliding-window layers (each attends to the last 1,024 tokens, in the 27B model) with one
full-attention layer. A pool that treats every layer as full attention (`policy="paged"` on the same model) keeps
every token's K/V in all 62 layers; the hybrid manager (sim/kv/hybrid.py) groups the layers as vLLM does and
returns a sliding group's blocks to the pool once the window has passed them, so a long sequence costs about
1/6 of the memory per token beyond the window. Both pools get the same bytes (what vLLM's 90% rule leaves on one
H100 after the weights). The trace: 200 requests arriving at once (the paper's offline batch style), prompts drawn
uniformly around each length (+-25%), outputs of 256-1,024 tokens, v1 scheduler; the roofline prices both alike
(sliding layers read at most the window, sim/clock/cost.py).
"""
from __future__ import annotations

from ..drivers.sweep import Task
from .style import caption, new_figure, save

MODEL, GPU = "gemma3-27b", "h100"
PROMPTS = {False: (1024, 2048, 4096, 8192, 16384), True: (1024, 8192)}
NUM_REQUESTS = {False: 200, True: 24}
SYSTEMS = {"paged": ("every layer as full attention (paged)", "#1f77b4", "o"),
           "hybrid": ("hybrid: sliding groups free their blocks", "#2ca02c", "s")}


def hybrid_tasks(quick: bool) -> list[Task]:
    return [Task.of(model=MODEL, gpu=GPU, policy=policy, workload="uniform", arrival="offline", duration=None,
                    rate=None, num_requests=NUM_REQUESTS[quick], prompt_len_range=(p * 3 // 4, p * 5 // 4),
                    output_len_range=(256, 1024), seed=0) for policy in SYSTEMS for p in PROMPTS[quick]]


def draw_hybrid(runs, outdir, quick: bool):
    fig, (ax_batch, ax_tput) = new_figure(1, 2, size=(12, 4.6))
    rows = []
    for task, result in runs:
        s = result.summary
        low, high = task.params["prompt_len_range"]
        rows.append({"system": task.params["policy"], "prompt_len": (low + high) // 2,
                     "prompt_len_low": low, "prompt_len_high": high, "mean_batch_size": s["mean_batch_size"],
                     "throughput_req_per_s": s["throughput_req_per_s"], "num_preemptions": s["num_preemptions"],
                     "mean_ttft_s": s["mean_ttft_s"], "num_kv_slots": s["num_kv_slots"],
                     "num_requests": s["num_requests"]})
    for system, (label, color, marker) in SYSTEMS.items():
        mine = sorted((r for r in rows if r["system"] == system), key=lambda r: r["prompt_len"])
        x = [r["prompt_len"] for r in mine]
        ax_batch.plot(x, [r["mean_batch_size"] for r in mine], marker=marker, color=color, label=label)
        ax_tput.plot(x, [r["throughput_req_per_s"] for r in mine], marker=marker, color=color, label=label)
    for ax in (ax_batch, ax_tput):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt length (tokens, +-25%)")
        ax.set_ylim(0, None)
        ax.legend(loc="upper right", fontsize=8, frameon=False)
    ax_batch.set_title("(a) requests batched per iteration")
    ax_batch.set_ylabel("mean batched requests")
    ax_tput.set_title("(b) throughput")
    ax_tput.set_ylabel("requests / s")
    by = {(r["system"], r["prompt_len"]): r for r in rows}
    longest = max(PROMPTS[quick])
    hyb, full = by["hybrid", longest], by["paged", longest]
    fig.suptitle("Gemma-3-27B on one H100: the hybrid KV cache manager vs every layer as full attention", fontsize=12)
    caption(fig, f"{NUM_REQUESTS[quick]} requests at t = 0, outputs 256-1024 tokens, same KV bytes for both (window "
                 f"1024 in 52 of 62 layers). At {longest}-token prompts the hybrid pool batches "
                 f"{hyb['mean_batch_size']:.1f} requests against {full['mean_batch_size']:.1f} and serves "
                 f"{hyb['throughput_req_per_s'] / full['throughput_req_per_s']:.1f}x the throughput "
                 f"({hyb['num_preemptions']} vs {full['num_preemptions']} preemptions). Roofline cost model.")
    return save(fig, rows, outdir, "hybrid_memory")
