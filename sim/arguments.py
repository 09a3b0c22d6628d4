"""A run's settings step: what `sim.run` accepts, checked before a simulation starts. Each field's type, range
(sim.base.limits) and choices are checked once, where RunConfig is built (sim.config); here are the combinations that mean
nothing (refused, not ignored), and the checks a setting's owner makes (a vattention page, a hybrid model, a
generated workload's size: sim.kv, sim.workloads.workload_source). What needs the workload or the pool is checked in those
steps (sim.workloads.workload_source.workload_for, sim.kv.pool.kv_pool).

The command line (sim.drivers.cli) and the sweep (sim.drivers.sweep) call the same checks, spelling arguments as their flags.
"""
from __future__ import annotations

import dataclasses

from .base.limits import require
from .base.specs import MODELS
from .config import RUN_DEFAULTS, RUN_FIELDS, RunConfig, choices
from .kv import (
    POLICIES,
    allocates_blocks_on_demand,
    always_caches_prefixes,
    check_model,
    has_prefix_cache,
    has_swap_space,
    offload_tier_refusal,
    pages_in_kib,
    simulator_block_size,
    takes_block_allocator,
)
from .workloads.trace import trace_format
from .workloads.workload_source import check_workload_size

# What a generated workload is made of: meaningless when the requests come from a trace or a list.
WORKLOAD_ARGUMENTS = ("workload", "rate", "duration", "num_requests", "arrival", "burstiness", "n", "beam_width",
                      "prefix_len", "num_prefixes", "prompt_len", "output_len", "prompt_len_range",
                      "output_len_range", "turns", "think_time", "history_limit", "priority_share")
CONVERSATION_ARGUMENTS = ("turns", "think_time", "history_limit")  # sim/workloads/conversation.py's options


def check_arguments(params: RunConfig | dict, given: set[str] | None = None, say=None) -> str | None:
    """Every check of run()'s arguments that needs no simulation: each field's type, range (sim.base.limits) and choices
    (building the RunConfig from a dict `params` checks them; keys that are not its fields are ignored), the
    combinations (`check_combinations`, with `given` and `say`), the workload's size. ValueError names the argument
    and what is allowed. Returns the trace's format (sim.workloads.trace.trace_format) if there is one, else None."""
    config = params if isinstance(params, RunConfig) else RunConfig(**{k: v for k, v in params.items()
                                                                       if k in RUN_FIELDS})
    p = config.as_dict()
    kind = check_combinations(p, given, say or _say)
    # a page that is not a whole number of the model's tokens (vattention): one line naming the allowed sizes
    simulator_block_size(p["policy"], p["block_size"], model=MODELS[p["model"]], num_gpus=p["num_gpus"],
                         page_kib=p["page_kib"])
    check_model(p["policy"], MODELS[p["model"]])  # hybrid on a model without sliding windows: one line
    require(p["n"] == 1 or p["beam_width"] == 1, "n and beam_width", (p["n"], p["beam_width"]),
            "at most one of them > 1")
    if p["trace"] is None and p["requests"] is None:
        check_workload_size(workload=p["workload"], rate=p["rate"], duration=p["duration"],
                            num_requests=p["num_requests"], arrival=p["arrival"], turns=p["turns"])
    return kind


