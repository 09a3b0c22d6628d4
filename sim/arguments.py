"""What `sim.run` accepts: every argument's type and range (sim.limits), the choices, the combinations that mean
nothing (refused, not ignored), and the workload and pool sizes, all checked before a simulation starts.

The command line (sim.cli) and the sweep (sim.sweep) call the same checks, spelling arguments as their flags.
"""
from __future__ import annotations

import numbers

from .config import RUN_DEFAULTS, RUN_FIELDS, RunConfig, choices, require
from .kv import (POLICIES, allocates_blocks_on_demand, always_caches_prefixes, check_model, gpu_pool_blocks,
                 has_prefix_cache, has_swap_space, offload_tier_refusal, pages_in_kib, simulator_block_size,
                 takes_block_allocator)  # fmt: skip
from .limits import MAX_KV_SLOTS, MAX_NUM_REQUESTS, MAX_POOL_BLOCKS, MAX_TIME_S, is_int
from .request import Request
from .specs import MODELS
from .trace import JSON_FIELDS, parse_record, trace_format

# What a generated workload is made of: meaningless when the requests come from a trace or a list.
WORKLOAD_ARGUMENTS = ("workload", "rate", "duration", "num_requests", "arrival", "burstiness", "n", "beam_width",
                      "prefix_len", "num_prefixes", "prompt_len", "output_len", "prompt_len_range",
                      "output_len_range", "turns", "think_time", "history_limit", "priority_share")  # fmt: skip
CONVERSATION_ARGUMENTS = ("turns", "think_time", "history_limit")  # sim/conversation.py's options


