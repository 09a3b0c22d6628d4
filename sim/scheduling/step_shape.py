"""What a cost model prices a step by: the shape of a `StepPlan` (sim/clock/cost.py: `step_time(*step_shape(plan))`).

The plan says what to compute; its shape says how much work that is for the machine: prompt tokens fed, sequences
that decode, the K/V the attention reads, the query-key pairs of the prompt chunks' attention (what makes a long
prompt cost more than its tokens) and, of the K/V read, what another sequence of the step reads too (a block read
twice in one pass is read the second time from cache). The engine records the same numbers for each step it runs
(reference/engine/outputs.py, `StepRecord`), so that measured steps fit the same model.
"""
from __future__ import annotations

from typing import NamedTuple

from .plan import StepPlan


class StepShape(NamedTuple):
    """What a cost model prices a step by (sim/clock/cost.py: `step_time(*shape)`)."""

    num_prefill_tokens: int  # prompt (or recompute) tokens fed, a verify entry's drafts included
    num_decode_seqs: int  # sequences that decode (one token each, before any drafts)
    num_context_tokens: int  # K/V the attention reads (StepPlan.num_context_tokens)
    num_prefill_pairs: int = 0  # query-key pairs of the prompt chunks' (and drafts') attention
    num_shared_context_tokens: int = 0  # of the K/V read, what another sequence of the step reads too


def step_shape(plan: StepPlan, num_shared_context_tokens: int = 0) -> StepShape:
    """The step as a cost model prices it (`num_shared_context_tokens`: when the model reads them, else 0). A verify
    entry's drafts are priced as a chunk after its decode."""
    prefill, pairs = plan.num_prefill_tokens, prefill_pairs(plan)
    if plan.num_draft_tokens:
        prefill, pairs = prefill + plan.num_draft_tokens, pairs + draft_pairs(plan)
    return StepShape(prefill, plan.num_decode_seqs, plan.num_context_tokens, pairs, num_shared_context_tokens)


def prefill_pairs(plan: StepPlan) -> int:
    """Query-key pairs of the prompt chunks' attention: a chunk of k tokens after c cached ones has its j-th token
    (j = 1..k) attend to c + j keys, k * c + k * (k + 1) / 2 pairs in all. Decodes count none (their attention is
    num_context_tokens, one query each)."""
    return sum(s.num_new_tokens * s.num_computed_tokens + s.num_new_tokens * (s.num_new_tokens + 1) // 2
               for s in plan.prefills)


def draft_pairs(plan: StepPlan) -> int:
    """Query-key pairs of the draft tokens' attention: a verify entry after c cached tokens feeds its last token and
    d drafts, the j-th draft attending to c + 1 + j keys (as a chunk does; sim.clock.cost prices a verify entry as a decode
    plus a d-token chunk)."""
    return sum(s.num_draft_tokens * (s.num_computed_tokens + 1) + s.num_draft_tokens * (s.num_draft_tokens + 1) // 2
               for s in plan.decodes if s.num_draft_tokens)


def shared_context_tokens(plan: StepPlan, block_size: int) -> int:
    """Of num_context_tokens, those read from a block that an earlier fed entry of the step also reads: a prompt shared
    by n samples or k beams, a cached system prompt. On a CPU a block read twice in one pass is read the second time
    from cache, at about half the cost (sim.clock.cost.PiecewiseCostModel.d_shared). O(blocks read)."""
    return shared_tokens(((s.block_table, s.num_computed_tokens + s.num_new_tokens)
                          for s in plan.entries if s.num_new_tokens), block_size)


def shared_tokens(reads, block_size: int) -> int:
    """For (block_table, tokens read) per sequence, in order: the tokens read from a block an earlier sequence read
    (shared_context_tokens; the fast plane counts a run's the same way)."""
    seen: set[int] = set()
    shared = 0
    for table, read in reads:
        for j, block in enumerate(table[:-(-read // block_size)]):
            if block in seen:
                shared += min(block_size, read - j * block_size)
            else:
                seen.add(block)
    return shared
