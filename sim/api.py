"""`sim.run(...)`: one simulated serving run, from arguments to the summary the paper reports.

It wires the layers together (docs/ARCHITECTURE.md): specs -> KV pool size (vLLM's rule, paper Table 1) -> KV manager
for the policy -> scheduler -> workload (or a trace) -> event loop -> metrics. Every argument is checked up
front: a bad one raises ValueError naming it and what is allowed, before any simulation starts.
"""
from __future__ import annotations

import functools
import inspect
import math
import numbers
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .cost import RooflineCostModel
from .kv import POLICIES, make_kv_manager, simulator_block_size
from .limits import (MAX_BURSTINESS, MAX_COUNT, MAX_KV_SLOTS, MAX_NUM_GPUS, MAX_NUM_REQUESTS, MAX_POOL_BLOCKS,
                     MAX_SEED, MAX_SWAP_GIB, MAX_TIME_S, MAX_TOKENS, MIN_BURSTINESS)  # fmt: skip
from .loop import Simulator
from .metrics import Table, summarize
from .request import Request
from .preemption import VICTIM_POLICIES
from .scheduler import DEFAULT_BUDGET, MODES, PREEMPTION_MODES, Scheduler, SchedulerConfig
from .slots import ALLOCATORS
from .specs import GPUS, MODELS, GiB, get_gpu, get_model, kv_capacity_tokens
from .trace import (JSON_FIELDS, default_count_tokens, load_sharegpt_pairs, parse_record, read_trace,
                    sharegpt_requests, trace_format)  # fmt: skip
from .workload import ARRIVALS, DATASETS, generate_requests


@dataclass(slots=True)
class SimResult:
    summary: dict  # the `python -m sim run --json` object plus extras
    requests: Table  # per request: sim.metrics.REQUEST_COLUMNS
    steps: Table  # per step: sim.metrics.STEP_COLUMNS


