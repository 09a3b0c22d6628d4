"""Speculative decoding in the simulator: how many draft tokens a verify step accepts, and what it costs.

Leviathan, Kalman and Matias, "Fast Inference from Transformers via Speculative Decoding", ICML 2023 (section 3.1):
a cheap draft proposes k tokens, the target model computes all of them in one forward pass (the verify step), and
keeps the longest prefix it agrees with, plus one token of its own. Under their standard model each draft token is
accepted with the same probability alpha, independently, as long as every draft before it was:

    accepted drafts a:  P(a = j) = alpha^j (1 - alpha) for j < k,  P(a = k) = alpha^k
    tokens per step:    E[1 + a] = (1 - alpha^(k+1)) / (1 - alpha)        (k + 1 when alpha = 1)

The scheduler (sim/scheduling/scheduler.py, `num_speculative_tokens`) gives each decoding sequence up to k lookahead slots for
its drafts (how many: `draft_counts`, below); the loop (sim/clock/loop.py) draws the accepted count of each verify entry from `AcceptanceModel` and reports
it (`StepOutcome.num_accepted`); the scheduler rolls the rest back through the KV contract.

Cost. The verify step is priced by the cost model's ordinary `step_time`: a verify entry is a decode (its last
sampled token) plus a chunk of its d drafts after its context (sim.scheduling.plan.StepPlan.num_draft_tokens and
sim.scheduling.step_shape.draft_pairs): d more new tokens (weights are read once either way: on a memory-bound GPU the drafts come almost
free, until the batch's tokens make the step compute-bound) and its K/V read once. NOTE: the draft's own cost is not
charged: an n-gram (prompt-lookup) draft, as the reference engine's, matches token ids on the CPU and costs ~nothing
next to a forward pass; a draft MODEL would add its own k small forward passes per step (not modelled).
"""
from __future__ import annotations

import numpy as np


class AcceptanceModel:
    """Accepted draft counts under the i.i.d. model above, from a seeded generator of their own (a stream apart from
    the workload's and the beam scores', so that the same seed gives the same run)."""

    def __init__(self, rate: float, seed: int = 0) -> None:
        if not (isinstance(rate, (int, float)) and 0.0 <= rate <= 1.0):
            raise ValueError(f"acceptance_rate: got {rate!r} (allowed: a number from 0 to 1)")
        self.rate = float(rate)
        self.rng = np.random.default_rng([seed, 0x5EC])

    def accepted(self, num_drafts: int) -> int:
        """How many of `num_drafts` draft tokens the target accepts: leading successes of probability `rate`."""
        if self.rate == 1.0:
            return num_drafts
        if self.rate == 0.0:
            return 0
        # leading successes before the first rejection: a geometric count of trials to the first failure, minus one
        return min(num_drafts, int(self.rng.geometric(1.0 - self.rate)) - 1)


def expected_tokens_per_step(rate: float, k: int) -> float:
    """E[1 + accepted] for k drafts at acceptance rate `rate` (Leviathan et al., eq. 1)."""
    return float(k + 1) if rate == 1.0 else (1.0 - rate ** (k + 1)) / (1.0 - rate)


def draft_counts(group, seqs, counts: list[int], budget: int | None, k: int, max_model_len: int,
                 draft_len=None) -> list[int] | None:
    """The scheduler's rule: draft tokens each sequence `seqs` of the group verifies this step, after the `counts`
    tokens it is fed, or None for none. k for a plain decode (one token fed: the last sampled one), fewer where its
    output would end first (it samples at most 1 + its drafts, never past output_len: its K/V then stays within its
    final length), past `max_model_len` (0: no limit), where `draft_len(request_id, seq_id)` (the engine's n-gram
    draft) has fewer, or where the `budget` left after the group's own tokens runs out (None: no budget). None for
    beam search (its beams branch each step)."""
    if group.is_beam_search:
        return None
    left = None if budget is None else budget - sum(counts)
    drafts = []
    for seq, count in zip(seqs, counts):
        d = 0
        if count == 1 and not seq.prefilling and seq.num_computed_tokens == seq.num_tokens - 1:
            d = min(k, seq.output_len - seq.num_generated - 1)
            if max_model_len:
                d = min(d, max_model_len - seq.num_tokens)
            if d > 0 and draft_len is not None:
                d = min(d, draft_len(seq.request_id, seq.seq_id))
            if left is not None:
                d = min(d, left)
                left -= max(d, 0)
        drafts.append(max(d, 0))
    return drafts if any(drafts) else None


def check_accepted(plan, outcome) -> None:
    """ValueError unless the outcome names, for every verify entry of the plan, how many of its drafts were accepted
    (0 .. its drafts): the scheduler checks it before finish_step changes anything."""
    for entry in plan.decodes:
        if entry.num_draft_tokens:
            accepted = outcome.num_accepted.get(entry.seq_id)
            if not (isinstance(accepted, int) and 0 <= accepted <= entry.num_draft_tokens):
                raise ValueError(f"num_accepted[{entry.seq_id}]: expected 0 to {entry.num_draft_tokens} (the entry's "
                                 f"draft tokens), found {accepted!r}")


def tokens_kept(plan, outcome) -> dict[int, int]:
    """After a verify step: per request that sampled, the tokens it kept (1 + its accepted drafts; the most of its
    sequences'), what its token-step count grows by (sim.clock.metrics.RequestTimes)."""
    kept: dict[int, int] = {}
    for entry in plan.entries:
        if entry.sample:
            tokens = 1 + outcome.num_accepted.get(entry.seq_id, 0)
            kept[entry.request_id] = max(tokens, kept.get(entry.request_id, 0))
    return kept
