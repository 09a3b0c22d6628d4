"""What moves the lab's numbers away from the paper's: one setting changed at a time, each run through `sim.run`.

README section "The paper, side by side" (sim/figures/paper.py) sets every number the lab reproduces from the
vLLM paper (Kwon et al., SOSP 2023) beside the paper's. Where the two differ by more than 10%, a study here
starts from the figure's own setup (the constants of sim/figures/*.py, so nothing is restated) and changes the
one setting that plausibly explains the gap. One CSV row per run, `figures/paper_sensitivity.csv`:

    python -m sim paper-sensitivity          # about 110 runs in one process: 2-3 minutes on one core

    study             what changes, from the figure's setup          where the setting comes from
    allocator         Orca's buddy allocator -> first fit            a counterfactual: the paper's Orca used a buddy
                                                                     allocator (section 6.1); it prices the rounding
    length_shape      log-normal lengths -> uniform, same means      the lab's log-normal spread is chosen by eye
                                                                     (sim/workloads/workload.py); the means are Fig. 11's
    duration          600 s (45 s) traces -> one hour (180 s)        the paper's 1-hour traces (section 6.1)
    pool              15,805 KV slots -> 15,700                      Table 1: 15.7K slots for OPT-13B on an A100-40GB
    watermark         vLLM v0's 0.01 -> none                         the paper names no watermark
    seed              workload seed 0 -> 1, 2, 3                     the spread between traces of one setup
    rates             more request rates on a figure's curve         a curve that had not crossed 1 s/token
    rate              Fig. 15 at 2 and 12 req/s instead of 6         Fig. 15's rate is not given in the paper
    sharing_sharegpt  Fig. 15 on ShareGPT-shaped requests            section 6.3 gives ShareGPT savings too
    turns             chat sessions of 12 turns instead of 6         section 6.5: "most" prompts have 1024 tokens
    block_load        Fig. 18b's Alpaca at 60 req/s instead of 30    Fig. 18b's rate is not given in the paper

NOTE: nothing is tuned towards the paper's numbers: each changed setting is named above with its source, and a
study reports what the change does, whichever way it goes. The studies use the figures' own (shorter than the
paper's) traces except `duration`, which measures what the trace length does.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from ..arguments import check_arguments
from ..base.outfiles import check_outputs, write_csv
from ..base.specs import get_model
from ..drivers.sweep import Task, run_tasks
from ..kv.contiguous import ContiguousKVManager
from ..workloads.workload import PUBLISHED_MEANS
from . import ablations, chatbot, memory, sampling, sharing, throughput
from .probes import Sharing

CSV_PATH = Path(__file__).resolve().parents[2] / "figures" / "paper_sensitivity.csv"
COMMAND = "python -m sim paper-sensitivity"
TABLE1_SLOTS = 15_700  # Table 1: max. # KV cache slots for OPT-13B on one A100-40GB, "15.7K"
CHAT_TURNS = 12.0  # study `turns`: twice the figure's chatbot.TURNS
SHAREGPT_SHARING = {"rate": 0.2, "duration": 600.0}  # a light load: few groups preempted (a recompute drops sharing)
BLOCK_LOAD_RATE = 60.0  # req/s of Alpaca in study `block_load`: past the paged cache's first preemptions
PARAMS = ("model", "workload", "policy", "scheduler", "allocator", "rate", "duration", "seed", "kv_slots",
          "watermark", "n", "beam_width", "prefix_len", "enable_prefix_caching", "turns", "history_limit",
          "block_size", "prompt_len_range", "output_len_range")
OUTPUTS = ("num_requests", "mean_batch_size", "token_states_of_used", "normalized_latency_s_per_token",
           "num_preemptions", "memory_saving", "prompts_at_cut", "pow2_over_context")
COLUMNS = ("study", "curve", *PARAMS, *OUTPUTS)


@dataclass(frozen=True, slots=True)
class Point:
    study: str  # which question (the module docstring's table)
    curve: str  # the bar or curve it belongs to, e.g. "fig13:sharegpt:pow2": what sim/figures/paper.py looks up
    task: Task


@dataclass(frozen=True, slots=True)
class Shapes:
    """A probe of the run's requests: the share of prompts cut at `cut` tokens (chat sessions), and the share
    whose Orca (Pow2) reservation is longer than the model's context (sim.kv.contiguous's rule)."""

    cut: int | None = None
    name: str = "shapes"

    def start(self) -> "_ShapesRecorder":
        return _ShapesRecorder(self.cut)


class _ShapesRecorder:
    on_step = None  # reads the finished run's request table only
    stop_at = ()

    def __init__(self, cut: int | None) -> None:
        self.cut = cut

    def finish(self, result) -> dict:
        context = get_model(result.summary["model"]).max_seq_len
        rule = ContiguousKVManager(1, 1, reserve="pow2", max_seq_len=context)
        prompts, outputs = result.requests["prompt_len"].tolist(), result.requests["output_len"].tolist()
        over = sum(rule.reserved_tokens(p, p + o - 1) > context for p, o in zip(prompts, outputs))
        cut = None if self.cut is None else sum(p == self.cut for p in prompts) / len(prompts)
        return {"prompts_at_cut": cut, "pow2_over_context": over / len(prompts)}


# --- the figures' setups -----------------------------------------------------------------------------
def fig13(workload: str, system: str, **change) -> dict:
    """Figs. 2 and 13: one system at the paper's Fig. 13 rate (Fig. 2 is the ShareGPT run)."""
    return {"workload": workload, "rate": throughput.BATCH_RATE[workload], "duration": throughput.DURATION[workload][False],
            **throughput.system_kwargs(system), **change}


