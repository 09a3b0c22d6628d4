"""`sim.run(...)`: one simulated serving run, from arguments to the summary the paper reports.

It wires the layers together (docs/ARCHITECTURE.md): specs -> KV pool size (vLLM's rule, paper Table 1) -> KV manager
for the policy -> scheduler -> workload (or a trace) -> event loop -> metrics. Every argument is checked up
front: a bad one raises ValueError naming it and what is allowed, before any simulation starts.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .arguments import check_arguments, check_given_requests, check_pool
from .config import RUN_DEFAULTS, RunConfig, require
from .conversation import flatten, generate_sessions
from .conversation_import import import_conversations
from .cost import PiecewiseCostModel, RooflineCostModel
from .cost_file import cost_model_for
from .kv import has_prefix_cache, make_kv_manager, pages_in_kib, simulator_block_size
from .limits import MAX_POOL_BLOCKS
from .fast.loop import FastSimulator
from .loop import Simulator
from .metrics import Table, summarize
from .request import Request
from .scheduler import Scheduler
from .speculative import AcceptanceModel
from .specs import GiB, get_gpu, get_model, kv_capacity_tokens
from .sharegpt import default_count_tokens, load_sharegpt_pairs, sharegpt_requests
from .trace import read_trace, request_lines
from .workload import assign_priorities, generate_requests


@dataclass(slots=True)
class SimResult:
    summary: dict  # the `python -m sim run --json` object plus extras
    requests: Table  # per request: sim.metrics.REQUEST_COLUMNS
    steps: Table | None  # per step: sim.metrics.STEP_COLUMNS; None with step_table=False


def function_name(value) -> str:
    """A setting as the summary names it: a string as it is, a class or function by its qualified name."""
    return value if isinstance(value, str) else getattr(value, "__qualname__", type(value).__name__)


def run(config: RunConfig | None = None, /, **settings) -> SimResult:
    """Simulate serving one workload and return its summary and per-request / per-step tables.

    `config` (a sim.config.RunConfig) holds every setting and its default; `settings` are its fields by name, as
    keyword shortcuts (`sim.run(policy="max", rate=1.0)`), or changes to `config`. Each field is checked when the
    config is built, the combinations before the run starts: a bad one raises ValueError naming it and what is
    allowed, before any simulation.

    Requests come from `requests` (a list), else `trace` (a .jsonl/.csv file, or a ShareGPT .json file: imported
    with Poisson arrivals at `rate`, or all at t = 0 with arrival="offline"), else the synthetic `workload`
    (`num_requests` of them if given, else every arrival in `duration` seconds at `rate` req/s). `workload`
    "conversation" is multi-turn chat sessions (sim.conversation): `rate` and `duration` are then of session starts,
    `turns` the mean turns per session, `think_time` the mean seconds between turns, `history_limit` the prompt's
    last tokens kept (None: a session ends where its history outgrows the context); `trace` with
    `conversations=True` imports a ShareGPT file's conversations as such sessions (sim.conversation_import). An argument
    that means nothing with the others (a workload's with a trace, block_size with a contiguous policy, ...)
    is refused, not ignored (sim.arguments.check_combinations); every size has a limit (sim.limits). The KV pool
    holds `kv_slots` token slots (default: what vLLM would allocate for `model` on `num_gpus` x `gpu`).
    `policy` paged uses `block_size`; the contiguous baselines use block_size 1 (token-granular runs, as the
    paper's Orca reimplementation); vattention maps pages of `page_kib` KiB per layer per K/V buffer (default: the
    smallest page of whole tokens >= 64 KiB; sim.kv.vattention). `swap_space_gib`: CPU swap space per GPU.
    `scheduler`: "v1" (token budget, chunked prefill; `enable_chunked_prefill=False` turns chunking off), "v0"
    (the paper's prefill-only steps) or "static"; `max_num_batched_tokens` defaults by
    sim.config.default_max_num_batched_tokens (2048 in v1; the context, at least 2560, without chunking).
    `victim`: who is preempted (a name of sim.preemption.VICTIM_POLICIES, or a function victim(candidates)).
    `block_allocator` (paged): the GPU pool's allocator is block_allocator(num_blocks, block_size), a class or
    function, instead of sim.blocks.BlockAllocator (a student's own, lab 03; the capstone lab runs the paper's traces
    on it).
    `slo_ttft` / `slo_tbt`: latency targets in seconds for SLO attainment and goodput (see sim.metrics).
    `stop_at`: times the fast-forward never jumps across (an observer then sees the pool after the step that
    contains each, exactly as stepping would show it).
    `jump`: jump over runs of identical decode steps (same results as stepping, faster); `validate`: check each
    jump's memory bookkeeping against the KV manager (slower). `cost_model`: any object with step_time and
    swap_time, or the path of a calibrated model's JSON file (sim.cost_file; it must have been measured on
    `model`) (default: `RooflineCostModel(model, gpu, num_gpus, block_size=block_size)` for paged).
    `watermark`: fraction of KV blocks kept free at admission (vLLM v0's default 0.01; it curbs
    admit-then-preempt thrashing). `on_step`: an observer `f(simulator, plan_or_None)` called after every step
    (see `sim.loop.Simulator`). `step_table=False`: keep no per-step table (the result's steps are None; the summary
    is the same), for runs of millions of steps.
    """
    if config is None:
        config = RunConfig(**settings)
    elif not isinstance(config, RunConfig):
        raise TypeError(f"run: config must be a sim.config.RunConfig, got {type(config).__name__}")
    elif settings:
        config = dataclasses.replace(config, **settings)
    c = config
    started = time.perf_counter()
    kind = check_arguments(c)  # every check that needs no simulation, first
    cost_model, requests = c.cost_model, c.requests
    cost_file = str(cost_model) if isinstance(cost_model, (str, Path)) else None
    if cost_file is not None:  # a file `python -m reference calibrate` wrote
        cost_model = cost_model_for(cost_file, c.model, c.num_gpus, c.kv_dtype)
    elif cost_model is not None:
        _check_cost_object(cost_model)
    model_spec, gpu_spec = get_model(c.model), get_gpu(c.gpu)
    if c.kv_dtype != "auto":  # an 8-bit KV cache: fewer bytes per token for the pool, the K/V reads and swaps
        model_spec = dataclasses.replace(model_spec, kv_dtype=c.kv_dtype)
    num_slots = c.kv_slots if c.kv_slots is not None else kv_capacity_tokens(model_spec, gpu_spec, c.num_gpus)
    synthetic = requests is None and c.trace is None
    source = c.workload if synthetic else ("requests" if requests is not None else str(c.trace))
    notes = {}
    if synthetic:
        if c.workload == "conversation":
            sessions = generate_sessions(
                c.num_requests, rate=None if c.arrival == "offline" else c.rate,
                duration=None if c.num_requests is not None else c.duration, arrival=c.arrival, burstiness=c.burstiness,
                max_seq_len=model_spec.max_seq_len, turns=c.turns, think_time=c.think_time,
                history_limit=c.history_limit,
                seed=c.seed,
            )  # fmt: skip
            requests, notes = flatten(sessions), {"num_sessions": len(sessions)}
        else:
            requests = generate_requests(
                c.workload, c.num_requests, rate=c.rate, duration=None if c.num_requests is not None else c.duration,
                arrival=c.arrival, burstiness=c.burstiness, max_seq_len=model_spec.max_seq_len, n=c.n,
                beam_width=c.beam_width, prefix_len=c.prefix_len, num_prefixes=c.num_prefixes, seed=c.seed,
                prompt_len=c.prompt_len, output_len=c.output_len, prompt_len_range=c.prompt_len_range,
                output_len_range=c.output_len_range,
            )  # fmt: skip
        if not requests:  # (the message formats `rate`, None with offline arrivals, which always bring requests)
            require(False, "duration", c.duration, f"long enough for a request to arrive at {c.rate:g} req/s "
                    f"(none did; or give num_requests)")  # fmt: skip
        if c.priority_share > 0:
            assign_priorities(requests, c.priority_share, c.seed)
    elif kind == "sharegpt" and c.conversations:
        requests, notes = _import_conversations(c.trace, model_spec, None if c.arrival == "offline" else c.rate, c.seed,
                                                c.think_time, c.history_limit)  # fmt: skip
    elif kind == "sharegpt":
        requests, notes = _import_sharegpt(c.trace, model_spec, None if c.arrival == "offline" else c.rate, c.seed)
    elif requests is None:
        requests = read_trace(c.trace)
    else:
        check_given_requests(requests)
    # auto: on for a shared prefix in a paged pool (contiguous policies have no prefix cache)
    caching = c.enable_prefix_caching
    if caching is None:  # (a CPU offload tier keeps evicted prefix-cache blocks: it turns the cache on)
        caching = (c.prefix_len > 0 or c.cpu_offload_gib > 0) and has_prefix_cache(c.policy)
    kv_block_size = simulator_block_size(c.policy, c.block_size, model=model_spec, num_gpus=c.num_gpus,
                                         page_kib=c.page_kib)
    num_cpu_blocks = int(c.num_gpus * c.swap_space_gib * GiB // (kv_block_size * model_spec.kv_bytes_per_token))
    check_pool(c.policy, num_slots, kv_block_size, num_cpu_blocks, c.kv_slots, model_spec)
    num_offload_blocks = offload_blocks(c.cpu_offload_gib, c.num_gpus, kv_block_size * model_spec.kv_bytes_per_token)
    sched_config = c.scheduler_config(model_spec.max_seq_len)

    def make_scheduler() -> Scheduler:
        kv = make_kv_manager(c.policy, num_slots, block_size=kv_block_size, max_seq_len=model_spec.max_seq_len,
                             allocator=c.allocator, enable_prefix_caching=caching, num_cpu_blocks=num_cpu_blocks,
                             watermark=c.watermark, model=model_spec, block_allocator=c.block_allocator,
                             num_offload_blocks=num_offload_blocks)  # fmt: skip
        return Scheduler(kv, sched_config)

    try:
        _check_requests(requests, model_spec, make_scheduler())
    except ValueError as e:  # "request 7: ..." from a c.trace file: name the file and the line that holds it
        found = re.match(r"request (\d+): ", str(e))
        if found is None or c.trace is None or kind == "sharegpt":
            raise
        line = request_lines(c.trace).get(int(found.group(1)))
        raise ValueError(f"{c.trace}{'' if line is None else f' line {line}'}: {e}") from None
    sched = make_scheduler()
    # The paged kernel gathers K/V block by block; the contiguous baselines read one run (no block overhead).
    cost = cost_model if cost_model is not None else RooflineCostModel(model_spec, gpu_spec, c.num_gpus,
                                                                       block_size=sched.kv.gather_block_size)
    block_bytes = kv_block_size * model_spec.kv_bytes_per_token
    calibrated = cost if isinstance(cost, PiecewiseCostModel) else None  # a fitted c.model knows what it measured
    # jump=False: the plain loop alone; else the fast plane's (sim/fast/), with exactly its results
    fast = {"validate": c.validate, "stop_at": c.stop_at} if c.jump else {}
    result = (FastSimulator if c.jump else Simulator)(
        sched, cost, requests, block_bytes=block_bytes, seed=c.seed, progress=c.progress, on_step=c.on_step,
        in_range=calibrated.in_range if calibrated is not None else None,
        shared_reads=calibrated is not None and calibrated.uses_shared_reads, step_table=c.step_table,
        acceptance=AcceptanceModel(c.acceptance_rate, c.seed) if c.num_speculative_tokens else None, **fast).run()
    extras = {
        "model": c.model, "gpu": c.gpu, "num_gpus": c.num_gpus, "workload": source,
        "rate": c.rate if (synthetic or kind == "sharegpt") and c.arrival != "offline" else None, "arrival": c.arrival,
        "seed": c.seed,
        "block_size": kv_block_size, "num_kv_slots": sched.kv.num_slots, "preemption": c.preemption,
        "scheduler": c.scheduler, "n": c.n, "beam_width": c.beam_width, "prefix_len": c.prefix_len,
        "enable_prefix_caching": sched.kv.enable_prefix_caching, "max_num_seqs": c.max_num_seqs,
        "watermark": c.watermark, "max_num_batched_tokens": sched_config.max_num_batched_tokens,
        "enable_chunked_prefill": sched_config.chunked,
        "victim": function_name(c.victim), "jump": c.jump, "num_events": result.num_events, **notes,
        **({"kv_dtype": c.kv_dtype} if c.kv_dtype != "auto" else {}),
        **(offload_summary(c.cpu_offload_gib, num_offload_blocks, sched.kv.prefix_cache_stats(), cost, block_bytes)
           if num_offload_blocks else {}),
        **({"scheduling_policy": c.scheduling_policy} if c.scheduling_policy != "fcfs" else {}),
        **({"priority_share": c.priority_share} if c.priority_share > 0 else {}),
        **(_speculation_summary(c, result, sched.kv.num_slots) if c.num_speculative_tokens else {}),
        # a c.policy that maps pages (vattention): its page in KiB per layer per K/V buffer on each GPU
        **({"page_kib": kv_block_size * model_spec.kv_bytes_per_token / (2 * model_spec.num_layers * c.num_gpus * 1024)}
           if pages_in_kib(c.policy) else {}),
        **({"block_allocator": function_name(c.block_allocator)} if c.block_allocator is not None else {}),
        **({"cost_model": cost_file} if cost_file is not None else {}),  # absent: the roofline (or an object given)
        # a calibrated c.model: the steps it priced by extrapolation, outside the shapes it measured
        **({"extrapolated_steps": result.extrapolated_steps,
            "extrapolated_time_share": _share(result.extrapolated_time, result.steps, result.step_totals),
            "calibrated_range": calibrated.describe_range()} if calibrated is not None else {}),
    }  # fmt: skip
    summary = summarize(
        policy=c.policy, requests=result.requests, step_totals=result.step_totals, integral=result.memory_integral,
        span=result.end_time - result.start_time, wall_time_s=time.perf_counter() - started, extras=extras,
        slo_ttft_s=c.slo_ttft, slo_tbt_s=c.slo_tbt, prefix_cache=sched.kv.prefix_cache_stats(),
    )  # fmt: skip
    return SimResult(summary, result.requests, result.steps)


def offload_blocks(gib: float, num_gpus: int, block_bytes: int) -> int:
    """Blocks of `block_bytes` that a CPU offload tier of `gib` GiB per GPU holds; a tier holding none is refused."""
    blocks = int(num_gpus * gib * GiB // block_bytes)
    if gib > 0 and blocks < 1:
        raise ValueError(f"cpu_offload_gib: {gib:g} GiB per GPU holds no KV block of {block_bytes:,} bytes (allowed: "
                         f"0 for none, or at least {block_bytes / GiB / num_gpus:.3g})")  # fmt: skip
    if blocks > MAX_POOL_BLOCKS:
        raise ValueError(f"cpu_offload_gib: {blocks:,} CPU blocks (allowed: at most {MAX_POOL_BLOCKS:,} blocks)")
    return blocks


def offload_summary(gib: float, num_blocks: int, stats, cost, block_bytes: int) -> dict:
    """The offload tier's part of the summary: hit rates per tier (of the admitted prompts' tokens), its copies, and
    the time its reloads added to steps (cost.swap_time is linear in the blocks, so the sum over steps is one call)."""
    queried = stats.queried_tokens
    reloaded = stats.reloaded_blocks
    return {"cpu_offload_gib": gib, "num_offload_blocks": num_blocks,
            "prefix_cache_hit_rate_gpu_tokens": ((stats.hit_tokens - stats.cpu_hit_tokens) / queried if queried
                                                 else None),
            "prefix_cache_hit_rate_cpu_tokens": stats.cpu_hit_tokens / queried if queried else None,
            "offloaded_blocks": stats.offloaded_blocks, "reloaded_blocks": reloaded,
            "reload_time_s": cost.swap_time(reloaded * block_bytes, reloaded) if reloaded else 0.0}  # fmt: skip


def _speculation_summary(c: RunConfig, result, num_slots: int) -> dict:
    """Speculative decoding's numbers: its settings, the share of drafts accepted, and the lookahead slots the drafts
    held on average over the run (their K/V counts among the token states while a verify step runs)."""
    drafts, accepted, slot_seconds = result.speculation
    span = result.end_time - result.start_time
    lookahead = slot_seconds / span if span > 0 else 0.0
    return {"num_speculative_tokens": c.num_speculative_tokens, "acceptance_rate": c.acceptance_rate,
            "num_draft_tokens": drafts, "num_accepted_tokens": accepted,
            "draft_acceptance": accepted / drafts if drafts else None,
            "mean_lookahead_slots": lookahead, "lookahead_share": lookahead / num_slots}


def run_defaults() -> dict:
    """run()'s keywords and their defaults: sim.config.RunConfig's fields."""
    return dict(RUN_DEFAULTS)


def _share(seconds: float, steps, totals: tuple[int, int, float | None]) -> float:
    """`seconds` as a share of the run's simulated step time (0 for a run without steps), from the step table when
    the run kept one, else from the loop's running total of step seconds."""
    busy = (float(steps.columns["duration"].sum()) if len(steps) else 0.0) if steps is not None else totals[2]
    return seconds / busy if busy > 0 else 0.0


