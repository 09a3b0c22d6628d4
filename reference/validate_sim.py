"""`python -m reference validate-sim`: does the simulator predict the engine's latencies? Each trace is served twice:
by the engine in real time (requests added at their arrival times on the wall clock) and by the simulator priced
by a calibrated cost model (`python -m reference calibrate`), with the same scheduler settings and KV pool.

Both run the same scheduler code (sim/scheduler.py), so they make the same decisions as long as their clocks
agree; the comparison is per request, of what a user sees (sim.metrics): time to first token (TTFT), mean
inter-token latency (ITL) and end-to-end latency (E2E), each as |simulated - measured| / measured, reported as the
median and p90 over the trace's requests, plus the error of the output throughput (tokens/s over the run).

Without --trace it runs its own held-out suite (`SUITE`; traces the calibration never saw, written under
--traces-dir so that each can be replayed alone with --trace): Poisson arrivals, bursty (gamma) arrivals, chunked
prefill under a 256-token budget, the same budget without chunking, and a small pool that forces preemptions.
Results: a summary CSV (one row per trace), a per-request CSV and a figure of simulated vs measured latencies.

NOTE: the engine side is a real-time measurement: run it on a quiet machine, at the thread count the cost model
was measured at (the file says which; a mismatch is reported).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.limits import MAX_SEED, MAX_TOKENS
from sim.request import Request

DEFAULT_COST_MODEL = "figures/cost_model_cpu.json"
DEFAULT_OUT = "figures/validate_sim.csv"
DEFAULT_REQUESTS = "figures/validate_sim_requests.csv"
DEFAULT_FIGURE = "figures/validate_sim.png"
DEFAULT_TRACES = "figures/validation"
DEFAULT_BLOCKS = 512  # KV blocks of the engine (and the simulated pool), unless a case or --num-gpu-blocks says
QUICK_DIR = "figures/quick"  # --quick's outputs (ignored by git): a smoke run never overwrites the committed results
MAX_BLOCKS = 8192  # 6 GiB of SmolLM2 K/V in float32 (720 KiB a block of 16): more than a CPU run needs
METRICS = ("ttft", "itl_mean", "e2e_latency")
SUMMARY_COLUMNS = ("trace", "num_requests", "num_gpu_blocks", "max_num_batched_tokens", "chunked_prefill",
                   *(f"{stat}_{m}_error" for m in METRICS for stat in ("median", "p90")),
                   "measured_tokens_per_s", "simulated_tokens_per_s", "throughput_error",
                   "measured_preemptions", "simulated_preemptions", "wall_s")  # fmt: skip
REQUEST_COLUMNS = ("trace", "request_id", "arrival_time", "prompt_len", "output_len",
                   *(f"{side}_{m}" for m in METRICS for side in ("measured", "simulated")))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Case:
    """A held-out trace (sim.workload's uniform lengths, CPU-sized) and the engine settings it runs under."""

    name: str
    workload: dict
    engine: dict = field(default_factory=dict)


SUITE = (
    Case("poisson", {"rate": 0.8}),
    Case("bursty", {"rate": 0.8, "arrival": "gamma", "burstiness": 0.25}),
    Case("chunked-256", {"rate": 1.0}, {"max_num_batched_tokens": 256}),
    Case("unchunked-256", {"rate": 1.0}, {"max_num_batched_tokens": 256, "enable_chunked_prefill": False}),
    Case("preemption", {"rate": 1.5}, {"num_gpu_blocks": 40}),
)


def case_requests(case: Case, *, quick: bool, seed: int) -> list[Request]:
    """The case's requests: uniform prompt and output lengths, arrivals shifted to start at 0."""
    from sim.workload import generate_requests

    count, prompts, outputs = (8, (8, 96), (4, 24)) if quick else (32, (8, 256), (8, 96))
    requests = generate_requests("uniform", count, prompt_len_range=prompts, output_len_range=outputs,
                                 max_seq_len=8192, seed=seed, **case.workload)  # fmt: skip
    first = min(r.arrival_time for r in requests)
    return [Request(r.request_id, r.arrival_time - first, r.prompt_len, r.output_len) for r in requests]


def _token_ids(requests: list[Request], vocab_size: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng([seed, 0x7A1])
    return [r.prompt_token_ids or rng.integers(100, vocab_size, r.prompt_len).tolist() for r in requests]


def replay(llm, requests: list[Request], prompts: list[list[int]]) -> dict[int, list[float]]:
    """Serve `requests` on the wall clock: each is added once its arrival time has passed (checked between steps,
    as a server's loop would), the engine steps while anything is unfinished and sleeps until the next arrival
    otherwise. Returns, per request id, the time (since the start) at which each of its tokens was returned."""
    from reference import SamplingParams

    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_time)
    times: dict[int, list[float]] = {r.request_id: [] for r in requests}
    nxt, start = 0, time.perf_counter()
    while nxt < len(order) or llm.has_unfinished_requests():
        now = time.perf_counter() - start
        while nxt < len(order) and requests[order[nxt]].arrival_time <= now:
            r = requests[order[nxt]]
            llm.add_request(prompts[order[nxt]], SamplingParams(temperature=0.0, max_tokens=r.output_len,
                                                                ignore_eos=True), request_id=str(r.request_id))
            nxt += 1
        if not llm.has_unfinished_requests():
            time.sleep(max(0.0, requests[order[nxt]].arrival_time - now))
            continue
        outputs = llm.step()
        now = time.perf_counter() - start
        for out in outputs:
            got = times[int(out.request_id)]
            got += [now] * (len(out.outputs[0].token_ids) - len(got))
    return times


def measured_latencies(requests: list[Request], times: dict[int, list[float]]) -> dict[int, dict[str, float]]:
    """TTFT, mean ITL and E2E per request from its token times (sim.metrics' definitions)."""
    out = {}
    for r in requests:
        t = times[r.request_id]
        itl = (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else float("nan")
        out[r.request_id] = {"ttft": t[0] - r.arrival_time, "itl_mean": itl, "e2e_latency": t[-1] - r.arrival_time}
    return out


def simulate(requests: list[Request], llm, cost_model, block_size: int, watermark: float = 0.0):
    """sim.run over the same requests, pool and scheduler settings as `llm`, priced by `cost_model`."""
    from sim.api import run

    cfg, kv = llm.scheduler.config, llm.scheduler.kv
    return run(requests=requests, model="smollm2-135m", kv_slots=kv.num_blocks * block_size, block_size=block_size,
               scheduler=cfg.mode, max_num_batched_tokens=cfg.max_num_batched_tokens, max_num_seqs=cfg.max_num_seqs,
               enable_chunked_prefill=cfg.enable_chunked_prefill, preemption=cfg.preemption, victim=cfg.victim,
               watermark=watermark, enable_prefix_caching=kv.enable_prefix_caching, cost_model=cost_model)  # fmt: skip


def _errors(measured: np.ndarray, simulated: np.ndarray) -> np.ndarray:
    ok = np.isfinite(measured) & np.isfinite(simulated) & (measured > 0)
    return np.abs(simulated[ok] - measured[ok]) / measured[ok]


def validate(loaded, name: str, requests: list[Request], cost_model, *, engine: dict, block_size: int = 16,
             seed: int = 0) -> tuple[dict, list[dict]]:
    """One trace through the engine and the simulator: its summary row and its per-request rows."""
    from reference import LLM

    settings = {"num_gpu_blocks": DEFAULT_BLOCKS, **engine}
    llm = LLM.from_loaded(*loaded, block_size=block_size, **settings)
    prompts = _token_ids(requests, loaded[0].config.vocab_size, seed)
    started = time.perf_counter()
    measured = measured_latencies(requests, replay(llm, requests, prompts))
    wall = time.perf_counter() - started
    sim = simulate(requests, llm, cost_model, block_size, settings.get("watermark", 0.0))
    table = {int(i): k for k, i in enumerate(sim.requests.columns["request_id"])}
    rows = []
    for r in requests:
        row = {"trace": name, "request_id": r.request_id, "arrival_time": r.arrival_time, "prompt_len": r.prompt_len,
               "output_len": r.output_len}
        for m in METRICS:
            row[f"measured_{m}"] = measured[r.request_id][m]
            row[f"simulated_{m}"] = float(sim.requests.columns[m][table[r.request_id]])
        rows.append(row)
    summary = {"trace": name, "num_requests": len(requests), "num_gpu_blocks": llm.scheduler.kv.num_blocks,
               "max_num_batched_tokens": llm.scheduler.config.max_num_batched_tokens,
               "chunked_prefill": llm.scheduler.config.chunked, "wall_s": round(wall, 1),
               "measured_preemptions": llm.stats.num_preemptions,
               "simulated_preemptions": sim.summary["num_preemptions"]}  # fmt: skip
    for m in METRICS:
        err = _errors(np.array([x[f"measured_{m}"] for x in rows]), np.array([x[f"simulated_{m}"] for x in rows]))
        summary[f"median_{m}_error"] = float(np.median(err)) if len(err) else float("nan")
        summary[f"p90_{m}_error"] = float(np.percentile(err, 90)) if len(err) else float("nan")
    tokens, first = sum(r.output_len for r in requests), min(r.arrival_time for r in requests)
    for side in ("measured", "simulated"):
        end = max(x["arrival_time"] + x[f"{side}_e2e_latency"] for x in rows)
        summary[f"{side}_tokens_per_s"] = tokens / (end - first)
    summary["throughput_error"] = abs(summary["simulated_tokens_per_s"] / summary["measured_tokens_per_s"] - 1)
    return summary, rows


def figure(rows: list[dict], path: str) -> None:
    """Simulated vs measured TTFT, ITL and E2E per request, one colour per trace; the diagonal and +-20%."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    from sim.outfiles import save_figure

    titles = {"ttft": "time to first token", "itl_mean": "mean inter-token latency", "e2e_latency": "end-to-end latency"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.4))
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    for ax, m in zip(axes, METRICS):
        values = []
        for trace in traces:
            x = np.array([r[f"measured_{m}"] for r in rows if r["trace"] == trace])
            y = np.array([r[f"simulated_{m}"] for r in rows if r["trace"] == trace])
            ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
            ax.scatter(x[ok], y[ok], s=14, alpha=0.75, label=trace)
            values += [*x[ok], *y[ok]]
        lo, hi = min(values) / 1.3, max(values) * 1.3
        line = np.array([lo, hi])
        ax.plot(line, line, color="black", lw=1)
        for f in (0.8, 1.2):
            ax.plot(line, line * f, color="gray", lw=0.8, ls="--")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), title=titles[m],
               xlabel="measured on the engine (s)", ylabel="simulated, calibrated cost model (s)")
        for axis in (ax.xaxis, ax.yaxis):  # label the decades only: minor labels on a short log axis collide
            axis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.25)
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle("The simulator vs the engine, request by request (dashed: +-20%)")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", action="append", metavar="FILE",
                   help="a .jsonl/.csv request trace (sim.trace) to replay; repeatable (default: the held-out suite)")
    p.add_argument("--cost-model", default=DEFAULT_COST_MODEL,
                   help=f"calibrated cost model (default: {DEFAULT_COST_MODEL}, from `python -m reference calibrate`)")
    p.add_argument("--num-gpu-blocks", type=int, help=f"--trace: the engine's KV blocks (default: {DEFAULT_BLOCKS})")
    p.add_argument("--max-num-batched-tokens", type=int, help="--trace: the step's token budget (default: the engine's)")
    p.add_argument("--no-chunked-prefill", action="store_true", help="--trace: whole prompts only")
    p.add_argument("--quick", action="store_true", help=f"the suite with 8 short requests per trace (a smoke run; "
                   f"its files go under {QUICK_DIR}/ unless named, so the committed results stay)")
    p.add_argument("--traces-dir", help=f"where the suite writes its traces (default: {DEFAULT_TRACES})")
    p.add_argument("--out", help=f"summary CSV, a row per trace (default: {DEFAULT_OUT})")
    p.add_argument("--requests-csv", help=f"per-request CSV (default: {DEFAULT_REQUESTS})")
    p.add_argument("--figure", help=f"PNG of simulated vs measured (default: {DEFAULT_FIGURE})")
    p.add_argument("--seed", type=int, default=0, help="seed of the suite's traces and of prompt ids (default: 0)")


def _default_paths(args: argparse.Namespace) -> None:
    """Unnamed outputs: the committed files, or with --quick the same names under QUICK_DIR."""
    for name, default in (("traces_dir", DEFAULT_TRACES), ("out", DEFAULT_OUT), ("requests_csv", DEFAULT_REQUESTS),
                          ("figure", DEFAULT_FIGURE)):  # fmt: skip
        if getattr(args, name) is None:
            setattr(args, name, str(Path(QUICK_DIR) / Path(default).name) if args.quick else default)


def check_args(args: argparse.Namespace) -> None:
    """Every flag, the cost model and the traces, before the model loads."""
    _default_paths(args)
    from sim.cost_file import cost_model_for
    from sim.outfiles import check_outputs
    from sim.trace import read_trace

    for flag, value, high in (("--num-gpu-blocks", args.num_gpu_blocks, MAX_BLOCKS),
                              ("--max-num-batched-tokens", args.max_num_batched_tokens, MAX_TOKENS)):
        if value is not None and not 1 <= value <= high:
            raise ValueError(f"{flag}: got {value} (allowed: an integer from 1 to {high})")
    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"--seed: got {args.seed} (allowed: an integer from 0 to {MAX_SEED})")
    if args.trace is None and (args.num_gpu_blocks or args.max_num_batched_tokens or args.no_chunked_prefill):
        raise ValueError("--num-gpu-blocks, --max-num-batched-tokens and --no-chunked-prefill apply to --trace only "
                         "(the suite's traces carry their own settings)")  # fmt: skip
    if args.trace is not None and args.quick:
        raise ValueError("--quick applies to the suite only, not to --trace")
    check_outputs({"--out": args.out, "--requests-csv": args.requests_csv, "--figure": args.figure},
                  {"--cost-model": args.cost_model, **{f"--trace {t}": t for t in args.trace or ()}}, make_parents=True)
    cost_model_for(args.cost_model, "smollm2-135m")  # readable, and measured on the engine's model
    for trace in args.trace or ():
        for r in read_trace(trace):
            if r.n > 1 or r.beam_width > 1 or r.total_len > 8192:
                raise ValueError(f"--trace {trace}: request {r.request_id} has n={r.n}, beam_width={r.beam_width}, "
                                 f"{r.total_len} tokens (allowed: n = beam_width = 1, at most 8192 tokens)")


def _cases(args: argparse.Namespace) -> list[tuple[str, list[Request], dict]]:
    """(name, requests, engine settings) per trace: the --trace files, or the suite (its traces written first)."""
    from sim.trace import read_trace, write_jsonl

    if args.trace:
        engine = {k: v for k, v in (("num_gpu_blocks", args.num_gpu_blocks),
                                    ("max_num_batched_tokens", args.max_num_batched_tokens)) if v is not None}
        if args.no_chunked_prefill:
            engine["enable_chunked_prefill"] = False
        return [(Path(t).stem, read_trace(t), engine) for t in args.trace]
    cases = []
    for case in SUITE:
        requests = case_requests(case, quick=args.quick, seed=args.seed)
        path = Path(args.traces_dir) / f"{case.name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(requests, path)
        cases.append((case.name, requests, dict(case.engine)))
    return cases


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """The `python -m reference validate-sim` command (flags checked by check_args first)."""
    import torch

    from reference.calibrate import measure
    from reference.executor import use_one_cpu_thread
    from reference.models import load_model
    from sim.cost_file import read_cost_model
    from sim.outfiles import write_csv

    cost_model, record = read_cost_model(args.cost_model)  # check_args has checked it is SmolLM2's
    cases = _cases(args)
    use_one_cpu_thread(torch.device("cpu"))
    threads, calibrated = torch.get_num_threads(), record.get("engine", {}).get("threads")
    if calibrated is not None and calibrated != threads:
        print(f"warning: the engine runs {threads} thread(s), the cost model was measured at {calibrated}: "
              f"set OMP_NUM_THREADS={calibrated}", file=sys.stderr)
    loaded = load_model("smollm2")
    measure(loaded, [], progress=False)  # the warm-up only: the first steps load compiled kernels
    summaries, all_rows = [], []
    for i, (name, requests, engine) in enumerate(cases):
        summary, rows = validate(loaded, name, requests, cost_model, engine=engine, seed=args.seed)
        summaries.append(summary)
        all_rows += rows
        print(f"  [{i + 1}/{len(cases)}] {name:14s} {len(requests)} requests in {summary['wall_s']:5.1f} s   "
              f"E2E error median {summary['median_e2e_latency_error']:6.1%} p90 {summary['p90_e2e_latency_error']:6.1%}"
              f"   TTFT median {summary['median_ttft_error']:6.1%}   ITL median {summary['median_itl_mean_error']:6.1%}"
              f"   throughput {summary['throughput_error']:5.1%}", flush=True)
    comments = [f"command: {' '.join(argv)}", f"cost model: {args.cost_model} ({record.get('created', '?')})",
                f"engine threads: {threads}"]
    write_csv(args.out, SUMMARY_COLUMNS, summaries, comments=comments, make_parents=True)
    write_csv(args.requests_csv, REQUEST_COLUMNS, all_rows, comments=comments, make_parents=True)
    figure(all_rows, args.figure)
    print(readme_table(summaries))
    print(f"wrote {args.out}, {args.requests_csv} and {args.figure}")
    return 0


def readme_table(summaries: list[dict]) -> str:
    """The README's table of a validation run, made from its summary rows (the committed CSV); a test checks that
    the README quotes exactly this."""
    lines = ["| trace | requests | E2E error median / p90 | TTFT median / p90 | ITL median / p90 | throughput error "
             "| preemptions engine / sim |", "|---|---|---|---|---|---|---|"]
    for s in summaries:
        cells = [f"{float(s[f'median_{m}_error']):.1%} / {float(s[f'p90_{m}_error']):.1%}" for m in
                 ("e2e_latency", "ttft", "itl_mean")]  # fmt: skip
        lines.append(f"| {s['trace']} | {s['num_requests']} | {' | '.join(cells)} | {float(s['throughput_error']):.1%} "
                     f"| {s['measured_preemptions']} / {s['simulated_preemptions']} |")
    return "\n".join(lines)
