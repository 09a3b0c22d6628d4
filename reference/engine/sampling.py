"""How the next token is chosen: the request's parameters and the sampler.

Shaped like vLLM's `SamplingParams` / `BeamSearchParams` (vllm/sampling_params.py), so a script moves
between vLLM and this lab by changing an import. The sampler follows vLLM v1's order of operations on one
row of logits:

    logits --min_tokens mask, penalties--> greedy: argmax (temperature 0, or below 1e-5: no draw)
                                       +-> /temperature --> min-p --> top-k --> top-p --> softmax --> draw

(min_tokens masks the end-of-sequence and stop ids until that many tokens are out; repetition_penalty divides
positive and multiplies negative logits of every prompt or output token; frequency and presence penalties subtract
per occurrence and once for each generated token.) Stop strings and ids are checked after the draw
(reference/engine/engine.py), as vLLM's stop checker and detokenizer do.

The reported log-probability of a token is the log-softmax of the RAW logits (before temperature and
filters), as vLLM reports it by default; `cumulative_logprob` sums those, and is None, as in vLLM, for a request
that asked for no `logprobs` (then no log-softmax over the vocabulary is computed for it). `prompt_logprobs` reports the prompt's
tokens the same way (reference/engine/prompt_logprobs.py, which the engine runs; not the sampler).

Randomness: every sequence owns a `torch.Generator` seeded from its request's seed and its index among
the request's n samples, so the same seed gives the same text whatever else shares the batch, and the
n samples of one request draw different streams.

Both parameter records check themselves when built, strictly, so that nothing a step later chokes on gets
in: an integer field takes an integer (numpy integers are converted; a bool or a float such as 2.5 is a
TypeError), a number field takes a finite real (inf and NaN are ValueErrors), a flag takes a bool. As in
vLLM, a temperature below 1e-5 samples greedily (dividing logits by it would overflow).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

GREEDY_BELOW = 1e-5  # temperatures under this are greedy (vLLM's _SAMPLING_EPS)
MAX_LENGTH_PENALTY = 10.0  # |length_penalty| at most: a score divides by generated_len ** length_penalty
MAX_LOGPROBS = 20  # vLLM's default max_logprobs
# repetition_penalty scales a seen token's logit by up to 1 / penalty, and temperature (>= GREEDY_BELOW) by up to
# 1e5 more: at 1e-4 a logit grows at most 1e9-fold, finite in float32 for any logit a model makes (below 3e29),
# where 1e-300 made inf and then NaN probabilities inside a step. vLLM takes any value > 0; the CTRL paper's is 1.2.
# 100 was this lab's bound before (dividing never overflows; it only has to mean something).
REPETITION_PENALTY_RANGE = (1e-4, 100.0)


def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an int: an int or a numpy integer, not a bool (TypeError otherwise); ValueError below `minimum` or
    above `maximum`."""
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        low = "" if minimum is None else f"{minimum:,} "
        raise ValueError(f"{name} must be <= {maximum:,}, got {value:,} (allowed: {low}.. {maximum:,})")
    return value


def check_real(name: str, value) -> float:
    """`value` as a finite float: an int, float or numpy number, not a bool (TypeError); ValueError if inf or NaN."""
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    return value


def check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return bool(value)


