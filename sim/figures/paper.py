"""The paper, side by side: every number the lab reproduces from the vLLM paper, beside the lab's (README table).

`PAPER` holds the numbers of Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention" (SOSP 2023, arXiv 2309.06180) that the lab's figures reproduce, each with where the paper prints
it; `ROWS` says how the lab's number is read off the committed figure CSVs (figures/*.csv, never re-simulated
here). `readme_block()` is the README section's generated part: the table, what the lab's numbers are, and a
note for every difference beyond 10%, whose numbers come from the sensitivity sweep's CSV
(figures/paper_sensitivity.csv, sim/figures/paper_sensitivity.py). The README quotes it between two marker
comments and a test checks that it is exactly this, so no number there is typed by hand.

    python -m sim paper-table              # print the block
    python -m sim paper-table --write      # rewrite README.md's block
    python -m sim paper-table --check      # exit 1 if README.md's block is not what the CSVs give

What a lab number is:
- sustained rate: the highest rate run whose normalized latency, and that of every lower rate run, stays under
  1 s/token, the top of the paper's plots (`sampling.knee`), over the figure's rates and the extra rates of the
  sweep's `rates` study; a curve that never crossed gives a lower bound (">=").
- difference: lab / paper - 1; against a range, 0 inside it, else from the nearer end.
- best block sizes: those whose normalized latency is within 10% of the lowest.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..base.specs import get_model
from ..kv.contiguous import next_power_of_two
from ..workloads.workload import PUBLISHED_MEANS
from .chatbot import HISTORY_LIMIT, TURNS
from .memory import PAPER_TOKEN_STATES
from .paper_sensitivity import CHAT_TURNS, ResultsError, read_results, read_sensitivity
from .paper_sensitivity import COMMAND as SENSITIVITY_COMMAND
from .paper_sensitivity import CSV_PATH as SENSITIVITY_CSV
from .sampling import knee
from .sharing import PAPER_RANGE, PREFIXES, WIDTHS
from .throughput import PAPER_BATCH

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "figures"
README = ROOT / "README.md"
BEGIN, END = "<!-- paper-table:begin -->", "<!-- paper-table:end -->"
LIMIT = 1.0  # s/token: a sustained rate stays under it (the paper's plots end there)
SIGNIFICANT = 0.10  # a difference beyond this gets a note measured by the sensitivity sweep
BEST_BLOCK = 0.10  # best block sizes: normalized latency within this of the lowest
SYSTEMS = {"max": "Orca (Max)", "pow2": "Orca (Pow2)", "oracle": "Orca (Oracle)", "paged": "vLLM"}


@dataclass(frozen=True, slots=True)
class PaperNumber:
    value: float | tuple[float, float] | str  # a number, a (low, high) range, or words (a qualitative claim)
    source: str  # where the paper prints it


# From the paper's text and its figures' bar labels (section numbers of arXiv 2309.06180). Fig. 2's and 13's numbers
# and Fig. 15's endpoints are the figure modules' own constants, not restated.
PAPER = {
    **{f"fig2.{p}": PaperNumber(100 * share, "Fig. 2 bar label" + ("; §1: 20.4%-38.2%" if p in ("max", "oracle") else ""))
       for p, share in PAPER_TOKEN_STATES.items()},
    "fig12.sharegpt.oracle": PaperNumber((1.7, 2.7), "§6.2: 1.7×-2.7× (ShareGPT; OPT-13B, 66B, 175B)"),
    "fig12.sharegpt.max": PaperNumber((2.7, 8.0), "§6.2: 2.7×-8× (ShareGPT; OPT-13B, 66B, 175B)"),
    "fig12.alpaca.oracle": PaperNumber(1.3, "§6.3: \"1.3× in basic sampling\" (OPT-13B, Alpaca)"),
    **{f"fig13.{w}.{s}": PaperNumber(PAPER_BATCH[w][s], f"Fig. 13{'ab'[w == 'alpaca']} bar label")
       for w in PAPER_BATCH for s in SYSTEMS},
    "fig13.sharegpt.paged/oracle": PaperNumber(2.2, "§6.2: 2.2× more requests than Orca (Oracle)"),
    "fig13.sharegpt.paged/max": PaperNumber(4.3, "§6.2: 4.3× more requests than Orca (Max)"),
    "fig14.beam6": PaperNumber(2.3, "§6.3: \"2.3× in beam search with a width of 6\""),
    "fig15.n.2": PaperNumber(100 * PAPER_RANGE["n"][0], "§6.3: 6.1%-9.8%; Fig. 15a"),
    "fig15.n.4": PaperNumber(8.53, "Fig. 15a bar label"),
    "fig15.n.6": PaperNumber(100 * PAPER_RANGE["n"][1], "§6.3: 6.1%-9.8%; Fig. 15a"),
    "fig15.beam_width.2": PaperNumber(100 * PAPER_RANGE["beam_width"][0], "§6.3: 37.6%-55.2%; Fig. 15b"),
    "fig15.beam_width.4": PaperNumber(53.13, "Fig. 15b bar label"),
    "fig15.beam_width.6": PaperNumber(100 * PAPER_RANGE["beam_width"][1], "§6.3: 37.6%-55.2%; Fig. 15b"),
    "fig15.sharegpt.n": PaperNumber((16.2, 30.5), "§6.3: ShareGPT, parallel sampling"),
    "fig15.sharegpt.beam_width": PaperNumber((44.3, 66.3), "§6.3: ShareGPT, beam search"),
    "fig16.1-shot": PaperNumber(1.67, "§6.4: 1.67× (one-shot prefix)"),
    "fig16.5-shot": PaperNumber(3.58, "§6.4: 3.58× (five-shot prefix)"),
    **{f"fig17.{s}": PaperNumber(2.0, "§6.5: 2× the three Orca baselines") for s in ("max", "pow2", "oracle")},
    "fig18b.sharegpt": PaperNumber((16, 128), "§7.2: \"block sizes from 16 to 128\""),
    "fig18b.alpaca": PaperNumber((16, 32), "§7.2: \"block size 16 and 32 work well\""),
    "fig19.small": PaperNumber("recompute faster", "§7.3: recomputation more efficient at small block sizes"),
    "fig19.medium": PaperNumber("comparable", "§7.3: comparable for block sizes 16 to 64"),
    "fig19.large": PaperNumber("swap faster", "§7.3: swapping more efficient at large block sizes"),
}


# --- the committed CSVs --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Value:
    """A lab number: a float, a (low, high) range, words, or None (not determined); `bound` ">=" or "<="."""

    x: float | tuple | str | None
    bound: str = ""
    verdict: str = ""  # a qualitative row's comparison with the paper: "agrees", "overlaps", "differs" or ""


class Data:
    """The committed figure CSVs and the sensitivity sweep's rows, read once."""

    def __init__(self, folder: str | Path = FIGURES, sensitivity: str | Path | None = None) -> None:
        self.folder = Path(folder)
        self.sweep = read_sensitivity(sensitivity if sensitivity is not None else self.folder / SENSITIVITY_CSV.name)
        self._tables: dict[str, list[dict]] = {}

    def fig(self, name: str) -> list[dict]:
        if name not in self._tables:
            self._tables[name] = read_results(self.folder / f"{name}.csv", "python -m sim figures")
        return self._tables[name]

    def where(self, name: str, **match) -> list[dict]:
        return [r for r in self.fig(name) if all(r[k] == str(v) for k, v in match.items())]

    def one(self, name: str, column: str, **match) -> float:
        rows = self.where(name, **match)
        if len(rows) != 1:
            raise ResultsError(f"{self.folder / name}.csv: expected one row with {match}, found {len(rows)} (make it "
                               f"again with `python -m sim figures`)")
        return float(rows[0][column])

    def study(self, study: str, curve: str) -> list[dict]:
        rows = [r for r in self.sweep if r["study"] == study and r["curve"] == curve]
        if not rows:
            raise ResultsError(f"paper_sensitivity.csv: no rows of study {study!r}, curve {curve!r} (run "
                               f"`{SENSITIVITY_COMMAND}` again)")
        return rows

    def extra_rates(self, curve: str) -> list[dict]:
        """The sweep's runs of a figure's curve at rates the figure did not run (study `rates`; maybe none)."""
        return [r for r in self.sweep if r["study"] == "rates" and r["curve"] == curve]

    def value(self, study: str, curve: str, column: str) -> float:
        rows = self.study(study, curve)
        if len(rows) != 1:
            raise ResultsError(f"paper_sensitivity.csv: expected one row of {study!r}, {curve!r}, found {len(rows)}")
        return float(rows[0][column])


