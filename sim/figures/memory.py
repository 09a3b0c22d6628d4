"""Where the KV memory goes: the paper's Fig. 2 (waste per system), over time, and as a picture of the pool.

All three figures come from the same four runs (one per KV policy) of one trace: ShareGPT-shaped requests at
2 req/s on OPT-13B / A100-40GB, a load at which every contiguous baseline's pool is full. The paper
measured Fig. 2 on its own busy serving runs; it reports the share of token states among the memory in use
as 20.4% (Orca Max), 26.8% (Pow2), 38.2% (Oracle) and 96.3% (vLLM).
"""
from __future__ import annotations

import numpy as np
from matplotlib import patheffects

from ..drivers.sweep import Task
from ..kv.base import SHARE_NAMES
from .memory_map import draw_slot_map
from .probes import Snapshot, Timeline
from .style import SETUP, SHARE_COLORS, SHARE_LABELS, SYSTEM_LABELS, caption, new_figure, percent_axis, save

POLICIES = ("max", "pow2", "oracle", "paged")
PAPER_TOKEN_STATES = {"max": 0.204, "pow2": 0.268, "oracle": 0.382, "paged": 0.963}  # Fig. 2, of memory in use
RATE = 2.0
DURATION = {False: 600.0, True: 40.0}  # seconds of arrivals (quick: a short trace); the paper ran 1-hour traces


def _tasks(quick: bool) -> list[Task]:
    duration = DURATION[quick]
    probes = (Timeline(), Snapshot(duration / 2))
    return [Task.of(probes, policy=p, scheduler="v0", workload="sharegpt", rate=RATE, duration=duration) for p in POLICIES]


def _trace_text(quick: bool) -> str:
    return f"ShareGPT-shaped requests, {RATE:g} req/s, a {DURATION[quick]:g} s trace (the paper: 1 hour)"


# --- Fig. 2: the memory breakdown per system ---------------------------------------------------------
def waste_tasks(quick: bool) -> list[Task]:
    return _tasks(quick)


def draw_waste(runs, outdir, quick: bool):
    fig, (whole, busy) = new_figure(1, 2, size=(12, 5.2))
    rows = []
    labels = [SYSTEM_LABELS[t.params["policy"]] for t, _ in runs]
    for ax, key, names in ((whole, "memory", SHARE_NAMES), (busy, "memory_busy", SHARE_NAMES[:-1])):
        bottom = np.zeros(len(runs))
        for name in names:
            values = np.array([r.summary[key][name] for _, r in runs])
            ax.bar(labels, values, bottom=bottom, color=SHARE_COLORS[name], label=SHARE_LABELS[name], width=0.62)
            for x, (v, b) in enumerate(zip(values, bottom)):
                if v >= 0.04:
                    ax.text(x, b + v / 2, f"{v:.1%}", ha="center", va="center", fontsize=8)
            bottom += values
        percent_axis(ax)
        ax.set_ylim(0, 1)
        ax.tick_params(axis="x", labelsize=9)
    for x, (task, _) in enumerate(runs):
        paper = PAPER_TOKEN_STATES[task.params["policy"]]
        busy.plot([x - 0.31, x + 0.31], [paper, paper], color="black", linestyle="--", linewidth=1.2,
                  label="paper: token states" if x == 0 else None)
    whole.set_title("(a) share of the whole KV pool")
    busy.set_title("(b) share of the memory in use (the paper's Fig. 2 view)")
    # One legend for both panels: the five kinds as drawn in (a) (free appears only there), then the paper's line.
    handles, names = whole.get_legend_handles_labels()
    paper = [(h, n) for h, n in zip(*busy.get_legend_handles_labels()) if n.startswith("paper")]
    busy.legend(handles + [h for h, _ in paper], names + [n for _, n in paper], loc="upper left",
                bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.suptitle(f"KV cache memory: what each slot holds, time-weighted ({SETUP})", fontsize=12)
    caption(fig, f"{_trace_text(quick)}. Dashed: the paper's Fig. 2 token-state shares (Max 20.4%, Pow2 26.8%, "
                 "Oracle 38.2%, vLLM 96.3%). External fragmentation includes free slots while a request waits that "
                 "it cannot use; 'free' is idle capacity while nothing waits.")
    for task, result in runs:
        for key, view in (("memory", "whole pool"), ("memory_busy", "memory in use")):
            row = {"policy": task.params["policy"], "system": SYSTEM_LABELS[task.params["policy"]], "view": view}
            row.update({name: result.summary[key].get(name, "") for name in SHARE_NAMES})
            row["paper_token_states"] = PAPER_TOKEN_STATES[task.params["policy"]] if key == "memory_busy" else ""
            row.update(workload="sharegpt", rate=RATE, trace_duration_s=DURATION[quick],
                       mean_batch_size=result.summary["mean_batch_size"])
            rows.append(row)
    return save(fig, rows, outdir, "memory_waste")


# --- the breakdown over time -------------------------------------------------------------------------
def timeline_tasks(quick: bool) -> list[Task]:
    return _tasks(quick)


def draw_timeline(runs, outdir, quick: bool):
    fig, axes = new_figure(len(runs), 1, size=(12, 2.3 * len(runs) + 1.2), sharex=True)
    rows, twins = [], []
    for ax, (task, result) in zip(axes, runs):
        tl = result.probes["timeline"]
        slots = result.summary["num_kv_slots"]
        ok = ~np.isnan(tl["token_states"])
        shares = [np.where(ok, tl[name], 0.0) / slots for name in SHARE_NAMES]
        ax.stackplot(tl["time"], shares, colors=[SHARE_COLORS[n] for n in SHARE_NAMES],
                     labels=[SHARE_LABELS[n] for n in SHARE_NAMES], linewidth=0)
        percent_axis(ax)
        ax.set_ylim(0, 1)
        ax.axvline(task.params["duration"], color="black", linestyle=":", linewidth=1)
        ax.set_ylabel("% of KV pool")
        policy = task.params["policy"]
        ax.set_title(f"{SYSTEM_LABELS[policy]}: {result.summary['mean_batch_size']:.1f} running requests on average",
                     loc="left", fontsize=10)
        twin = ax.twinx()
        twins.append(twin)
        # NOTE: a white halo under the black line keeps it visible on every share's colour (red included).
        twin.plot(tl["time"], tl["num_running"], color="black", linewidth=0.9, label="running requests",
                  path_effects=[patheffects.Stroke(linewidth=2.6, foreground="white"), patheffects.Normal()])
        twin.set_ylabel("running", fontsize=9)
        twin.grid(False)
        twin.set_ylim(0, None)
        for i in range(len(tl["time"])):
            rows.append({"policy": policy, "time_s": tl["time"][i],
                         **{n: tl[n][i] / slots for n in SHARE_NAMES},
                         "num_running": tl["num_running"][i], "num_waiting": tl["num_waiting"][i]})
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.06, 1.0), frameon=False)
    twins[0].legend(loc="upper left", bbox_to_anchor=(1.06, 0.35), frameon=False)
    axes[-1].set_xlim(0, max(r.probes["timeline"]["time"][-1] for _, r in runs))
    axes[-1].set_xlabel("simulated time (s)")
    fig.suptitle(f"KV memory breakdown over time, same trace for each system ({SETUP})", fontsize=12)
    caption(fig, f"{_trace_text(quick)}. Shares are time-weighted means over {len(runs[0][1].probes['timeline']['time'])} "
                 "equal time bins per run; black: running requests (right axis); dotted: arrivals stop. Blank bins: "
                 "the engine was idle. Each system drains its queue at its own pace after arrivals stop.")
    return save(fig, rows, outdir, "memory_timeline")


