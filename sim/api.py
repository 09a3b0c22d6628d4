"""`sim.run(...)`: one simulated serving run, from arguments to the summary the paper reports.

It wires the layers together (docs/ARCHITECTURE.md): specs -> KV pool size (vLLM's rule, paper Table 1) -> KV manager
for the policy -> scheduler -> workload (or a trace) -> event loop -> metrics. Every argument is checked up
front: a bad one raises ValueError naming it and what is allowed, before any simulation starts.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from .cost import RooflineCostModel
from .kv import POLICIES, make_kv_manager, simulator_block_size
from .loop import Simulator
from .metrics import Table, summarize
from .request import Request
from .preemption import VICTIM_POLICIES
from .scheduler import DEFAULT_BUDGET, MODES, PREEMPTION_MODES, Scheduler, SchedulerConfig
from .slots import ALLOCATORS
from .specs import GiB, get_gpu, get_model, kv_capacity_tokens
from .trace import read_trace
from .workload import ARRIVALS, DATASETS, generate_requests


@dataclass(slots=True)
class SimResult:
    summary: dict  # the `python -m sim run --json` object plus extras
    requests: Table  # per request: sim.metrics.REQUEST_COLUMNS
    steps: Table  # per step: sim.metrics.STEP_COLUMNS


def _require(ok: bool, name: str, value, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{name}: got {value!r} (allowed: {allowed})")


def _check_choices(**given: tuple[str, tuple]) -> None:
    for name, (value, allowed) in given.items():
        _require(value in allowed, name, value, ", ".join(allowed))


def run(
    *,
    model: str = "opt-13b",
    gpu: str = "a100-40gb",
    num_gpus: int = 1,
    workload: str = "sharegpt",
    rate: float | None = 2.0,
    duration: float | None = 3600.0,
    num_requests: int | None = None,
    policy: str = "paged",
    block_size: int = 16,
    seed: int = 0,
    n: int = 1,
    beam_width: int = 1,
    prefix_len: int = 0,
    num_prefixes: int = 1,
    preemption: str = "recompute",
    swap_space_gib: float = 4.0,
    trace: str | Path | None = None,
    scheduler: str = "v1",
    arrival: str = "poisson",
    burstiness: float = 1.0,
    allocator: str = "buddy",
    enable_prefix_caching: bool | None = None,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int | None = None,
    jump: bool = True,
    validate: bool = False,
    kv_slots: int | None = None,
    requests: list[Request] | None = None,
    progress: bool = False,
    prompt_len: int | None = None,
    output_len: int | None = None,
    prompt_len_range: tuple[int, int] | None = None,
    output_len_range: tuple[int, int] | None = None,
    cost_model=None,
    watermark: float = 0.01,
    on_step=None,
    enable_chunked_prefill: bool | None = None,
    victim: str = "latest_arrival",
    slo_ttft: float | None = None,
    slo_tbt: float | None = None,
    stop_at=(),
) -> SimResult:
    """Simulate serving one workload and return its summary and per-request / per-step tables.

    Requests come from `requests` (a list), else `trace` (a .jsonl/.csv file), else the synthetic `workload`
    (`num_requests` of them if given, else every arrival in `duration` seconds at `rate` req/s). The KV pool
    holds `kv_slots` token slots (default: what vLLM would allocate for `model` on `num_gpus` x `gpu`).
    `policy` paged uses `block_size`; the contiguous baselines use block_size 1 (token-granular runs, as the
    paper's Orca reimplementation). `swap_space_gib`: CPU swap space per GPU (vLLM's default 4 GiB).
    `scheduler`: "v1" (token budget, chunked prefill; `enable_chunked_prefill=False` turns chunking off), "v0"
    (the paper's prefill-only steps) or "static"; `max_num_batched_tokens` defaults to 2048 in v1 and to
    max(2560, the model's context) otherwise. `victim`: who is preempted (sim.preemption.VICTIM_POLICIES).
    `slo_ttft` / `slo_tbt`: latency targets in seconds for SLO attainment and goodput (see sim.metrics).
    `stop_at`: times the fast-forward never jumps across (an observer then sees the pool after the step that
    contains each, exactly as stepping would show it).
    `jump`: jump over runs of identical decode steps (same results as stepping, faster); `validate`: check each
    jump's memory bookkeeping against the KV manager (slower). `cost_model`: any object with step_time and
    swap_time (default: `RooflineCostModel(model, gpu, num_gpus, block_size=block_size)` for paged). `watermark`: fraction of KV blocks kept
    free at admission (vLLM v0's default 0.01; it curbs admit-then-preempt thrashing). `on_step`: an observer
    `f(simulator, plan_or_None)` called after every step (see `sim.loop.Simulator`).
    """
    started = time.perf_counter()
    model_spec, gpu_spec = get_model(model), get_gpu(gpu)
    _check_system(policy=policy, workload=workload, preemption=preemption, scheduler=scheduler, arrival=arrival,
                  allocator=allocator, num_gpus=num_gpus, block_size=block_size, n=n, beam_width=beam_width,
                  num_prefixes=num_prefixes, max_num_seqs=max_num_seqs, swap_space_gib=swap_space_gib,
                  kv_slots=kv_slots, max_num_batched_tokens=max_num_batched_tokens, victim=victim,
                  enable_chunked_prefill=enable_chunked_prefill, slo_ttft=slo_ttft, slo_tbt=slo_tbt)  # fmt: skip
    num_slots = kv_slots if kv_slots is not None else kv_capacity_tokens(model_spec, gpu_spec, num_gpus)
    synthetic = requests is None and trace is None
    source = workload if synthetic else ("requests" if requests is not None else str(trace))
    if synthetic:
        _check_workload(rate, duration, num_requests, arrival)
        requests = generate_requests(
            workload, num_requests, rate=rate, duration=None if num_requests is not None else duration,
            arrival=arrival, burstiness=burstiness, max_seq_len=model_spec.max_seq_len, n=n, beam_width=beam_width,
            prefix_len=prefix_len, num_prefixes=num_prefixes, seed=seed, prompt_len=prompt_len, output_len=output_len,
            prompt_len_range=prompt_len_range, output_len_range=output_len_range,
        )  # fmt: skip
    elif requests is None:
        requests = read_trace(trace)
    caching = prefix_len > 0 if enable_prefix_caching is None else enable_prefix_caching
    kv_block_size = simulator_block_size(policy, block_size)
    budget = max_num_batched_tokens
    if budget is None:
        budget = DEFAULT_BUDGET["v1"] if scheduler == "v1" else max(DEFAULT_BUDGET[scheduler], model_spec.max_seq_len)
    num_cpu_blocks = int(num_gpus * swap_space_gib * GiB // (kv_block_size * model_spec.kv_bytes_per_token))
    config = SchedulerConfig(max_num_seqs, budget, scheduler, preemption, enable_chunked_prefill, victim)

    def make_scheduler() -> Scheduler:
        kv = make_kv_manager(policy, num_slots, block_size=kv_block_size, max_seq_len=model_spec.max_seq_len,
                             allocator=allocator, enable_prefix_caching=caching, num_cpu_blocks=num_cpu_blocks,
                             watermark=watermark)  # fmt: skip
        return Scheduler(kv, config)

    _check_requests(requests, model_spec, make_scheduler())
    sched = make_scheduler()
    # The paged kernel gathers K/V block by block; the contiguous baselines read one run (no block overhead).
    cost = cost_model if cost_model is not None else RooflineCostModel(model_spec, gpu_spec, num_gpus,
                                                                       block_size=sched.kv.gather_block_size)
    block_bytes = kv_block_size * model_spec.kv_bytes_per_token
    result = Simulator(sched, cost, requests, block_bytes=block_bytes, seed=seed, jump=jump,
                       validate=validate, progress=progress, on_step=on_step, stop_at=stop_at).run()
    extras = {
        "model": model, "gpu": gpu, "num_gpus": num_gpus, "workload": source,
        "rate": rate if synthetic and arrival != "offline" else None, "arrival": arrival, "seed": seed,
        "block_size": kv_block_size, "num_kv_slots": sched.kv.num_slots, "preemption": preemption,
        "scheduler": scheduler, "n": n, "beam_width": beam_width, "prefix_len": prefix_len,
        "enable_prefix_caching": sched.kv.enable_prefix_caching, "max_num_seqs": max_num_seqs,
        "watermark": watermark, "max_num_batched_tokens": budget, "enable_chunked_prefill": config.chunked,
        "victim": victim, "jump": jump, "num_events": result.num_events,
    }  # fmt: skip
    summary = summarize(
        policy=policy, requests=result.requests, steps=result.steps, integral=result.memory_integral,
        span=result.end_time - result.start_time, wall_time_s=time.perf_counter() - started, extras=extras,
        slo_ttft_s=slo_ttft, slo_tbt_s=slo_tbt, prefix_cache=sched.kv.prefix_cache_stats(),
    )  # fmt: skip
    return SimResult(summary, result.requests, result.steps)


def _check_system(*, policy, workload, preemption, scheduler, arrival, allocator, swap_space_gib, kv_slots,
                  max_num_batched_tokens, victim, enable_chunked_prefill, slo_ttft, slo_tbt, **counts: int) -> None:
    """Choices, counts (each an integer >= 1) and sizes of the serving system, before anything is built."""
    _check_choices(policy=(policy, POLICIES), workload=(workload, DATASETS), preemption=(preemption, PREEMPTION_MODES),
                   scheduler=(scheduler, MODES), arrival=(arrival, ARRIVALS), allocator=(allocator, tuple(ALLOCATORS)),
                   victim=(victim, tuple(VICTIM_POLICIES)))  # fmt: skip
    _require(not enable_chunked_prefill or scheduler == "v1", "enable_chunked_prefill", enable_chunked_prefill,
             "True only with scheduler 'v1' (v0 and static run whole prompts)")  # fmt: skip
    for name, slo in (("slo_ttft", slo_ttft), ("slo_tbt", slo_tbt)):
        _require(slo is None or (slo > 0 and math.isfinite(slo)), name, slo, "a finite number of seconds > 0")
    for name, value in counts.items():
        _require(isinstance(value, int) and value >= 1, name, value, "an integer >= 1")
    _require(counts["n"] == 1 or counts["beam_width"] == 1, "n and beam_width", (counts["n"], counts["beam_width"]),
             "at most one of them > 1")  # fmt: skip
    _require(swap_space_gib >= 0 and math.isfinite(swap_space_gib), "swap_space_gib", swap_space_gib, "a number >= 0")
    _require(kv_slots is None or (isinstance(kv_slots, int) and kv_slots >= 1), "kv_slots", kv_slots, "an integer >= 1")
    _require(max_num_batched_tokens is None or (isinstance(max_num_batched_tokens, int) and max_num_batched_tokens >= 1),
             "max_num_batched_tokens", max_num_batched_tokens, "an integer >= 1")  # fmt: skip


def _check_workload(rate, duration, num_requests, arrival) -> None:
    if arrival != "offline":
        _require(rate is not None and rate > 0 and math.isfinite(rate), "rate", rate, "a finite number > 0 requests/s")
    if num_requests is not None:
        _require(isinstance(num_requests, int) and num_requests >= 1, "num_requests", num_requests, "an integer >= 1")
    elif arrival == "offline":
        raise ValueError("num_requests: got None (allowed: an integer >= 1; offline arrivals need a count)")
    else:
        _require(duration is not None and duration > 0 and math.isfinite(duration), "duration", duration,
                 "a finite number > 0 seconds")  # fmt: skip


def _check_requests(requests: list[Request], model_spec, probe: Scheduler) -> None:
    """Every request must fit the model's context and, alone, the whole KV pool; checked before simulating,
    once per distinct shape, on a throwaway scheduler (its add_request is the rule the run will apply)."""
    _require(len(requests) >= 1, "requests", len(requests), "at least one request")
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
            probe.add_request(Request(r.request_id, 0.0, r.prompt_len, r.output_len, r.n, r.beam_width))