def _check_cost_object(cost) -> None:
    """A cost object must price a step from its four numbers and a swap from its bytes (sim.cost.CostModel)."""
    for name, args in (("step_time", (0, 1, 1, 0, 0)), ("swap_time", (0, 0))):
        method = getattr(cost, name, None)
        try:
            inspect.signature(method).bind(*args)
        except (TypeError, ValueError):
            raise ValueError(
                f"cost_model: {type(cost).__name__}.{name} must take {len(args)} positional numbers (allowed: a "
                f"sim.cost.CostModel, with step_time(num_prefill_tokens, num_decode_seqs, num_context_tokens, "
                f"num_prefill_pairs=0, num_shared_context_tokens=0) and swap_time(num_bytes, num_blocks=0), or the "
                f"path of a calibrated model)"
            ) from None


def _import_sharegpt(trace, model_spec, rate: float | None, seed: int) -> tuple[list[Request], dict]:
    """A ShareGPT conversation file as requests, and what happened, for the summary (`trace_import`)."""
    pairs = load_sharegpt_pairs(trace, default_count_tokens(), model_spec.max_seq_len)
    requests = sharegpt_requests(trace, pairs, rate=rate, seed=seed)
    arrivals = "all at t = 0" if rate is None else f"Poisson arrivals at {rate:g} req/s (seed {seed})"
    note = (f"{trace} is a ShareGPT conversation file: imported {pairs.describe()}; too long means over "
            f"{model_spec.name}'s {model_spec.max_seq_len}-token context; tokens counted by SmolLM2's tokenizer; "
            f"{arrivals}")  # fmt: skip
    return requests, {"trace_format": "sharegpt", "trace_import": note}