def check_arguments(params: RunConfig | dict, given: set[str] | None = None, say=None) -> str | None:
    """Every check of run()'s arguments that needs no simulation: each field's type, range (sim.limits) and choices
    (building the RunConfig from a dict `params` checks them; keys that are not its fields are ignored), the
    combinations (`check_combinations`, with `given` and `say`), the workload's size. ValueError names the argument
    and what is allowed. Returns the trace's format (sim.trace.trace_format) if there is one, else None."""
    config = params if isinstance(params, RunConfig) else RunConfig(**{k: v for k, v in params.items()
                                                                       if k in RUN_FIELDS})  # fmt: skip
    p = config.as_dict()
    kind = check_combinations(p, given, say or _say)
    # a page that is not a whole number of the model's tokens (vattention): one line naming the allowed sizes
    simulator_block_size(p["policy"], p["block_size"], model=MODELS[p["model"]], num_gpus=p["num_gpus"],
                         page_kib=p["page_kib"])  # fmt: skip
    check_model(p["policy"], MODELS[p["model"]])  # hybrid on a model without sliding windows: one line
    require(p["n"] == 1 or p["beam_width"] == 1, "n and beam_width", (p["n"], p["beam_width"]),
            "at most one of them > 1")  # fmt: skip
    if p["trace"] is None and p["requests"] is None:
        _check_workload(p)
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
            if p["conversations"]:  # imported as sessions (sim.conversation_import)
                del why["think_time"], why["history_limit"]
            if p["arrival"] == "gamma":
                why["arrival"] = (f"a ShareGPT file's requests arrive by Poisson at {say('rate', p['rate'])}, or all "
                                  f"at t = 0 with {say('arrival', 'offline')}")  # fmt: skip
    else:
        for name, workload in (("prompt_len", "fixed"), ("output_len", "fixed"), ("prompt_len_range", "uniform"),
                               ("output_len_range", "uniform")):  # fmt: skip
            if p["workload"] != workload:
                why[name] = f"applies to {say('workload', workload)} only, not {say('workload', p['workload'])}"
        for name in CONVERSATION_ARGUMENTS:
            if p["workload"] != "conversation":
                why[name] = f"applies to {say('workload', 'conversation')} only, not {say('workload', p['workload'])}"
        if p["workload"] == "conversation":  # every turn is one sequence, its prompt a session's own history
            for name in ("n", "beam_width", "prefix_len"):
                why[name] = (f"means nothing with {say('workload', 'conversation')}: a turn is one sequence whose "
                             "prompt is its session's history")  # fmt: skip
        if p["arrival"] != "gamma":
            why["burstiness"] = f"applies to {say('arrival', 'gamma')} only, not {say('arrival', p['arrival'])}"
        if p["arrival"] == "offline":
            why["duration"] = (f"means nothing with {say('arrival', 'offline')}, which takes "
                               f"{say('num_requests', 'N')} (all arrive at t = 0)")  # fmt: skip
        elif p["num_requests"] is not None:
            why["duration"] = f"conflicts with {say('num_requests', p['num_requests'])} (give one of them)"
        if p["prefix_len"] == 0:
            why["num_prefixes"] = f"applies with a shared prefix only ({say('prefix_len', 'N')} with N > 0)"
            if p["enable_prefix_caching"] and p["workload"] != "conversation":  # its turns carry token ids
                why["enable_prefix_caching"] = ("has nothing to cache: a generated workload's prompts have token ids "
                                                f"only with a shared prefix ({say('prefix_len', 'N')}, N > 0) or "
                                                f"{say('workload', 'conversation')}")  # fmt: skip
    if p["conversations"] and (p["requests"] is not None or kind != "sharegpt"):
        why["conversations"] = (f"applies to a ShareGPT conversation file only ({say('trace', 'FILE.json')}, a JSON "
                                "list of conversations), imported as multi-turn sessions")  # fmt: skip
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
                                     f"{say('preemption', p['preemption'])}")  # fmt: skip
        if p["preemption"] == "swap" and not has_swap_space(p["policy"]):
            why["preemption"] = (f"needs CPU swap space, and {say('policy', p['policy'])} has none: it preempts by "
                                 f"recompute only (allowed: {say('preemption', 'recompute')})")  # fmt: skip
        if p["enable_prefix_caching"] and not has_prefix_cache(p["policy"]):
            why["enable_prefix_caching"] = f"{say('policy', p['policy'])} has no prefix cache"
        if p["enable_prefix_caching"] is False and always_caches_prefixes(p["policy"]):
            why["enable_prefix_caching"] = (f"{say('policy', p['policy'])} always caches prefixes: its prefix cache is "
                                            "the policy itself and cannot be turned off")  # fmt: skip
    if offload_tier_refusal(p["policy"]) is not None:
        why["cpu_offload_gib"] = offload_tier_refusal(p["policy"])
    elif p["enable_prefix_caching"] is False:
        why["cpu_offload_gib"] = (f"keeps evicted prefix-cache blocks and needs the prefix cache (not "
                                  f"{say('enable_prefix_caching', False)})")  # fmt: skip
    elif p["block_allocator"] is not None:
        why["cpu_offload_gib"] = "needs the pool's own block allocator (it is told of every eviction), not block_allocator"
    if p["block_allocator"] is not None and not takes_block_allocator(p["policy"]):
        takes = ", ".join(name for name in POLICIES if takes_block_allocator(name))
        why["block_allocator"] = f"applies to {say('policy', takes)} only; {say('policy', p['policy'])} runs its own"
    if not p["num_speculative_tokens"]:
        why["acceptance_rate"] = (f"is the draft tokens' acceptance rate, and speculative decoding is off "
                                  f"({say('num_speculative_tokens', 0)})")  # fmt: skip
    if pages_in_kib(p["policy"]):
        why["block_size"] = (f"{say('policy', p['policy'])} maps pages given in KiB per layer per K/V buffer "
                             f"({say('page_kib', 'KIB')}), not blocks of tokens")  # fmt: skip
    else:
        paging = ", ".join(name for name in POLICIES if pages_in_kib(name))
        why["page_kib"] = f"applies to {say('policy', paging)} only, not {say('policy', p['policy'])}"
    if p["scheduler"] != "v1":
        why["enable_chunked_prefill"] = (f"applies to {say('scheduler', 'v1')} only; "
                                         f"{say('scheduler', p['scheduler'])} never chunks a prompt")  # fmt: skip
    return why


