"""What the engine keeps per request between steps, and the outputs it makes of it.

A request that passed `LLM`'s checks (`CheckedRequest`) joins the scheduler's queue; the engine keeps its
`RequestState` (public id, prompt, sampling parameters, per sequence a `SampleState`: tokens, log-probs, stop state)
until it finishes. `request_output` turns a state into the `RequestOutput` vLLM's API returns, texts cut as vLLM cuts
them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from reference.engine.beam import BeamSearchState
from reference.engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from reference.engine.prompt_logprobs import PromptLogprobs
from reference.engine.sampling import BeamSearchParams, SamplingParams

Params = SamplingParams | BeamSearchParams


@dataclass(slots=True)
class SampleState:
    index: int  # position among the request's samples / beams
    token_ids: list[int]  # generated so far
    cum_logprob: float = 0.0
    finish_reason: str | None = None
    generator: torch.Generator | None = None  # None: greedy (or a beam)
    logprobs: list[dict] | None = None  # per token {id: (logprob, rank)}, when the params ask for them
    stop_reason: int | str | None = None
    stop_token: bool = False  # stopped by an end-of-sequence or stop token: its text is left out of the text
    text_len: int = 0  # characters of the text searched for stop strings so far (check_stop_strings: only new text)
    text_end: int | None = None  # a stop string cut the text here


@dataclass(slots=True)
class RequestState:
    request_id: str  # the public id (the engine's dicts key it by the scheduler's int)
    prompt: str | None
    prompt_token_ids: list[int]
    params: Params
    max_tokens: int  # params.max_tokens, cut to what the model context leaves
    seqs: dict[int, SampleState]  # scheduler seq id -> state: samples, or the current beams
    beam: BeamSearchState | None = None
    num_cached_tokens: int | None = None  # set at the first admission
    prompt_logprobs: PromptLogprobs | None = None  # SamplingParams.prompt_logprobs set: collected as computed
    metrics: RequestMetrics | None = None  # set when queued; updated after every step it is in


@dataclass(slots=True)
class CheckedRequest:
    """One request as add_request would queue it, every check passed (nothing queued yet)."""

    prompt: str | None  # the text, None when given as token ids
    prompt_token_ids: list[int]
    params: Params
    max_tokens: int  # params.max_tokens, cut to what the model context leaves
    request_id: str | None  # None: the engine's next id
    priority: int = 0  # its place under scheduling_policy="priority": the lower value first (vLLM's priority)


def completion_output(seq: SampleState, params, decode) -> CompletionOutput:
    """A sample's CompletionOutput, its text cut as vLLM cuts it (a stop token's or stop string's text is left out
    unless include_stop_str_in_output). `decode(token_ids, skip_special_tokens)`: the text of tokens."""
    ids = list(seq.token_ids)  # (beams in progress have BeamSearchParams: vLLM's defaults)
    skip = getattr(params, "skip_special_tokens", True)
    keep_stop = getattr(params, "include_stop_str_in_output", False)
    text = decode(ids[:-1] if seq.stop_token and not keep_stop else ids, skip)
    if seq.text_end is not None and seq.text_end >= 0:
        text = text[:seq.text_end]
    # decoded_token shows special tokens as they are (vLLM converts ids to tokens for logprobs)
    logprobs = None if seq.logprobs is None else [
        {t: Logprob(lp, rank, decode([t], False)) for t, (lp, rank) in step.items()} for step in seq.logprobs]
    # vLLM: no cumulative_logprob for a sample that asked for no logprobs (beams always score theirs)
    cumulative = seq.cum_logprob if getattr(params, "logprobs", 0) is not None else None
    return CompletionOutput(seq.index, text, ids, cumulative, logprobs, seq.finish_reason, seq.stop_reason)


def request_output(state: RequestState, finished: bool, decode) -> RequestOutput:
    """The request's RequestOutput under its public id: a beam search's finished hypotheses (best first) once it is
    done, else every sample in order."""
    if state.beam is not None and state.beam.done:
        outputs = [CompletionOutput(i, decode(h.token_ids, True), h.token_ids, h.cum_logprob, None, h.finish_reason)
                   for i, h in enumerate(state.beam.hypotheses)]
    else:
        outputs = [completion_output(s, state.params, decode) for s in sorted(state.seqs.values(), key=lambda s: s.index)]
    prompt_logprobs = None if state.prompt_logprobs is None else list(state.prompt_logprobs.entries)
    return RequestOutput(state.request_id, state.prompt, list(state.prompt_token_ids), prompt_logprobs, outputs,
                         finished, state.num_cached_tokens or 0, replace(state.metrics))