def run_settings(config: RunConfig | None, changes: dict) -> tuple[RunConfig, str | None]:
    """sim.run's settings: `config` (None: the defaults) with `changes` (RunConfig fields by name), every field and
    combination checked (`check_arguments`); and the trace's format, if there is a trace."""
    if config is None:
        config = RunConfig(**changes)
    elif not isinstance(config, RunConfig):
        raise TypeError(f"run: config must be a sim.config.RunConfig, got {type(config).__name__}")
    elif changes:
        config = dataclasses.replace(config, **changes)
    return config, check_arguments(config)


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
            if p["conversations"]:  # imported as sessions (sim.workloads.conversation_import)
                del why["think_time"], why["history_limit"]
            if p["arrival"] == "gamma":
                why["arrival"] = (f"a ShareGPT file's requests arrive by Poisson at {say('rate', p['rate'])}, or all "
                                  f"at t = 0 with {say('arrival', 'offline')}")
    else:
        for name, workload in (("prompt_len", "fixed"), ("output_len", "fixed"), ("prompt_len_range", "uniform"),
                               ("output_len_range", "uniform")):
            if p["workload"] != workload:
                why[name] = f"applies to {say('workload', workload)} only, not {say('workload', p['workload'])}"
        for name in CONVERSATION_ARGUMENTS:
            if p["workload"] != "conversation":
                why[name] = f"applies to {say('workload', 'conversation')} only, not {say('workload', p['workload'])}"
        if p["workload"] == "conversation":  # every turn is one sequence, its prompt a session's own history
            for name in ("n", "beam_width", "prefix_len"):
                why[name] = (f"means nothing with {say('workload', 'conversation')}: a turn is one sequence whose "
                             "prompt is its session's history")
        if p["arrival"] != "gamma":
            why["burstiness"] = f"applies to {say('arrival', 'gamma')} only, not {say('arrival', p['arrival'])}"
        if p["arrival"] == "offline":
            why["duration"] = (f"means nothing with {say('arrival', 'offline')}, which takes "
                               f"{say('num_requests', 'N')} (all arrive at t = 0)")
        elif p["num_requests"] is not None:
            why["duration"] = f"conflicts with {say('num_requests', p['num_requests'])} (give one of them)"
        if p["prefix_len"] == 0:
            why["num_prefixes"] = f"applies with a shared prefix only ({say('prefix_len', 'N')} with N > 0)"
            if p["enable_prefix_caching"] and p["workload"] != "conversation":  # its turns carry token ids
                why["enable_prefix_caching"] = ("has nothing to cache: a generated workload's prompts have token ids "
                                                f"only with a shared prefix ({say('prefix_len', 'N')}, N > 0) or "
                                                f"{say('workload', 'conversation')}")
    if p["conversations"] and (p["requests"] is not None or kind != "sharegpt"):
        why["conversations"] = (f"applies to a ShareGPT conversation file only ({say('trace', 'FILE.json')}, a JSON "
                                "list of conversations), imported as multi-turn sessions")
    if p["arrival"] == "offline" and "rate" not in why:
        why["rate"] = f"means nothing with {say('arrival', 'offline')}: every request arrives at t = 0"
    if not allocates_blocks_on_demand(p["policy"]):
        contiguous = f"{say('policy', p['policy'])} reserves contiguous runs of token slots and never preempts"
        for name in ("block_size", "watermark", "swap_space_gib", "preemption", "victim"):
            why[name] = f"applies to {say('policy', 'paged')} only; {contiguous}"
        if p["enable_prefix_caching"]:
            why["enable_prefix_caching"] = f"applies to {say('policy', 'paged')} only; {contiguous}"
    else:
        why["allocator"] = f"applies to the contiguous policies (max, pow2, oracle) only, not {say('policy', 'paged')}"
        if p["preemption"] != "swap":
            why["swap_space_gib"] = (f"applies to {say('preemption', 'swap')} only, not "
                                     f"{say('preemption', p['preemption'])}")
        if p["preemption"] == "swap" and not has_swap_space(p["policy"]):
            why["preemption"] = (f"needs CPU swap space, and {say('policy', p['policy'])} has none: it preempts by "
                                 f"recompute only (allowed: {say('preemption', 'recompute')})")
        if p["enable_prefix_caching"] and not has_prefix_cache(p["policy"]):
            why["enable_prefix_caching"] = f"{say('policy', p['policy'])} has no prefix cache"
        if p["enable_prefix_caching"] is False and always_caches_prefixes(p["policy"]):
            why["enable_prefix_caching"] = (f"{say('policy', p['policy'])} always caches prefixes: its prefix cache is "
                                            "the policy itself and cannot be turned off")
    if offload_tier_refusal(p["policy"]) is not None:
        why["cpu_offload_gib"] = offload_tier_refusal(p["policy"])
    elif p["enable_prefix_caching"] is False:
        why["cpu_offload_gib"] = (f"keeps evicted prefix-cache blocks and needs the prefix cache (not "
                                  f"{say('enable_prefix_caching', False)})")
    elif p["block_allocator"] is not None:
        why["cpu_offload_gib"] = "needs the pool's own block allocator (it is told of every eviction), not block_allocator"
    if p["block_allocator"] is not None and not takes_block_allocator(p["policy"]):
        takes = ", ".join(name for name in POLICIES if takes_block_allocator(name))
        why["block_allocator"] = f"applies to {say('policy', takes)} only; {say('policy', p['policy'])} runs its own"
    if not p["num_speculative_tokens"]:
        why["acceptance_rate"] = (f"is the draft tokens' acceptance rate, and speculative decoding is off "
                                  f"({say('num_speculative_tokens', 0)})")
    if pages_in_kib(p["policy"]):
        why["block_size"] = (f"{say('policy', p['policy'])} maps pages given in KiB per layer per K/V buffer "
                             f"({say('page_kib', 'KIB')}), not blocks of tokens")
    else:
        paging = ", ".join(name for name in POLICIES if pages_in_kib(name))
        why["page_kib"] = f"applies to {say('policy', paging)} only, not {say('policy', p['policy'])}"
    if p["scheduler"] != "v1":
        why["enable_chunked_prefill"] = (f"applies to {say('scheduler', 'v1')} only; "
                                         f"{say('scheduler', p['scheduler'])} never chunks a prompt")
    return why


def check_combinations(params: dict, given: set[str] | None = None, say=_say) -> str | None:
    """Refuse an argument that means nothing with the others (a workload option with a trace, block_size with a
    contiguous policy, ...): one of `given` (default: those not None that differ from RunConfig's defaults, as nothing
    else can be told from a call). `params`: every RunConfig field by name. `say(name, value)` spells an argument in
    the message (the CLI spells flags). Returns the trace's format (sim.workloads.trace.trace_format), or None without a trace."""
    for name in ("policy", "scheduler", "arrival", "workload", "preemption"):
        require(params[name] in choices(name), name, params[name], ", ".join(choices(name)))
    kind = None if params["trace"] is None or params["requests"] is not None else trace_format(params["trace"])
    if given is None:
        given = {name for name, default in RUN_DEFAULTS.items() if params[name] is not None  # None: not given
                 and params[name] is not default and params[name] != default}
    why = _why_not(params, kind, say)
    for name in why:
        if name in given:
            raise ValueError(f"{say(name, params[name])}: {why[name]}")
    return kind