def check_combinations(params: dict, given: set[str] | None = None, say=_say) -> str | None:
    """Refuse an argument that means nothing with the others (a workload option with a trace, block_size with a
    contiguous policy, ...): one of `given` (default: those not None that differ from RunConfig's defaults, as nothing
    else can be told from a call). `params`: every RunConfig field by name. `say(name, value)` spells an argument in
    the message (the CLI spells flags). Returns the trace's format (sim.trace.trace_format), or None without a trace."""
    for name in ("policy", "scheduler", "arrival", "workload", "preemption"):
        require(params[name] in choices(name), name, params[name], ", ".join(choices(name)))
    kind = None if params["trace"] is None or params["requests"] is not None else trace_format(params["trace"])
    if given is None:
        given = {name for name, default in RUN_DEFAULTS.items() if params[name] is not None  # None: not given
                 and params[name] is not default and params[name] != default}  # fmt: skip
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
        require(rate is not None, "rate", rate, "a finite number > 0 requests/s")
    if num_requests is None:
        require(arrival != "offline", "num_requests", None, "an integer >= 1; offline arrivals need a count")
        require(duration is not None, "duration", duration, "a finite number > 0 seconds, or num_requests")
        turns = p["turns"] if p["workload"] == "conversation" else 1  # requests per session, a mean
        if rate * duration * turns > MAX_NUM_REQUESTS:
            times = f" x turns: {rate:g} x {duration:g} x {turns:g}" if turns != 1 else f": {rate:g} x {duration:g}"
            raise ValueError(f"rate x duration{times} = {rate * duration * turns:.3g} expected requests "
                             f"(allowed: at most {MAX_NUM_REQUESTS:,}, the limit of one workload)")  # fmt: skip
    elif arrival != "offline" and num_requests / rate > MAX_TIME_S:
        raise ValueError(f"num_requests / rate: {num_requests} / {rate:g} = {num_requests / rate:.3g} s of arrivals "
                         f"(allowed: at most {MAX_TIME_S:g} s of simulated time)")  # fmt: skip


def check_pool(policy: str, num_slots: int, block_size: int, num_cpu_blocks: int, kv_slots, model=None) -> None:
    """The KV pools fit the simulator's limits (sim.limits): slots, and blocks of a paged GPU or CPU pool (the blocks
    the policy makes of those slots: `model`'s layer groups for hybrid)."""
    name = "kv_slots" if kv_slots is not None else "the KV pool (what model, gpu and num_gpus leave)"
    if num_slots > MAX_KV_SLOTS:
        raise ValueError(f"{name}: {num_slots:,} token slots (allowed: at most {MAX_KV_SLOTS:,})")
    paged = allocates_blocks_on_demand(policy)
    blocks = gpu_pool_blocks(policy, model, num_slots, block_size) if paged else 0
    if blocks > MAX_POOL_BLOCKS:
        under = "" if blocks == num_slots // block_size else f" under {policy!r}"  # (hybrid: a page per layer group)
        raise ValueError(f"{name}: {num_slots:,} token slots = {blocks:,} blocks of {block_size}{under} "
                         f"(allowed: at most {MAX_POOL_BLOCKS:,} blocks: a larger block_size, or kv_slots)")
    if paged and num_cpu_blocks > MAX_POOL_BLOCKS:
        raise ValueError(f"swap_space_gib: {num_cpu_blocks:,} CPU blocks of {block_size} tokens (allowed: at most "
                         f"{MAX_POOL_BLOCKS:,} blocks of swap space)")  # fmt: skip


def check_given_requests(requests: list[Request]) -> None:
    """A list given to run(): every request as a trace line would have to be (sim.trace), ids unique."""
    seen: set[int] = set()
    for i, r in enumerate(requests):
        # numpy scalars are numbers here (a trace line's JSON is stricter: 3.0 is no integer there)
        record = {name: v if type(v) is int or not is_int(v) else int(v)
                  for name in JSON_FIELDS if (v := getattr(r, name)) is not None}  # fmt: skip
        t = record["arrival_time"]
        record["arrival_time"] = float(t) if isinstance(t, numbers.Real) and not is_int(t) else t
        ids = record.get("prompt_token_ids")
        if isinstance(ids, (list, tuple)) and (type(ids) is not list or {*map(type, ids)} - {int}):
            record["prompt_token_ids"] = [int(i) if is_int(i) else i for i in ids]
        try:
            parse_record(record)
        except ValueError as e:
            raise ValueError(f"requests[{i}]: {e}") from None
        require(r.request_id not in seen, f"requests[{i}]: request_id", r.request_id, "each request_id once")
        seen.add(r.request_id)
