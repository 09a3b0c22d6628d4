"""A run's workload step: where `sim.run`'s requests come from, and the one check of a generated workload's size.

    requests (a list)        checked as trace lines would be (sim.workloads.trace.check_given_requests)
    trace (.jsonl / .csv)    read (sim.workloads.trace.read_trace)
    trace (ShareGPT .json)   imported: first turns as requests (sim.workloads.sharegpt), or whole conversations as multi-turn
                             sessions with conversations=True (sim.workloads.conversation_import)
    workload                 generated: sharegpt, alpaca, fixed, uniform (sim.workloads.workload) or conversation sessions
                             (sim.workloads.conversation)

`workload_for` takes a run's settings (a sim.config.RunConfig, whose fields were checked when it was built and whose
combinations sim.arguments checked) and the model they name; it reads only the workload's fields. This module sits
in the data layer (tools/layers.py), below the settings: it takes the settings as a value and imports nothing above.
"""
from __future__ import annotations

from ..base.limits import MAX_NUM_REQUESTS, MAX_TIME_S, require
from ..base.request import Request
from .conversation import flatten, generate_sessions
from .conversation_import import import_conversations
from .sharegpt import default_count_tokens, load_sharegpt_pairs, sharegpt_requests
from .trace import check_given_requests, read_trace
from .workload import assign_priorities, generate_requests


def check_workload_size(*, workload: str, rate: float | None, duration: float | None, num_requests: int | None,
                        arrival: str, turns: float) -> None:
    """A generated workload's size, before numpy draws it: at most MAX_NUM_REQUESTS requests (expected), the last
    arriving by MAX_TIME_S (expected). Each field's own range is RunConfig's; this is what they make together."""
    if arrival != "offline":
        require(rate is not None, "rate", rate, "a finite number > 0 requests/s")
    if num_requests is None:
        require(arrival != "offline", "num_requests", None, "an integer >= 1; offline arrivals need a count")
        require(duration is not None, "duration", duration, "a finite number > 0 seconds, or num_requests")
        turns = turns if workload == "conversation" else 1  # requests per session, a mean
        if rate * duration * turns > MAX_NUM_REQUESTS:
            times = f" x turns: {rate:g} x {duration:g} x {turns:g}" if turns != 1 else f": {rate:g} x {duration:g}"
            raise ValueError(f"rate x duration{times} = {rate * duration * turns:.3g} expected requests "
                             f"(allowed: at most {MAX_NUM_REQUESTS:,}, the limit of one workload)")
    elif arrival != "offline" and num_requests / rate > MAX_TIME_S:
        raise ValueError(f"num_requests / rate: {num_requests} / {rate:g} = {num_requests / rate:.3g} s of arrivals "
                         f"(allowed: at most {MAX_TIME_S:g} s of simulated time)")


def workload_for(c, kind: str | None, model_spec) -> tuple[list[Request], dict]:
    """The requests of a run with settings `c` (a sim.config.RunConfig) for `model_spec` (a sim.base.specs.ModelSpec),
    and notes for its summary (how a file was imported, the number of sessions). `kind`: the trace's format
    (sim.workloads.trace.trace_format, as sim.arguments found it), None without a trace."""
    rate = None if c.arrival == "offline" else c.rate  # None: every request (or session) at t = 0
    if c.requests is not None:
        check_given_requests(c.requests)
        return c.requests, {}
    if kind == "sharegpt" and c.conversations:
        return _import_conversations(c.trace, model_spec, rate, c.seed, c.think_time, c.history_limit)
    if kind == "sharegpt":
        return _import_sharegpt(c.trace, model_spec, rate, c.seed)
    if c.trace is not None:
        return read_trace(c.trace), {}
    return _generated(c, model_spec, rate)


def _generated(c, model_spec, rate: float | None) -> tuple[list[Request], dict]:
    """The synthetic workload `c.workload`, with priorities drawn when `c.priority_share` asks for them."""
    duration = None if c.num_requests is not None else c.duration
    notes = {}
    if c.workload == "conversation":
        sessions = generate_sessions(
            c.num_requests, rate=rate, duration=duration, arrival=c.arrival, burstiness=c.burstiness,
            max_seq_len=model_spec.max_seq_len, turns=c.turns, think_time=c.think_time,
            history_limit=c.history_limit, seed=c.seed,
        )
        requests, notes = flatten(sessions), {"num_sessions": len(sessions)}
    else:
        requests = generate_requests(
            c.workload, c.num_requests, rate=c.rate, duration=duration, arrival=c.arrival, burstiness=c.burstiness,
            max_seq_len=model_spec.max_seq_len, n=c.n, beam_width=c.beam_width, prefix_len=c.prefix_len,
            num_prefixes=c.num_prefixes, seed=c.seed, prompt_len=c.prompt_len, output_len=c.output_len,
            prompt_len_range=c.prompt_len_range, output_len_range=c.output_len_range,
        )
    if not requests:  # (the message formats `rate`, None with offline arrivals, which always bring requests)
        require(False, "duration", c.duration, f"long enough for a request to arrive at {c.rate:g} req/s "
                f"(none did; or give num_requests)")
    if c.priority_share > 0:
        assign_priorities(requests, c.priority_share, c.seed)
    return requests, notes


def _import_sharegpt(trace, model_spec, rate: float | None, seed: int) -> tuple[list[Request], dict]:
    """A ShareGPT conversation file as requests, and what happened, for the summary (`trace_import`)."""
    pairs = load_sharegpt_pairs(trace, default_count_tokens(), model_spec.max_seq_len)
    requests = sharegpt_requests(trace, pairs, rate=rate, seed=seed)
    arrivals = "all at t = 0" if rate is None else f"Poisson arrivals at {rate:g} req/s (seed {seed})"
    note = (f"{trace} is a ShareGPT conversation file: imported {pairs.describe()}; too long means over "
            f"{model_spec.name}'s {model_spec.max_seq_len}-token context; tokens counted by SmolLM2's tokenizer; "
            f"{arrivals}")
    return requests, {"trace_format": "sharegpt", "trace_import": note}


def _import_conversations(trace, model_spec, rate: float | None, seed: int, think_time: float,
                          history_limit: int | None) -> tuple[list[Request], dict]:
    """A ShareGPT file's conversations as multi-turn sessions, and what happened, for the summary."""
    sessions, imported = import_conversations(trace, max_seq_len=model_spec.max_seq_len, history_limit=history_limit,
                                              rate=rate, think_time=think_time, seed=seed)
    arrivals = "all at t = 0" if rate is None else f"sessions start by Poisson at {rate:g} sessions/s (seed {seed})"
    cut = "" if history_limit is None else f"; prompts cut to their last {history_limit} tokens"
    note = (f"{trace} is a ShareGPT conversation file, imported as multi-turn sessions: {imported.describe()}; "
            f"context: {model_spec.name}'s {model_spec.max_seq_len} tokens{cut}; tokens by SmolLM2's tokenizer; "
            f"{arrivals}, then mean think time {think_time:g} s between turns")
    return flatten(sessions), {"trace_format": "sharegpt", "trace_import": note, "num_sessions": len(sessions)}