def points(rows: list[dict], rate: str = "rate") -> list[tuple[float, float]]:
    """(rate, normalized latency) of CSV rows."""
    return [(float(r[rate]), float(r["normalized_latency_s_per_token"])) for r in rows]


def sustained(curve: list[tuple[float, float]]) -> Value:
    """The highest rate under LIMIT (and every lower rate's); ">=" when the curve never crossed it."""
    rates = [r for r, _ in curve]
    best = knee(rates, [v for _, v in curve], LIMIT)
    return Value(best, ">=" if best is not None and best == max(rates) else "")


def ratio(a: Value, b: Value) -> Value:
    """a / b of two sustained rates: a lower bound on a makes a lower bound, on b an upper bound."""
    if a.x is None or b.x is None or (a.bound and b.bound):
        return Value(None)
    return Value(a.x / b.x, a.bound or ("<=" if b.bound else ""))


# --- the lab's numbers -----------------------------------------------------------------------------------
def fig2(policy: str) -> Callable[[Data], Value]:
    return lambda d: Value(100 * d.one("memory_waste", "token_states", policy=policy, view="memory in use"))


def fig12_rate(d: Data, workload: str, system: str) -> Value:
    rows = d.where("latency_vs_rate", workload=workload, system=system)
    return sustained(points(rows + d.extra_rates(f"fig12:{workload}:{system}")))


def fig12(workload: str, system: str) -> Callable[[Data], Value]:
    return lambda d: ratio(fig12_rate(d, workload, "paged"), fig12_rate(d, workload, system))


def fig13(workload: str, system: str) -> Callable[[Data], Value]:
    return lambda d: Value(d.one("batch_size", "mean_batch_size", workload=workload, system=system))


