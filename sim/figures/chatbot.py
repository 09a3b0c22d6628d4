"""A chatbot: normalized latency against request rate when every prompt is a conversation's history (paper Fig. 17).

The paper's section 6.5 serves OPT-13B on one A100-40GB as a chatbot: a request's prompt is the chat history and
the user's last message, synthesized from ShareGPT; "we cut the prompt to the last 1024 tokens and let the model
generate at most 1024 tokens", and the KV cache is not kept between the rounds of a conversation. Its finding:
vLLM sustains 2x the request rate of all three Orca baselines, which behave alike, because with prompts of about
1024 tokens the buddy allocator reserves 1024 slots for the output whatever the predicted length (prompt + output
past 1024 rounds up to a 2048-slot run, the whole context, as Orca (Max) reserves anyway).

Here the conversations are sim.workloads.conversation's synthetic sessions: ShareGPT-shaped messages and replies, a
geometric number of turns with mean TURNS, `history_limit` 1024 (prompts keep their last 1024 tokens, replies at
most 2048 - 1024), Poisson session starts, prefix caching off (no KV kept between rounds, as the paper). The x axis
is the request rate, TURNS x the rate of session starts (a session's turns add its requests); the CSV also holds
the session rate and the requests per second of sessions actually drawn.
"""
from __future__ import annotations

import numpy as np

from ..base.specs import get_model
from ..drivers.sweep import Task
from ..workloads.conversation import DEFAULT_THINK_TIME, generate_conversations
from .sampling import knee
from .style import SETUP, SYSTEM_COLORS, SYSTEM_LABELS, SYSTEM_MARKERS, caption, new_figure, save

SYSTEMS = ("max", "pow2", "oracle", "paged")
HISTORY_LIMIT = 1024  # the paper's cut: the prompt's last 1024 tokens, at most 2048 - 1024 generated
CONTEXT = get_model("opt-13b").max_seq_len  # sim.run's default model, as SETUP says
# Mean turns per session. A modelling choice: the paper says most of its prompts have 1024 tokens (long ShareGPT
# conversations); with 6 turns about 60% of prompts here reach the cut (turn 1 is one message, turn 2 ~660 tokens).
TURNS = 6.0
# Request rates (req/s) spanning every system's knee (found by a coarse sweep); quick: three of them. The Orca
# baselines are run up to RATE_CAP: past it their latency is far above the axis and the runs are the costly ones.
RATES = {False: (0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.8), True: (0.4, 1.0, 1.6)}
RATE_CAP = {"max": 1.4, "pow2": 1.4, "oracle": 1.4, "paged": 1.8}
DURATION = {False: 1800.0, True: 600.0}  # seconds of session starts; their later turns arrive after
Y_LIMIT = 1.0  # s/token, as Figs. 12 and 14 here


def _params(quick: bool) -> dict:
    return {"workload": "conversation", "duration": DURATION[quick], "turns": TURNS, "history_limit": HISTORY_LIMIT,
            "scheduler": "v0"}


def chatbot_tasks(quick: bool) -> list[Task]:
    return [Task.of(rate=rate / TURNS, policy=system, **_params(quick))
            for system in SYSTEMS for rate in RATES[quick] if quick or rate <= RATE_CAP[system]]


def _request_rate(task: Task) -> float:
    return round(task.params["rate"] * TURNS, 6)