# --- the pool as a picture at one moment -------------------------------------------------------------
def map_tasks(quick: bool) -> list[Task]:
    return _tasks(quick)


def draw_map(runs, outdir, quick: bool):
    fig, axes = new_figure(len(runs), 1, size=(13, 2.75 * len(runs) + 1.0))
    rows = []
    for i, (ax, (task, result)) in enumerate(zip(axes, runs)):
        smap, policy = result.probes["snapshot"], task.params["policy"]
        counts, total = smap.counts(), len(smap.kind)
        parts = ", ".join(f"{SHARE_LABELS[n].split(' ')[0]} {counts[n] / total:.0%}" for n in SHARE_NAMES)
        unit = f"blocks of {smap.block_size}" if smap.block_size > 1 else "token slots, buddy allocator"
        title = (f"{SYSTEM_LABELS[policy]} at t = {smap.time:.1f} s ({unit}): {smap.num_owners} requests in memory, "
                 f"{smap.num_waiting} waiting | {parts}")
        draw_slot_map(smap, ax, row_slots=256, title=title, legend=i == 0)
        ax.title.set_fontsize(9.5)
        rows.append({"policy": policy, "time_s": smap.time, "num_slots": total, "block_size": smap.block_size,
                     "num_requests_in_memory": smap.num_owners, "num_waiting": smap.num_waiting,
                     **{n: counts[n] for n in SHARE_NAMES}})
    fig.suptitle("The KV pool at the same moment of the same trace: contiguous reservations vs paged blocks "
                 f"({SETUP})", fontsize=12)
    caption(fig, f"{_trace_text(quick)}; each panel is the pool of its own run at the first step ending after "
                 f"t = {DURATION[quick] / 2:g} s, 256 token slots per row, addresses reading like text; paged: one "
                 "4x4 tile per block of 16 slots, 64 blocks per row. Colour = owning request; pale = reserved but not "
                 "holding a token. CSV: slot counts of each kind.", width=170)
    return save(fig, rows, outdir, "memory_map")
