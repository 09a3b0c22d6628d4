"""How the next token is chosen: the request's parameters and the sampler.

Shaped like vLLM's `SamplingParams` / `BeamSearchParams` (vllm/sampling_params.py), so a script moves
between vLLM and this lab by changing an import. The sampler follows vLLM's order of operations on one
row of logits:

    logits --/temperature--> top-k filter --> top-p filter --> softmax --> draw with the sequence's generator
                     (temperature 0: argmax of the raw logits, no draw)

The reported log-probability of a token is the log-softmax of the RAW logits (before temperature and
filters), as vLLM reports it by default; `cumulative_logprob` sums those.

Randomness: every sequence owns a `torch.Generator` seeded from its request's seed and its index among
the request's n samples, so the same seed gives the same text whatever else shares the batch, and the
n samples of one request draw different streams.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


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
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be None or >= 0, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class BeamSearchParams:
    beam_width: int  # k beams, sharing blocks by reference count (paper 4.4)
    max_tokens: int  # output tokens at most
    ignore_eos: bool = False  # an end-of-sequence token does not finish a hypothesis
    length_penalty: float = 1.0  # a hypothesis scores cum_logprob / generated_len ** length_penalty

    def __post_init__(self) -> None:
        if self.beam_width < 1:
            raise ValueError(f"beam_width must be >= 1, got {self.beam_width}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


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
    """One token per row of `logits` [num_rows, vocab] (float32, CPU), with row i's params and generator.

    Returns (token ids, log-probability of each under the raw logits).
    """
    logprobs = torch.log_softmax(logits, dim=-1)  # [num_rows, vocab], raw: what vLLM reports
    tokens = torch.argmax(logits, dim=-1).tolist()  # the greedy answer for every row; sampled rows overwrite
    for i, (p, gen) in enumerate(zip(params, generators)):
        if p.greedy:
            continue
        probs = torch.softmax(_filter_logits(logits[i], p), dim=-1)
        tokens[i] = int(torch.multinomial(probs, 1, generator=gen).item())
    chosen = logprobs[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.int64)]
    return tokens, chosen.tolist()
