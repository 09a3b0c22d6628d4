"""Speculative decoding under load: latency, batch and the KV memory the lookahead holds, k = 0, 2, 4, 8 (not a figure
of the paper; vLLM's `num_speculative_tokens`, Leviathan et al., ICML 2023).

Each decoding sequence verifies k draft tokens per step (sim/scheduling/scheduler.py), each accepted with probability alpha while
every draft before it was (sim/scheduling/speculative.py; no draft cost: an n-gram draft), so a step samples
(1 - alpha^(k+1)) / (1 - alpha) tokens per sequence on average instead of one. The verify step is priced by the
roofline as a decode plus a k-token chunk (sim/clock/loop.py): on a memory-bound A100 a few more tokens per sequence cost
little next to reading the weights and the K/V, so requests finish in fewer steps and the pool turns over faster.
The same ShareGPT traces run with every k, at two acceptance rates:

    left     normalized latency (end-to-end seconds per output token) against the request rate (log scale)
    middle   mean batched requests against the request rate
    right    the pool's slots held by draft K/V (lookahead slots, time-weighted) against the request rate

NOTE: the draft's own cost is not charged (an n-gram draft matches ids on the CPU); a draft model would add k forward
passes of its own per step. Under this roofline larger k keeps paying at alpha 0.8 because a verify step's extra
tokens are nearly free while the step is memory-bound: a GPU whose steps were compute-bound would see less.
"""
from __future__ import annotations

from ..drivers.sweep import Task
from .style import SETUP, caption, new_figure, save

KS = (0, 2, 4, 8)
ALPHAS = {False: (0.6, 0.8), True: (0.8,)}
RATES = {False: (2.0, 4.0, 6.0), True: (2.0, 4.0)}  # req/s: below the plain system's knee, past it, far past
KS_QUICK = (0, 4)
DURATION = {False: 300.0, True: 60.0}  # seconds of arrivals
SEED = 0
K_COLORS = {0: "black", 2: "#1f77b4", 4: "#2ca02c", 8: "#d62728"}
ALPHA_STYLES = {0.6: dict(ls="--", marker="s", mfc="white"), 0.8: dict(ls="-", marker="o")}


def _ks(quick: bool) -> tuple[int, ...]:
    return KS_QUICK if quick else KS


def speculative_tasks(quick: bool) -> list[Task]:
    base = {"policy": "paged", "workload": "sharegpt", "scheduler": "v1", "duration": DURATION[quick], "seed": SEED}
    tasks = [Task.of(**base, rate=r) for r in RATES[quick]]  # k = 0: plain decoding (no acceptance rate)
    tasks += [Task.of(**base, rate=r, num_speculative_tokens=k, acceptance_rate=a)
              for k in _ks(quick) if k for a in ALPHAS[quick] for r in RATES[quick]]
    return tasks


def _row(task: Task, s: dict, quick: bool) -> dict:
    k = task.params.get("num_speculative_tokens", 0)
    return {"num_speculative_tokens": k, "acceptance_rate": task.params.get("acceptance_rate", ""),
            "rate": task.params["rate"], "normalized_latency_s_per_token": s["normalized_latency_s_per_token"],
            "mean_ttft_s": s["mean_ttft_s"], "mean_itl_mean_s": s["mean_itl_mean_s"],
            "mean_batch_size": s["mean_batch_size"], "throughput_req_per_s": s["throughput_req_per_s"],
            "num_preemptions": s["num_preemptions"], "num_steps": s["num_steps"],
            "draft_acceptance": s["draft_acceptance"] if k else "",
            "mean_lookahead_slots": s["mean_lookahead_slots"] if k else 0.0,
            "lookahead_share": s["lookahead_share"] if k else 0.0, "token_states_share": s["memory"]["token_states"],
            "num_kv_slots": s["num_kv_slots"], "num_requests": s["num_requests"], "num_finished": s["num_finished"],
            "trace_duration_s": DURATION[quick], "seed": SEED}


def draw_speculative(runs, outdir, quick: bool):
    rows = sorted((_row(task, result.summary, quick) for task, result in runs),
                  key=lambda r: (r["num_speculative_tokens"], str(r["acceptance_rate"]), r["rate"]))
    fig, (norm, batch, memory) = new_figure(1, 3, size=(15, 4.6))
    curves = [(0, None)] + [(k, a) for k in _ks(quick) if k for a in ALPHAS[quick]]
    for k, alpha in curves:
        mine = [r for r in rows if r["num_speculative_tokens"] == k and (not k or r["acceptance_rate"] == alpha)]
        rates = [r["rate"] for r in mine]
        label = "k = 0 (plain decoding)" if not k else f"k = {k}, alpha = {alpha:g}"
        style = {**(ALPHA_STYLES[alpha] if k else dict(ls="-", marker="D")), "color": K_COLORS[k]}
        norm.plot(rates, [r["normalized_latency_s_per_token"] for r in mine], label=label, **style)
        batch.plot(rates, [r["mean_batch_size"] for r in mine], label=label, **style)
        memory.plot(rates, [100 * r["lookahead_share"] for r in mine], label=label, **style)
    norm.set_yscale("log")
    norm.set_ylabel("normalized latency (s/token, log scale)")
    norm.set_title("End to end, per output token")
    batch.set_ylabel("mean batched requests")
    batch.set_title("Batch size")
    memory.set_ylabel("KV pool held by draft tokens (% of slots)")
    memory.set_title("Lookahead slots (time-weighted)")
    for ax in (norm, batch, memory):
        ax.set_xlabel("request rate (req/s)")
    norm.legend(loc="upper left", frameon=False, fontsize=8)
    fig.suptitle(f"Speculative decoding: k draft tokens per step ({SETUP}, ShareGPT, vLLM v1 scheduler)", fontsize=12)
    top, alpha = max(RATES[quick]), max(ALPHAS[quick])
    at = {r["num_speculative_tokens"]: r for r in rows if r["rate"] == top and r["acceptance_rate"] in ("", alpha)}
    big = max(_ks(quick))
    caption(fig, "Each draft accepted with probability alpha while every earlier one was (i.i.d., seeded); the draft "
                 "costs nothing (n-gram); a verify step is priced as a decode plus a k-token chunk. Same %g s traces "
                 "for every k. At %g req/s: normalized latency %.3f s/token with k = 0 against %.3f with k = %d "
                 "(alpha %g); the drafts hold %.2f%% of the pool on average. Numbers in the CSV."
                 % (DURATION[quick], top, at[0]["normalized_latency_s_per_token"],
                    at[big]["normalized_latency_s_per_token"], big, alpha,
                    100 * at[big]["lookahead_share"]))
    return save(fig, rows, outdir, "speculative")