def fig13_ratio(system: str) -> Callable[[Data], Value]:
    return lambda d: Value(fig13("sharegpt", "paged")(d).x / fig13("sharegpt", system)(d).x)


def fig14_rate(d: Data, system: str) -> Value:
    rows = d.where("sampling_latency", kind="beam_width", width=6, system=system)
    return sustained(points(rows + d.extra_rates(f"fig14:beam6:{system}")))


def fig15(kind: str, width: int) -> Callable[[Data], Value]:
    return lambda d: Value(100 * d.one("sharing", "memory_saving", kind=kind, width=width))


def fig16_rate(d: Data, shot: str, system: str) -> Value:
    rows = d.where("shared_prefix", prefix=shot, system=system)
    return sustained(points(rows + d.extra_rates(f"fig16:{shot}:{system}")))


def fig17_rate(d: Data, system: str) -> Value:
    return sustained(points(d.where("chatbot", system=system), rate="request_rate"))


def best_blocks(rows: list[dict]) -> tuple[int, int]:
    """The smallest and largest block size whose normalized latency is within BEST_BLOCK of the lowest."""
    latency = {int(r["block_size"]): float(r["normalized_latency_s_per_token"]) for r in rows}
    best = min(latency.values())
    good = [b for b, v in latency.items() if v <= (1 + BEST_BLOCK) * best]
    return min(good), max(good)


def swap_over_recompute(d: Data) -> dict[int, float]:
    """Normalized latency under swap / under recompute, per block size (Fig. 19's CSV)."""
    latency = {(r["preemption"], int(r["block_size"])): float(r["normalized_latency_s_per_token"])
               for r in d.fig("recompute_vs_swap")}
    return {b: latency["swap", b] / latency["recompute", b] for (mode, b) in latency if mode == "swap"}


def fig19(sizes: tuple[int, ...], faster: str | None) -> Callable[[Data], Value]:
    """Swap / recompute normalized latency over `sizes`, in words; `faster`: the mode the paper finds faster there
    ("swap", "recompute"), None where it finds them comparable (no verdict: the reader compares)."""

    def lab(d: Data) -> Value:
        ratios = [v for b, v in swap_over_recompute(d).items() if b in sizes]
        words = f"swap / recompute {min(ratios):.2f}" + (f"-{max(ratios):.2f}" if len(ratios) > 1 else "")
        if faster is None:
            return Value(words)
        agrees = all(v < 1 for v in ratios) if faster == "swap" else all(v > 1 for v in ratios)
        return Value(words, verdict="agrees" if agrees else "differs")

    return lab


def block_range(workload: str) -> Callable[[Data], Value]:
    def lab(d: Data) -> Value:
        low, high = best_blocks(d.where("block_size", workload=workload))
        paper_low, paper_high = PAPER[f"fig18b.{workload}"].value
        verdict = ("agrees" if (low, high) == (paper_low, paper_high) else
                   "overlaps" if low <= paper_high and paper_low <= high else "differs")
        return Value((low, high), verdict=verdict)

    return lab


@dataclass(frozen=True, slots=True)
class Row:
    key: str  # into PAPER
    figure: str
    quantity: str
    unit: str  # "%", "x" (a ratio), "" (a count), "blocks" (a range of block sizes), "words"
    lab: Callable[[Data], Value]
    note: str | None = None  # the note that explains a difference beyond SIGNIFICANT (NOTES)


ROWS = (
    *(Row(f"fig2.{p}", "Fig. 2", f"{SYSTEMS[p]}: token states, % of memory in use", "%", fig2(p),
          "pow2" if p == "pow2" else None) for p in SYSTEMS),
    Row("fig12.sharegpt.oracle", "Fig. 12", "ShareGPT: vLLM's sustained rate / Orca (Oracle)'s", "x",
        fig12("sharegpt", "oracle"), "trace"),
    Row("fig12.sharegpt.max", "Fig. 12", "ShareGPT: vLLM's sustained rate / Orca (Max)'s", "x", fig12("sharegpt", "max"),
        "trace"),
    Row("fig12.alpaca.oracle", "Fig. 12", "Alpaca: vLLM's sustained rate / Orca (Oracle)'s", "x",
        fig12("alpaca", "oracle"), "rounding"),
    *(Row(f"fig13.{w}.{s}", "Fig. 13", f"{'ShareGPT, 2' if w == 'sharegpt' else 'Alpaca, 30'} req/s: {SYSTEMS[s]}, "
          "mean batched requests", "", fig13(w, s), "pow2" if s == "pow2" else "rate")
      for w in PAPER_BATCH for s in SYSTEMS),
    Row("fig13.sharegpt.paged/oracle", "Fig. 13", "ShareGPT: vLLM's batch / Orca (Oracle)'s", "x", fig13_ratio("oracle"),
        "rate"),
    Row("fig13.sharegpt.paged/max", "Fig. 13", "ShareGPT: vLLM's batch / Orca (Max)'s", "x", fig13_ratio("max"), "rate"),
    Row("fig14.beam6", "Fig. 14", "beam width 6: vLLM's sustained rate / Orca (Oracle)'s", "x",
        lambda d: ratio(fig14_rate(d, "paged"), fig14_rate(d, "oracle")), "rounding"),
    *(Row(f"fig15.{kind}.{w}", "Fig. 15", f"{'parallel sampling, n' if kind == 'n' else 'beam search, width'} = {w}: "
          "memory saved", "%", fig15(kind, w), "sharing") for kind in ("n", "beam_width") for w in (2, 4, 6)),
    *(Row(f"fig16.{shot}", "Fig. 16", f"{shot} prefix: vLLM's sustained rate / Orca (Oracle)'s", "x",
          lambda d, shot=shot: ratio(fig16_rate(d, shot, "paged+prefix"), fig16_rate(d, shot, "oracle")), "rounding")
      for shot in ("1-shot", "5-shot")),
    *(Row(f"fig17.{s}", "Fig. 17", f"chatbot: vLLM's sustained rate / {SYSTEMS[s]}'s", "x",
          lambda d, s=s: ratio(fig17_rate(d, "paged"), fig17_rate(d, s)), "chatbot") for s in ("max", "pow2", "oracle")),
    Row("fig18b.sharegpt", "Fig. 18b", "ShareGPT, 2 req/s: best block sizes", "blocks", block_range("sharegpt"), "block"),
    Row("fig18b.alpaca", "Fig. 18b", "Alpaca, 30 req/s: best block sizes", "blocks", block_range("alpaca"), "block"),
    Row("fig19.small", "Fig. 19", "block sizes 1-8: normalized latency, swap / recompute", "words",
        fig19((1, 2, 4, 8), "recompute")),
    Row("fig19.medium", "Fig. 19", "block sizes 16-64: the same", "words", fig19((16, 32, 64), None)),
    Row("fig19.large", "Fig. 19", "block sizes 128-256: the same", "words", fig19((128, 256), "swap")),
)


