"""`python -m sim`: the simulator's command line (a thin user of `sim.run` and the benchmarks).

    python -m sim run --model opt-13b --gpu a100-40gb --workload sharegpt --rate 2 --duration 3600 --policy paged --json
    python -m sim bench [--quick] [--csv PATH]          simulator speed (sim.drivers.bench_sim)
    python -m sim bench-alloc ...                       allocator ops/s (sim.drivers.bench_alloc)
    python -m sim figures [--only NAME ...] [--quick]   the paper-style figures into figures/ (sim.figures)
    python -m sim sweep --grid 'rate=1,2' [--set ...]   sim.run over a parameter grid, one CSV row each (sim.drivers.sweep)
    python -m sim animate [--out PATH.gif]              the pool, step by step, as an animated GIF (sim.views.viewer)
    python -m sim paper-table [--write | --check]       the README's table of the paper's numbers beside the lab's
    python -m sim paper-sensitivity [--out PATH]        the sweep behind that table's notes (sim.figures.paper*)
    python -m sim readme-numbers [--write | --check]    the README's other numbers, from the committed results
    python -m sim disagg --prefill N --decode M [--colocated]   prefill/decode instances apart (sim.disagg)

Each subcommand is one `add_<name>_parser(sub)` function that declares its flags and sets `func`; `main`
dispatches. Bad input (a flag value, a trace file) ends with one line `error: ...` on stderr and exit
status 2, never a traceback (docs/ARCHITECTURE.md, "Bad input").
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import NoReturn

from ..base.specs import GPUS, KV_CACHE_DTYPES, MODELS
from ..config import MODES, PREEMPTION_MODES, RUN_DEFAULTS, SCHEDULING_POLICIES, default_max_num_batched_tokens
from ..kv import POLICIES
from ..kv.base import SHARE_NAMES
from ..kv.slots import ALLOCATORS
from ..scheduling.preemption import VICTIM_POLICIES
from ..views.pool_page import MAX_STEPS as POOL_PAGE_STEPS
from ..views.pool_page import STEPS_RANGE as POOL_PAGE_STEPS_RANGE
from ..workloads.workload import ARRIVALS, DATASETS

BAR_WIDTH = 40  # characters of the memory bar chart for a share of 100%


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        if message.endswith(": expected one argument"):  # e.g. --rate -inf: argparse took '-inf' for a flag
            flag = message.split(":")[0].removeprefix("argument ").split("/")[-1]
            message += f" (a value that starts with '-' is written {flag}=VALUE)"
        self.exit(2, f"error: {message}\n")


def _choices(values) -> str:
    return "{" + ",".join(values) + "}"


def _pair(text: str) -> tuple[int, int]:
    """'LO,HI' -> (LO, HI) for the uniform workload's length ranges."""
    try:
        low, high = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO,HI (two integers), got {text!r}") from None
    return low, high


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m sim",
        description="Simulate LLM serving with a paged (vLLM) or contiguous (Orca baselines) KV cache, "
        "after Kwon et al., SOSP 2023.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_run_parser(sub)
    add_bench_parser(sub)
    add_bench_alloc_parser(sub)
    add_figures_parser(sub)
    add_sweep_parser(sub)
    add_animate_parser(sub)
    add_paper_table_parser(sub)
    add_paper_sensitivity_parser(sub)
    add_readme_numbers_parser(sub)
    add_disagg_parser(sub)
    return parser


def _budget_help() -> str:
    """The default token budget as `sim.run` picks it (sim.config.default_max_num_batched_tokens), for every model."""
    budget = default_max_num_batched_tokens
    by_model = "; ".join(f"{name} {budget('v1', False, m.max_seq_len):,} / {budget('v0', False, m.max_seq_len):,}"
                         for name, m in MODELS.items())
    return (f"{budget('v1', True):,} in v1 with chunked prefill; without it the model's context, "
            f"at least {budget('v1', False):,} in v1 and "
            f"{budget('v0', False):,} in v0/static; per model, v1 / v0: {by_model}")


