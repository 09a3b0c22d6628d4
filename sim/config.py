"""Every setting of a simulated run, with its default, in one place: the scheduler's, the KV pool's, the workload's.

    SchedulerConfig                 what sim.scheduling.scheduler.Scheduler takes: mode, token budget, sequence cap, preemption,
                                    victim (the simulator and the engine both build one, by keyword)
    RunConfig                       everything `sim.run` takes; its field names are `sim.run`'s keyword shortcuts,
                                    and `python -m sim run`'s flags and `python -m sim sweep`'s grid read their
                                    defaults, types and choices from it
    default_max_num_batched_tokens  the token budget when none is given (vLLM's rule, for a server or an offline LLM)

A default is written once, here (or, for a workload's own knobs, where the workload is defined, and imported here);
the engine's settings (`reference.engine.config.EngineConfig`, the keywords of `LLM`) take the scheduler and KV defaults they
share with the simulator from these classes. Each
class checks its fields when it is built: a bad value raises ValueError naming the field and what is allowed, the
same one line whichever caller gave it. Checks across fields (an option that means nothing with the others, the
size of a workload) are sim.arguments'.
"""
from __future__ import annotations

import math
import os
from dataclasses import MISSING, dataclass, field, fields
from typing import Callable

from .base.limits import (
    MAX_BURSTINESS,
    MAX_COUNT,
    MAX_KV_SLOTS,
    MAX_NUM_GPUS,
    MAX_NUM_REQUESTS,
    MAX_SEED,
    MAX_SWAP_GIB,
    MAX_TIME_S,
    MAX_TOKENS,
    MAX_TURNS,
    MIN_BURSTINESS,
    is_int,
    is_real,
    require,
)
from .base.request import Request
from .base.specs import GPUS, KV_CACHE_DTYPES, MODELS
from .kv import POLICIES
from .kv.slots import ALLOCATORS
from .scheduling.preemption import VICTIM_POLICIES, victim_policy
from .workloads.conversation import DEFAULT_THINK_TIME, DEFAULT_TURNS
from .workloads.workload import ARRIVALS, DATASETS

MODES = ("v1", "v0", "static")
SCHEDULING_POLICIES = ("fcfs", "priority")  # vLLM's --scheduling-policy: the queues' order
PREEMPTION_MODES = ("recompute", "swap")
# NOTE: speculative decoding's draft tokens per step at most: drafts past a few tens are almost never all accepted
# (with acceptance rate a, the j-th draft survives with probability a^j), so a larger k only wastes slots and compute
MAX_SPECULATIVE_TOKENS = 64


def default_max_num_batched_tokens(mode: str, chunked: bool, max_model_len: int = 0, *,
                                   offline_budget: int | None = None) -> int:
    """The token budget of a step when none is given, by vLLM's rule (vllm/engine/arg_utils.py): a base of 2048 for
    an API server in v1 (the simulator's server) and 2560 for the paper's v0 and for static batching, or
    `offline_budget` for the offline `LLM` class (the engine: 4096 on a CPU, 8192 or 16384 on a GPU,
    reference.engine.executor.default_token_budget); without chunked prefill, at least the context (`max_model_len`),
    so that any prompt fits one step."""
    base = offline_budget if offline_budget is not None else (2048 if mode == "v1" else 2560)
    return base if chunked else max(base, max_model_len)


