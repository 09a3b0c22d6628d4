"""Every KV memory manager on the same traces: where the memory goes, how many requests it batches, and how much
of a conversation's history each prefix cache hands back.

Panel (a), Fig. 2's measure for all the managers: the time-weighted five-share breakdown of the whole pool and the
mean batch size, on the trace `memory_waste` uses (ShareGPT-shaped requests at 2 req/s, OPT-13B / A100-40GB, the
paper's scheduler): the Orca baselines (max, pow2, oracle: contiguous runs at token granularity, buddy allocator),
vAttention (sim/kv/vattention.py: one contiguous virtual buffer per request, physical pages mapped on demand, at
two page sizes that hold whole OPT-13B tokens), vLLM's paged blocks of 16 and SGLang's radix tree at page size 1.

Panel (b), the prefix caches: the share of prompt tokens found in the cache (tokens, as vLLM counts hits) against
the block or page size (1, 16, 64), for vLLM's hashed full blocks (`paged`, enable_prefix_caching) and the radix
tree (`radix`), on a conversation trace (sim.workloads.conversation: each turn's prompt is the whole history, replies' ids
known, no history limit, vLLM v1's scheduler). The CSV adds the prompt tokens actually computed (looked up minus
hit), the mean batch size, the normalized latency and the preemptions.

Cost model: sim.clock.cost's roofline prices every step. It charges a paged kernel a gather overhead per block
(`block_gather_tokens`), so page size 1 reads K/V several times slower than blocks of 16: the radix runs at page
1 are slower, which on a busy trace means larger batches, more memory pressure and fewer hits.

NOTE: a third panel, the hybrid manager against paged on a Gemma-3-shaped model (sliding-window and full
attention layers), belongs here once sim/kv/hybrid*.py lands: its runs go into `manager_tasks` (tagged
panel "hybrid" in `_panel`) and its axis into `draw_managers` beside (a) and (b).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..drivers.sweep import Task
from ..kv import allocates_blocks_on_demand, pages_in_kib
from ..kv.base import SHARE_NAMES, PrefixCacheStats
from .memory import DURATION as WASTE_DURATION
from .memory import RATE as WASTE_RATE
from .style import SHARE_COLORS, SHARE_LABELS, SYSTEM_LABELS, caption, new_figure, percent_axis, save

# Panel (a): (policy, extra run() keywords) in drawing order. vAttention's pages: 640 KiB and 2560 KiB per layer
# per K/V buffer are 64 and 256 OPT-13B tokens (10 KiB a token).
SYSTEMS = (("max", {}), ("pow2", {}), ("oracle", {}), ("vattention", {"page_kib": 640.0}),
           ("vattention", {"page_kib": 2560.0}), ("paged", {}), ("radix", {"block_size": 1}))
# (paged: sim.run's default block size, 16, left unnamed so that the task equals memory_waste's)
LABELS = {**SYSTEM_LABELS, "vattention": "vAttention", "radix": "SGLang (radix)"}
UNITS = {"paged": "blocks of {n}"}  # what a label calls a policy's blocks (default: pages)
# Panel (b)
CACHES = {"paged": "hashed full blocks (vLLM)", "radix": "radix tree (SGLang)"}
CACHE_STYLE = {"paged": dict(color="#1f77b4", marker="o"), "radix": dict(color="#2ca02c", marker="s")}
BLOCK_SIZES = (1, 16, 64)
SESSION_RATE = 0.2  # sessions/s: about 0.8 req/s with 4 turns per session on average
CONVERSATION_DURATION = {False: 1800.0, True: 300.0}  # seconds of session starts (later turns arrive after)


@dataclass(frozen=True, slots=True)
class PrefixCounts:
    """The KV manager's prefix-cache counters at the end of the run (PrefixCacheStats: tokens looked up, hit)."""

    name: str = "prefix_counts"

    def start(self) -> "_PrefixCountsRecorder":
        return _PrefixCountsRecorder()


class _PrefixCountsRecorder:
    stop_at = ()

    def __init__(self) -> None:
        self.kv = None

    def on_step(self, simulator, step) -> None:
        self.kv = simulator.kv

    def finish(self, result) -> dict:
        stats = self.kv.prefix_cache_stats() if self.kv is not None else PrefixCacheStats()
        return {f.name: getattr(stats, f.name) for f in fields(PrefixCacheStats)}