def add_run_parser(sub) -> None:
    D = RUN_DEFAULTS
    p = sub.add_parser("run", help="simulate one serving run and print its summary",
                       description="Simulate one serving run (paper section 6) and print the summary: throughput, "
                       "normalized latency, batch size, preemptions and the time-weighted KV memory breakdown.")
    g = p.add_argument_group("hardware and model")
    g.add_argument("--model", default=D["model"], metavar=_choices(MODELS), help="model spec (default: %(default)s)")
    g.add_argument("--gpu", default=D["gpu"], metavar=_choices(GPUS), help="GPU spec (default: %(default)s)")
    g.add_argument("--num-gpus", type=int, default=D["num_gpus"], help="GPUs, tensor parallel (default: %(default)s)")
    g.add_argument("--kv-slots", type=int, help="KV pool size in token slots (default: what vLLM's 90%% memory rule leaves)")
    g.add_argument("--kv-dtype", default=D["kv_dtype"], metavar=_choices(KV_CACHE_DTYPES),
                   help="how the KV cache stores a token: auto (the model's 2 bytes), fp16, fp8 (1 byte) or int8 (1 "
                   "byte + a 4-byte scale per token and KV head); the pool's token slots and the attention's K/V "
                   "reads follow (default: %(default)s)")
    g.add_argument("--cost-model", metavar="FILE", help="price steps with a calibrated model (JSON from `python -m "
                   "reference calibrate`, measured on --model) instead of --gpu's roofline; --gpu then only sizes the pool")
    g = p.add_argument_group("workload")
    g.add_argument("--workload", default=D["workload"], metavar=_choices(DATASETS),
                   help="request lengths: ShareGPT/Alpaca-shaped log-normals, fixed or uniform; conversation: "
                   "multi-turn chat sessions, --rate in sessions/s (default: %(default)s)")
    g.add_argument("--rate", type=float, default=D["rate"], help="mean arrival rate, requests/s (default: %(default)s)")
    g.add_argument("--duration", type=float, default=D["duration"], help="seconds of arrivals (default: %(default)s)")
    g.add_argument("--num-requests", type=int, help="exactly this many requests (instead of --duration)")
    g.add_argument("--arrival", default=D["arrival"], metavar=_choices(ARRIVALS),
                   help="arrival process; offline = all at t=0, needs --num-requests (default: %(default)s)")
    g.add_argument("--burstiness", type=float, default=D["burstiness"], help="gamma arrivals' shape k: CV = 1/sqrt(k) (default: %(default)s)")
    g.add_argument("--seed", type=int, default=D["seed"], help="seed of the workload and beam scores (default: %(default)s)")
    g.add_argument("--n", type=int, default=D["n"], help="parallel samples per request (default: %(default)s)")
    g.add_argument("--beam-width", type=int, default=D["beam_width"], help="beam search width (default: %(default)s, no beam search)")
    g.add_argument("--prefix-len", type=int, default=D["prefix_len"], help="shared prefix tokens prepended to each prompt (default: %(default)s)")
    g.add_argument("--num-prefixes", type=int, default=D["num_prefixes"], help="distinct shared prefixes (default: %(default)s)")
    g.add_argument("--prompt-len", type=int, help="--workload fixed: prompt tokens")
    g.add_argument("--output-len", type=int, help="--workload fixed: output tokens")
    g.add_argument("--prompt-len-range", type=_pair, metavar="LO,HI", help="--workload uniform: prompt tokens")
    g.add_argument("--output-len-range", type=_pair, metavar="LO,HI", help="--workload uniform: output tokens")
    g.add_argument("--trace", metavar="FILE", help="read requests from a .jsonl/.csv trace instead, or import a ShareGPT "
                   ".json file (--rate, --arrival offline and --seed then set its arrivals) (sim.workloads.trace)")
    g.add_argument("--conversations", action="store_true", help="--trace FILE.json: import every turn of the "
                   "ShareGPT conversations as multi-turn sessions (--rate: sessions/s), not only the first "
                   "(sim.workloads.conversation_import)")
    g.add_argument("--turns", type=float, default=D["turns"],
                   help="--workload conversation: mean turns per session, geometric (default: %(default)s)")
    g.add_argument("--think-time", type=float, default=D["think_time"], help="--workload conversation or "
                   "--conversations: mean seconds between a session's turns (default: %(default)s)")
    g.add_argument("--history-limit", type=int, metavar="TOKENS", help="--workload conversation or --conversations: "
                   "keep the prompt's last TOKENS tokens and cut replies to the context left (the paper's chatbot: "
                   "1024); default: a session ends where its history outgrows the context")
    g = p.add_argument_group("serving system")
    g.add_argument("--policy", default=D["policy"], metavar=_choices(POLICIES),
                   help="KV cache: paged (vLLM), contiguous Orca max/pow2/oracle reservations, or vattention "
                   "(a virtual range per request, pages mapped on demand) (default: %(default)s)")
    g.add_argument("--block-size", type=int, default=D["block_size"], help="tokens per KV block, paged only (default: %(default)s)")
    g.add_argument("--page-kib", type=float, metavar="KIB", help="--policy vattention: physical page in KiB per layer "
                   "per K/V buffer, a whole number of tokens (OPT-13B: multiples of 10; default: the smallest such "
                   "page >= 64 KiB)")
    g.add_argument("--allocator", default=D["allocator"], metavar=_choices(ALLOCATORS),
                   help="contiguous policies' slot allocator (default: %(default)s)")
    g.add_argument("--preemption", default=D["preemption"], metavar=_choices(PREEMPTION_MODES),
                   help="what a preempted request loses (default: %(default)s)")
    g.add_argument("--swap-space", type=float, default=D["swap_space_gib"], help="CPU swap space per GPU, GiB (default: %(default)s)")
    g.add_argument("--cpu-offload-gib", type=float, default=D["cpu_offload_gib"], metavar="GIB",
                   help="a CPU offload tier per GPU, GiB: evicted prefix-cache blocks are kept there and reloaded over "
                   "PCIe on a hit (paged; turns prefix caching on) (default: %(default)s, none)")
    g.add_argument("--scheduler", default=D["scheduler"], metavar=_choices(MODES),
                   help="v1: token budget and chunked prefill (today's vLLM); v0: the paper's prefill-only steps; "
                   "static: request-level batching (default: %(default)s)")
    g.add_argument("--no-chunked-prefill", action="store_true",
                   help="v1 without chunked prefill: a prompt must fit what is left of the token budget")
    g.add_argument("--victim", default=D["victim"], metavar=_choices(VICTIM_POLICIES),
                   help="who is preempted when memory runs out (default: %(default)s)")
    g.add_argument("--scheduling-policy", default=D["scheduling_policy"], metavar=_choices(SCHEDULING_POLICIES),
                   help="the queues' order: fcfs (arrival) or priority (each request's priority, lower first, then "
                   "arrival; vLLM's --scheduling-policy) (default: %(default)s)")
    g.add_argument("--priority-share", type=float, default=D["priority_share"], metavar="SHARE",
                   help="a generated workload: the share of requests given priority 0, the rest 1 (a trace's own "
                   "column: priority) (default: %(default)s)")
    g.add_argument("--num-speculative-tokens", type=int, default=D["num_speculative_tokens"], metavar="K",
                   help="speculative decoding: draft tokens each decode verifies per step (vLLM's "
                   "num_speculative_tokens; 0 = off) (default: %(default)s)")
    g.add_argument("--acceptance-rate", type=float, default=D["acceptance_rate"], metavar="ALPHA",
                   help="speculative decoding: the chance that a draft token is accepted when every draft before it "
                   "was (i.i.d., Leviathan et al. 2023; an assumption: measure your draft's) (default: %(default)s)")
    g.add_argument("--prefix-caching", default="auto", metavar="{auto,on,off}",
                   help="paged prefix caching; auto = on when --prefix-len > 0 (default: %(default)s)")
    g.add_argument("--max-num-seqs", type=int, default=D["max_num_seqs"], help="running sequences at most (default: %(default)s)")
    g.add_argument("--watermark", type=float, default=D["watermark"],
                   help="fraction of KV blocks kept free when admitting (default: %(default)s, vLLM v0's)")
    g.add_argument("--max-num-batched-tokens", type=int, help=f"token budget of a step (default: {_budget_help()})")
    g.add_argument("--slo-ttft", type=float, metavar="SECONDS", help="time-to-first-token target for SLO attainment")
    g.add_argument("--slo-tbt", type=float, metavar="SECONDS",
                   help="time-between-tokens target (a request's mean inter-token latency) for SLO attainment")
    g = p.add_argument_group("output")
    g.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    g.add_argument("--requests-csv", metavar="PATH", help="also write the per-request table")
    g.add_argument("--steps-csv", metavar="PATH", help="also write the per-step table")
    g.add_argument("--chrome-trace", metavar="PATH", help="also write the step and request timeline as a Chrome trace "
                   "(JSON; open in ui.perfetto.dev or chrome://tracing)")
    g.add_argument("--pool-page", metavar="PATH", help="also write the run as a page of the KV pool that replays it step "
                   "by step in a browser (HTML, no server; the page `python -m reference serve` shows live at /pool); "
                   "steps token by token")
    g.add_argument("--pool-page-steps", type=int, default=POOL_PAGE_STEPS, metavar="N",
                   help="--pool-page: steps the page keeps, evenly spread over a longer run (default: %(default)s, "
                   f"{POOL_PAGE_STEPS_RANGE[0]} to {POOL_PAGE_STEPS_RANGE[1]:,})")
    g.add_argument("--no-jump", action="store_true", help="step token by token (same results, slower)")
    g.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from ..api import run
    from ..base.outfiles import check_outputs

    # Outputs first, before the run: writable, not a folder, not the trace, not each other (sim.base.outfiles).
    check_outputs({"--requests-csv": args.requests_csv, "--steps-csv": args.steps_csv,
                   "--chrome-trace": args.chrome_trace, "--pool-page": args.pool_page},
                  {"--trace": args.trace, "--cost-model": args.cost_model})
    low, high = POOL_PAGE_STEPS_RANGE
    if not low <= args.pool_page_steps <= high:
        raise ValueError(f"--pool-page-steps: got {args.pool_page_steps} (allowed: an integer from {low} to {high:,})")
    if "pool_page_steps" in args.typed and not args.pool_page:
        raise ValueError(f"--pool-page-steps {args.pool_page_steps}: means nothing without --pool-page (allowed: with "
                         f"--pool-page PATH)")
    recorder = None
    if args.pool_page:
        from ..views.pool_page import ReplayRecorder

        recorder = ReplayRecorder(args.pool_page_steps)

    caching = {"auto": None, "on": True, "off": False}
    if args.prefix_caching not in caching:
        raise ValueError(f"--prefix-caching: got {args.prefix_caching!r} (allowed: auto, on, off)")
    _check_typed_flags(args)
    result = run(
        model=args.model, gpu=args.gpu, num_gpus=args.num_gpus, workload=args.workload, rate=args.rate,
        duration=args.duration, num_requests=args.num_requests, policy=args.policy, block_size=args.block_size,
        kv_dtype=args.kv_dtype,
        page_kib=args.page_kib,
        seed=args.seed, n=args.n, beam_width=args.beam_width, prefix_len=args.prefix_len,
        num_prefixes=args.num_prefixes, preemption=args.preemption, swap_space_gib=args.swap_space, trace=args.trace,
        cpu_offload_gib=args.cpu_offload_gib,
        scheduler=args.scheduler, arrival=args.arrival, burstiness=args.burstiness, allocator=args.allocator,
        enable_prefix_caching=caching[args.prefix_caching], max_num_seqs=args.max_num_seqs, watermark=args.watermark,
        max_num_batched_tokens=args.max_num_batched_tokens, jump=not (args.no_jump or recorder), kv_slots=args.kv_slots,
        progress=args.progress, prompt_len=args.prompt_len, output_len=args.output_len,
        prompt_len_range=args.prompt_len_range, output_len_range=args.output_len_range,
        enable_chunked_prefill=False if args.no_chunked_prefill else None, victim=args.victim,
        scheduling_policy=args.scheduling_policy, priority_share=args.priority_share,
        num_speculative_tokens=args.num_speculative_tokens, acceptance_rate=args.acceptance_rate,
        slo_ttft=args.slo_ttft, slo_tbt=args.slo_tbt, cost_model=args.cost_model, turns=args.turns,
        think_time=args.think_time, history_limit=args.history_limit, conversations=args.conversations,
        on_step=recorder, step_table=bool(args.steps_csv or args.chrome_trace),  # only these read the table
    )
    if "trace_import" in result.summary:  # a ShareGPT file was imported: say how
        print(f"note: {result.summary['trace_import']}", file=sys.stderr)
    if result.summary.get("extrapolated_steps"):  # a calibrated cost model priced steps it never measured
        print(f"note: {extrapolation_sentence(result.summary)}", file=sys.stderr)
    try:
        _write_outputs(args, result, recorder)
    except OSError as exc:  # checked before the run, and still unwritable (a full disk, /dev/full): one line
        if isinstance(exc, BrokenPipeError):
            raise
        raise ValueError(f"cannot write the outputs ({exc.strerror or exc}); none was replaced") from None
    print(json.dumps(result.summary, indent=2) if args.json else format_summary(result.summary))
    return 0