@dataclass(frozen=True, kw_only=True, slots=True)
class SchedulerConfig:
    """The scheduler's settings (see sim/scheduling/scheduler.py for what each mode does). A bad value raises ValueError
    naming the field."""

    mode: str = "v1"  # "v1" (token budget, chunked prefill) | "v0" (the paper's prefill-only steps) | "static"
    max_num_seqs: int = 256  # running sequences at most
    # tokens fed in one step at most; None: default_max_num_batched_tokens(mode, chunked, max_model_len), a server's
    max_num_batched_tokens: int | None = None
    max_model_len: int = 0  # the longest sequence (the context); only the default budget reads it
    enable_chunked_prefill: bool | None = None  # None: on in v1; v0 and static never chunk
    preemption: str = "recompute"  # "recompute" | "swap" (swap falls back to recompute when CPU memory is short)
    victim: str | Callable = "latest_arrival"  # who is preempted: a name of sim.scheduling.preemption.VICTIM_POLICIES, or a
    # function
    scheduling_policy: str = "fcfs"  # "fcfs" | "priority": queues ordered by (request.priority, arrival)
    num_speculative_tokens: int = 0  # speculative decoding: draft tokens a decode verifies per step (0 = off)

    def __post_init__(self) -> None:
        require(self.mode in MODES, "mode", self.mode, ", ".join(MODES))
        if self.max_num_batched_tokens is None:
            budget = default_max_num_batched_tokens(self.mode, self.chunked, self.max_model_len)
            object.__setattr__(self, "max_num_batched_tokens", budget)
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            require(is_int(value) and value >= 1, name, value, "an integer >= 1")
        require(self.preemption in PREEMPTION_MODES, "preemption", self.preemption, ", ".join(PREEMPTION_MODES))
        if self.enable_chunked_prefill and self.mode != "v1":
            raise ValueError(f"enable_chunked_prefill needs mode 'v1' (mode {self.mode!r} runs whole prompts)")
        victim_policy(self.victim)  # raises for an unknown name
        require(self.scheduling_policy in SCHEDULING_POLICIES, "scheduling_policy", self.scheduling_policy,
                ", ".join(SCHEDULING_POLICIES))
        require(is_int(self.num_speculative_tokens) and 0 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS,
                "num_speculative_tokens", self.num_speculative_tokens,
                f"an integer from 0 (off) to {MAX_SPECULATIVE_TOKENS}")

    @property
    def chunked(self) -> bool:
        return self.mode == "v1" and self.enable_chunked_prefill is not False


SCHEDULER_DEFAULTS = SchedulerConfig()


def _arg(default, kind: str, low=None, high=None, *, choices: tuple = (), function: str = ""):
    """A RunConfig field: its default and what it accepts. Kinds: "int" (not a bool), "real" (a finite number, not a
    bool), "bool", "choice" (one of `choices`; with `function`, which says what it is, also any callable), "range"
    ((low, high) token counts), "times" (a tuple or list of finite numbers from `low` to `high`), "callable" (a class
    or function, as `function` says), "any" (checked elsewhere); a trailing "?" also takes None. Limits: sim.base.limits."""
    meta = {"kind": kind, "low": low, "high": high, "choices": choices, "function": function}
    return field(default=default, metadata=meta)