def _set(record, **values) -> None:
    for name, value in values.items():  # frozen dataclass: the checked, converted values replace the given ones
        object.__setattr__(record, name, value)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """vLLM's SamplingParams, field for field where the lab implements the option (vllm/sampling_params.py)."""

    n: int = 1  # parallel samples sharing the prompt's blocks (paper 4.4)
    presence_penalty: float = 0.0  # [-2, 2]: subtracted once from the logit of every token already generated
    frequency_penalty: float = 0.0  # [-2, 2]: subtracted per occurrence in the generated tokens
    repetition_penalty: float = 1.0  # [1e-4, 100]: logits of the prompt's or output's tokens: / if > 0, * if <= 0
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # keep the smallest set of tokens whose probability reaches top_p
    top_k: int = 0  # keep the k most likely tokens; 0 (vLLM's default) or -1 = off
    min_p: float = 0.0  # [0, 1]: drop tokens less likely than min_p times the most likely one
    seed: int | None = None  # per-request generator; same seed -> same text
    stop: str | list[str] | None = None  # stop when the text contains one; the text ends before it
    stop_token_ids: list[int] | None = None  # stop after sampling one of these (besides end-of-sequence)
    ignore_eos: bool = False  # keep generating past an end-of-sequence token
    max_tokens: int = 16  # output tokens at most (fewer if the model context ends first)
    min_tokens: int = 0  # no stop (end-of-sequence, stop ids, stop strings) before this many output tokens
    logprobs: int | None = None  # also return the top-`logprobs` log-probabilities of every generated token
    prompt_logprobs: int | None = None  # RequestOutput.prompt_logprobs: each prompt token's, and the top k there
    skip_special_tokens: bool = True  # leave special tokens out of the text
    include_stop_str_in_output: bool = False  # keep the stop string (or stop token's text) in the text

    def __post_init__(self) -> None:
        temperature, top_p = check_real("temperature", self.temperature), check_real("top_p", self.top_p)
        if temperature < 0.0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        top_k = check_int("top_k", self.top_k)
        if top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (off) or >= 1, got {top_k}")
        seed = None if self.seed is None else check_int("seed", self.seed)
        if seed is not None and seed < 0:
            raise ValueError(f"seed must be None or an integer >= 0, got {seed}")
        penalties = {name: check_real(name, getattr(self, name)) for name in ("presence_penalty", "frequency_penalty")}
        for name, value in penalties.items():
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        repetition = check_real("repetition_penalty", self.repetition_penalty)
        low, high = REPETITION_PENALTY_RANGE
        if not low <= repetition <= high:
            raise ValueError(f"repetition_penalty must be in [{low:g}, {high:g}] (1 = off), got {repetition:g}")
        min_p = check_real("min_p", self.min_p)
        if not 0.0 <= min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {min_p}")
        max_tokens = check_int("max_tokens", self.max_tokens, 1)
        min_tokens = check_int("min_tokens", self.min_tokens, 0)
        if min_tokens > max_tokens:
            raise ValueError(f"min_tokens must be <= max_tokens={max_tokens}, got {min_tokens}")
        logprobs, prompt_logprobs = (None if v is None else check_int(name, v) for name, v in (
            ("logprobs", self.logprobs), ("prompt_logprobs", self.prompt_logprobs)))
        for name, v in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs)):
            if v is not None and not 0 <= v <= MAX_LOGPROBS:  # NOTE: vLLM's -1 (the whole vocabulary) is over 20 too
                raise ValueError(f"{name} must be None or an integer in [0, {MAX_LOGPROBS}], got {v}")
        _set(self, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
             max_tokens=max_tokens, n=check_int("n", self.n, 1), ignore_eos=check_bool("ignore_eos", self.ignore_eos),
             repetition_penalty=repetition, min_p=min_p, min_tokens=min_tokens, logprobs=logprobs,
             prompt_logprobs=prompt_logprobs,
             stop=_stop_strings(self.stop), stop_token_ids=_stop_ids(self.stop_token_ids),
             skip_special_tokens=check_bool("skip_special_tokens", self.skip_special_tokens),
             include_stop_str_in_output=check_bool("include_stop_str_in_output", self.include_stop_str_in_output),
             **penalties)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0


def _stop_strings(stop) -> list[str]:
    """vLLM takes one str or a list; stored as a list (empty: none)."""
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise TypeError(f"stop must be None, a non-empty str or a list of non-empty str, got {stop!r}")
    return list(stop)


def _stop_ids(ids) -> list[int]:
    if ids is None:
        return []
    if not isinstance(ids, (list, tuple)):
        raise TypeError(f"stop_token_ids must be None or a list of token ids, got {type(ids).__name__}")
    return [check_int("stop_token_ids[]", t, 0) for t in ids]


@dataclass(frozen=True, slots=True)
class BeamSearchParams:
    beam_width: int  # k beams, sharing blocks by reference count (paper 4.4); 1 is greedy with a hypothesis list
    max_tokens: int  # output tokens at most
    ignore_eos: bool = False  # an end-of-sequence token does not finish a hypothesis
    length_penalty: float = 1.0  # a hypothesis scores cum_logprob / generated_len ** length_penalty

    def __post_init__(self) -> None:
        length_penalty = check_real("length_penalty", self.length_penalty)
        if not -MAX_LENGTH_PENALTY <= length_penalty <= MAX_LENGTH_PENALTY:  # len ** 500 overflows a float
            raise ValueError(f"length_penalty must be in [-{MAX_LENGTH_PENALTY}, {MAX_LENGTH_PENALTY}] (HF's usual "
                             f"values: 0.5 .. 2), got {length_penalty}")
        _set(self, beam_width=check_int("beam_width", self.beam_width, 1), length_penalty=length_penalty,
             max_tokens=check_int("max_tokens", self.max_tokens, 1),
             ignore_eos=check_bool("ignore_eos", self.ignore_eos))