# --- the notes: what the sensitivity sweep measured --------------------------------------------------------
def _batch(rows: list[dict]) -> list[float]:
    return [float(r["mean_batch_size"]) for r in rows]


def _span(values: list[float], fmt: str = ".2f") -> str:
    low, high = min(values), max(values)
    return f"{low:{fmt}}" if f"{low:{fmt}}" == f"{high:{fmt}}" else f"{low:{fmt}}-{high:{fmt}}"


def _setting(rows: list[dict], column: str) -> str:
    """The values a column of the sweep's rows takes, as text: "15,700", "1-3" (consecutive) or "2, 12"."""
    values = sorted({float(r[column]) for r in rows})
    text = [f"{v:,g}" for v in values]
    consecutive = len(values) > 2 and all(b - a == 1 for a, b in zip(values, values[1:]))
    return f"{text[0]}-{text[-1]}" if consecutive else ", ".join(text)


def _peak(d: Data, workload: str, system: str) -> tuple[float, float]:
    """(largest mean batch, its rate) over Fig. 12's runs of one system."""
    return max((float(r["mean_batch_size"]), float(r["rate"])) for r in d.where("latency_vs_rate", workload=workload,
                                                                                   system=system))


def _rate(value: Value) -> str:
    return "not determined" if value.x is None else {">=": "≥ ", "<=": "≤ "}.get(value.bound, "") + f"{value.x:g}"


def _x(value: Value) -> str:
    return lab_cell(value, "x")


def note_pow2(d: Data) -> str:
    context = get_model("opt-13b").max_seq_len  # sim.run's default model, every figure's but Fig. 16's
    run = next_power_of_two(context + 1)
    slots = d.one("memory_map", "num_slots", policy="pow2")
    over = d.value("allocator", "fig13:sharegpt:pow2", "pow2_over_context")
    shape, first_fit = (d.study(s, "fig13:sharegpt:pow2")[0] for s in ("length_shape", "allocator"))
    paper_b, paper_t = PAPER["fig13.sharegpt.pow2"].value, PAPER["fig2.pow2"].value
    (long,), (pool,), seeds = (d.study(s, "fig13:sharegpt:pow2") for s in ("duration", "pool", "seed"))
    return (f"Its rule reserves the prompt plus the output rounded up to a power of two, and the buddy allocator rounds "
            f"the whole run up to a power of two again: {over:.1%} of the ShareGPT-shaped requests (mostly those with "
            f"outputs over {context // 2:,} tokens) reserve more than OPT's {context:,}-token context, which no request "
            f"can fill, and get a {run:,}-slot run, {run / slots:.0%} of the pool (the paper's Pow2 \"over-reserves "
            f"the space for outputs by at most 2×\", §6.1). Uniform lengths with the paper's means, none of them that "
            f"long (study `length_shape`), give Pow2 {float(shape['mean_batch_size']):.2f} batched requests "
            f"and {100 * float(shape['token_states_of_used']):.1f}% token states (paper {paper_b:g}, {paper_t:.1f}%); "
            f"a first-fit allocator, no second rounding (study `allocator`), "
            f"{float(first_fit['mean_batch_size']):.2f} and {100 * float(first_fit['token_states_of_used']):.1f}%, and "
            f"{d.value('allocator', 'fig13:alpaca:pow2', 'mean_batch_size'):.2f} on Alpaca (paper "
            f"{PAPER['fig13.alpaca.pow2'].value:g}). The paper's Orca used a buddy allocator too (§6.1): first fit "
            f"prices the rounding, it is not the paper's setting. With the buddy allocator and log-normal lengths Pow2 "
            f"batches {float(long['mean_batch_size']):.2f} with {_setting([long], 'duration')} s traces (study "
            f"`duration`), {float(pool['mean_batch_size']):.2f} with Table 1's {_setting([pool], 'kv_slots')} slots "
            f"(`pool`), {_span(_batch(seeds))} with seeds {_setting(seeds, 'seed')} (`seed`).")