def fig12(workload: str, system: str, rate: float, **change) -> dict:
    return {**fig13(workload, system), "rate": rate, **change}


def fig14(system: str, rate: float, **change) -> dict:
    return {"workload": "alpaca", "rate": rate, "duration": sampling.DURATION[False], "policy": system,
            "scheduler": "v0", "beam_width": 6, **change}


def fig15(kind: str, width: int, **change) -> dict:
    return {"policy": "paged", "scheduler": "v0", "workload": "alpaca", "rate": sharing.SHARING_RATE,
            "duration": sharing.SHARING_DURATION[False], kind: width, **change}


def fig16(shot: str, system: str, rate: float, **change) -> dict:
    return {"model": "llama-13b", "scheduler": "v0", "workload": "alpaca", "rate": rate,
            "duration": sharing.PREFIX_DURATION[False], "prefix_len": sharing.PREFIXES[shot],
            **sharing.PREFIX_SYSTEMS[system][0], **change}


def fig17(system: str, request_rate: float, turns: float) -> dict:
    return {"workload": "conversation", "rate": request_rate / turns, "duration": chatbot.DURATION[False],
            "turns": turns, "history_limit": chatbot.HISTORY_LIMIT, "scheduler": "v0", "policy": system}


def uniform_lengths(workload: str) -> dict:
    """Uniform prompt and output lengths from 1 to twice the paper's mean (Fig. 11), so the means are kept."""
    prompt, output = PUBLISHED_MEANS[workload]
    return {"workload": "uniform", "prompt_len_range": (1, round(2 * prompt) - 1),
            "output_len_range": (1, round(2 * output) - 1)}


# --- the studies -------------------------------------------------------------------------------------
def _point(study: str, curve: str, kwargs: dict, probes: tuple = ()) -> Point:
    return Point(study, curve, Task.of((Shapes(kwargs.get("history_limit")), *probes), **kwargs))


def memory_points() -> list[Point]:
    """Figs. 2 and 13: what sets the contiguous baselines' and the paged cache's batch at one rate."""
    points = []
    for workload in throughput.WORKLOADS:
        for system in ("pow2", "oracle"):
            points.append(_point("allocator", f"fig13:{workload}:{system}", fig13(workload, system, allocator="first_fit")))
    for system in memory.POLICIES:
        sharegpt = fig13("sharegpt", system)
        shape = {**sharegpt, **uniform_lengths("sharegpt")}
        points.append(_point("length_shape", f"fig13:sharegpt:{system}", shape))
        points.append(_point("duration", f"fig13:sharegpt:{system}", {**sharegpt, "duration": 3600.0}))
        points.append(_point("pool", f"fig13:sharegpt:{system}", {**sharegpt, "kv_slots": TABLE1_SLOTS}))
    points.append(_point("watermark", "fig13:sharegpt:paged", fig13("sharegpt", "paged", watermark=0.0)))
    for seed in (1, 2, 3):
        for system in ("pow2", "paged"):
            points.append(_point("seed", f"fig13:sharegpt:{system}", fig13("sharegpt", system, seed=seed)))
    return points