_S = SCHEDULER_DEFAULTS


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    """Everything `sim.run` takes, each with its default. See sim.run for how the fields work together."""

    # hardware and model
    model: str = _arg("opt-13b", "choice", choices=tuple(MODELS))
    gpu: str = _arg("a100-40gb", "choice", choices=tuple(GPUS))
    num_gpus: int = _arg(1, "int", 1, MAX_NUM_GPUS)
    kv_slots: int | None = _arg(None, "int?", 1, MAX_KV_SLOTS)  # None: what vLLM would allocate (paper Table 1)
    cost_model: object = _arg(None, "any")  # a sim.clock.cost.CostModel, or a calibrated model's JSON file; None: roofline
    # workload
    workload: str = _arg("sharegpt", "choice", choices=DATASETS)
    rate: float | None = _arg(2.0, "real?", 0, math.inf)  # requests/s (sessions/s for conversations)
    duration: float | None = _arg(3600.0, "real?", 0, MAX_TIME_S)  # seconds of arrivals
    num_requests: int | None = _arg(None, "int?", 1, MAX_NUM_REQUESTS)  # exactly this many, instead of duration
    arrival: str = _arg("poisson", "choice", choices=ARRIVALS)
    burstiness: float = _arg(1.0, "real", MIN_BURSTINESS, MAX_BURSTINESS)  # gamma arrivals' shape
    seed: int = _arg(0, "int", 0, MAX_SEED)
    n: int = _arg(1, "int", 1, MAX_COUNT)  # parallel samples per request
    beam_width: int = _arg(1, "int", 1, MAX_COUNT)
    prefix_len: int = _arg(0, "int", 0, MAX_TOKENS)  # shared prefix tokens prepended to each prompt
    num_prefixes: int = _arg(1, "int", 1, MAX_COUNT)
    prompt_len: int | None = _arg(None, "int?", 1, MAX_TOKENS)  # workload "fixed"
    output_len: int | None = _arg(None, "int?", 1, MAX_TOKENS)
    prompt_len_range: tuple[int, int] | None = _arg(None, "range?")  # workload "uniform"
    output_len_range: tuple[int, int] | None = _arg(None, "range?")
    turns: float = _arg(DEFAULT_TURNS, "real", 1, MAX_TURNS)  # workload "conversation": mean turns per session
    think_time: float = _arg(DEFAULT_THINK_TIME, "real", 0, MAX_TIME_S)  # mean seconds between turns
    history_limit: int | None = _arg(None, "int?", 1, MAX_TOKENS)  # the prompt's last tokens kept
    trace: str | os.PathLike | None = _arg(None, "any")  # a .jsonl/.csv trace or a ShareGPT .json file
    conversations: bool = _arg(False, "bool")  # a ShareGPT file's conversations as multi-turn sessions
    requests: list[Request] | None = _arg(None, "any")  # the requests themselves
    # the KV pool
    policy: str = _arg("paged", "choice", choices=POLICIES)
    block_size: int = _arg(16, "int", 1, MAX_TOKENS)  # tokens per block (paged, radix, hybrid)
    page_kib: float | None = _arg(None, "real?", 0, MAX_TOKENS)  # vattention: KiB per layer per K/V buffer
    allocator: str = _arg("buddy", "choice", choices=tuple(ALLOCATORS))  # the contiguous baselines' run allocator
    # paged: the GPU pool's block allocator is block_allocator(num_blocks, block_size) (a student's, lab 03)
    block_allocator: Callable | None = _arg(None, "callable?", function="a class or function (num_blocks, "
                                            "block_size) -> a block allocator (lab 03's methods)")
    enable_prefix_caching: bool | None = _arg(None, "bool?")  # None: on for a shared prefix in a paged pool
    swap_space_gib: float = _arg(4.0, "real", 0, MAX_SWAP_GIB)  # CPU swap space per GPU (vLLM's default)
    # a CPU offload tier per GPU for evicted prefix-cache blocks (sim/kv/offload.py; turns prefix caching on); 0: none
    cpu_offload_gib: float = _arg(0.0, "real", 0, MAX_SWAP_GIB)
    watermark: float = _arg(0.01, "real", 0, 1)  # blocks kept free at admission (vLLM v0's block manager)
    # how the KV cache stores a token (sim.base.specs.KV_CACHE_DTYPES): "auto" is the model's 2 bytes; the 8-bit ones
    # shrink the bytes per token, so the pool's token slots and the cost model's K/V reads follow
    kv_dtype: str = _arg("auto", "choice", choices=tuple(KV_CACHE_DTYPES))
    # the scheduler (defaults: SchedulerConfig's)
    scheduler: str = _arg(_S.mode, "choice", choices=MODES)
    max_num_seqs: int = _arg(_S.max_num_seqs, "int", 1, MAX_COUNT)
    max_num_batched_tokens: int | None = _arg(None, "int?", 1, MAX_TOKENS)  # None: default_max_num_batched_tokens
    enable_chunked_prefill: bool | None = _arg(_S.enable_chunked_prefill, "bool?")
    preemption: str = _arg(_S.preemption, "choice", choices=PREEMPTION_MODES)
    victim: str | Callable = _arg(_S.victim, "choice", choices=tuple(VICTIM_POLICIES),
                                  function="a function victim(candidates) -> one of them")
    scheduling_policy: str = _arg(_S.scheduling_policy, "choice", choices=SCHEDULING_POLICIES)
    # synthetic workloads: the share of requests drawn (by `seed`) to priority 0, the rest 1 (a trace has its own)
    priority_share: float = _arg(0.0, "real", 0, 1)
    # speculative decoding (sim.scheduling.speculative): draft tokens a decode verifies per step (0 = off), and the chance that a
    # draft token is accepted when every draft before it was (an assumption of the run: measure your draft's)
    num_speculative_tokens: int = _arg(_S.num_speculative_tokens, "int", 0, MAX_SPECULATIVE_TOKENS)
    acceptance_rate: float = _arg(0.7, "real", 0, 1)
    # the run
    jump: bool = _arg(True, "bool")  # jump over runs of identical decode steps (same results, faster)
    validate: bool = _arg(False, "bool")  # check each jump's bookkeeping against the KV manager (slower)
    progress: bool = _arg(False, "bool")  # a progress bar on stderr
    # keep the per-step table (SimResult.steps); False: None there, the summary from the steps' totals (a run of
    # a million requests steps tens of millions of times: its table would take gigabytes)
    step_table: bool = _arg(True, "bool")
    slo_ttft: float | None = _arg(None, "real?", 0, MAX_TIME_S)  # latency targets (s) for SLO attainment, goodput
    slo_tbt: float | None = _arg(None, "real?", 0, MAX_TIME_S)
    stop_at: tuple = _arg((), "times", 0, MAX_TIME_S)  # times the fast-forward never jumps across
    on_step: Callable | None = _arg(None, "callable?", function="a function f(simulator, plan_or_None)")  # an
    # observer, called after every step

    def __post_init__(self) -> None:
        for f in fields(self):
            check_field(f.name, getattr(self, f.name))
        trace, requests = self.trace, self.requests
        require(trace is None or isinstance(trace, (str, os.PathLike)), "trace", trace, "a file path, or None")
        require(requests is None or (isinstance(requests, list) and all(isinstance(r, Request) for r in requests)),
                "requests", type(requests).__name__, "a list of sim.base.request.Request, or None")
        require(trace is None or requests is None, "trace and requests", "both", "at most one of them")

    def as_dict(self) -> dict:
        """Field name -> value (the objects themselves, not copies)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        return SchedulerConfig(mode=self.scheduler, max_num_seqs=self.max_num_seqs,
                               max_num_batched_tokens=self.max_num_batched_tokens, max_model_len=max_model_len,
                               enable_chunked_prefill=self.enable_chunked_prefill, preemption=self.preemption,
                               victim=self.victim, scheduling_policy=self.scheduling_policy,
                               num_speculative_tokens=self.num_speculative_tokens)


RUN_FIELDS = {f.name: f for f in fields(RunConfig)}
RUN_DEFAULTS = {name: f.default for name, f in RUN_FIELDS.items() if f.default is not MISSING}
# fields given as numbers that are > low rather than >= low, and < high rather than <= high
_OPEN_BELOW = ("rate", "duration", "slo_ttft", "slo_tbt", "page_kib")
_OPEN_ABOVE = ("watermark", "rate")  # rate: finite
_UNITS = {"rate": " requests/s", "burstiness": "", "watermark": ", a share of the blocks", "swap_space_gib": " GiB",
          "cpu_offload_gib": " GiB",
          "priority_share": ", a share of the requests",
          "acceptance_rate": ", the chance that a draft token is accepted",
          "turns": " (the mean turns per session)", "page_kib": " KiB per layer per K/V buffer"}  # else seconds


def choices(name: str) -> tuple:
    """The values RunConfig field `name` takes, for one that takes a choice (policy, scheduler, ...)."""
    return RUN_FIELDS[name].metadata["choices"]


def _num(x) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def allowed(name: str) -> str:
    """What RunConfig field `name` accepts, as the refusal's "(allowed: ...)" says it."""
    meta = RUN_FIELDS[name].metadata
    kind, low, high = meta["kind"].rstrip("?"), meta["low"], meta["high"]
    if kind == "choice":
        return ", ".join(meta["choices"]) + (f", or {meta['function']}" if meta["function"] else "")
    if kind == "callable":
        return ("None, or " if meta["kind"].endswith("?") else "") + meta["function"]
    if kind == "bool":
        return "True or False"
    if kind == "range":
        return f"None, or (low, high): two integers from 1 to {MAX_TOKENS:,}"
    if kind == "times":
        return f"a tuple of finite numbers from {_num(low)} to {_num(high)} seconds"
    if kind == "int":
        return f"an integer from {low:,} to {high:,}"
    above = f"> {_num(low)}" if name in _OPEN_BELOW else f">= {_num(low)}"
    below = "" if high == math.inf else (f" and < {_num(high)}" if name in _OPEN_ABOVE else f" and <= {_num(high)}")
    return f"a finite number {above}{below}{_UNITS.get(name, ' seconds')}"


def check_field(name: str, value) -> None:
    """ValueError "name: got value (allowed: ...)" unless `value` is what RunConfig field `name` accepts."""
    meta = RUN_FIELDS[name].metadata
    kind, low, high = meta["kind"], meta["low"], meta["high"]
    if (value is None and kind.endswith("?")) or kind == "any":
        return
    base = kind.rstrip("?")
    if base == "choice":
        ok = (isinstance(value, str) and value in meta["choices"]) or (bool(meta["function"]) and callable(value))
    elif base == "callable":
        ok = callable(value)
    elif base == "bool":
        ok = isinstance(value, bool)
    elif base == "int":
        ok = is_int(value) and low <= value <= high
    elif base == "range":
        ok = isinstance(value, (tuple, list)) and len(value) == 2 and all(is_int(v) and 1 <= v <= MAX_TOKENS
                                                                          for v in value)
    elif base == "times":
        ok = isinstance(value, (tuple, list)) and all(is_real(v) and low <= v <= high for v in value)
    else:
        ok = is_real(value) and (low < value if name in _OPEN_BELOW else low <= value) and (
            value < high if name in _OPEN_ABOVE else value <= high)
    require(ok, name, value, allowed(name))
