"""A CPU offload tier for the prefix cache on multi-turn conversations (not a figure of the paper; vLLM's CPU
offloading connector, LMCache, SGLang's hierarchical cache).

In a conversation every turn's prompt repeats the history (sim/workloads/conversation.py), so the prefix cache could serve
most of it, if the history's blocks were still there when the user comes back after their think time. A GPU pool
evicts them first, to make room for the requests running meanwhile; the tier (sim/kv/offload.py) keeps what the
GPU evicts in host memory and reloads it over PCIe on a hit, the reload priced as a swap and added to the step. The
same conversation traces run with prefix caching on and a tier of 0 (none) to 256 GiB per GPU, on vLLM v1's
scheduler, at two session rates: below the knee and near it.

    left    the share of the admitted prompts' tokens found in the cache, on the GPU and in the tier (stacked)
    right   mean and p99 time to first token against the tier's size
"""
from __future__ import annotations

from ..drivers.sweep import Task
from ..workloads.conversation import DEFAULT_TURNS as CONVERSATION_TURNS
from .style import SETUP, caption, new_figure, save

TIER_GIB = {False: (0.0, 4.0, 16.0, 64.0, 256.0), True: (0.0, 16.0, 64.0)}  # per GPU; 0: prefix caching without a tier
RATES = {False: (0.5, 0.65), True: (0.65,)}  # new conversations per second
DURATION = {False: 600.0, True: 120.0}  # seconds of arrivals (of first turns; later turns follow their think time)
SEED = 0
RATE_COLORS = {0.5: "#1f77b4", 0.65: "#d62728"}


def offload_tasks(quick: bool) -> list[Task]:
    base = {"policy": "paged", "workload": "conversation", "scheduler": "v1", "duration": DURATION[quick],
            "seed": SEED, "enable_prefix_caching": True, "step_table": False}
    return [Task.of(**base, rate=r, cpu_offload_gib=g) for r in RATES[quick] for g in TIER_GIB[quick]]


def draw_offload(runs, outdir, quick: bool):
    rows = []
    for task, result in runs:
        s = result.summary
        tier = task.params["cpu_offload_gib"]
        cpu = s.get("prefix_cache_hit_rate_cpu_tokens") or 0.0  # (absent without a tier)
        rows.append({"rate": task.params["rate"], "cpu_offload_gib": tier, "num_offload_blocks": s.get(
                         "num_offload_blocks", 0), "num_requests": s["num_requests"],
                     "hit_rate_tokens": s["prefix_cache_hit_rate_tokens"],
                     "gpu_hit_rate_tokens": s["prefix_cache_hit_rate_tokens"] - cpu, "cpu_hit_rate_tokens": cpu,
                     "mean_ttft_s": s["mean_ttft_s"], "p99_ttft_s": s["p99_ttft_s"],
                     "normalized_latency_s_per_token": s["normalized_latency_s_per_token"],
                     "num_preemptions": s["num_preemptions"], "offloaded_blocks": s.get("offloaded_blocks", 0),
                     "reloaded_blocks": s.get("reloaded_blocks", 0), "reload_time_s": s.get("reload_time_s", 0.0),
                     "trace_duration_s": DURATION[quick], "seed": SEED})
    rows.sort(key=lambda r: (r["rate"], r["cpu_offload_gib"]))
    fig, (hits, ttft) = new_figure(1, 2, size=(12, 4.6))
    sizes = TIER_GIB[quick]
    width = 0.8 / len(RATES[quick])
    for k, rate in enumerate(RATES[quick]):
        mine = [r for r in rows if r["rate"] == rate]
        xs = [i + (k - (len(RATES[quick]) - 1) / 2) * width for i in range(len(mine))]
        color = RATE_COLORS[rate]
        gpu = [100 * r["gpu_hit_rate_tokens"] for r in mine]
        hits.bar(xs, gpu, width * 0.95, color=color, alpha=0.9, label=f"{rate:g} conv/s: GPU")
        hits.bar(xs, [100 * r["cpu_hit_rate_tokens"] for r in mine], width * 0.95, bottom=gpu, color=color,
                 alpha=0.35, hatch="//", label=f"{rate:g} conv/s: CPU tier")
        tiers = range(len(mine))
        ttft.plot(tiers, [r["mean_ttft_s"] for r in mine], marker="o", color=color, label=f"{rate:g} conv/s: mean")
        ttft.plot(tiers, [r["p99_ttft_s"] for r in mine], marker="s", ls="--", mfc="white", color=color,
                  label=f"{rate:g} conv/s: p99")
    labels = ["none" if g == 0 else f"{g:g}" for g in sizes]
    for ax in (hits, ttft):
        ax.set_xticks(range(len(sizes)), labels)
        ax.set_xlabel("CPU offload tier (GiB per GPU)")
    hits.legend(loc="upper left", frameon=False, fontsize=8)
    hits.set_ylabel("prompt tokens found in the cache (%)")
    hits.set_title("Prefix-cache hits per tier")
    ttft.set_yscale("log")
    ttft.set_ylabel("time to first token (s, log scale)")
    ttft.set_title("Time to first token")
    low, high = ttft.get_ylim()
    ttft.set_ylim(low, high * 30)  # room for the legend above the curves
    ttft.legend(loc="upper center", frameon=False, fontsize=8, ncol=2)
    fig.suptitle(f"A CPU offload tier for the prefix cache: multi-turn conversations ({SETUP}, vLLM v1 scheduler)",
                 fontsize=12)
    rate = max(RATES[quick])
    none, most = (next(r for r in rows if r["rate"] == rate and r["cpu_offload_gib"] == g) for g in (0.0, max(sizes)))
    caption(fig, "Conversations of %g turns on average (history as the prompt, think time between turns), %g s of "
                 "first arrivals, seed %d; prefix caching on in every run. Evicted cached blocks go to the tier "
                 "(LRU) and come back over PCIe on a hit, priced as a swap and added to the step; offloads are "
                 "taken as overlapped with compute. At %g conversations/s: %.0f%% of prompt tokens hit without a "
                 "tier, %.0f%% with %g GiB (%.0f%% from CPU memory); mean TTFT %.2f s -> %.2f s, p99 %.1f s -> "
                 "%.1f s. Numbers in the CSV."
                 % (CONVERSATION_TURNS, DURATION[quick], SEED, rate, 100 * none["hit_rate_tokens"],
                    100 * most["hit_rate_tokens"], max(sizes), 100 * most["cpu_hit_rate_tokens"],
                    none["mean_ttft_s"], most["mean_ttft_s"], none["p99_ttft_s"], most["p99_ttft_s"]))
    return save(fig, rows, outdir, "cpu_offload")
