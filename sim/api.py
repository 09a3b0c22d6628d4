"""`sim.run(...)`: one simulated serving run, from arguments to the summary the paper reports.

It reads in one direction, each step in the layer that owns it (docs/ARCHITECTURE.md, "The layers"):

    1. settings   sim.arguments.run_settings: every field checked once where RunConfig is built, the combinations
                  and a generated workload's size before anything is drawn; the model and GPU specs; the cost model
    2. workload   sim.workloads.workload_source.workload_for: a list, a trace, a ShareGPT import or a generated workload
    3. pool       sim.kv.pool.kv_pool: token slots (vLLM's rule, paper Table 1), block size, CPU blocks, checked
                  against sim.base.limits; the KV manager and the scheduler over it, every request checked to fit
    4. loop       sim.clock.loop (or the fast plane's, sim.fast), then the summary (sim.clock.metrics)

A bad argument raises ValueError naming it and what is allowed, before any simulation starts.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from .arguments import run_settings
from .base.limits import require
from .base.request import Request
from .base.specs import get_gpu, get_model
from .clock.cost import PiecewiseCostModel, RooflineCostModel, check_cost_model
from .clock.cost_file import cost_model_for
from .clock.loop import Simulator
from .clock.metrics import Table, summarize
from .config import RUN_DEFAULTS, RunConfig
from .fast.loop import FastSimulator
from .kv import make_kv_manager, pages_in_kib
from .kv.pool import kv_pool
from .scheduling.scheduler import Scheduler
from .scheduling.speculative import AcceptanceModel
from .workloads.trace import request_lines
from .workloads.workload_source import workload_for


@dataclass(slots=True)
class SimResult:
    summary: dict  # the `python -m sim run --json` object plus extras
    requests: Table  # per request: sim.clock.metrics.REQUEST_COLUMNS
    steps: Table | None  # per step: sim.clock.metrics.STEP_COLUMNS; None with step_table=False


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
    "conversation" is multi-turn chat sessions (sim.workloads.conversation): `rate` and `duration` are then of session starts,
    `turns` the mean turns per session, `think_time` the mean seconds between turns, `history_limit` the prompt's
    last tokens kept (None: a session ends where its history outgrows the context); `trace` with
    `conversations=True` imports a ShareGPT file's conversations as such sessions (sim.workloads.conversation_import). An argument
    that means nothing with the others (a workload's with a trace, block_size with a contiguous policy, ...)
    is refused, not ignored (sim.arguments.check_combinations); every size has a limit (sim.base.limits). The KV pool
    holds `kv_slots` token slots (default: what vLLM would allocate for `model` on `num_gpus` x `gpu`).
    `policy` paged uses `block_size`; the contiguous baselines use block_size 1 (token-granular runs, as the
    paper's Orca reimplementation); vattention maps pages of `page_kib` KiB per layer per K/V buffer (default: the
    smallest page of whole tokens >= 64 KiB; sim.kv.vattention). `swap_space_gib`: CPU swap space per GPU.
    `scheduler`: "v1" (token budget, chunked prefill; `enable_chunked_prefill=False` turns chunking off), "v0"
    (the paper's prefill-only steps) or "static"; `max_num_batched_tokens` defaults by
    sim.config.default_max_num_batched_tokens (2048 in v1; the context, at least 2560, without chunking).
    `victim`: who is preempted (a name of sim.scheduling.preemption.VICTIM_POLICIES, or a function victim(candidates)).
    `block_allocator` (paged): the GPU pool's allocator is block_allocator(num_blocks, block_size), a class or
    function, instead of sim.kv.blocks.BlockAllocator (a student's own, lab 03; the capstone lab runs the paper's traces
    on it).
    `slo_ttft` / `slo_tbt`: latency targets in seconds for SLO attainment and goodput (see sim.clock.metrics).
    `stop_at`: times the fast-forward never jumps across (an observer then sees the pool after the step that
    contains each, exactly as stepping would show it).
    `jump`: jump over runs of identical decode steps (same results as stepping, faster); `validate`: check each
    jump's memory bookkeeping against the KV manager (slower). `cost_model`: any object with step_time and
    swap_time, or the path of a calibrated model's JSON file (sim.clock.cost_file; it must have been measured on
    `model`) (default: `RooflineCostModel(model, gpu, num_gpus, block_size=block_size)` for paged).
    `watermark`: fraction of KV blocks kept free at admission (vLLM v0's default 0.01; it curbs
    admit-then-preempt thrashing). `on_step`: an observer `f(simulator, plan_or_None)` called after every step
    (see `sim.clock.loop.Simulator`). `step_table=False`: keep no per-step table (the result's steps are None; the summary
    is the same), for runs of millions of steps.
    """
    started = time.perf_counter()
    c, kind = run_settings(config, settings)  # 1. settings: every field and combination checked, nothing simulated
    model_spec, gpu_spec = run_specs(c)
    cost_model, cost_file = _given_cost_model(c)
    sched_config = c.scheduler_config(model_spec.max_seq_len)
    requests, notes = workload_for(c, kind, model_spec)  # 2. the workload (sim.workloads.workload_source)
    pool = kv_pool(c.policy, model_spec, gpu_spec, num_gpus=c.num_gpus, kv_slots=c.kv_slots, block_size=c.block_size,
                   page_kib=c.page_kib, swap_space_gib=c.swap_space_gib, cpu_offload_gib=c.cpu_offload_gib,
                   enable_prefix_caching=c.enable_prefix_caching, prefix_len=c.prefix_len)  # 3. the pool (sim.kv.pool)

    def make_scheduler() -> Scheduler:
        kv = make_kv_manager(c.policy, pool.num_slots, block_size=pool.block_size, max_seq_len=model_spec.max_seq_len,
                             allocator=c.allocator, enable_prefix_caching=pool.enable_prefix_caching,
                             num_cpu_blocks=pool.num_cpu_blocks, watermark=c.watermark, model=model_spec,
                             block_allocator=c.block_allocator, num_offload_blocks=pool.num_offload_blocks)
        return Scheduler(kv, sched_config)

    _check_requests(requests, model_spec, make_scheduler(), c.trace if kind != "sharegpt" else None)
    sched = make_scheduler()
    # 4. the loop. The paged kernel gathers K/V block by block; the contiguous baselines read one run (no block
    # overhead).
    cost = cost_model if cost_model is not None else RooflineCostModel(model_spec, gpu_spec, c.num_gpus,
                                                                       block_size=sched.kv.gather_block_size)
    calibrated = cost if isinstance(cost, PiecewiseCostModel) else None  # a fitted c.model knows what it measured
    # jump=False: the plain loop alone; else the fast plane's (sim/fast/), with exactly its results
    fast = {"validate": c.validate, "stop_at": c.stop_at} if c.jump else {}
    result = (FastSimulator if c.jump else Simulator)(
        sched, cost, requests, block_bytes=pool.block_bytes, seed=c.seed, progress=c.progress, on_step=c.on_step,
        in_range=calibrated.in_range if calibrated is not None else None,
        shared_reads=calibrated is not None and calibrated.uses_shared_reads, step_table=c.step_table,
        acceptance=AcceptanceModel(c.acceptance_rate, c.seed) if c.num_speculative_tokens else None, **fast).run()
    synthetic = c.requests is None and c.trace is None
    extras = {
        "model": c.model, "gpu": c.gpu, "num_gpus": c.num_gpus,
        "workload": c.workload if synthetic else ("requests" if c.requests is not None else str(c.trace)),
        "rate": c.rate if (synthetic or kind == "sharegpt") and c.arrival != "offline" else None, "arrival": c.arrival,
        "seed": c.seed,
        "block_size": pool.block_size, "num_kv_slots": sched.kv.num_slots, "preemption": c.preemption,
        "scheduler": c.scheduler, "n": c.n, "beam_width": c.beam_width, "prefix_len": c.prefix_len,
        "enable_prefix_caching": sched.kv.enable_prefix_caching, "max_num_seqs": c.max_num_seqs,
        "watermark": c.watermark, "max_num_batched_tokens": sched_config.max_num_batched_tokens,
        "enable_chunked_prefill": sched_config.chunked,
        "victim": function_name(c.victim), "jump": c.jump, "num_events": result.num_events, **notes,
        **({"kv_dtype": c.kv_dtype} if c.kv_dtype != "auto" else {}),
        **(offload_summary(c.cpu_offload_gib, pool.num_offload_blocks, sched.kv.prefix_cache_stats(), cost,
                           pool.block_bytes) if pool.num_offload_blocks else {}),
        **({"scheduling_policy": c.scheduling_policy} if c.scheduling_policy != "fcfs" else {}),
        **({"priority_share": c.priority_share} if c.priority_share > 0 else {}),
        **(_speculation_summary(c, result, sched.kv.num_slots) if c.num_speculative_tokens else {}),
        # a c.policy that maps pages (vattention): its page in KiB per layer per K/V buffer on each GPU
        **({"page_kib": pool.block_bytes / (2 * model_spec.num_layers * c.num_gpus * 1024)}
           if pages_in_kib(c.policy) else {}),
        **({"block_allocator": function_name(c.block_allocator)} if c.block_allocator is not None else {}),
        **({"cost_model": cost_file} if cost_file is not None else {}),  # absent: the roofline (or an object given)
        # a calibrated c.model: the steps it priced by extrapolation, outside the shapes it measured
        **({"extrapolated_steps": result.extrapolated_steps,
            "extrapolated_time_share": _share(result.extrapolated_time, result.steps, result.step_totals),
            "calibrated_range": calibrated.describe_range()} if calibrated is not None else {}),
    }
    summary = summarize(
        policy=c.policy, requests=result.requests, step_totals=result.step_totals, integral=result.memory_integral,
        span=result.end_time - result.start_time, wall_time_s=time.perf_counter() - started, extras=extras,
        slo_ttft_s=c.slo_ttft, slo_tbt_s=c.slo_tbt, prefix_cache=sched.kv.prefix_cache_stats(),
    )
    return SimResult(summary, result.requests, result.steps)