def _below_knee(d: Data) -> str:
    """Where Fig. 13's rate sits against each system's knee (Fig. 12), and the batches past it."""
    rate = {w: float(d.where("batch_size", workload=w, system="paged")[0]["rate"]) for w in ("sharegpt", "alpaca")}
    knee_of = {(w, s): fig12_rate(d, w, s) for w in rate for s in ("paged", "oracle")}
    below = all(knee_of[w, "paged"].x > rate[w] for w in rate) and knee_of["alpaca", "oracle"].x > rate["alpaca"]
    pre = {w: d.one("batch_size", "num_preemptions", workload=w, system="paged") for w in rate}
    peak = {(w, s): _peak(d, w, s) for w, s in (("sharegpt", "paged"), ("sharegpt", "oracle"), ("sharegpt", "max"),
                                                 ("alpaca", "paged"), ("alpaca", "oracle"))}
    first_fit = d.study("allocator", "fig13:alpaca:oracle")
    return (f"A system below its knee batches what arrives (rate × time in the system), one past it what its memory "
            f"holds. The lab's vLLM sustains {_rate(knee_of['sharegpt', 'paged'])} req/s of ShareGPT and "
            f"{_rate(knee_of['alpaca', 'paged'])} of Alpaca, and Oracle {_rate(knee_of['alpaca', 'oracle'])} of "
            f"Alpaca (Fig. 12 rows), against Fig. 13's {rate['sharegpt']:g} and {rate['alpaca']:g} req/s"
            f"{': there they are below their knees' if below else ''} (vLLM preempts {pre['sharegpt']:.0f} times on "
            f"ShareGPT, {pre['alpaca']:.0f} on Alpaca). Over Fig. 12's runs vLLM's batch peaks at "
            f"{peak['sharegpt', 'paged'][0]:.2f} on ShareGPT ({peak['sharegpt', 'paged'][1]:g} req/s; paper "
            f"{PAPER['fig13.sharegpt.paged'].value:g}) and {peak['alpaca', 'paged'][0]:.2f} on Alpaca "
            f"({peak['alpaca', 'paged'][1]:g} req/s; paper {PAPER['fig13.alpaca.paged'].value:g}), Oracle's at "
            f"{peak['alpaca', 'oracle'][0]:.2f} on Alpaca ({peak['alpaca', 'oracle'][1]:g} req/s; paper "
            f"{PAPER['fig13.alpaca.oracle'].value:g}), and at the peaks vLLM batches "
            f"{peak['sharegpt', 'paged'][0] / peak['sharegpt', 'oracle'][0]:.2f}x Oracle and "
            f"{peak['sharegpt', 'paged'][0] / peak['sharegpt', 'max'][0]:.2f}x Max on ShareGPT (paper "
            f"{PAPER['fig13.sharegpt.paged/oracle'].value:g}x, {PAPER['fig13.sharegpt.paged/max'].value:g}x). With "
            f"first fit (study `allocator`) Oracle batches {float(first_fit[0]['mean_batch_size']):.2f} at "
            f"{_setting(first_fit, 'rate')} req/s of Alpaca.")


def _paged_settings(d: Data) -> str:
    """vLLM's Fig. 13 batch on ShareGPT with one setting changed at a time."""
    (long,), (pool,), seeds = (d.study(s, "fig13:sharegpt:paged") for s in ("duration", "pool", "seed"))
    return (f"At {_setting([long], 'rate')} req/s of ShareGPT vLLM batches {float(long['mean_batch_size']):.2f} with "
            f"{_setting([long], 'duration')} s traces (study `duration`), {float(pool['mean_batch_size']):.2f} with "
            f"Table 1's {_setting([pool], 'kv_slots')} slots (`pool`), "
            f"{d.value('watermark', 'fig13:sharegpt:paged', 'mean_batch_size'):.2f} with no watermark (`watermark`), "
            f"{d.value('length_shape', 'fig13:sharegpt:paged', 'mean_batch_size'):.2f} with uniform lengths "
            f"(`length_shape`), {_span(_batch(seeds))} with seeds {_setting(seeds, 'seed')} (`seed`).")


def note_rate(d: Data) -> str:
    return f"{_below_knee(d)} {_paged_settings(d)}"


def _hour_rate(d: Data, system: str) -> Value:
    return sustained(points(d.study("duration", f"fig12:sharegpt:{system}")))