def prompt_shares(quick: bool) -> tuple[float, float]:
    """(share of prompts cut to HISTORY_LIMIT, mean prompt length) of the figure's workload, at its middle rate."""
    rates = RATES[quick]
    requests = generate_conversations(rate=rates[len(rates) // 2] / TURNS, duration=DURATION[quick], turns=TURNS,
                                      history_limit=HISTORY_LIMIT)
    prompts = np.array([r.prompt_len for r in requests])
    return float(np.mean(prompts == HISTORY_LIMIT)), float(prompts.mean())


def draw_chatbot(runs, outdir, quick: bool):
    fig, (ax, ax_batch) = new_figure(1, 2, size=(13, 4.8))
    rows, sustained_by = [], {}
    for system in SYSTEMS:
        mine = sorted(((t, r) for t, r in runs if t.params["policy"] == system), key=lambda tr: tr[0].params["rate"])
        rates = [_request_rate(t) for t, _ in mine]
        latency = [r.summary["normalized_latency_s_per_token"] for _, r in mine]
        sustained = sustained_by[system] = knee(rates, latency, Y_LIMIT)
        at_least = "" if sustained is None or sustained < max(rates) else ">= "  # never crossed the limit
        style = dict(marker=SYSTEM_MARKERS[system], color=SYSTEM_COLORS[system], markersize=5)
        ax.plot(rates, [np.nan if v is None else v for v in latency], **style,
                label=f"{SYSTEM_LABELS[system]}: {'-' if sustained is None else f'{at_least}{sustained:g}'} req/s")
        ax_batch.plot(rates, [r.summary["mean_batch_size"] for _, r in mine], **style, label=SYSTEM_LABELS[system])
        for (task, result), rate, value in zip(mine, rates, latency):
            s = result.summary
            rows.append({"system": system, "request_rate": rate, "session_rate": task.params["rate"],
                         "drawn_request_rate": s["num_requests"] / DURATION[quick],
                         "normalized_latency_s_per_token": value, "sustained_rate": sustained,
                         "sustained_is_lower_bound": bool(at_least), "throughput_req_per_s": s["throughput_req_per_s"],
                         "mean_batch_size": s["mean_batch_size"], "num_requests": s["num_requests"],
                         "num_sessions": s["num_sessions"], "num_preemptions": s["num_preemptions"],
                         "mean_turns": TURNS, "history_limit": HISTORY_LIMIT,
                         "trace_duration_s": DURATION[quick]})
    ax.set_ylim(0, Y_LIMIT)
    ax.set_title("normalized latency (the paper's Fig. 17)")
    ax.set_ylabel("normalized latency (s/token)")
    ax.legend(loc="upper left", frameon=False, fontsize=8, title="sustained (under 1 s/token)", title_fontsize=8)
    ax_batch.set_title("requests batched per iteration")
    ax_batch.set_ylabel("mean batched requests")
    ax_batch.legend(loc="upper left", frameon=False, fontsize=8)
    for a in (ax, ax_batch):
        a.set_xlim(0, None)
        a.set_xlabel("request rate (req/s)")
    cut, mean_prompt = prompt_shares(quick)
    orca = [sustained_by[s] for s in SYSTEMS if s != "paged"]
    ratio = (sustained_by["paged"] / max(orca)) if sustained_by["paged"] and all(orca) else None
    fig.suptitle(f"Chatbot: prompts are the conversation's history, the paper's Fig. 17 ({SETUP})", fontsize=12)
    caption(fig, f"Synthetic ShareGPT-shaped sessions (sim.workloads.conversation): mean {TURNS:g} turns, Poisson session "
                 f"starts for {DURATION[quick]:g} s, a turn every {DEFAULT_THINK_TIME:g} s on average; each prompt is "
                 f"the history and the new message cut to its last {HISTORY_LIMIT} tokens ({cut:.0%} of prompts reach the cut, mean "
                 f"{mean_prompt:.0f} tokens), at most {CONTEXT - HISTORY_LIMIT} tokens generated, no KV kept between "
                 f"turns. The paper's scheduler. vLLM sustains "
                 f"{'-' if ratio is None else f'{ratio:.2g}x'} the highest rate of the Orca baselines (the paper: "
                 "2x); past ~1024 tokens of prompt, their buddy allocator reserves a 2048-slot run whatever the "
                 "output, so Pow2 and Oracle move towards Max.")
    return save(fig, rows, outdir, "chatbot")
