"""How the next token is chosen: the request's parameters and the sampler.

Shaped like vLLM's `SamplingParams` / `BeamSearchParams` (vllm/sampling_params.py), so a script moves
between vLLM and this lab by changing an import. The sampler follows vLLM's order of operations on one
row of logits:

    logits --/temperature--> top-k filter --> top-p filter --> softmax --> draw with the sequence's generator
                     (temperature 0, or below 1e-5: argmax of the raw logits, no draw)

The reported log-probability of a token is the log-softmax of the RAW logits (before temperature and
filters), as vLLM reports it by default; `cumulative_logprob` sums those.

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

import numpy as np
import torch

GREEDY_BELOW = 1e-5  # temperatures under this are greedy (vLLM's _SAMPLING_EPS)
MAX_LENGTH_PENALTY = 10.0  # |length_penalty| at most: a score divides by generated_len ** length_penalty


def check_int(name: str, value, minimum: int | None = None) -> int:
    """`value` as an int: an int or a numpy integer, not a bool (TypeError otherwise); ValueError below `minimum`."""
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
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
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # keep the smallest set of tokens whose probability reaches top_p
    top_k: int = -1  # keep the k most likely tokens; -1 = off (vLLM's convention)
    max_tokens: int = 16  # output tokens at most (fewer if the model context ends first)
    n: int = 1  # parallel samples sharing the prompt's blocks (paper 4.4)
    seed: int | None = None  # per-request generator; same seed -> same text
    ignore_eos: bool = False  # keep generating past an end-of-sequence token

    def __post_init__(self) -> None:
        temperature, top_p = check_real("temperature", self.temperature), check_real("top_p", self.top_p)
        if temperature < 0.0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        top_k = check_int("top_k", self.top_k)
        if top_k == 0 or top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {top_k}")
        seed = None if self.seed is None else check_int("seed", self.seed)
        if seed is not None and seed < 0:
            raise ValueError(f"seed must be None or an integer >= 0, got {seed}")
        _set(self, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
             max_tokens=check_int("max_tokens", self.max_tokens, 1), n=check_int("n", self.n, 1),
             ignore_eos=check_bool("ignore_eos", self.ignore_eos))  # fmt: skip

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


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


def _filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p on one row [vocab]; filtered-out tokens get -inf."""
    logits = logits / params.temperature
    if params.top_k != -1 and params.top_k < logits.shape[-1]:
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


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> tuple[list[int], list[float]]:
    """One token per row of `logits` [num_rows, vocab] (float32, on any device), with row i's params and generator.

    Returns (token ids, log-probability of each under the raw logits).

    NOTE: log-probabilities and the greedy answer are computed where the logits are (on a GPU: 50 MB of logits
    for 256 rows of SmolLM2's vocabulary stay there; only the ids and log-probabilities come back). A sampled
    row goes to the CPU, where its torch.Generator lives, so a seed gives the same tokens on every device.
    """
    logprobs = torch.log_softmax(logits, dim=-1)  # [num_rows, vocab], raw: what vLLM reports
    greedy = torch.argmax(logits, dim=-1)  # the greedy answer for every row; sampled rows overwrite
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if sampled:
        rows = logits[sampled].cpu()
        for j, i in enumerate(sampled):
            probs = torch.softmax(_filter_logits(rows[j], params[i]), dim=-1)
            greedy[i] = int(torch.multinomial(probs, 1, generator=generators[i]).item())
    chosen = logprobs.gather(1, greedy[:, None])[:, 0]
    return greedy.tolist(), chosen.tolist()
