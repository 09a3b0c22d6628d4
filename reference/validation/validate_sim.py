"""`python -m reference validate-sim`: does the simulator predict the engine's latencies? Each trace is served twice:
by the engine in real time (requests added at their arrival times on the wall clock) and by the simulator priced
by a calibrated cost model (`python -m reference calibrate`), with the same scheduler settings and KV pool.

Both run the same scheduler code (sim/scheduling/scheduler.py), so they make the same decisions as long as their clocks
agree; the comparison is per request, of what a user sees (sim.clock.metrics): time to first token (TTFT), mean
inter-token latency (ITL) and end-to-end latency (E2E), each as |simulated - measured| / measured, reported as the
median and p90 over the trace's requests, plus the error of the output throughput (tokens/s over the run).

Without --trace it runs its own held-out suite (`SUITE` in reference/validation/validation_suite.py: traces the calibration
never saw, written under --traces-dir so that each can be replayed alone with --trace), one trace per shape: long
prompts near the token budget, decode-heavy with ~25 sequences at once, mixed lengths, bursty (gamma) arrivals,
chunked prefill under a 256-token budget, parallel sampling (n = 2 and 4), beam search (width 4), a shared system
prompt with prefix caching, and a small pool that preempts by recompute and by swap. Results: a summary CSV (one row per trace), a
per-request CSV and a figure of simulated vs measured latencies, written together or not at all. Each summary row
also prices the engine's own steps of the trace with the cost model (`*_step_error_*`, split into steps with prompt
tokens and plain decodes, with the signed bias): where a trace misses, that says whether the model mispriced the
steps that ran or the simulator ran other steps; and how much simulated time was priced outside the calibrated
range.

NOTE: the engine side is a real-time measurement: run it on a quiet machine, at the thread count the cost model
was measured at (the file says which; a mismatch is reported).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from reference.validation.validation_suite import (
    DEFAULT_BLOCKS,
    FIRST_ID,
    SERVED_ENGINE,
    SERVED_NAME,
    SUITE,
    VOCAB_SIZE,
    case_requests,
    served_requests,
    simulate,
)
from sim.base.limits import MAX_SEED, MAX_TOKENS
from sim.base.request import Request

DEFAULT_COST_MODEL = "figures/cost_model_cpu.json"
DEFAULT_OUT = "figures/validate_sim.csv"
DEFAULT_REQUESTS = "figures/validate_sim_requests.csv"
DEFAULT_FIGURE = "figures/validate_sim.png"
DEFAULT_TRACES = "figures/validation"
ONLINE_DEFAULTS = {"out": "figures/validate_online.csv", "requests_csv": "figures/validate_online_requests.csv",
                   "figure": "figures/validate_online.png"}  # --online's outputs
QUICK_DIR = "figures/quick"  # --quick's outputs (ignored by git): a smoke run never overwrites the committed results
MAX_BLOCKS = 8192  # 6 GiB of SmolLM2 K/V in float32 (720 KiB a block of 16): more than a CPU run needs
METRICS = ("ttft", "itl_mean", "e2e_latency")
SUMMARY_COLUMNS = ("trace", "num_requests", "num_gpu_blocks", "max_num_batched_tokens", "chunked_prefill", "n",
                   "beam_width", "prefix_caching", "preemption",
                   *(f"{stat}_{m}_error" for m in METRICS for stat in ("median", "p90")),
                   "measured_tokens_per_s", "simulated_tokens_per_s", "throughput_error",
                   "measured_preemptions", "simulated_preemptions", "sim_extrapolated_steps",
                   "sim_extrapolated_time_share", *(f"{kind}_step_error_{stat}" for kind in ("all", "prefill", "decode")
                                                    for stat in ("median", "p90")),
                   "prefill_step_bias", "decode_step_bias", "wall_s")
REQUEST_COLUMNS = ("trace", "request_id", "arrival_time", "prompt_len", "output_len",
                   *(f"{side}_{m}" for m in METRICS for side in ("measured", "simulated")))


def _token_ids(requests: list[Request], vocab_size: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng([seed, 0x7A1])
    return [r.prompt_token_ids or rng.integers(FIRST_ID, vocab_size, r.prompt_len).tolist() for r in requests]


def _params(r: Request):
    from reference import BeamSearchParams, SamplingParams

    if r.beam_width > 1:
        return BeamSearchParams(beam_width=r.beam_width, max_tokens=r.output_len, ignore_eos=True)
    # ignore_eos: every sequence runs output_len tokens, as the simulator assumes. NOTE: n samples are greedy, as in
    # the calibration (reference.validation.calibrate._params says why): the blocks they share and copy are the same either way.
    return SamplingParams(n=r.n, temperature=0.0, max_tokens=r.output_len, ignore_eos=True)


def replay(llm, requests: list[Request], prompts: list[list[int]]) -> dict[int, list[float]]:
    """Serve `requests` on the wall clock: each is added once its arrival time has passed (checked between steps,
    as a server's loop would), the engine steps while anything is unfinished and sleeps until the next arrival
    otherwise. Returns, per request id, the times (since the start) of the steps that gave it a token (one per step
    whatever its number of samples or beams, as sim.clock.metrics counts them)."""
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_time)
    times: dict[int, list[float]] = {r.request_id: [] for r in requests}
    by_scheduler_id: dict[int, int] = {}
    nxt, start = 0, time.perf_counter()
    while nxt < len(order) or llm.has_unfinished_requests():
        now = time.perf_counter() - start
        while nxt < len(order) and requests[order[nxt]].arrival_time <= now:
            r = requests[order[nxt]]
            public = llm.add_request(prompts[order[nxt]], _params(r), request_id=str(r.request_id))
            by_scheduler_id[llm.scheduler_request_id(public)] = r.request_id
            nxt += 1
        if not llm.has_unfinished_requests():
            time.sleep(max(0.0, requests[order[nxt]].arrival_time - now))
            continue
        logged = len(llm.step_log)
        llm.step()
        now = time.perf_counter() - start
        for record in llm.step_log[logged:]:
            for rid in record.sampled_request_ids:
                times[by_scheduler_id[rid]].append(now)
    return times


def measured_latencies(requests: list[Request], times: dict[int, list[float]]) -> dict[int, dict[str, float]]:
    """TTFT, mean ITL and E2E per request from its token times (sim.clock.metrics' definitions)."""
    out = {}
    for r in requests:
        t = times[r.request_id]
        itl = (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else float("nan")
        out[r.request_id] = {"ttft": t[0] - r.arrival_time, "itl_mean": itl, "e2e_latency": t[-1] - r.arrival_time}
    return out


def relative_errors(measured: np.ndarray, simulated: np.ndarray) -> np.ndarray:
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
    kv = llm.scheduler.kv
    summary = {"trace": name, "num_requests": len(requests), "num_gpu_blocks": kv.num_blocks,
               "max_num_batched_tokens": llm.scheduler.config.max_num_batched_tokens,
               "chunked_prefill": llm.scheduler.config.chunked, "n": max(r.n for r in requests),
               "beam_width": max(r.beam_width for r in requests), "prefix_caching": kv.enable_prefix_caching,
               "preemption": llm.scheduler.config.preemption, "wall_s": round(wall, 1),
               "measured_preemptions": llm.stats.num_preemptions,
               "simulated_preemptions": sim.summary["num_preemptions"],
               "sim_extrapolated_steps": sim.summary.get("extrapolated_steps", 0),
               "sim_extrapolated_time_share": sim.summary.get("extrapolated_time_share", 0.0),
               **step_errors(cost_model, llm.step_log)}
    for m in METRICS:
        err = relative_errors(np.array([x[f"measured_{m}"] for x in rows]),
                              np.array([x[f"simulated_{m}"] for x in rows]))
        summary[f"median_{m}_error"] = float(np.median(err)) if len(err) else float("nan")
        summary[f"p90_{m}_error"] = float(np.percentile(err, 90)) if len(err) else float("nan")
    tokens, first = sum(r.output_len for r in requests), min(r.arrival_time for r in requests)
    for side in ("measured", "simulated"):
        end = max(x["arrival_time"] + x[f"{side}_e2e_latency"] for x in rows)
        summary[f"{side}_tokens_per_s"] = tokens / (end - first)
    summary["throughput_error"] = abs(summary["simulated_tokens_per_s"] / summary["measured_tokens_per_s"] - 1)
    return summary, rows


def step_errors(cost_model, step_log) -> dict:
    """The cost model on the engine's own steps of the trace (each step's shape priced, against its measured time):
    where a trace's latencies miss, this says whether the model mispriced the steps that ran or the simulator ran
    other steps. Split into steps that computed prompt tokens and plain decode steps; swap steps apart (their copies
    are priced by swap_bandwidth, not measured)."""
    kinds: dict[str, list[float]] = {"all": [], "prefill": [], "decode": []}
    for r in step_log:
        if r.blocks_to_swap_in or r.blocks_to_swap_out or r.step_time_s <= 0:
            continue
        predicted = cost_model.step_time(r.num_prefill_tokens, len(r.decodes), r.num_context_tokens, r.num_prefill_pairs,
                                         r.num_shared_context_tokens)
        error = (predicted - r.step_time_s) / r.step_time_s
        kinds["all"].append(error)
        kinds["prefill" if r.num_prefill_tokens else "decode"].append(error)
    out = {}
    for kind, errors in kinds.items():
        e = np.abs(np.array(errors))
        out[f"{kind}_step_error_median"] = float(np.median(e)) if len(e) else float("nan")
        out[f"{kind}_step_error_p90"] = float(np.percentile(e, 90)) if len(e) else float("nan")
        if kind != "all":  # signed: does the model price these steps too high (> 0) or too low?
            out[f"{kind}_step_bias"] = float(np.median(errors)) if errors else float("nan")
    return out


def figure(rows: list[dict], path: str, files=None, *, xlabel: str = "measured on the engine (s)",
           title: str = "The simulator vs the engine, request by request (dashed: +-20%)") -> None:
    """Simulated vs measured TTFT, ITL and E2E per request, one colour per trace; the diagonal and +-20%."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    from sim.base.outfiles import save_figure

    titles = {"ttft": "time to first token", "itl_mean": "mean inter-token latency", "e2e_latency": "end-to-end latency"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.4))
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    for ax, m in zip(axes, METRICS):
        values = []
        for trace in traces:
            x = np.array([r[f"measured_{m}"] for r in rows if r["trace"] == trace])
            y = np.array([r[f"simulated_{m}"] for r in rows if r["trace"] == trace])
            ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
            k = traces.index(trace)  # 10 colours, then the same colours with another marker
            ax.scatter(x[ok], y[ok], s=14, alpha=0.75, label=trace, color=plt.cm.tab10(k % 10), marker="os^D"[k // 10 % 4])
            values += [*x[ok], *y[ok]]
        lo, hi = min(values) / 1.3, max(values) * 1.3
        line = np.array([lo, hi])
        ax.plot(line, line, color="black", lw=1)
        for f in (0.8, 1.2):
            ax.plot(line, line * f, color="gray", lw=0.8, ls="--")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), title=titles[m],
               xlabel=xlabel, ylabel="simulated, calibrated cost model (s)")
        for axis in (ax.xaxis, ax.yaxis):  # label the decades only: minor labels on a short log axis collide
            axis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.25)
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, files=files)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", action="append", metavar="FILE",
                   help="a .jsonl/.csv request trace (sim.workloads.trace) to replay; repeatable (default: the held-out suite)")
    p.add_argument("--cost-model", default=DEFAULT_COST_MODEL,
                   help=f"calibrated cost model (default: {DEFAULT_COST_MODEL}, from `python -m reference calibrate`)")
    p.add_argument("--num-gpu-blocks", type=int, help=f"--trace: the engine's KV blocks (default: {DEFAULT_BLOCKS})")
    p.add_argument("--max-num-batched-tokens", type=int, help="--trace: the step's token budget (default: the engine's)")
    p.add_argument("--no-chunked-prefill", action="store_true", help="--trace: whole prompts only")
    p.add_argument("--enable-prefix-caching", action="store_true", help="--trace: cache full blocks of prompts (the "
                   "trace's prompt_token_ids decide what is shared; JSONL)")
    p.add_argument("--preemption", choices=("recompute", "swap"), help="--trace: how a request is preempted when the "
                   "pool runs out (default: recompute; swap needs --num-cpu-blocks)")
    p.add_argument("--num-cpu-blocks", type=int, help="--trace: CPU blocks to swap to (default: 0)")
    p.add_argument("--only", action="append", metavar="NAME", help="the suite: run only this trace (repeatable; "
                   "names: " + ", ".join(case.name for case in SUITE) + ")")
    p.add_argument("--quick", action="store_true", help=f"the suite with 8 short requests per trace (a smoke run; "
                   f"its files go under {QUICK_DIR}/ unless named, so the committed results stay)")
    p.add_argument("--traces-dir", help=f"where the suite writes its traces (default: {DEFAULT_TRACES})")
    p.add_argument("--out", help=f"summary CSV, a row per trace (default: {DEFAULT_OUT})")
    p.add_argument("--requests-csv", help=f"per-request CSV (default: {DEFAULT_REQUESTS})")
    p.add_argument("--figure", help=f"PNG of simulated vs measured (default: {DEFAULT_FIGURE})")
    p.add_argument("--seed", type=int, default=0, help="seed of the suite's traces and of prompt ids (default: 0)")
    p.add_argument("--online", action="store_true", help="serve the --trace through `python -m reference serve` (in "
                   "this process) to an HTTP client at its arrival times, and compare the latencies the client saw, "
                   "and the engine's own, with the simulator's (reference/validation/validate_online.py; default outputs: "
                   f"{', '.join(ONLINE_DEFAULTS.values())})")


def _default_paths(args: argparse.Namespace) -> None:
    """Unnamed outputs: the committed files, or with --quick the same names under QUICK_DIR; --online's own."""
    defaults = {"traces_dir": DEFAULT_TRACES, "out": DEFAULT_OUT, "requests_csv": DEFAULT_REQUESTS,
                "figure": DEFAULT_FIGURE, **(ONLINE_DEFAULTS if getattr(args, "online", False) else {})}
    for name, default in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, str(Path(QUICK_DIR) / Path(default).name) if args.quick else default)


def check_args(args: argparse.Namespace) -> None:
    """Every flag, the cost model and the traces, before the model loads."""
    _default_paths(args)
    from sim.base.outfiles import check_outputs
    from sim.clock.cost_file import cost_model_for
    from sim.workloads.trace import read_trace

    for flag, value, high in (("--num-gpu-blocks", args.num_gpu_blocks, MAX_BLOCKS),
                              ("--max-num-batched-tokens", args.max_num_batched_tokens, MAX_TOKENS)):
        if value is not None and not 1 <= value <= high:
            raise ValueError(f"{flag}: got {value} (allowed: an integer from 1 to {high})")
    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"--seed: got {args.seed} (allowed: an integer from 0 to {MAX_SEED})")
    if args.num_cpu_blocks is not None and not 0 <= args.num_cpu_blocks <= MAX_BLOCKS:
        raise ValueError(f"--num-cpu-blocks: got {args.num_cpu_blocks} (allowed: an integer from 0 to {MAX_BLOCKS})")
    trace_only = (args.num_gpu_blocks is not None or args.max_num_batched_tokens is not None or args.no_chunked_prefill
                  or args.enable_prefix_caching or args.preemption is not None or args.num_cpu_blocks is not None)
    if args.trace is None and trace_only:
        raise ValueError("--num-gpu-blocks, --max-num-batched-tokens, --no-chunked-prefill, --enable-prefix-caching, "
                         "--preemption and --num-cpu-blocks apply to --trace only (the suite's traces carry their own "
                         "settings)")
    if args.preemption == "swap" and not args.num_cpu_blocks:
        raise ValueError("--preemption swap needs --num-cpu-blocks N (N > 0): CPU blocks to swap to")
    if args.online and (len(args.trace or ()) > 1 or args.quick or args.only):
        raise ValueError("--online serves one trace (allowed: --online alone, its ShareGPT-shaped trace, or --online "
                         "--trace FILE, once; --quick and --only pick traces of the offline suite)")
    if args.trace is not None and args.quick:
        raise ValueError("--quick applies to the suite only, not to --trace")
    if args.trace is not None and args.only:
        raise ValueError("--only picks traces of the suite, not of --trace")
    unknown = [name for name in args.only or () if name not in {case.name for case in SUITE}]
    if unknown:
        raise ValueError(f"--only: no suite trace {unknown[0]!r} (allowed: {', '.join(case.name for case in SUITE)})")
    names = [] if args.trace else [case.name for case in SUITE if not args.only or case.name in args.only]
    if args.online:
        names = [] if args.trace else [SERVED_NAME]
    traces = [(f"--traces-dir {args.traces_dir}", str(Path(args.traces_dir) / f"{name}.jsonl")) for name in names]
    if Path(args.traces_dir).exists() and not Path(args.traces_dir).is_dir():
        raise ValueError(f"--traces-dir {args.traces_dir}: not a folder (allowed: a folder, made if missing)")
    check_outputs([("--out", args.out), ("--requests-csv", args.requests_csv), ("--figure", args.figure), *traces],
                  {"--cost-model": args.cost_model, **{f"--trace {t}": t for t in args.trace or ()}}, make_parents=True)
    cost_model_for(args.cost_model, "smollm2-135m")  # readable, and measured on the engine's model
    for trace in args.trace or ():
        for r in read_trace(trace):
            blocks = -(-r.total_len // 16) * r.num_seqs  # the engine's admission rule, blocks of 16 tokens
            if blocks > (args.num_gpu_blocks or DEFAULT_BLOCKS):
                raise ValueError(f"--trace {trace}: request {r.request_id} needs {blocks} KV blocks of 16 tokens, more "
                                 f"than the pool's {args.num_gpu_blocks or DEFAULT_BLOCKS} (allowed: a larger "
                                 f"--num-gpu-blocks)")
            if r.total_len > 8192:
                raise ValueError(f"--trace {trace}: request {r.request_id} has {r.total_len} tokens, prompt and output "
                                 f"(allowed: at most SmolLM2's context, 8192 tokens)")
            if r.prompt_token_ids is not None and not all(0 <= t < VOCAB_SIZE for t in r.prompt_token_ids):
                raise ValueError(f"--trace {trace}: request {r.request_id} has a prompt token id outside SmolLM2's "
                                 f"vocabulary (allowed: 0 to {VOCAB_SIZE - 1})")
        if args.online:
            from reference.bench.loadtest import check_requests

            check_requests(read_trace(trace), f"--trace {trace}")


def trace_cases(args: argparse.Namespace) -> list[tuple[str, list[Request], dict]]:
    """(name, requests, engine settings) per trace: the --trace files, or the suite's (written with the results); with
    --online and no --trace, its ShareGPT-shaped trace."""
    from sim.workloads.trace import read_trace

    if args.online and not args.trace:
        return [(SERVED_NAME, served_requests(args.seed), dict(SERVED_ENGINE))]
    if args.trace:
        engine = {k: v for k, v in (("num_gpu_blocks", args.num_gpu_blocks), ("num_cpu_blocks", args.num_cpu_blocks),
                                    ("max_num_batched_tokens", args.max_num_batched_tokens),
                                    ("preemption", args.preemption)) if v is not None}
        if args.no_chunked_prefill:
            engine["enable_chunked_prefill"] = False
        if args.enable_prefix_caching:
            engine["enable_prefix_caching"] = True
        return [(Path(t).stem, read_trace(t), engine) for t in args.trace]
    return [(case.name, case_requests(case, quick=args.quick, seed=args.seed), dict(case.engine))
            for case in SUITE if not args.only or case.name in args.only]


def prepare(cost_model_path: str):
    """(cost model, its JSON record, the engine's threads, SmolLM2 loaded and warmed up): the engine on one thread where
    the machine has several, as calibrate measured it (a mismatch with the cost model's record is a warning)."""
    import torch

    from reference.engine.executor import use_one_cpu_thread
    from reference.models import load_model
    from reference.validation.calibrate import measure
    from sim.clock.cost_file import read_cost_model

    cost_model, record = read_cost_model(cost_model_path)  # check_args has checked it is SmolLM2's
    use_one_cpu_thread(torch.device("cpu"))
    threads, calibrated = torch.get_num_threads(), record.get("engine", {}).get("threads")
    if calibrated is not None and calibrated != threads:
        print(f"warning: the engine runs {threads} thread(s), the cost model was measured at {calibrated}: "
              f"set OMP_NUM_THREADS={calibrated}", file=sys.stderr)
    loaded = load_model("smollm2")
    measure(loaded, [], progress=False)  # the warm-up only: the first steps load compiled kernels
    return cost_model, record, threads, loaded


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """The `python -m reference validate-sim` command (flags checked by check_args first)."""
    from sim.base.outfiles import atomic_files, write_csv
    from sim.workloads.trace import jsonl_text

    cases = trace_cases(args)
    cost_model, record, threads, loaded = prepare(args.cost_model)
    summaries, all_rows = [], []
    for i, (name, requests, engine) in enumerate(cases):
        summary, rows = validate(loaded, name, requests, cost_model, engine=engine, seed=args.seed)
        summaries.append(summary)
        all_rows += rows
        print(f"  [{i + 1}/{len(cases)}] {name:14s} {len(requests)} requests in {summary['wall_s']:5.1f} s   "
              f"E2E error median {summary['median_e2e_latency_error']:6.1%} p90 {summary['p90_e2e_latency_error']:6.1%}"
              f"   TTFT median {summary['median_ttft_error']:6.1%}   ITL median {summary['median_itl_mean_error']:6.1%}"
              f"   throughput {summary['throughput_error']:5.1%}   model on the engine's steps: median "
              f"{summary['all_step_error_median']:5.1%}", flush=True)
        if summary["sim_extrapolated_steps"]:
            print(f"  note: {summary['sim_extrapolated_steps']} simulated steps "
                  f"({summary['sim_extrapolated_time_share']:.1%} of the simulated step time) were priced outside the "
                  f"cost model's calibrated range", flush=True)
    comments = [f"command: {' '.join(argv)}", f"cost model: {args.cost_model} ({record.get('created', '?')})",
                f"engine threads: {threads}"]
    with atomic_files(make_parents=True) as files:  # every output, or none (the suite's traces too)
        if not args.trace:
            for name, requests, _ in cases:
                with files.open(Path(args.traces_dir) / f"{name}.jsonl") as f:
                    f.write(jsonl_text(requests))
        write_csv(args.out, SUMMARY_COLUMNS, summaries, comments=comments, files=files)
        write_csv(args.requests_csv, REQUEST_COLUMNS, all_rows, comments=comments, files=files)
        figure(all_rows, args.figure, files=files)
    print(readme_table(summaries))
    print(targets_sentence(summaries))
    print(f"wrote {args.out}, {args.requests_csv} and {args.figure}")
    return 0


TARGETS = (("median_e2e_latency_error", 0.10, "median E2E"), ("p90_e2e_latency_error", 0.20, "p90 E2E"),
           ("median_ttft_error", 0.15, "median TTFT"))  # the bar, on the machine that calibrated


def targets_sentence(summaries: list[dict]) -> str:
    """Which traces meet the targets and, for each that misses, the breakdown that says why (the README's
    `validation` block, made by reference/validation/readme_numbers.py from the committed CSV, ends with this)."""
    bar = ", ".join(f"{label} error <= {limit:.0%}" for _, limit, label in TARGETS)
    missed = [(s, [label for key, limit, label in TARGETS if not float(s[key]) <= limit]) for s in summaries]
    missed = [(s, labels) for s, labels in missed if labels]
    text = f"{len(summaries) - len(missed)} of {len(summaries)} traces meet the targets ({bar})"
    if not missed:
        return text + "."
    parts = []
    for s, labels in missed:
        steps = "; ".join(
            f"{kind} steps {float(s[f'{kind}_step_error_median']):.1%} (signed median {float(s[f'{kind}_step_bias']):+.1%})"
            for kind in ("prefill", "decode") if s[f"{kind}_step_error_median"] not in ("", "nan")
            and float(s[f"{kind}_step_error_median"]) == float(s[f"{kind}_step_error_median"]))
        parts.append(f"{s['trace']} misses {' and '.join(labels)} (the model on the engine's own steps of it: {steps}; "
                     f"preemptions {s['measured_preemptions']} on the engine, {s['simulated_preemptions']} simulated)")
    return text + "; " + "; ".join(parts) + "."


def readme_table(summaries: list[dict]) -> str:
    """The README's table of a validation run, made from its summary rows (the committed CSV): the README's
    `validation` block (reference/validation/readme_numbers.py) carries it."""
    lines = ["| trace | requests | E2E error median / p90 | TTFT median / p90 | ITL median / p90 | throughput error "
             "| preemptions engine / sim | model on the engine's steps (median) | sim time outside the calibrated "
             "range |", "|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        cells = [f"{float(s[f'median_{m}_error']):.1%} / {float(s[f'p90_{m}_error']):.1%}" for m in
                 ("e2e_latency", "ttft", "itl_mean")]
        lines.append(f"| {s['trace']} | {s['num_requests']} | {' | '.join(cells)} | {float(s['throughput_error']):.1%} "
                     f"| {s['measured_preemptions']} / {s['simulated_preemptions']} "
                     f"| {float(s['all_step_error_median']):.1%} | {float(s['sim_extrapolated_time_share']):.1%} |")
    return "\n".join(lines)