def sample_generator(seed: int, index: int) -> torch.Generator:
    """The generator of sample `index` of a request seeded with `seed`: one independent stream per
    (seed, index), derived with numpy's SeedSequence so that nearby seeds give unrelated streams."""
    state = np.random.SeedSequence([seed, index]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator(device="cpu").manual_seed(int(state) >> 1)  # manual_seed takes < 2**63


@dataclass(slots=True)
class RowContext:
    """What the penalties and min_tokens need of one row's sequence (vLLM keeps the same per request)."""

    prompt_ids: list[int]
    output_ids: list[int]  # generated so far
    stop_ids: tuple[int, ...]  # end-of-sequence ids (unless ignore_eos) and stop_token_ids


class Sampled(NamedTuple):
    tokens: list[int]
    logprobs: list[float | None]  # raw log-probability of each chosen token; None where params.logprobs is None
    top: list[dict[int, tuple[float, int]] | None]  # rows that asked for logprobs: {token: (logprob, rank)}


def process_row(row: torch.Tensor, params: SamplingParams, ctx: RowContext) -> None:
    """In place, before the choice (vLLM v1's order): min_tokens masks the stop ids, then the penalties."""
    if len(ctx.output_ids) < params.min_tokens and ctx.stop_ids:
        row[list(ctx.stop_ids)] = float("-inf")
    if params.repetition_penalty != 1.0:  # every token of the prompt or the output, once
        seen = torch.tensor(sorted(set(ctx.prompt_ids) | set(ctx.output_ids)), device=row.device)
        values = row[seen]
        row[seen] = torch.where(values > 0, values / params.repetition_penalty, values * params.repetition_penalty)
    if ctx.output_ids and (params.frequency_penalty or params.presence_penalty):  # generated tokens only
        ids, counts = torch.tensor(ctx.output_ids, device=row.device).unique(return_counts=True)
        row[ids] -= params.frequency_penalty * counts.to(row.dtype) + params.presence_penalty


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then min-p, then top-k, then top-p on one row [vocab]; filtered-out tokens get -inf."""
    logits = logits / params.temperature
    if params.min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs  # probability of the tokens ranked above
        # drop a token once the tokens above it already reach top_p; the most likely one always stays
        drop = mass_before >= params.top_p
        drop[0] = False
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    return logits


def _top_logprobs(row: torch.Tensor, k: int, token: int) -> dict[int, tuple[float, int]]:
    """vLLM's per-token logprobs: the chosen token first, then the k most likely, each with its 1-based rank
    (the number of tokens at least as likely)."""
    chosen = float(row[token])
    out = {token: (chosen, int((row >= row[token]).sum()))}
    if k:
        values, ids = torch.topk(row, k)
        for rank, (t, v) in enumerate(zip(ids.tolist(), values.tolist()), start=1):
            out.setdefault(t, (v, rank))
    return out


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
           contexts: list[RowContext] | None = None) -> Sampled:
    """One token per row of `logits` [num_rows, vocab] (float32, on any device), with row i's params and generator
    (and its RowContext, needed when a row has penalties or min_tokens).

    Returns the tokens, the log-probability of each under the raw logits (None for rows that ask for no logprobs),
    and the top log-probabilities of the rows whose params ask for them. As vLLM v1: raw log-probabilities; then min_tokens and the penalties change the
    logits; greedy rows take the argmax of those; sampled rows go on through temperature, min-p, top-k, top-p.

    NOTE: log-probabilities and the greedy answer are computed where the logits are (on a GPU: 50 MB of logits
    for 256 rows of SmolLM2's vocabulary stay there; only the ids and log-probabilities come back). A sampled
    row goes to the CPU, where its torch.Generator lives, so a seed gives the same tokens on every device.
    """
    # NOTE: log-softmax over a 49,152-token vocabulary costs ~3 ms per step for 64 rows on one CPU core, and vLLM
    # computes it only for rows that ask: so here (their cumulative_logprob is None, as in vLLM).
    wanted = [i for i, p in enumerate(params) if p.logprobs is not None]
    raw = torch.log_softmax(logits[wanted], dim=-1) if wanted else None  # [len(wanted), vocab], what vLLM reports
    work = logits
    if contexts is not None:
        touched = [i for i, p in enumerate(params)
                   if p.has_penalties or len(contexts[i].output_ids) < p.min_tokens]
        if touched:
            work = logits.clone()
            for i in touched:
                process_row(work[i], params[i], contexts[i])
    # the greedy answer for every row (sampled rows overwrite). NOTE: max's indices, the first maximum as argmax's, in
    # 1.7 ms instead of argmax's 5.7 for 64 rows of SmolLM2's vocabulary on one CPU core
    chosen = work.max(dim=-1).indices
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if sampled:
        rows = work[sampled].cpu()
        for j, i in enumerate(sampled):
            probs = torch.softmax(filter_logits(rows[j], params[i]), dim=-1)
            chosen[i] = int(torch.multinomial(probs, 1, generator=generators[i]).item())
    tokens = chosen.tolist()
    logprobs: list[float | None] = [None] * len(params)
    top: list[dict[int, tuple[float, int]] | None] = [None] * len(params)
    if wanted:
        picked = raw.gather(1, chosen[wanted][:, None])[:, 0].tolist()
        for j, i in enumerate(wanted):
            logprobs[i], top[i] = picked[j], _top_logprobs(raw[j], params[i].logprobs, tokens[i])
    return Sampled(tokens, logprobs, top)