# Rates added to a figure's curve (same setup) where it had not crossed 1 s/token, and the figure's own rates
# around each knee for the other studies. Each list starts at or below the figure's knee for that curve.
KNEE_RATES = {
    ("fig12:sharegpt", "max"): (0.5, 0.75, 1.0), ("fig12:sharegpt", "oracle"): (1.0, 1.25, 1.5),
    ("fig12:sharegpt", "paged"): (2.0, 2.25, 2.5), ("fig12:alpaca", "paged"): (90.0, 100.0),
    ("fig12:alpaca", "oracle"): (60.0, 70.0, 80.0, 90.0), ("fig14:beam6", "paged"): (20.0, 22.0, 25.0),
    ("fig14:beam6", "oracle"): (8.0, 10.0, 12.0, 15.0),
    ("fig16:1-shot", "oracle"): (40.0, 48.0, 56.0), ("fig16:1-shot", "paged+prefix"): (88.0, 104.0, 120.0),
    ("fig16:5-shot", "oracle"): (16.0, 20.0, 24.0), ("fig16:5-shot", "paged+prefix"): (72.0, 80.0),
    ("fig16-180s:1-shot", "oracle"): (16.0, 20.0, 24.0), ("fig16-180s:1-shot", "paged+prefix"): (48.0, 56.0, 64.0),
    ("fig16-180s:5-shot", "oracle"): (8.0, 12.0), ("fig16-180s:5-shot", "paged+prefix"): (24.0, 32.0, 40.0),
    ("fig17", "max"): (0.9, 1.0, 1.1, 1.2), ("fig17", "pow2"): (0.9, 1.0, 1.1, 1.2),
    ("fig17", "oracle"): (0.9, 1.0, 1.1, 1.2), ("fig17", "paged"): (1.3, 1.4, 1.5, 1.6),
}


def knee_points() -> list[Point]:
    """Figs. 12, 14, 16, 17: curves completed past 1 s/token, and the same curves with one setting changed."""
    r = KNEE_RATES
    points = [_point("duration", f"fig12:sharegpt:{s}", fig12("sharegpt", s, rate, duration=3600.0))
              for s in ("max", "oracle", "paged") for rate in r["fig12:sharegpt", s]]
    points += [_point("rates", "fig12:alpaca:paged", fig12("alpaca", "paged", rate)) for rate in r["fig12:alpaca", "paged"]]
    points += [_point("allocator", "fig12:alpaca:oracle", fig12("alpaca", "oracle", rate, allocator="first_fit"))
               for rate in r["fig12:alpaca", "oracle"]]
    points += [_point("rates", "fig14:beam6:paged", fig14("paged", rate)) for rate in r["fig14:beam6", "paged"]]
    points += [_point("allocator", "fig14:beam6:oracle", fig14("oracle", rate, allocator="first_fit"))
               for rate in r["fig14:beam6", "oracle"]]
    for shot in sharing.PREFIXES:
        points += [_point("rates", f"fig16:{shot}:{s}", fig16(shot, s, rate)) for s in ("oracle", "paged+prefix")
                   for rate in r[f"fig16:{shot}", s] if rate > max(sharing.PREFIX_RATES[shot][s])]  # past the figure's
        points += [_point("allocator", f"fig16:{shot}:oracle", fig16(shot, "oracle", rate, allocator="first_fit"))
                   for rate in r[f"fig16:{shot}", "oracle"]]
        points += [_point("duration", f"fig16:{shot}:{s}", fig16(shot, s, rate, duration=180.0))
                   for s in ("oracle", "paged+prefix") for rate in r[f"fig16-180s:{shot}", s]]
    points += [_point("turns", f"fig17:{s}", fig17(s, rate, CHAT_TURNS)) for s in chatbot.SYSTEMS for rate in r["fig17", s]]
    # the figure's own sessions at one rate, for the share of prompts they cut (the probe's prompts_at_cut)
    return points + [_point("turns", "fig17:figure-turns", fig17("paged", r["fig17", "paged"][0], chatbot.TURNS))]