def _system_task(policy: str, extra: dict, quick: bool) -> Task:
    # NOTE: the same keywords as memory_waste's runs (sim/figures/memory.py), so that asking for both figures
    # runs the shared points once.
    return Task.of(policy=policy, scheduler="v0", workload="sharegpt", rate=WASTE_RATE, duration=WASTE_DURATION[quick],
                   **extra)


def _cache_task(policy: str, block_size: int, quick: bool) -> Task:
    return Task.of((PrefixCounts(),), policy=policy, block_size=block_size, workload="conversation",
                   rate=SESSION_RATE, duration=CONVERSATION_DURATION[quick], enable_prefix_caching=True)


def manager_tasks(quick: bool) -> list[Task]:
    return ([_system_task(p, extra, quick) for p, extra in SYSTEMS]
            + [_cache_task(p, bs, quick) for p in CACHES for bs in BLOCK_SIZES])


def _panel(task: Task) -> str:
    return "b" if task.params["workload"] == "conversation" else "a"


def _system_label(task: Task, block_size: int) -> str:
    policy = task.params["policy"]
    if pages_in_kib(policy):
        return f"{LABELS[policy]}\n{task.params['page_kib']:g} KiB pages\n({block_size} tokens)"
    if not allocates_blocks_on_demand(policy):
        return f"{LABELS[policy]}\ntoken runs"
    return f"{LABELS[policy]}\n" + UNITS.get(policy, "{n}-token pages").format(n=block_size)


def _system_rows(runs) -> list[dict]:
    rows = []
    for task, result in runs:
        s = result.summary
        rows.append({"panel": "a", "policy": task.params["policy"], "system": _system_label(task, s["block_size"]),
                     "block_size_tokens": s["block_size"], "page_kib": task.params.get("page_kib", ""),
                     **{name: s["memory"][name] for name in SHARE_NAMES},
                     "mean_batch_size": s["mean_batch_size"],
                     "normalized_latency_s_per_token": s["normalized_latency_s_per_token"],
                     "num_preemptions": s["num_preemptions"], "workload": "sharegpt", "rate": task.params["rate"],
                     "trace_duration_s": task.params["duration"]})
    return rows


def _cache_rows(runs) -> list[dict]:
    rows = []
    for task, result in runs:
        s, counts = result.summary, result.probes["prefix_counts"]
        rows.append({"panel": "b", "policy": task.params["policy"], "system": CACHES[task.params["policy"]],
                     "block_size_tokens": task.params["block_size"],
                     "prefix_hit_rate_tokens": s["prefix_cache_hit_rate_tokens"],
                     "prompt_tokens": counts["queried_tokens"], "hit_tokens": counts["hit_tokens"],
                     "computed_prompt_tokens": counts["queried_tokens"] - counts["hit_tokens"],
                     "mean_batch_size": s["mean_batch_size"],
                     "normalized_latency_s_per_token": s["normalized_latency_s_per_token"],
                     "num_preemptions": s["num_preemptions"], "num_requests": s["num_requests"],
                     "workload": "conversation", "rate": task.params["rate"],
                     "trace_duration_s": task.params["duration"]})
    return rows


def _draw_systems(ax, rows: list[dict]) -> None:
    labels = [r["system"] for r in rows]
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for name in SHARE_NAMES:
        values = np.array([r[name] for r in rows])
        ax.bar(x, values, bottom=bottom, color=SHARE_COLORS[name], label=SHARE_LABELS[name], width=0.62)
        for i, (v, b) in enumerate(zip(values, bottom)):
            if v >= 0.05:
                ax.text(i, b + v / 2, f"{v:.0%}", ha="center", va="center", fontsize=7.5)
        bottom += values
    percent_axis(ax)
    ax.set_ylim(0, 1)
    ax.set_xticks(x, labels, fontsize=7.5)
    ax.set_ylabel("share of the KV pool (time-weighted)")
    twin = ax.twinx()
    twin.plot(x, [r["mean_batch_size"] for r in rows], "D", color="black", markersize=6, label="mean batch size")
    for i, r in enumerate(rows):
        twin.annotate(f"{r['mean_batch_size']:.1f}", (i, r["mean_batch_size"]), textcoords="offset points",
                      xytext=(0, 6), ha="center", fontsize=8, fontweight="bold")
    twin.set_ylim(0, max(r["mean_batch_size"] for r in rows) * 1.25)
    twin.set_ylabel("mean batched requests")
    twin.grid(False)
    handles, names = ax.get_legend_handles_labels()
    more, more_names = twin.get_legend_handles_labels()
    ax.legend(handles + more, names + more_names, loc="upper left", bbox_to_anchor=(0.0, -0.2), ncol=3,
              frameon=False, fontsize=8)
    ax.set_title("(a) where the memory goes, and how many requests run (ShareGPT, 2 req/s)")


