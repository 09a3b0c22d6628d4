"""From the paper's scheduler to vLLM v1: what chunked prefill does to latency (not a figure of the paper).

The paper's scheduler (v0) runs a step of whole prompts whenever a request is admitted, and every running
request waits for it: a decode stalls for as long as the longest prompt in that step takes. vLLM v1 gives
every step a token budget, running requests first, and serves longer prompts in chunks mixed with the
decodes (Sarathi-Serve, Agrawal et al., OSDI 2024): a decode waits at most one budget's worth of prompt.
Two panels on the same traces (same seed per rate):

    left    the stall: p99 over requests of each request's largest gap between two tokens, against rate
    middle  what it costs: p50 and p99 time to first token, against rate (a chunked prompt takes more steps)
    right   the knob: at one rate, the token budget against the stall and the mean inter-token latency
"""
from __future__ import annotations

from ..drivers.sweep import Task
from .style import SETUP, caption, new_figure, save

SYSTEMS = {  # name -> run() keywords
    "v0": {"scheduler": "v0"},
    "v1-512": {"scheduler": "v1", "max_num_batched_tokens": 512},
    "v1-2048": {"scheduler": "v1", "max_num_batched_tokens": 2048},
}
LABELS = {"v0": "paper's scheduler (v0): prefill-only steps", "v1-512": "vLLM v1, chunked prefill, 512-token budget",
          "v1-2048": "vLLM v1, chunked prefill, 2048-token budget"}
COLORS = {"v0": "#d62728", "v1-512": "#1f77b4", "v1-2048": "#17becf"}
RATES = {False: (0.25, 0.5, 0.75, 1.0, 1.25, 1.5), True: (0.5, 1.5)}  # req/s, up to the knee of 30-minute traces
BUDGET_RATE = 1.0  # req/s of the budget sweep
BUDGETS = {False: (128, 256, 512, 1024, 2048, 4096), True: (128, 512, 2048)}
DURATION = {False: 1800.0, True: 120.0}  # seconds of arrivals
SEED = 0


def _base(quick: bool) -> dict:
    return {"policy": "paged", "workload": "sharegpt", "duration": DURATION[quick], "seed": SEED}


def chunked_tasks(quick: bool) -> list[Task]:
    tasks = [Task.of(**_base(quick), rate=r, **kw) for kw in SYSTEMS.values() for r in RATES[quick]]
    tasks += [Task.of(**_base(quick), rate=BUDGET_RATE, scheduler="v1", max_num_batched_tokens=b)
              for b in BUDGETS[quick]]
    return tasks + [Task.of(**_base(quick), rate=BUDGET_RATE, **SYSTEMS["v0"])]


def _system(task: Task) -> str:
    p = task.params
    return "v0" if p["scheduler"] == "v0" else f"v1-{p['max_num_batched_tokens']}"


def draw_chunked(runs, outdir, quick: bool):
    fig, (stall, ttft, knob) = new_figure(1, 3, size=(15, 4.6))
    rows, seen = [], set()
    for (task, result) in runs:
        key = (_system(task), task.params["rate"])
        if key in seen:  # the budget sweep repeats v1-512 / v1-2048 at BUDGET_RATE: one row each
            continue
        seen.add(key)
        s = result.summary
        rows.append({"system": key[0], "scheduler": s["scheduler"], "max_num_batched_tokens": s["max_num_batched_tokens"],
                     "rate": key[1], "p50_itl_max_s": s["p50_itl_max_s"], "p99_itl_max_s": s["p99_itl_max_s"],
                     "mean_itl_mean_s": s["mean_itl_mean_s"], "p50_ttft_s": s["p50_ttft_s"],
                     "p99_ttft_s": s["p99_ttft_s"], "normalized_latency_s_per_token": s["normalized_latency_s_per_token"],
                     "num_requests": s["num_requests"], "num_finished": s["num_finished"],
                     "num_preemptions": s["num_preemptions"], "trace_duration_s": DURATION[quick], "seed": SEED})
    for name in SYSTEMS:
        mine = sorted((r for r in rows if r["system"] == name and r["rate"] in RATES[quick]), key=lambda r: r["rate"])
        rates = [r["rate"] for r in mine]
        stall.plot(rates, [1e3 * r["p99_itl_max_s"] for r in mine], marker="o", color=COLORS[name], label=LABELS[name])
        ttft.plot(rates, [1e3 * r["p99_ttft_s"] for r in mine], marker="o", color=COLORS[name], label=f"{name} p99")
        ttft.plot(rates, [1e3 * r["p50_ttft_s"] for r in mine], marker=".", ls="--", color=COLORS[name],
                  label=f"{name} p50")
    stall.set_xlabel("request rate (req/s)")
    stall.set_ylabel("p99 of each request's largest gap (ms)")
    stall.set_ylim(0, None)
    stall.set_title("Decodes stall behind whole prompts")
    stall.legend(loc="upper left", frameon=False, fontsize=8)
    ttft.set_xlabel("request rate (req/s)")
    ttft.set_ylabel("time to first token (ms, log scale)")
    ttft.set_yscale("log")
    ttft.set_title("What chunking costs the first token")
    ttft.legend(loc="upper left", frameon=False, fontsize=8, ncol=2)
    budget = sorted((r for r in rows if r["rate"] == BUDGET_RATE and r["scheduler"] == "v1"),
                    key=lambda r: r["max_num_batched_tokens"])
    xs = [r["max_num_batched_tokens"] for r in budget]
    knob.plot(xs, [1e3 * r["p99_itl_max_s"] for r in budget], marker="o", color="#1f77b4",
              label="p99 largest gap (v1)")
    knob.plot(xs, [1e3 * r["p99_ttft_s"] for r in budget], marker="s", color="#2ca02c", label="p99 TTFT (v1)")
    v0 = next(r for r in rows if r["system"] == "v0" and r["rate"] == BUDGET_RATE)
    knob.axhline(1e3 * v0["p99_itl_max_s"], color=COLORS["v0"], ls=":", label="p99 largest gap, v0")
    knob.set_xscale("log", base=2)
    knob.set_xticks(xs, [str(x) for x in xs])
    knob.set_xlabel("token budget per step (max_num_batched_tokens)")
    knob.set_ylabel("ms")
    knob.set_ylim(0, None)
    knob.set_title(f"The budget, at {BUDGET_RATE:g} req/s")
    knob.legend(loc="lower right", frameon=False, fontsize=8)
    fig.suptitle(f"From the paper's scheduler to vLLM v1: chunked prefill ({SETUP}, ShareGPT)", fontsize=12)
    caption(fig, "Largest gap: per request, the longest time between two of its consecutive tokens; its p99 over "
                 "requests shows the stalls. v0 computes every admitted prompt whole in a step of its own, so the "
                 "decodes wait for it; v1 decodes first and gives prompts what is left of the token budget, in "
                 "chunks. Same %g s traces for every system at each rate (seed %d), up to the knee (~1.5 req/s "
                 "for such traces): past it, queues and preemptions dominate. Numbers in the CSV." % (DURATION[quick], SEED))
    return save(fig, rows, outdir, "chunked_prefill")
