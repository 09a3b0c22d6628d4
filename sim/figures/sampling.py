"""Parallel sampling and beam search under load: normalized latency against request rate (paper Fig. 14).

Fig. 15 (sharing.py) measures the memory that sharing saves at one rate; Fig. 14 asks what that memory buys:
the request rate each system sustains when every request wants n samples (parallel sampling) or a beam search
of width k, OPT-13B serving Alpaca-shaped requests, as in the paper's section 6.3. The Orca baselines reserve
room for every sequence of a request separately (no sharing: n copies of the prompt, each with its own
reservation), while the paged cache holds the prompt once and shares the beams' common history, so its knee
moves further right as n or k grows. Rates span every system's knee; past a knee latency grows with the trace.
"""
from __future__ import annotations

import numpy as np

from ..drivers.sweep import Task
from .style import SETUP, SYSTEM_COLORS, SYSTEM_LABELS, SYSTEM_MARKERS, caption, new_figure, save

# NOTE: Orca (Pow2) is left out. These traces hold requests whose output rounds up to 2,048 tokens: n reservations
# of over 2,048 slots each (prompt + 2,048), which its buddy allocator rounds to 4,096, never fit the 15,805-slot
# pool for n >= 4, and the simulator refuses such a request (the run fails) rather than serve it.
SYSTEMS = ("max", "oracle", "paged")
KINDS = ("n", "beam_width")
WIDTHS = (2, 4, 6)
KIND_TITLES = {"n": "parallel sampling, n = {}", "beam_width": "beam search, width {}"}
# Rates (req/s) spanning every system's knee per panel (found by a coarse sweep); quick: three of them.
RATES = {
    ("n", 2): (1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0, 45.0, 50.0),
    ("n", 4): (1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 15.0, 18.0, 22.0),
    ("n", 6): (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0),
    ("beam_width", 2): (1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 45.0, 55.0),
    ("beam_width", 4): (1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0, 25.0),
    ("beam_width", 6): (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 15.0, 18.0),
}
DURATION = {False: 90.0, True: 15.0}  # seconds of arrivals (as Fig. 12's Alpaca traces)
Y_LIMIT = 1.0  # s/token, as the paper's axes


def _rates(kind: str, width: int, quick: bool) -> tuple[float, ...]:
    rates = RATES[kind, width]
    return (rates[0], rates[len(rates) // 2], rates[-1]) if quick else rates


def sampling_tasks(quick: bool) -> list[Task]:
    return [Task.of(workload="alpaca", rate=rate, duration=DURATION[quick], policy=system, scheduler="v0",
                    **{kind: width})
            for kind in KINDS for width in WIDTHS for system in SYSTEMS for rate in _rates(kind, width, quick)]


def knee(rates: list[float], latency: list[float | None], limit: float = Y_LIMIT) -> float | None:
    """The highest rate whose normalized latency, and every lower rate's, stays under `limit` (None: not even the
    lowest): the rate a system sustains, as read off the paper's plots."""
    best = None
    for rate, value in sorted(zip(rates, latency)):
        if value is None or value > limit:
            break
        best = rate
    return best


def draw_sampling(runs, outdir, quick: bool):
    fig, axes = new_figure(2, 3, size=(14, 8))
    rows = []
    for row_axes, kind in zip(axes, KINDS):
        for ax, width in zip(row_axes, WIDTHS):
            for system in SYSTEMS:
                mine = sorted(((t, r) for t, r in runs if t.params.get(kind) == width and t.params["policy"] == system),
                              key=lambda tr: tr[0].params["rate"])
                rates = [t.params["rate"] for t, _ in mine]
                latency = [r.summary["normalized_latency_s_per_token"] for _, r in mine]
                sustained = knee(rates, latency)
                at_least = "" if sustained is None or sustained < max(rates) else ">= "  # never crossed the limit
                ax.plot(rates, [np.nan if v is None else v for v in latency], marker=SYSTEM_MARKERS[system],
                        color=SYSTEM_COLORS[system], markersize=5,
                        label=f"{SYSTEM_LABELS[system]}: {'-' if sustained is None else f'{at_least}{sustained:g}'} req/s")
                for (task, result), value in zip(mine, latency):
                    s = result.summary
                    rows.append({"kind": kind, "width": width, "system": system, "rate": task.params["rate"],
                                 "normalized_latency_s_per_token": value, "sustained_rate": sustained,
                                 "sustained_is_lower_bound": bool(at_least),
                                 "throughput_req_per_s": s["throughput_req_per_s"],
                                 "mean_batch_size": s["mean_batch_size"], "num_requests": s["num_requests"],
                                 "num_preemptions": s["num_preemptions"], "trace_duration_s": DURATION[quick]})
            ax.set_ylim(0, Y_LIMIT)
            ax.set_xlim(0, None)
            ax.set_title(KIND_TITLES[kind].format(width))
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel("normalized latency (s/token)")
            ax.legend(loc="upper right", frameon=False, fontsize=8, title="sustained (under 1 s/token)",
                      title_fontsize=8)
    fig.suptitle(f"Parallel sampling and beam search, the paper's Fig. 14 ({SETUP}, Alpaca-shaped requests)",
                 fontsize=12)
    caption(fig, "Mean over requests of end-to-end latency / output length, %g s of Poisson arrivals per point, the "
                 "paper's scheduler. Legend: the highest rate (of those run) below 1 s/token. The Orca baselines "
                 "reserve every sequence of a request separately; the paged cache stores a shared prompt once and "
                 "beams' common history once (copy-on-write). Orca (Pow2) is not drawn: some requests here need n "
                 "reservations that its buddy allocator rounds past the pool, and the simulator refuses them."
                 % DURATION[quick])
    return save(fig, rows, outdir, "sampling_latency")
