"""Speculative decoding in the simulator: how many draft tokens a verify step accepts, and what it costs.

Leviathan, Kalman and Matias, "Fast Inference from Transformers via Speculative Decoding", ICML 2023 (section 3.1):
a cheap draft proposes k tokens, the target model computes all of them in one forward pass (the verify step), and
keeps the longest prefix it agrees with, plus one token of its own. Under their standard model each draft token is
accepted with the same probability alpha, independently, as long as every draft before it was:

    accepted drafts a:  P(a = j) = alpha^j (1 - alpha) for j < k,  P(a = k) = alpha^k
    tokens per step:    E[1 + a] = (1 - alpha^(k+1)) / (1 - alpha)        (k + 1 when alpha = 1)

The scheduler (sim/scheduler.py, `num_speculative_tokens`) gives each decoding sequence up to k lookahead slots for
its drafts; the loop (sim/loop.py) draws the accepted count of each verify entry from `AcceptanceModel` and reports
it (`StepOutcome.num_accepted`); the scheduler rolls the rest back through the KV contract.

Cost. The verify step is priced by the cost model's ordinary `step_time`: a verify entry is a decode (its last
sampled token) plus a chunk of its d drafts after its context (sim.plan.StepPlan.num_draft_tokens and
num_draft_pairs): d more new tokens (weights are read once either way: on a memory-bound GPU the drafts come almost
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