def note_trace(d: Data) -> str:
    hour = {s: _hour_rate(d, s) for s in ("max", "oracle", "paged")}
    ratios = {s: ratio(hour["paged"], hour[s]) for s in ("oracle", "max")}
    figure = {s: fig12("sharegpt", s)(d) for s in ratios}
    inside = all(difference(PAPER[f"fig12.sharegpt.{s}"], ratios[s]) == 0 for s in ratios)
    short = _setting(d.where("latency_vs_rate", workload="sharegpt"), "trace_duration_s")
    long = _setting(d.study("duration", "fig12:sharegpt:paged"), "duration")
    return (f"The lab's ShareGPT traces last {short} s, the paper's an hour (§6.1); near a knee a longer trace has "
            f"longer to queue. At the figure's rates with {long} s traces (study `duration`) the knees are Max "
            f"{_rate(hour['max'])}, Oracle {_rate(hour['oracle'])} and vLLM {_rate(hour['paged'])} req/s: vLLM "
            f"sustains {_x(ratios['oracle'])} Oracle's rate and {_x(ratios['max'])} Max's "
            f"({'inside' if inside else 'not inside'} the paper's ranges; {short} s: {_x(figure['oracle'])} and "
            f"{_x(figure['max'])}).")


def note_rounding(d: Data) -> str:
    prompt, output = PUBLISHED_MEANS["alpaca"]
    mean = round(prompt + output)
    oracle = {"alpaca": sustained(points(d.study("allocator", "fig12:alpaca:oracle"))),
              "beam": sustained(points(d.study("allocator", "fig14:beam6:oracle"))),
              **{shot: sustained(points(d.study("allocator", f"fig16:{shot}:oracle"))) for shot in PREFIXES}}
    paged = {"alpaca": fig12_rate(d, "alpaca", "paged"), "beam": fig14_rate(d, "paged"),
             **{shot: fig16_rate(d, shot, "paged+prefix") for shot in PREFIXES}}
    paper = {"alpaca": "fig12.alpaca.oracle", "beam": "fig14.beam6", **{shot: f"fig16.{shot}" for shot in PREFIXES}}
    pairs = ", ".join(f"{_x(ratio(paged[k], oracle[k]))} (paper {PAPER[paper[k]].value:g}x)" for k in oracle)
    longer = {shot: ratio(*(sustained(points(d.study("duration", f"fig16:{shot}:{s}"))) for s in ("paged+prefix",
                                                                                                      "oracle")))
              for shot in PREFIXES}
    durations = (_setting(d.study("duration", "fig16:1-shot:oracle"), "duration"),
                 _setting(d.fig("shared_prefix"), "trace_duration_s"))
    return (f"Orca (Oracle) reserves exactly a request's length, and its buddy allocator rounds the run up to a power "
            f"of two: Alpaca's mean request of {mean} tokens takes {next_power_of_two(mean)} slots, with the "
            f"{PREFIXES['1-shot']}-token prefix {next_power_of_two(mean + PREFIXES['1-shot'])}. With first fit instead "
            f"(study `allocator`; the paper's Orca used a buddy allocator, §6.1, so this prices the rounding and is not "
            f"the paper's setting) Oracle sustains {_rate(oracle['alpaca'])} req/s on Alpaca, {_rate(oracle['beam'])} "
            f"at beam width 6, {_rate(oracle['1-shot'])} and {_rate(oracle['5-shot'])} with the 1- and 5-shot "
            f"prefixes, and vLLM / Oracle becomes {pairs}. With the buddy allocator and {durations[0]} s traces instead of "
            f"{durations[1]} s, "
            f"Fig. 16's ratios are {_x(longer['1-shot'])} and {_x(longer['5-shot'])} (study `duration`). Beam search "
            f"also shares more blocks here than in the paper (the note on Fig. 15).")


def _savings(d: Data, study: str, kind: str, curves: tuple) -> list[float]:
    return [100 * float(r["memory_saving"]) for c in curves for r in d.study(study, f"fig15:{kind}:{c}")]


def note_sharing(d: Data) -> str:
    n2 = [100 * d.one("sharing", "memory_saving", kind="n", width=2)] + _savings(d, "seed", "n", (2,))
    beam6 = _savings(d, "seed", "beam_width", (6,)) + _savings(d, "rate", "beam_width", (6,))
    sharegpt = {k: _savings(d, "sharing_sharegpt", k, WIDTHS) for k in ("n", "beam_width")}
    paper = {k: paper_cell(PAPER[f"fig15.sharegpt.{k}"], "%") for k in sharegpt}
    paper_n2, paper_beam6 = PAPER["fig15.n.2"].value, PAPER["fig15.beam_width.6"].value
    seeds = _setting(d.study("seed", "fig15:n:2"), "seed")
    light = [r for r in d.sweep if r["study"] == "sharing_sharegpt"]
    return (f"Parallel sampling with n = 2 saves {_span(n2, '.1f')}% over seed 0 and seeds {seeds} (study `seed`), a "
            f"spread that "
            f"{'holds' if min(n2) <= paper_n2 <= max(n2) else 'misses'} the paper's {paper_n2:.1f}%; on ShareGPT-shaped "
            f"requests (study `sharing_sharegpt`, {_setting(light, 'rate')} req/s, a light load: "
            f"{sum(int(r['num_preemptions']) for r in light)} preemptions in {len(light)} runs) "
            f"n = {WIDTHS[0]}-{WIDTHS[-1]} save {_span(sharegpt['n'], '.1f')}% against the paper's ShareGPT "
            f"{paper['n']}. Beam search saves {_span(sharegpt['beam_width'], '.1f')}% on ShareGPT-shaped requests "
            f"(widths {WIDTHS[0]}-{WIDTHS[-1]}) against {paper['beam_width']}, and at width 6 on Alpaca "
            f"{_span(beam6, '.1f')}% over seeds {seeds} and {_setting(d.study('rate', 'fig15:beam_width:6'), 'rate')} "
            f"req/s (studies `seed`, `rate`; "
            f"the figure: {100 * d.one('sharing', 'memory_saving', kind='beam_width', width=6):.1f}%, the paper: "
            f"{paper_beam6:.1f}%). What neither trace nor load changes is the beam model: the lab draws beam scores at "
            f"random (sim/clock/loop.py, a stated approximation), not from a language model (not measured here).")