def _draw_caches(ax, rows: list[dict]) -> None:
    for policy, label in CACHES.items():
        mine = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["block_size_tokens"])
        ax.plot([r["block_size_tokens"] for r in mine], [r["prefix_hit_rate_tokens"] for r in mine], label=label,
                **CACHE_STYLE[policy])
    ax.set_xscale("log", base=2)
    ax.set_xticks(BLOCK_SIZES, [str(b) for b in BLOCK_SIZES])
    ax.minorticks_off()
    percent_axis(ax)
    ax.set_xlabel("block / page size (tokens)")
    ax.set_ylabel("prompt tokens found in the cache")
    ax.legend(loc="lower center", frameon=False, fontsize=8)
    ax.set_title("(b) prefix hits on conversations (zoomed)")


def _pick(rows: list[dict], policy: str, block_size: int) -> dict:
    return next(r for r in rows if r["policy"] == policy and r["block_size_tokens"] == block_size)


def _hits(rows: list[dict], policy: str) -> str:
    return "/".join(f"{_pick(rows, policy, b)['prefix_hit_rate_tokens']:.1%}" for b in BLOCK_SIZES)


def draw_managers(runs, outdir, quick: bool):
    systems = _system_rows([(t, r) for t, r in runs if _panel(t) == "a"])
    caches = _cache_rows([(t, r) for t, r in runs if _panel(t) == "b"])
    fig, (ax_a, ax_b) = new_figure(1, 2, size=(15, 5.6), gridspec_kw={"width_ratios": (2.4, 1)})
    _draw_systems(ax_a, systems)
    _draw_caches(ax_b, caches)
    paged, radix = _pick(systems, "paged", 16), _pick(systems, "radix", 1)
    hashed16, tree1, tree16 = _pick(caches, "paged", 16), _pick(caches, "radix", 1), _pick(caches, "radix", 16)
    fig.suptitle("KV memory managers on the same traces (OPT-13B, 1x A100-40GB)", fontsize=12)
    caption(fig, f"(a) ShareGPT-shaped requests, {WASTE_RATE:g} req/s for {WASTE_DURATION[quick]:g} s, the paper's "
                 "scheduler (memory_waste's runs); whole pool, time-weighted; external fragmentation includes free "
                 "slots a waiting request cannot use. (b) Synthetic conversations (sim.workloads.conversation), "
                 f"{SESSION_RATE:g} sessions/s for {CONVERSATION_DURATION[quick]:g} s, every prompt the whole history, "
                 "replies' ids known, vLLM v1's scheduler; hits counted in tokens over every admission, as vLLM. "
                 "Steps are priced by sim.clock.cost's roofline, which charges a per-block gather overhead: at page size 1 "
                 f"attention reads K/V several times slower, so radix at page 1 runs at {radix['normalized_latency_s_per_token']:.3g} "
                 f"s/token against paged's {paged['normalized_latency_s_per_token']:.3g} in (a), batching "
                 f"{radix['mean_batch_size']:.1f} requests against {paged['mean_batch_size']:.1f}. "
                 f"In (b) the tree finds {_hits(caches, 'radix')} of prompt tokens at page size 1/16/64, hashed "
                 f"blocks {_hits(caches, 'paged')} (computed prompt tokens at 1: {tree1['computed_prompt_tokens']:,} "
                 f"vs {_pick(caches, 'paged', 1)['computed_prompt_tokens']:,}); both cache a running request's pages as "
                 "soon as the step computing them is scheduled, and at size 1 both match per token: what differs is "
                 "eviction (the tree trims unlocked leaves from their ends, least recently used first; the hashed "
                 "cache evicts freed blocks least recently freed first). Page 1 matches any prefix length, and its "
                 f"slower steps batch {tree1['mean_batch_size']:.1f} requests against {tree16['mean_batch_size']:.1f} "
                 f"at 16, whose running K/V competes with cached history: the tree at 1 hits "
                 f"{'more' if tree1['prefix_hit_rate_tokens'] > hashed16['prefix_hit_rate_tokens'] else 'less'} than "
                 "hashed blocks of 16 here.", width=190)
    return save(fig, systems + caches, outdir, "memory_managers")
