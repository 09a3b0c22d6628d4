"""vAttention's page size: where a virtually contiguous KV cache sits between paging and contiguous reservation.

vAttention (Prabhu et al., ASPLOS 2025; sim/kv/vattention.py) gives every request a contiguous *virtual* range for
its whole context and maps physical pages into it as tokens arrive. With small pages it keeps memory as paging does
(only the unused tail of each request's last page is wasted); as the page grows, each request holds more slots it
has not filled yet, and at a page of a whole context it reserves what Orca (Max) reserves. This figure runs the
memory figures' trace (ShareGPT-shaped requests at 2 req/s on OPT-13B / A100-40GB, the paper's scheduler) through
vAttention at pages of 1 to 2048 tokens (OPT-13B keeps 10 KiB of K, or of V, per token per layer, so a page of
640 KiB holds 64 tokens; vAttention's own sizes, 64 KiB and 2 MiB, are not whole tokens of OPT-13B) beside Orca
(Max), Orca (Oracle) and the paged pool (block 16): the share of the memory in use that holds token states, and the
mean batch size. Mapping a page costs no time here (sim/kv/vattention.py, NOTE), and the roofline prices
vAttention's attention as a contiguous read (no block-gather overhead, sim/clock/cost.py).
"""
from __future__ import annotations

import numpy as np

from ..drivers.sweep import Task
from ..kv import pages_in_kib
from ..kv.base import SHARE_NAMES
from .memory import DURATION, RATE
from .style import (
    SETUP,
    SHARE_COLORS,
    SHARE_LABELS,
    SYSTEM_COLORS,
    SYSTEM_LABELS,
    caption,
    new_figure,
    percent_axis,
    save,
)

TOKEN_KIB = 10  # OPT-13B: 40 heads x 128 x 2 bytes of K (or V) per token per layer
PAGE_TOKENS = {False: (1, 4, 16, 64, 256, 512, 1024, 2048), True: (1, 64, 2048)}
BASELINES = ("max", "oracle", "paged")


def _common(quick: bool) -> dict:
    return {"scheduler": "v0", "workload": "sharegpt", "rate": RATE, "duration": DURATION[quick]}


def pages_tasks(quick: bool) -> list[Task]:
    return ([Task.of(policy=p, **_common(quick)) for p in BASELINES]
            + [Task.of(policy="vattention", page_kib=TOKEN_KIB * t, **_common(quick)) for t in PAGE_TOKENS[quick]])


def draw_pages(runs, outdir, quick: bool):
    fig, (ax_share, ax_batch) = new_figure(1, 2, size=(12.5, 4.8))
    rows = []
    for task, result in runs:
        s = result.summary
        policy = task.params["policy"]
        rows.append({"system": policy, "page_tokens": s["block_size"] if pages_in_kib(policy) else None,
                     "page_kib": task.params.get("page_kib"), **{name: s["memory"][name] for name in SHARE_NAMES},
                     "token_states_of_used": s["memory_busy"]["token_states"], "mean_batch_size": s["mean_batch_size"],
                     "num_preemptions": s["num_preemptions"],
                     "normalized_latency_s_per_token": s["normalized_latency_s_per_token"],
                     "trace_duration_s": DURATION[quick]})
    paging = [r for r in rows if r["system"] == "vattention"]
    pages = np.array([r["page_tokens"] for r in paging])
    bottom = np.zeros(len(paging))
    for name in SHARE_NAMES[:-1]:  # the memory in use, stacked: what each page size spends it on
        busy = np.array([r[name] for r in paging]) / (1 - np.array([r["free"] for r in paging]))
        ax_share.fill_between(pages, bottom, bottom + busy, color=SHARE_COLORS[name], label=SHARE_LABELS[name],
                              step=None, alpha=0.9)
        bottom += busy
    ax_batch.plot(pages, [r["mean_batch_size"] for r in paging], marker="o", color="#2ca02c", label="vAttention")
    for r in (r for r in rows if r["system"] != "vattention"):
        style = dict(color=SYSTEM_COLORS[r["system"]], linestyle="--", linewidth=1.3)
        label = SYSTEM_LABELS[r["system"]]
        ax_share.axhline(r["token_states_of_used"], **style, label=f"{label}: token states")
        ax_batch.axhline(r["mean_batch_size"], **style, label=label)
    for ax in (ax_share, ax_batch):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("vAttention page (tokens per layer per K/V buffer; x 10 KiB for OPT-13B)")
    percent_axis(ax_share)
    ax_share.set_ylim(0, 1)
    ax_share.set_title("(a) the memory in use, by what it holds")
    ax_share.legend(loc="lower left", fontsize=7, frameon=True, ncol=2)
    ax_batch.set_title("(b) requests batched per iteration")
    ax_batch.set_ylabel("mean batched requests")
    ax_batch.set_ylim(0, None)
    ax_batch.legend(loc="lower left", fontsize=8, frameon=False)
    by = {(r["system"], r["page_tokens"]): r for r in rows}
    small, large = by["vattention", min(pages)], by["vattention", max(pages)]
    fig.suptitle(f"vAttention: from paging to reservation as the page grows ({SETUP}; paper's scheduler)", fontsize=12)
    caption(fig, f"ShareGPT-shaped requests at {RATE:g} req/s, a {DURATION[quick]:g} s trace. Token states are "
                 f"{small['token_states_of_used']:.1%} of the memory in use with {min(pages)}-token pages (paged, "
                 f"block 16: {by['paged', None]['token_states_of_used']:.1%}) and {large['token_states_of_used']:.1%} "
                 f"with {max(pages)}-token pages (Orca (Max): {by['max', None]['token_states_of_used']:.1%}); mean "
                 f"batch {small['mean_batch_size']:.1f} vs {large['mean_batch_size']:.1f} (Max "
                 f"{by['max', None]['mean_batch_size']:.1f}). Mapping a page is free here; attention reads a "
                 "contiguous range (no block-gather cost).")
    return save(fig, rows, outdir, "vattention_pages")
