"""Beam search bookkeeping of one request: which k beams survive each step, and when the search ends.

vLLM paper section 4.4: the k beams of a request are sequences that share blocks; each step the best k
continuations are kept, a beam chosen twice is forked (its blocks shared, copy-on-write later) and a beam
not chosen is freed. This module decides WHICH beams; the scheduler does the memory side
(`StepOutcome.beam_parents`).

The selection rules follow Hugging Face transformers' beam search (`GenerationMixin._beam_search`,
num_beams=k, do_sample=False, early_stopping=False), re-derived here in plain Python:

    1. candidates: every (beam, token) scored cum_logprob(beam) + log p(token | beam). On the first step all
       beams are the same prompt, so only beam 0 is expanded. Keep the K = max(2, 1 + #eos) * k best.
    2. a candidate "finishes" if its token is an end-of-sequence token or it reaches max_tokens. A finishing
       candidate ranked in the top k becomes a hypothesis scored cum_logprob / generated_len ** length_penalty;
       the k best hypotheses are kept. Finishing candidates ranked below k are dropped.
    3. the k best NON-finishing candidates are the next beams (K >= 2k guarantees there are k of them).
    4. the search stops when every candidate finished (max_tokens), or when k hypotheses exist and the best
       running beam's score at its current length cannot beat the worst of them (HF's heuristic for
       early_stopping=False: assume the beam's sum can only fall).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class Hypothesis:
    token_ids: list[int]  # generated ids, the end-of-sequence token included
    cum_logprob: float
    score: float  # cum_logprob / len(token_ids) ** length_penalty
    finish_reason: str  # "stop" or "length"


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
    hypotheses: list[Hypothesis] = field(default_factory=list)  # the best finished ones, best first, <= k
    first_step: bool = True
    done: bool = False  # the search is over: `hypotheses` are final

    def _hits(self, token: int, new_len: int) -> str | None:
        if token in self.eos_token_ids:
            return "stop"
        return "length" if new_len >= self.max_tokens else None

    def step(self, beams: list[Beam], logprobs: torch.Tensor) -> BeamStepResult:
        """Advance the search by one token. `logprobs` [len(beams), vocab] are each beam's next-token
        log-probabilities (log-softmax of the raw logits), rows in the order of `beams`."""
        if len(beams) != self.width or logprobs.shape[0] != self.width:
            raise ValueError(f"expected {self.width} running beams and logit rows, "
                             f"got {len(beams)} and {logprobs.shape[0]}")
        new_len = len(beams[0].token_ids) + 1
        vocab = logprobs.shape[1]
        cum = torch.tensor([b.cum_logprob for b in beams], dtype=torch.float64)
        scores = logprobs.to(torch.float64) + cum[:, None]  # [k, vocab]
        if self.first_step:  # all beams hold the same prompt: expand only beam 0 (HF gives the rest -1e9)
            scores = scores[:1]
            self.first_step = False
        num_candidates = min(max(2, 1 + len(self.eos_token_ids)) * self.width, scores.numel())
        top_scores, top_index = torch.topk(scores.flatten(), num_candidates)
        survivors: list[Beam] = []
        parents: list[int] = []
        all_finish = True
        for rank, (score, index) in enumerate(zip(top_scores.tolist(), top_index.tolist())):
            parent, token = beams[index // vocab], index % vocab
            reason = self._hits(token, new_len)
            if reason is not None:
                if rank < self.width:  # only the top k may become hypotheses (HF's top_num_beam_mask)
                    self._add(Hypothesis(parent.token_ids + [token], score,
                                         score / new_len ** self.length_penalty, reason))
                continue
            all_finish = False
            if len(survivors) < self.width:
                survivors.append(Beam(parent.seq_id, parent.token_ids + [token], score))
                parents.append(parent.seq_id)
        done = all_finish or len(survivors) < self.width or self._cannot_improve(survivors, new_len)
        self.done = done
        return BeamStepResult([] if done else survivors, [] if done else parents, done)

    def _add(self, hyp: Hypothesis) -> None:
        # NOTE: a stable sort keeps an earlier hypothesis ahead of a later one with an equal score, as HF's
        # merge (old finished first, then new) does in practice.
        self.hypotheses = sorted(self.hypotheses + [hyp], key=lambda h: -h.score)[: self.width]

    def _cannot_improve(self, survivors: list[Beam], new_len: int) -> bool:
        if len(self.hypotheses) < self.width:
            return False
        best_running = max(b.cum_logprob for b in survivors) / new_len ** self.length_penalty
        return best_running <= self.hypotheses[-1].score