def sharing_points() -> list[Point]:
    """Fig. 15: the memory saved by sharing, across seeds, rates and on ShareGPT-shaped requests."""
    probe = (Sharing(),)
    points = [_point("seed", f"fig15:{kind}:{width}", fig15(kind, width, seed=seed), probe)
              for kind, width in (("n", 2), ("beam_width", 6)) for seed in (1, 2, 3)]
    points += [_point("rate", "fig15:beam_width:6", fig15("beam_width", 6, rate=rate), probe) for rate in (2.0, 12.0)]
    points += [_point("sharing_sharegpt", f"fig15:{kind}:{width}",
                      fig15(kind, width, workload="sharegpt", **SHAREGPT_SHARING), probe)
               for kind in ("n", "beam_width") for width in sharing.WIDTHS]
    return points


def block_points() -> list[Point]:
    """Fig. 18b: Alpaca's block sizes with the pool under pressure."""
    _, _, durations = ablations.WORKLOADS["alpaca"]
    return [_point("block_load", "fig18b:alpaca", {"policy": "paged", "scheduler": "v0", "workload": "alpaca",
                                                    "rate": BLOCK_LOAD_RATE, "duration": durations[False], "block_size": b})
            for b in ablations.BLOCK_SIZES[False] if b >= 8]


def points() -> list[Point]:
    return memory_points() + knee_points() + sharing_points() + block_points()


# --- running and saving ------------------------------------------------------------------------------
def row(point: Point, result) -> dict:
    """One CSV row: the study, the run's changed keywords, and what it measured."""
    s, params = result.summary, point.task.params
    cells = {name: params[name] for name in PARAMS if name in params}
    for name in ("prompt_len_range", "output_len_range"):
        if name in cells:
            cells[name] = "-".join(map(str, cells[name]))
    measured = {"num_requests": s["num_requests"], "mean_batch_size": s["mean_batch_size"],
                "token_states_of_used": s["memory_busy"]["token_states"],
                "normalized_latency_s_per_token": s["normalized_latency_s_per_token"],
                "num_preemptions": s["num_preemptions"], **result.probes["shapes"]}
    if "sharing" in result.probes:
        measured["memory_saving"] = result.probes["sharing"]["saving"]
    cells.update({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in measured.items() if v is not None})
    return {"study": point.study, "curve": point.curve, **cells}


def run_sensitivity(out: str | Path = CSV_PATH, *, progress: bool = True, command: str = COMMAND) -> list[dict]:
    """Run every study's points in this process (one core), write `out` (its `# command:` line: `command`),
    return the rows."""
    check_outputs({"--out": out})  # before minutes of work
    todo = points()
    for point in todo:  # every point checked before any runs (a bad one would fail only when its turn came)
        check_arguments(point.task.params)
    results = run_tasks([p.task for p in todo], jobs=1, progress=progress, desc="paper sensitivity")
    rows = [row(p, r) for p, r in zip(todo, results)]
    write_csv(out, COLUMNS, rows, comments=[f"command: {command}", "one row per run; blank: the figure's setting "
                                            "(see sim/figures/paper_sensitivity.py)"])
    return rows


class ResultsError(ValueError):
    """A results CSV the paper table cannot read (one line naming the file: the command line prints it, exit 2)."""


def read_results(path: Path, remake: str) -> list[dict]:
    """The rows of a results CSV (its `# ` comment lines skipped), every number in it finite; ResultsError naming the
    file and `remake` (the command that writes it) for a file that is missing, not text, empty, or holds NaN/inf."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file (make it with `{remake}`)")
    if not path.is_file():
        raise ResultsError(f"{path}: not a regular file (allowed: the CSV `{remake}` writes)")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ResultsError(f"{path}: not a CSV file ({exc}) (make it again with `{remake}`)") from None
    if not rows:
        raise ResultsError(f"{path}: no rows (make it again with `{remake}`)")
    for line, r in enumerate(rows, 2):
        for column, cell in r.items():
            if isinstance(cell, str) and cell.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
                raise ResultsError(f"{path} row {line}: {column}: got {cell!r} (allowed: finite numbers; make it "
                                   f"again with `{remake}`)")
    return rows


def read_sensitivity(path: str | Path = CSV_PATH) -> list[dict]:
    """The rows of a saved sweep (its `# ` comment lines skipped)."""
    return read_results(Path(path), COMMAND)