def _write_outputs(args: argparse.Namespace, result, recorder=None) -> None:
    """--requests-csv, --steps-csv, --chrome-trace and --pool-page: every one or none (a failure at the last leaves
    the first as it was)."""
    from ..base.outfiles import atomic_files

    with atomic_files() as files:
        if args.requests_csv:
            result.requests.to_csv(args.requests_csv, files=files)
        if args.steps_csv:
            result.steps.to_csv(args.steps_csv, files=files)
        if args.chrome_trace:
            from ..views.chrome_trace import simulator_rows, write_trace

            title = f"sim run: {args.policy}, {args.scheduler} scheduler, {args.model} on {args.gpu}"
            write_trace(args.chrome_trace, *simulator_rows(result.steps, result.requests), title=title, files=files)
        if recorder is not None:
            recorder.write(args.pool_page, f"sim run: {args.policy}, {args.scheduler} scheduler, {args.model}",
                           files=files)


class Terminated(BaseException):
    """SIGTERM, raised where the program is, so that every `finally` and atomic output group cleans up."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def interruptible(body) -> int:
    """Run a command's body so that Ctrl-C (SIGINT) and SIGTERM end it with one line and the shell's status (130,
    143), no traceback: outputs are written in atomic groups (sim.base.outfiles), so an interruption leaves every old
    output as it was and no temporary behind, and a sweep's workers are terminated (sim.drivers.sweep)."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return body()
    except (KeyboardInterrupt, Terminated, Exception) as exc:
        caught = interruption(exc)
        if caught is None:
            raise
        if isinstance(caught, Terminated):
            print("error: terminated; outputs not yet written were left as they were", file=sys.stderr)
            return 143
        print("error: interrupted; outputs not yet written were left as they were", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def interruption(exc: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or Terminated that `exc` is, or that its chain of causes holds: a C extension that a
    signal interrupts can turn it into another exception (numba, loading a compiled function from its cache, raises
    a SystemError whose cause is the KeyboardInterrupt). None for any other failure."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (KeyboardInterrupt, Terminated)):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def broken_pipe() -> int:
    """After the reader of stdout closed it: point stdout at /dev/null (so Python's own flush at exit cannot fail
    again) and exit as a tool killed by SIGPIPE would, 128 + 13, with nothing printed."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141


def extrapolation_sentence(s: dict) -> str:
    """One line on the steps a calibrated cost model priced outside its calibrated range (sim.api.run's summary)."""
    return (f"{s['extrapolated_steps']} of {s['num_steps']} steps ({s['extrapolated_time_share']:.1%} of the simulated "
            f"step time) were priced outside the cost model's calibrated range ({s['calibrated_range']}), by "
            f"extrapolation")


def _num(value, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def format_summary(s: dict) -> str:
    """A readable summary: the headline numbers, then the memory shares as a text bar chart."""
    unit = "sessions/s" if "num_sessions" in s else "req/s"  # a conversation workload's rate starts sessions
    rate = "" if s.get("rate") is None else f", {s['arrival']} {s['rate']:g} {unit}"
    lines = [
        f"policy {s['policy']}  |  {s['model']} "
        + (f"priced by {s['cost_model']}" if s.get("cost_model") else f"on {s['num_gpus']} x {s['gpu']}")
        + f"  |  {s['workload']}{rate}",
        f"  requests             {s['num_requests']} ({s['num_finished']} finished)"
        + (f" in {s['num_sessions']} sessions" if "num_sessions" in s else ""),
        f"  throughput           {s['throughput_req_per_s']:.3f} req/s",
        f"  normalized latency   {_num(s['normalized_latency_s_per_token'], '.4f')} s/token "
        f"(p50 {_num(s['p50_normalized_latency_s_per_token'], '.4f')}, "
        f"p90 {_num(s['p90_normalized_latency_s_per_token'], '.4f')})",
        f"  TTFT                 mean {_num(s['mean_ttft_s'], '.3f')} s, p50 {_num(s['p50_ttft_s'], '.3f')}, "
        f"p99 {_num(s['p99_ttft_s'], '.3f')}",
        f"  inter-token latency  mean {_num(s['mean_itl_mean_s'], '.4f')} s, p99 {_num(s['p99_itl_mean_s'], '.4f')}; "
        f"largest gap p99 {_num(s['p99_itl_max_s'], '.3f')} s",
        f"  mean batch size      {s['mean_batch_size']:.1f} running requests per step",
        f"  preemptions          {s['num_preemptions']}",
        f"  simulated            {s['sim_time_s']:.1f} s in {s['num_steps']} steps (wall {s['wall_time_s']:.2f} s), "
        f"scheduler {s['scheduler']}",
    ]
    if s.get("extrapolated_steps"):
        lines.append(f"  cost model range     {s['extrapolated_steps']} steps ({s['extrapolated_time_share']:.1%} of step "
                     f"time) priced outside {s['calibrated_range']}")
    if s.get("slo_ttft_s") is not None or s.get("slo_tbt_s") is not None:
        lines.append(f"  SLO attainment       {s['slo_attainment']:.1%} (goodput {s['goodput_req_per_s']:.3f} req/s)")
    if s.get("prefix_cache_hit_rate_tokens") is not None:
        lines.append(f"  prefix cache hits    {s['prefix_cache_hit_rate_tokens']:.1%} of prompt tokens, "
                     f"{_num(s['prefix_cache_hit_rate_blocks'], '.1%')} of full blocks")  # n/a: no full block
    if s.get("cpu_offload_gib"):
        lines.append(f"  offload tier         {_num(s['prefix_cache_hit_rate_gpu_tokens'], '.1%')} of prompt tokens hit "
                     f"on the GPU, {_num(s['prefix_cache_hit_rate_cpu_tokens'], '.1%')} in CPU memory; "
                     f"{s['offloaded_blocks']} blocks offloaded, {s['reloaded_blocks']} reloaded "
                     f"({s['reload_time_s']:.3f} s of PCIe)")
    lines += [
        "",
        f"KV memory, time-weighted: share of the {s['num_kv_slots']} slots (and of the non-free ones)",
    ]
    for name in SHARE_NAMES:
        share = s["memory"][name]
        busy = f"({s['memory_busy'][name]:6.1%})" if name in s["memory_busy"] else " " * 8
        lines.append(f"  {name:<23} {share:6.1%} {busy}  {'#' * round(share * BAR_WIDTH)}")
    return "\n".join(lines)


def add_disagg_parser(sub) -> None:
    from .. import disagg

    p = sub.add_parser("disagg", help="disaggregated prefill/decode instances (DistServe) or the same GPUs colocated: "
                       "SLO attainment and goodput", description=disagg.__doc__.split("\n\n")[0])
    disagg.add_arguments(p)
    p.set_defaults(func=disagg.run_from_args)


def add_bench_parser(sub) -> None:
    from . import bench_sim

    p = sub.add_parser("bench", help="time the simulator (paper-scale runs, a 100k-request run)",
                       description=bench_sim.__doc__.splitlines()[0])
    bench_sim.add_arguments(p)
    p.set_defaults(func=bench_sim.run_from_args)


def add_bench_alloc_parser(sub) -> None:
    # NOTE: no flags of its own: everything after `bench-alloc` (--help included) goes to sim.drivers.bench_alloc.main.
    p = sub.add_parser("bench-alloc", add_help=False, help="time the block/slot allocators (sim.drivers.bench_alloc; see its --help)")
    p.set_defaults(func=_bench_alloc, passthrough=True)


def _bench_alloc(args: argparse.Namespace) -> int:
    from .bench_alloc import main as bench_alloc_main

    return bench_alloc_main(args.extra)


def add_figures_parser(sub) -> None:
    from ..figures import FIGURES  # the registry make_figures reads (paper-sensitivity's flags import sim.figures too)

    p = sub.add_parser("figures", help="regenerate the paper-style figures (PNG + CSV) into figures/",
                       description="Simulate and draw the vLLM paper's utilization and throughput figures "
                       "(sim.figures): each NAME.png beside the NAME.csv it was drawn from.",
                       epilog=f"NAME (for --only), one of: {', '.join(FIGURES)}")
    p.add_argument("--only", nargs="+", metavar="NAME", help="just these figures (default: all; the names are below)")
    p.add_argument("--out", default="figures", metavar="DIR", help="output folder (default: figures)")
    p.add_argument("--quick", action="store_true", help="short traces, few points: a reduced version of each figure")
    p.add_argument("--jobs", type=int, help="worker processes (default: the usable CPU cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=cmd_figures)


def cmd_figures(args: argparse.Namespace) -> int:
    import time

    from ..figures import make_figures

    started, before = time.perf_counter(), os.times()
    written = make_figures(args.only, args.out, quick=args.quick, jobs=args.jobs, progress=not args.no_progress)
    for path in written:
        print(path)
    after = os.times()
    cpu = sum(after[:4]) - sum(before[:4])  # user + system, this process and its finished worker processes
    print(f"{len(written)} files in {time.perf_counter() - started:.1f} s wall, {cpu:.1f} s CPU", file=sys.stderr)
    return 0


def add_sweep_parser(sub) -> None:
    from . import sweep

    p = sub.add_parser("sweep", help="run sim.run over a grid of parameters, one CSV row per point",
                       description=sweep.__doc__.split("\n\n")[0])
    sweep.add_arguments(p)
    p.set_defaults(func=sweep.run_from_args)


def add_animate_parser(sub) -> None:
    p = sub.add_parser("animate", help="the KV pool step by step as an animated GIF (sim.views.viewer; no ffmpeg)",
                       description="Record a small paged run with preemption (sim.views.viewer.DEMO_RUN), one frame per "
                       "step: the pool's memory map, block tables, queues and five shares, as an animated GIF.")
    p.add_argument("--out", default="figures/pool_animation.gif", metavar="PATH",
                   help="the GIF to write (default: figures/pool_animation.gif)")
    p.add_argument("--fps", type=float, default=8.0, help="frames per second (default: 8)")
    p.add_argument("--max-frames", type=int, default=120, help="frames at most: the run's first steps (default: 120)")
    p.add_argument("--dpi", type=float, default=80.0, help="pixels per inch of an 11 x 6 inch frame (default: 80)")
    p.set_defaults(func=cmd_animate)


def cmd_animate(args: argparse.Namespace) -> int:
    import time

    from ..views.viewer import DPI_RANGE, FPS_RANGE, MAX_FRAMES, animate, check_gif_path, check_range, record

    check_range("--fps", args.fps, FPS_RANGE)
    check_range("--dpi", args.dpi, DPI_RANGE)
    if not 1 <= args.max_frames <= MAX_FRAMES:
        raise ValueError(f"--max-frames: got {args.max_frames} (allowed: 1 to {MAX_FRAMES})")
    check_gif_path(args.out, "--out")  # before the work
    started = time.perf_counter()
    snapshots = record(max_steps=args.max_frames)
    size = animate(snapshots, args.out, fps=args.fps, dpi=args.dpi)
    print(args.out)
    print(f"{len(snapshots)} frames, {size / 1e6:.2f} MB in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


def add_paper_table_parser(sub) -> None:
    p = sub.add_parser("paper-table", help="the paper's numbers beside the lab's, from the committed CSVs (README)",
                       description="Print the README section \"The paper, side by side\" (sim.figures.paper): the "
                       "paper's numbers beside the lab's, read from figures/*.csv and figures/paper_sensitivity.csv.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the README's block between its markers")
    mode.add_argument("--check", action="store_true", help="exit 1 if the README's block is not what the CSVs give")
    p.add_argument("--figures", default="figures", metavar="DIR", help="folder of the figure CSVs (default: figures)")
    p.add_argument("--sensitivity", metavar="CSV", help="the sweep's CSV (default: DIR/paper_sensitivity.csv)")
    p.add_argument("--readme", default="docs/paper.md", metavar="PATH",
                   help="for --write/--check (default: docs/paper.md)")
    p.set_defaults(func=cmd_paper_table)


def cmd_paper_table(args: argparse.Namespace) -> int:
    from ..figures.paper import Data, current_block, readme_block, update_readme

    if args.write or args.check:  # the README and its markers first, before reading the CSVs
        try:
            with open(args.readme, encoding="utf-8") as f:
                current = current_block(f.read(), args.readme)
        except FileNotFoundError:
            raise ValueError(f"--readme {args.readme}: no such file") from None
    data = Data(args.figures, args.sensitivity)
    if args.write:
        print(f"{'rewrote' if update_readme(args.readme, data) else 'unchanged:'} {args.readme}")
    elif args.check:
        if current != readme_block(data):
            print(f"{args.readme}: its paper table is not what the CSVs give (run: python -m sim paper-table --write)",
                  file=sys.stderr)
            return 1
        print(f"{args.readme}: the paper table is the CSVs'")
    else:
        print(readme_block(data))
    return 0


def add_readme_numbers_parser(sub) -> None:
    p = sub.add_parser("readme-numbers", help="the README's numbers from the committed results files (README blocks)",
                       description="Print the README's generated blocks (sim.figures.readme_numbers): the numbers it "
                       "quotes from the committed figures/*.csv, benchmark CSVs and GPU test log, as small tables.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the README's blocks between their markers")
    mode.add_argument("--check", action="store_true", help="exit 1 if a block of the README is not what the files give")
    p.add_argument("--figures", default="figures", metavar="DIR", help="folder of the results files (default: figures)")
    p.add_argument("--readme", default=None, metavar="PATH",
                   help="for --write/--check: this one file (default: README.md and docs/*.md, each block on its page)")
    p.set_defaults(func=cmd_readme_numbers)


def cmd_readme_numbers(args: argparse.Namespace) -> int:
    from ..figures.readme_numbers import BLOCKS, COMMAND, Files, readme_blocks, readme_command

    return readme_command(args.readme, args.write, args.check, BLOCKS, lambda: readme_blocks(Files(args.figures)),
                          COMMAND, "the README's numbers are the files'")


def add_paper_sensitivity_parser(sub) -> None:
    from ..figures import paper_sensitivity

    p = sub.add_parser("paper-sensitivity", help="what moves the lab's numbers away from the paper's (one core, ~3 min)",
                       description=paper_sensitivity.__doc__.split("\n\n")[0])
    p.add_argument("--out", default="figures/paper_sensitivity.csv", metavar="PATH",
                   help="the CSV to write (default: figures/paper_sensitivity.csv)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=cmd_paper_sensitivity)


def cmd_paper_sensitivity(args: argparse.Namespace) -> int:
    import time

    from ..figures.paper_sensitivity import COMMAND, run_sensitivity

    started = time.perf_counter()
    command = COMMAND + ("" if args.out == "figures/paper_sensitivity.csv" else f" --out {args.out}")
    rows = run_sensitivity(args.out, progress=not args.no_progress, command=command)
    print(args.out)
    print(f"{len(rows)} runs in {time.perf_counter() - started:.0f} s; the README's notes read them: "
          "python -m sim paper-table --write", file=sys.stderr)
    return 0


# `python -m sim run` flags (argparse dests) whose run() keyword has another name
FLAG_KEYWORDS = {"swap_space": "swap_space_gib", "no_chunked_prefill": "enable_chunked_prefill",
             "prefix_caching": "enable_prefix_caching"}
_FLAGS = {keyword: dest for dest, keyword in FLAG_KEYWORDS.items()}


def _typed(argv: list[str] | None) -> set[str]:
    """The dests of the flags typed on the command line (argparse fills in defaults, so `--rate 2` and no --rate
    look alike): parse again with every default suppressed."""
    parser = build_parser()
    for action in parser._subparsers._group_actions:  # the subcommands
        for sub in action.choices.values():
            for flag in sub._actions:
                flag.default = argparse.SUPPRESS
    return set(vars(parser.parse_known_args(argv)[0]))


def _say_flag(keyword: str, value) -> str:
    """A run() argument as the flag that sets it, for messages: ('block_size', 8) -> '--block-size 8'."""
    flag = "--" + _FLAGS.get(keyword, keyword).replace("_", "-")
    if keyword == "enable_chunked_prefill":
        return flag if value is False else "chunked prefill (the default)"
    if keyword == "enable_prefix_caching":
        return f"{flag} {({None: 'auto', True: 'on', False: 'off'})[value]}"
    if keyword == "conversations":
        return flag
    if isinstance(value, tuple):
        return f"{flag} {','.join(map(str, value))}"
    return f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"


def _check_typed_flags(args: argparse.Namespace) -> None:
    """sim.run's checks of the `run` flags, before it starts, where a typed flag that means nothing with the others
    is refused even at its default value (sim.arguments.check_combinations): --rate with --trace, --block-size with
    --policy max, --burstiness without --arrival gamma, ..."""
    from ..api import run_defaults
    from ..arguments import check_arguments

    params = {**run_defaults(), **{FLAG_KEYWORDS.get(dest, dest): value for dest, value in vars(args).items()}}
    params["enable_chunked_prefill"] = False if args.no_chunked_prefill else None
    params["enable_prefix_caching"] = {"auto": None, "on": True, "off": False}[args.prefix_caching]
    params["jump"] = not args.no_jump
    typed = getattr(args, "typed", set())  # set by main()
    check_arguments(params, given={FLAG_KEYWORDS.get(dest, dest) for dest in typed}, say=_say_flag)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    args.typed = _typed(argv) if args.command in ("run", "disagg") else set()
    return interruptible(lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    try:
        return args.func(args)
    except BrokenPipeError:  # the reader went away (`| head`): not bad input; stop quietly, as a piped Unix tool does
        return broken_pipe()
    except (ValueError, OSError) as err:  # bad input (sim.workloads.trace.TraceError is a ValueError): one line, exit 2
        message = " ".join(str(err).split())
        print(f"error: {message}", file=sys.stderr)
        return 2