def run_specs(c: RunConfig):
    """The model and GPU specs a run names (sim.base.specs); an 8-bit KV cache (`kv_dtype`) makes fewer bytes per token
    for the pool, the K/V reads and the swaps."""
    model_spec = get_model(c.model)
    if c.kv_dtype != "auto":
        model_spec = dataclasses.replace(model_spec, kv_dtype=c.kv_dtype)
    return model_spec, get_gpu(c.gpu)


def _given_cost_model(c: RunConfig) -> tuple[object | None, str | None]:
    """The cost model the settings give, checked (None: the roofline, built once the pool is), and the calibrated
    model's file if it came from one (`python -m reference calibrate` wrote it; sim.clock.cost_file)."""
    if isinstance(c.cost_model, (str, Path)):
        return cost_model_for(str(c.cost_model), c.model, c.num_gpus, c.kv_dtype), str(c.cost_model)
    if c.cost_model is not None:
        check_cost_model(c.cost_model)
    return c.cost_model, None


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
            "reload_time_s": cost.swap_time(reloaded * block_bytes, reloaded) if reloaded else 0.0}


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


def _check_requests(requests: list[Request], model_spec, probe: Scheduler, trace=None) -> None:
    """Every request must fit the model's context and, alone, the whole KV pool; checked before simulating,
    once per distinct shape, on a throwaway scheduler (its check_request is the rule add_request will apply).
    `trace`: the JSONL or CSV file the requests came from, whose line a refusal then names."""
    require(len(requests) >= 1, "requests", len(requests), "at least one request")
    seen: set[tuple[int, int, int, int]] = set()
    for r in requests:
        problem = None
        if r.total_len > model_spec.max_seq_len:
            problem = (f"prompt_len + output_len = {r.total_len} exceeds {model_spec.name}'s context (allowed: <= "
                       f"{model_spec.max_seq_len} tokens)")
        elif (shape := (r.prompt_len, r.output_len, r.n, r.beam_width)) not in seen:
            seen.add(shape)
            problem = probe.check_request(r)  # add_request's rule, without queueing anything
        if problem is not None:
            line = None if trace is None else request_lines(trace).get(r.request_id)
            where = "" if trace is None else f"{trace}{'' if line is None else f' line {line}'}: "
            raise ValueError(f"{where}request {r.request_id}: {problem}")