def note_chatbot(d: Data) -> str:
    cut = {float(r["turns"]): 100 * float(r["prompts_at_cut"])
           for r in (d.study("turns", "fig17:figure-turns")[0], d.study("turns", "fig17:paged")[0])}
    more = {s: sustained([(float(r["rate"]) * CHAT_TURNS, float(r["normalized_latency_s_per_token"]))  # request rate
                          for r in d.study("turns", f"fig17:{s}")]) for s in SYSTEMS}  # = turns x session rate
    figure = {s: fig17_rate(d, s) for s in SYSTEMS}
    orca = ("max", "pow2", "oracle")
    lead = [ratio(more["paged"], more[s]) for s in orca]
    paper = PAPER["fig17.max"].value
    short = all(r.x is not None and difference(PAPER["fig17.max"], r) < -SIGNIFICANT for r in lead)
    return (f"The paper's prompts mostly reach the {HISTORY_LIMIT:,}-token cut (§6.5), so its three Orca baselines "
            f"reserve alike. The figure's sessions (mean {TURNS:g} turns) bring {cut[TURNS]:.0f}% of prompts to the "
            f"cut; with {CHAT_TURNS:g} turns (study `turns`) {cut[CHAT_TURNS]:.0f}%, and Max, Pow2 and Oracle sustain "
            f"{', '.join(_rate(more[s]) for s in orca)} req/s"
            f"{' (alike, as in the paper)' if len({more[s].x for s in orca}) == 1 else ''}, vLLM "
            f"{_rate(more['paged'])}: {', '.join(_x(r) for r in lead)} (the figure: "
            f"{', '.join(_x(ratio(figure['paged'], figure[s])) for s in orca)}; the paper: {paper:g}x). Longer "
            f"histories {'leave vLLM short of' if short else 'bring vLLM close to'} the paper's lead; what else "
            f"separates the two is not measured here.")


def note_block(d: Data) -> str:
    sharegpt = d.where("block_size", workload="sharegpt")
    latency = {int(r["block_size"]): float(r["normalized_latency_s_per_token"]) for r in sharegpt}
    best, (low, high) = min(latency, key=latency.get), best_blocks(sharegpt)
    alpaca = d.where("block_size", workload="alpaca")
    short = [int(r["block_size"]) for r in alpaca if float(r["num_preemptions"]) > 0]
    free = 100 * d.one("block_size", "memory.free", workload="alpaca", block_size=16)
    rows = d.study("block_load", "fig18b:alpaca")
    load = {int(r["block_size"]): float(r["normalized_latency_s_per_token"]) for r in rows}
    pressure = next(float(r["num_preemptions"]) for r in rows if int(r["block_size"]) == 16)
    load_low, load_high = best_blocks(rows)
    return (f"On ShareGPT the lab's best sizes are {low}-{high}: block 16 is {latency[16] / latency[best] - 1:+.1%} "
            f"over the best ({best}). On Alpaca at Fig. 18b's {_setting(alpaca, 'rate')} req/s the lab's pool is "
            f"{free:.0f}% free on average "
            f"(block 16), and only block sizes {', '.join(map(str, short)) or 'none'} ever run it short. The paper "
            f"does not state Fig. 18b's rates; at {_setting(rows, 'rate')} req/s (study `block_load`, {pressure:.0f} "
            f"preemptions at block 16) the best sizes are {load_low}-{load_high}, and larger blocks degrade as in the "
            f"paper: block 128 has {load[128] / load[16]:.1f}x the normalized latency of block 16, block 256 "
            f"{load[256] / load[16]:.1f}x.")


NOTES: dict[str, tuple[str, Callable[[Data], str]]] = {  # key -> (title, the measured sentences)
    "pow2": ("Orca (Pow2)'s reservations past the context (Figs. 2, 13).", note_pow2),
    "trace": ("Trace length and the knees (Fig. 12).", note_trace),
    "rounding": ("Orca (Oracle)'s buddy rounding of short requests (Figs. 12, 14, 16).", note_rounding),
    "rate": ("Batch sizes at one rate (Fig. 13).", note_rate),
    "sharing": ("Memory saved by sharing (Fig. 15).", note_sharing),
    "chatbot": ("The chatbot's long prompts (Fig. 17).", note_chatbot),
    "block": ("Block size under load (Fig. 18b).", note_block),
}


