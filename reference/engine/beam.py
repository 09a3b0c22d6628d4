"""Beam search bookkeeping of one request: which k beams survive each step, and when the search ends.

vLLM paper section 4.4: the k beams of a request are sequences that share blocks; each step the best k
continuations are kept, a beam chosen twice is forked (its blocks shared, copy-on-write later) and a beam
not chosen is freed. This module decides WHICH beams; the scheduler does the memory side
(`StepOutcome.beam_parents`).

The rules are vLLM's `LLM.beam_search` (vllm/entrypoints/generate/beam_search/offline.py), re-derived here:

    1. candidates: each running beam's 2k most likely next tokens, scored cum_logprob(beam) + log p(token | beam)
       (raw log-probabilities). The search starts from one beam, the prompt.
    2. a candidate whose token is an end-of-sequence token (unless ignore_eos) is COMPLETED: it is kept, whatever
       its rank, and competes at the end.
    3. the k best other candidates (by score; a stable sort) are the next beams.
    4. after max_tokens steps, the completed sequences and the running beams are ranked together by
       score = cum_logprob / len(prompt + generated, without a final end-of-sequence token) ** length_penalty,
       and the k best are the result, best first. (HF transformers differs: it keeps an end-of-sequence
       candidate only if it ranks in the top k, divides by the generated length only, and may stop early; with
       ignore_eos both give the same beams, which tests/reference/test_engine.py checks.)

NOTE: the scheduler runs exactly k beams per request, so should fewer than k candidates ever be left (a vocabulary
of fewer than 2k tokens), the search ends there; vLLM would go on with fewer beams.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class Hypothesis:
    token_ids: list[int]  # generated ids, the end-of-sequence token included
    cum_logprob: float
    score: float  # vLLM's: cum_logprob / (prompt + generated, minus a final EOS) ** length_penalty
    finish_reason: str  # "stop" (ended with an end-of-sequence token) or "length"


@dataclass(slots=True)
class Beam:
    """A running beam as the caller sees it: its sequence id, generated tokens and summed log-probability."""

    seq_id: int
    token_ids: list[int]
    cum_logprob: float


@dataclass(slots=True)
class BeamStepResult:
    beams: list[Beam]  # the k surviving beams, best first (token_ids already extended); [] when done
    parents: list[int]  # seq id of each surviving beam's parent (the scheduler's beam_parents)
    done: bool  # the search is over: hypotheses are final


@dataclass(slots=True)
class BeamSearchState:
    width: int  # k
    max_tokens: int
    eos_token_ids: tuple[int, ...]  # empty when ignore_eos
    length_penalty: float = 1.0
    prompt_len: int = 0  # counted in the score's length, as vLLM does
    hypotheses: list[Hypothesis] = field(default_factory=list)  # the final k, best first (set when done)
    completed: list[Hypothesis] = field(default_factory=list)  # every sequence that ended with EOS so far
    first_step: bool = True
    done: bool = False  # the search is over: `hypotheses` are final

    def score(self, token_ids: list[int], cum_logprob: float) -> float:
        length = self.prompt_len + len(token_ids) - (1 if token_ids and token_ids[-1] in self.eos_token_ids else 0)
        return cum_logprob / max(length, 1) ** self.length_penalty

    def step(self, beams: list[Beam], logprobs: torch.Tensor) -> BeamStepResult:
        """Advance the search by one token. `logprobs` [len(beams), vocab] are each beam's next-token
        log-probabilities (log-softmax of the raw logits), rows in the order of `beams`."""
        if len(beams) != self.width or logprobs.shape[0] != self.width:
            raise ValueError(f"expected {self.width} running beams and logit rows, "
                             f"got {len(beams)} and {logprobs.shape[0]}")
        if self.first_step:  # all beams hold the same prompt: the search starts from one
            beams, logprobs = beams[:1], logprobs[:1]
            self.first_step = False
        per_beam = min(2 * self.width, logprobs.shape[1])
        values, tokens = torch.topk(logprobs.to(torch.float64), per_beam, dim=1)
        candidates: list[tuple[float, Beam, int]] = []  # (score, new beam, parent seq id), in vLLM's order
        for parent, row_values, row_tokens in zip(beams, values.tolist(), tokens.tolist()):
            for value, token in zip(row_values, row_tokens):
                ids, cum = parent.token_ids + [token], parent.cum_logprob + value
                if token in self.eos_token_ids:
                    self.completed.append(Hypothesis(ids, cum, self.score(ids, cum), "stop"))
                else:
                    candidates.append((self.score(ids, cum), Beam(parent.seq_id, ids, cum), parent.seq_id))
        best = sorted(candidates, key=lambda c: c[0], reverse=True)[: self.width]  # stable, as vLLM's sorted
        new_len = len(beams[0].token_ids) + 1
        if new_len >= self.max_tokens or len(best) < self.width:
            running = [Hypothesis(b.token_ids, b.cum_logprob, score, "length") for score, b, _ in best]
            self.hypotheses = sorted(self.completed + running, key=lambda h: h.score, reverse=True)[: self.width]
            self.done = True
            return BeamStepResult([], [], True)
        return BeamStepResult([b for _, b, _ in best], [p for _, _, p in best], False)


def step_beams(request_id: int, state, row_of: dict[int, int], logits: torch.Tensor, outcome) -> tuple[list[Beam], str | None]:
    """One beam-search step of the request `state` (the engine's RequestState): every beam's row of `logits` (`row_of`:
    seq id -> row) scored, the survivors chosen; the step's outcome told which sequences finished or which parents
    survive (sim.scheduling.plan.StepOutcome). Returns the surviving beams and, when the search ends, its finish reason."""
    if set(row_of) != set(state.seqs):
        raise RuntimeError(f"request {request_id}: expected all beams {sorted(state.seqs)} in the step, "
                           f"found {sorted(row_of)}")
    order = sorted(state.seqs, key=lambda i: state.seqs[i].index)  # beam order, best first
    beams = [Beam(i, state.seqs[i].token_ids, state.seqs[i].cum_logprob) for i in order]
    step = state.beam.step(beams, torch.log_softmax(logits[[row_of[i] for i in order]], dim=-1).cpu())
    if step.done:
        outcome.finished_seq_ids.update(order)
        return step.beams, state.beam.hypotheses[0].finish_reason if state.beam.hypotheses else "length"
    if state.beam.width > 1:  # the scheduler re-chooses beams; a single beam simply goes on (a plain group)
        outcome.beam_parents[request_id] = step.parents
    return step.beams, None