def _require(ok: bool, name: str, value, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{name}: got {value!r} (allowed: {allowed})")


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

    Requests come from `requests` (a list), else `trace` (a .jsonl/.csv file, or a ShareGPT .json file: imported
    with Poisson arrivals at `rate`, or all at t = 0 with arrival="offline"), else the synthetic `workload`
    (`num_requests` of them if given, else every arrival in `duration` seconds at `rate` req/s). An argument
    that means nothing with the others (a workload's with a trace, block_size with a contiguous policy, ...)
    is refused, not ignored (`check_combinations`); every size has a limit (sim.limits). The KV pool
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
    params = dict(locals())  # every argument as given, for the checks
    started = time.perf_counter()
    kind = check_arguments(params)  # every check that needs no simulation, first
    model_spec, gpu_spec = get_model(model), get_gpu(gpu)
    num_slots = kv_slots if kv_slots is not None else kv_capacity_tokens(model_spec, gpu_spec, num_gpus)
    synthetic = requests is None and trace is None
    source = workload if synthetic else ("requests" if requests is not None else str(trace))
    notes = {}
    if synthetic:
        requests = generate_requests(
            workload, num_requests, rate=rate, duration=None if num_requests is not None else duration,
            arrival=arrival, burstiness=burstiness, max_seq_len=model_spec.max_seq_len, n=n, beam_width=beam_width,
            prefix_len=prefix_len, num_prefixes=num_prefixes, seed=seed, prompt_len=prompt_len, output_len=output_len,
            prompt_len_range=prompt_len_range, output_len_range=output_len_range,
        )  # fmt: skip
        _require(len(requests) >= 1, "duration", duration, f"long enough for a request to arrive at {rate:g} req/s "
                 f"(none did; or give num_requests)")  # fmt: skip
    elif kind == "sharegpt":
        requests, notes = _import_sharegpt(trace, model_spec, None if arrival == "offline" else rate, seed)
    elif requests is None:
        requests = read_trace(trace)
    else:
        _check_given_requests(requests)
    # auto: on for a shared prefix in a paged pool (contiguous policies have no prefix cache)
    caching = (prefix_len > 0 and policy == "paged") if enable_prefix_caching is None else enable_prefix_caching
    kv_block_size = simulator_block_size(policy, block_size)
    budget = max_num_batched_tokens
    if budget is None:
        budget = DEFAULT_BUDGET["v1"] if scheduler == "v1" else max(DEFAULT_BUDGET[scheduler], model_spec.max_seq_len)
    num_cpu_blocks = int(num_gpus * swap_space_gib * GiB // (kv_block_size * model_spec.kv_bytes_per_token))
    _check_pool(policy, num_slots, kv_block_size, num_cpu_blocks, kv_slots)
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
        "rate": rate if (synthetic or kind == "sharegpt") and arrival != "offline" else None, "arrival": arrival,
        "seed": seed,
        "block_size": kv_block_size, "num_kv_slots": sched.kv.num_slots, "preemption": preemption,
        "scheduler": scheduler, "n": n, "beam_width": beam_width, "prefix_len": prefix_len,
        "enable_prefix_caching": sched.kv.enable_prefix_caching, "max_num_seqs": max_num_seqs,
        "watermark": watermark, "max_num_batched_tokens": budget, "enable_chunked_prefill": config.chunked,
        "victim": victim, "jump": jump, "num_events": result.num_events, **notes,
    }  # fmt: skip
    summary = summarize(
        policy=policy, requests=result.requests, steps=result.steps, integral=result.memory_integral,
        span=result.end_time - result.start_time, wall_time_s=time.perf_counter() - started, extras=extras,
        slo_ttft_s=slo_ttft, slo_tbt_s=slo_tbt, prefix_cache=sched.kv.prefix_cache_stats(),
    )  # fmt: skip
    return SimResult(summary, result.requests, result.steps)


# run() keyword -> (kind, smallest, largest): what check_arguments accepts. Kinds: "int" (not a bool), "real" (a
# finite number, not a bool), "bool"; a trailing "?" also takes None. Limits: sim.limits. Choices: _CHOICES.
_ARGUMENTS = {
    "num_gpus": ("int", 1, MAX_NUM_GPUS), "block_size": ("int", 1, MAX_TOKENS), "seed": ("int", 0, MAX_SEED),
    "n": ("int", 1, MAX_COUNT), "beam_width": ("int", 1, MAX_COUNT), "prefix_len": ("int", 0, MAX_TOKENS),
    "num_prefixes": ("int", 1, MAX_COUNT), "max_num_seqs": ("int", 1, MAX_COUNT),
    "num_requests": ("int?", 1, MAX_NUM_REQUESTS), "kv_slots": ("int?", 1, MAX_KV_SLOTS),
    "max_num_batched_tokens": ("int?", 1, MAX_TOKENS), "prompt_len": ("int?", 1, MAX_TOKENS),
    "output_len": ("int?", 1, MAX_TOKENS), "swap_space_gib": ("real", 0, MAX_SWAP_GIB),
    "burstiness": ("real", MIN_BURSTINESS, MAX_BURSTINESS), "watermark": ("real", 0, 1),
    "rate": ("real?", 0, math.inf), "duration": ("real?", 0, MAX_TIME_S), "slo_ttft": ("real?", 0, MAX_TIME_S),
    "slo_tbt": ("real?", 0, MAX_TIME_S), "jump": ("bool", None, None), "validate": ("bool", None, None),
    "progress": ("bool", None, None), "enable_prefix_caching": ("bool?", None, None),
    "enable_chunked_prefill": ("bool?", None, None),
}  # fmt: skip
_OPEN_BELOW = ("rate", "duration", "slo_ttft", "slo_tbt")  # > 0, not >= 0
_OPEN_ABOVE = ("watermark", "rate")  # < 1; rate: finite
_CHOICES = {"model": tuple(MODELS), "gpu": tuple(GPUS), "policy": POLICIES, "workload": DATASETS,
            "preemption": PREEMPTION_MODES, "scheduler": MODES, "arrival": ARRIVALS, "allocator": tuple(ALLOCATORS),
            "victim": tuple(VICTIM_POLICIES)}  # fmt: skip
# What a generated workload is made of: meaningless when the requests come from a trace or a list.
WORKLOAD_ARGUMENTS = ("workload", "rate", "duration", "num_requests", "arrival", "burstiness", "n", "beam_width",
                      "prefix_len", "num_prefixes", "prompt_len", "output_len", "prompt_len_range",
                      "output_len_range")  # fmt: skip


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _num(x) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def _allowed(kind: str, low, high, name: str) -> str:
    if kind.startswith("bool"):
        text = "True or False"
    elif kind.startswith("int"):
        text = f"an integer from {low:,} to {high:,}"
    else:
        above = f"> {_num(low)}" if name in _OPEN_BELOW else f">= {_num(low)}"
        below = "" if high == math.inf else (f" and < {_num(high)}" if name in _OPEN_ABOVE else f" and <= {_num(high)}")
        unit = {"rate": " requests/s", "burstiness": "", "watermark": ", a share of the blocks",
                "swap_space_gib": " GiB"}.get(name, " seconds")  # fmt: skip
        text = f"a finite number {above}{below}{unit}"
    return text


def _check_value(name: str, value) -> None:
    kind, low, high = _ARGUMENTS[name]
    if value is None and kind.endswith("?"):
        return
    base = kind.rstrip("?")
    if base == "bool":
        ok = isinstance(value, bool)
    elif base == "int":
        ok = _is_int(value) and low <= value <= high
    else:
        ok = _is_real(value) and (low < value if name in _OPEN_BELOW else low <= value) and (
            value < high if name in _OPEN_ABOVE else value <= high)
    if not ok:
        _require(ok, name, value, _allowed(kind, low, high, name))


def _check_range(name: str, value) -> None:
    ok = value is None or (isinstance(value, (tuple, list)) and len(value) == 2 and all(
        _is_int(v) and 1 <= v <= MAX_TOKENS for v in value))
    _require(ok, name, value, f"None, or (low, high): two integers from 1 to {MAX_TOKENS:,}")


def check_arguments(params: dict, given: set[str] | None = None, say=None) -> str | None:
    """Every check of run()'s arguments `params` that needs no simulation: types, ranges (sim.limits), choices,
    combinations (`check_combinations`, with `given` and `say`), the workload's size. ValueError names the
    argument and what is allowed. Returns the trace's format (sim.trace.trace_format) if there is one, else None."""
    for name, allowed in _CHOICES.items():
        value = params[name]
        _require(isinstance(value, str) and value in allowed, name, value, ", ".join(allowed))
    for name in _ARGUMENTS:
        _check_value(name, params[name])
    for name in ("prompt_len_range", "output_len_range"):
        _check_range(name, params[name])
    trace, requests = params["trace"], params["requests"]
    _require(trace is None or isinstance(trace, (str, os.PathLike)), "trace", trace, "a file path, or None")
    _require(requests is None or (isinstance(requests, list) and all(isinstance(r, Request) for r in requests)),
             "requests", type(requests).__name__, "a list of sim.request.Request, or None")  # fmt: skip
    _require(trace is None or requests is None, "trace and requests", "both", "at most one of them")
    kind = check_combinations(params, given, say or _say)
    _require(params["n"] == 1 or params["beam_width"] == 1, "n and beam_width", (params["n"], params["beam_width"]),
             "at most one of them > 1")  # fmt: skip
    if trace is None and requests is None:
        _check_workload(params)
    return kind


def _say(name: str, value) -> str:
    return f"{name}={value!r}"


def _why_not(p: dict, kind: str | None, say) -> dict[str, str]:
    """run() keyword -> why it means nothing with the other arguments `p` (kind: the trace's format, if any)."""
    why = {}
    if p["requests"] is not None or kind is not None:
        source = "requests" if p["requests"] is not None else say("trace", p["trace"])
        for name in WORKLOAD_ARGUMENTS:
            why[name] = f"describes a generated workload, and {source} gives the requests"
        if kind == "sharegpt":
            del why["rate"], why["arrival"]
            if p["arrival"] == "gamma":
                why["arrival"] = (f"a ShareGPT file's requests arrive by Poisson at {say('rate', p['rate'])}, or all "
                                  f"at t = 0 with {say('arrival', 'offline')}")  # fmt: skip
    else:
        for name, workload in (("prompt_len", "fixed"), ("output_len", "fixed"), ("prompt_len_range", "uniform"),
                               ("output_len_range", "uniform")):  # fmt: skip
            if p["workload"] != workload:
                why[name] = f"applies to {say('workload', workload)} only, not {say('workload', p['workload'])}"
        if p["arrival"] != "gamma":
            why["burstiness"] = f"applies to {say('arrival', 'gamma')} only, not {say('arrival', p['arrival'])}"
        if p["arrival"] == "offline":
            why["duration"] = (f"means nothing with {say('arrival', 'offline')}, which takes "
                               f"{say('num_requests', 'N')} (all arrive at t = 0)")  # fmt: skip
        elif p["num_requests"] is not None:
            why["duration"] = f"conflicts with {say('num_requests', p['num_requests'])} (give one of them)"
        if p["prefix_len"] == 0:
            why["num_prefixes"] = f"applies with a shared prefix only ({say('prefix_len', 'N')} with N > 0)"
            if p["enable_prefix_caching"]:  # generated prompts carry token ids only with a shared prefix
                why["enable_prefix_caching"] = ("has nothing to cache: a generated workload's prompts have token ids "
                                                f"only with a shared prefix ({say('prefix_len', 'N')}, N > 0)")
    if p["arrival"] == "offline" and "rate" not in why:
        why["rate"] = f"means nothing with {say('arrival', 'offline')}: every request arrives at t = 0"
    if p["policy"] != "paged":
        contiguous = f"{say('policy', p['policy'])} reserves contiguous runs of token slots and never preempts"
        for name in ("block_size", "watermark", "swap_space_gib", "preemption", "victim"):
            why[name] = f"applies to {say('policy', 'paged')} only; {contiguous}"
        if p["enable_prefix_caching"]:
            why["enable_prefix_caching"] = f"applies to {say('policy', 'paged')} only; {contiguous}"
    else:
        why["allocator"] = f"applies to the contiguous policies (max, pow2, oracle) only, not {say('policy', 'paged')}"
        if p["preemption"] != "swap":
            why["swap_space_gib"] = (f"applies to {say('preemption', 'swap')} only, not "
                                     f"{say('preemption', p['preemption'])}")  # fmt: skip
    if p["scheduler"] != "v1":
        why["enable_chunked_prefill"] = (f"applies to {say('scheduler', 'v1')} only; "
                                         f"{say('scheduler', p['scheduler'])} never chunks a prompt")  # fmt: skip
    return why


@functools.lru_cache(maxsize=1)
def _defaults() -> dict:
    return {name: p.default for name, p in inspect.signature(run).parameters.items()}


def run_defaults() -> dict:
    """run()'s keywords and their defaults."""
    return dict(_defaults())


def check_combinations(params: dict, given: set[str] | None = None, say=_say) -> str | None:
    """Refuse an argument that means nothing with the others (a workload option with a trace, block_size with a
    contiguous policy, ...): one of `given` (default: those not None that differ from run()'s defaults, as
    nothing else can be told from a call). `say(name, value)` spells an argument in the message (the CLI spells flags).
    Returns the trace's format (sim.trace.trace_format), or None without a trace."""
    for name in ("policy", "scheduler", "arrival", "workload", "preemption"):
        _require(params[name] in _CHOICES[name], name, params[name], ", ".join(_CHOICES[name]))
    kind = None if params["trace"] is None or params["requests"] is not None else trace_format(params["trace"])
    if given is None:
        defaults = _defaults()
        given = {name for name in defaults if name in params and params[name] is not None  # None: not given
                 and params[name] is not defaults[name] and params[name] != defaults[name]}  # fmt: skip
    why = _why_not(params, kind, say)
    for name in why:
        if name in given:
            raise ValueError(f"{say(name, params[name])}: {why[name]}")
    return kind


def _check_workload(p: dict) -> None:
    """A generated workload's size, before numpy draws it: at most MAX_NUM_REQUESTS requests (expected), the
    last arriving by MAX_TIME_S (expected)."""
    rate, duration, num_requests, arrival = p["rate"], p["duration"], p["num_requests"], p["arrival"]
    if arrival != "offline":
        _require(rate is not None, "rate", rate, "a finite number > 0 requests/s")
    if num_requests is None:
        _require(arrival != "offline", "num_requests", None, "an integer >= 1; offline arrivals need a count")
        _require(duration is not None, "duration", duration, "a finite number > 0 seconds, or num_requests")
        if rate * duration > MAX_NUM_REQUESTS:
            raise ValueError(f"rate x duration: {rate:g} x {duration:g} = {rate * duration:.3g} expected requests "
                             f"(allowed: at most {MAX_NUM_REQUESTS:,}, the limit of one workload)")  # fmt: skip
    elif arrival != "offline" and num_requests / rate > MAX_TIME_S:
        raise ValueError(f"num_requests / rate: {num_requests} / {rate:g} = {num_requests / rate:.3g} s of arrivals "
                         f"(allowed: at most {MAX_TIME_S:g} s of simulated time)")  # fmt: skip


def _check_pool(policy: str, num_slots: int, block_size: int, num_cpu_blocks: int, kv_slots) -> None:
    """The KV pools fit the simulator's limits (sim.limits): slots, and blocks of a paged GPU or CPU pool."""
    name = "kv_slots" if kv_slots is not None else "the KV pool (what model, gpu and num_gpus leave)"
    if num_slots > MAX_KV_SLOTS:
        raise ValueError(f"{name}: {num_slots:,} token slots (allowed: at most {MAX_KV_SLOTS:,})")
    if policy == "paged" and num_slots // block_size > MAX_POOL_BLOCKS:
        raise ValueError(f"{name}: {num_slots:,} token slots = {num_slots // block_size:,} blocks of {block_size} "
                         f"(allowed: at most {MAX_POOL_BLOCKS:,} blocks: a larger block_size, or kv_slots)")
    if policy == "paged" and num_cpu_blocks > MAX_POOL_BLOCKS:
        raise ValueError(f"swap_space_gib: {num_cpu_blocks:,} CPU blocks of {block_size} tokens (allowed: at most "
                         f"{MAX_POOL_BLOCKS:,} blocks of swap space)")  # fmt: skip


def _check_given_requests(requests: list[Request]) -> None:
    """A list given to run(): every request as a trace line would have to be (sim.trace), ids unique."""
    seen: set[int] = set()
    for i, r in enumerate(requests):
        # numpy scalars are numbers here (a trace line's JSON is stricter: 3.0 is no integer there)
        record = {name: v if type(v) is int or not _is_int(v) else int(v)
                  for name in JSON_FIELDS if (v := getattr(r, name)) is not None}  # fmt: skip
        t = record["arrival_time"]
        record["arrival_time"] = float(t) if isinstance(t, numbers.Real) and not _is_int(t) else t
        ids = record.get("prompt_token_ids")
        if isinstance(ids, (list, tuple)) and (type(ids) is not list or {*map(type, ids)} - {int}):
            record["prompt_token_ids"] = [int(i) if _is_int(i) else i for i in ids]
        try:
            parse_record(record)
        except ValueError as e:
            raise ValueError(f"requests[{i}]: {e}") from None
        _require(r.request_id not in seen, f"requests[{i}]: request_id", r.request_id, "each request_id once")
        seen.add(r.request_id)


def _import_sharegpt(trace, model_spec, rate: float | None, seed: int) -> tuple[list[Request], dict]:
    """A ShareGPT conversation file as requests, and what happened, for the summary (`trace_import`)."""
    pairs = load_sharegpt_pairs(trace, default_count_tokens(), model_spec.max_seq_len)
    requests = sharegpt_requests(trace, pairs, rate=rate, seed=seed)
    arrivals = "all at t = 0" if rate is None else f"Poisson arrivals at {rate:g} req/s (seed {seed})"
    note = (f"{trace} is a ShareGPT conversation file: imported {pairs.describe()}; too long means over "
            f"{model_spec.name}'s {model_spec.max_seq_len}-token context; tokens counted by SmolLM2's tokenizer; "
            f"{arrivals}")  # fmt: skip
    return requests, {"trace_format": "sharegpt", "trace_import": note}


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