# --- the table -------------------------------------------------------------------------------------------
def paper_cell(number: PaperNumber, unit: str) -> str:
    """The paper's number as it prints it (no added digits)."""
    v, suffix = number.value, {"%": "%", "x": "x"}.get(unit, "")
    if isinstance(v, str):
        return v
    if isinstance(v, tuple):
        return f"{v[0]:g}-{v[1]:g}{suffix}"
    return f"{v:.2f}" if unit == "" else f"{v:g}{suffix}"  # batch sizes as Fig. 13 prints them


def lab_cell(value: Value, unit: str) -> str:
    if value.x is None:
        return "not determined"
    bound = {">=": "≥ ", "<=": "≤ "}.get(value.bound, "")
    if unit == "blocks":
        return f"{value.x[0]}-{value.x[1]}"
    if unit == "words":
        return value.x
    return bound + {"%": f"{value.x:.1f}%", "x": f"{value.x:.2f}x", "": f"{value.x:.2f}"}[unit]


def difference(number: PaperNumber, value: Value) -> float | None:
    """lab / paper - 1; against a (low, high) range 0 inside it, else from the nearer end; None: no number."""
    p, x = number.value, value.x
    if isinstance(p, str) or not isinstance(x, float):
        return None
    if isinstance(p, tuple):
        low, high = p
        return 0.0 if low <= x <= high else (x / low - 1 if x < low else x / high - 1)
    return x / p - 1


def needs_note(number: PaperNumber, value: Value) -> bool:
    d = difference(number, value)
    return (d is not None and abs(d) > SIGNIFICANT) or value.verdict not in ("", "agrees")


def difference_cell(number: PaperNumber, value: Value, note: int | None) -> str:
    d = difference(number, value)
    if d is None:
        text = "qualitative" + (f": {value.verdict}" if value.verdict else "")
    else:
        text = {">=": "≥ ", "<=": "≤ "}.get(value.bound, "") + f"{d:+.1%}"
    return text + (f" (note {note})" if note is not None else "")


def table(data: Data) -> tuple[str, list[str]]:
    """The markdown table, and the keys of the notes it refers to, numbered in order of first reference."""
    lines = ["| figure | quantity | paper | where in the paper | lab | difference |", "|---|---|---|---|---|---|"]
    notes: list[str] = []
    for row in ROWS:
        number, value = PAPER[row.key], row.lab(data)
        number_of_note = None
        if needs_note(number, value):
            if row.note is None:
                raise RuntimeError(f"{row.key}: the lab's {lab_cell(value, row.unit)} differs from the paper's "
                                   f"{paper_cell(number, row.unit)} and no note explains it (expected a Row.note)")
            notes += [] if row.note in notes else [row.note]
            number_of_note = notes.index(row.note) + 1
        lines.append(f"| {row.figure} | {row.quantity} | {paper_cell(number, row.unit)} | {number.source} | "
                     f"{lab_cell(value, row.unit)} | {difference_cell(number, value, number_of_note)} |")
    return "\n".join(lines), notes


def definitions() -> str:
    return (f"What the lab's numbers are: a *sustained rate* is the highest request rate run whose normalized latency, "
            f"and that of every lower rate run, stays under {LIMIT:g} s/token, the top of the paper's plots, over the "
            f"figure's rates and the extra rates of the sweep's `rates` study (≥: the curve never crossed it); a ratio "
            f"of two is the lab's \"×\". *Best block sizes* are those within {BEST_BLOCK:.0%} of the lowest normalized "
            f"latency. The *difference* is lab / paper - 1, and against a range 0 inside it, else from the nearer end. "
            f"Every difference beyond {SIGNIFICANT:.0%}, and every qualitative row that does not agree, has a note, "
            f"measured by `python -m sim paper-sensitivity` (one process; `figures/paper_sensitivity.csv`, one setting "
            f"changed at a time from the figure's setup, each named with its source in "
            f"`sim/figures/paper_sensitivity.py`).")


def readme_block(data: Data | None = None) -> str:
    """The README's generated part: the table, the definitions, the notes."""
    data = Data() if data is None else data
    text, keys = table(data)
    notes = [f"{i}. **{NOTES[key][0]}** {NOTES[key][1](data)}" for i, key in enumerate(keys, 1)]
    return "\n\n".join([text, definitions(), *(["Notes:", "\n".join(notes)] if notes else [])])


# --- the README ------------------------------------------------------------------------------------------
def current_block(text: str, name: str = "README.md") -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{name} has no {BEGIN} ... {END} block")
    return text[start + len(BEGIN):end].strip("\n")


def replace_block(text: str, block: str) -> str:
    current_block(text)  # the markers must be there
    start, end = text.find(BEGIN), text.find(END)
    return f"{text[:start + len(BEGIN)]}\n{block}\n{text[end:]}"


def update_readme(readme: str | Path = README, data: Data | None = None) -> bool:
    """Rewrite README's block from the CSVs; True if it changed."""
    from ..base.outfiles import write_text

    readme = Path(readme)
    text = readme.read_text(encoding="utf-8")
    new = replace_block(text, readme_block(data))
    if new != text:
        write_text(readme, new)
    return new != text