def _import_conversations(trace, model_spec, rate: float | None, seed: int, think_time: float,
                          history_limit: int | None) -> tuple[list[Request], dict]:  # fmt: skip
    """A ShareGPT file's conversations as multi-turn sessions, and what happened, for the summary."""
    sessions, imported = import_conversations(trace, max_seq_len=model_spec.max_seq_len, history_limit=history_limit,
                                              rate=rate, think_time=think_time, seed=seed)  # fmt: skip
    arrivals = "all at t = 0" if rate is None else f"sessions start by Poisson at {rate:g} sessions/s (seed {seed})"
    cut = "" if history_limit is None else f"; prompts cut to their last {history_limit} tokens"
    note = (f"{trace} is a ShareGPT conversation file, imported as multi-turn sessions: {imported.describe()}; "
            f"context: {model_spec.name}'s {model_spec.max_seq_len} tokens{cut}; tokens by SmolLM2's tokenizer; "
            f"{arrivals}, then mean think time {think_time:g} s between turns")  # fmt: skip
    return flatten(sessions), {"trace_format": "sharegpt", "trace_import": note, "num_sessions": len(sessions)}


def _check_requests(requests: list[Request], model_spec, probe: Scheduler) -> None:
    """Every request must fit the model's context and, alone, the whole KV pool; checked before simulating,
    once per distinct shape, on a throwaway scheduler (its check_request is the rule add_request will apply)."""
    require(len(requests) >= 1, "requests", len(requests), "at least one request")
    seen: set[tuple[int, int, int, int]] = set()
    for r in requests:
        if r.total_len > model_spec.max_seq_len:
            raise ValueError(
                f"request {r.request_id}: prompt_len + output_len = {r.total_len} exceeds {model_spec.name}'s context "
                f"(allowed: <= {model_spec.max_seq_len} tokens)"
            )
        shape = (r.prompt_len, r.output_len, r.n, r.beam_width)
        if shape not in seen:
            seen.add(shape)
            problem = probe.check_request(r)  # add_request's rule, without queueing anything
            if problem is not None:
                raise ValueError(f"request {r.request_id}: {problem}")
