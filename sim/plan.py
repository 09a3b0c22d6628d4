"""What one scheduler step asks an executor to do, and what the executor reports back.

vLLM v1's `SchedulerOutput` (vllm/v1/core/sched/output.py) on top of Orca's iteration-level scheduling (Yu et
al., OSDI 2022): every iteration the scheduler hands the executor a plain description of the work. The
simulator prices it with a cost model; the reference engine runs it on a real model. Neither touches the KV
manager: the block tables in the plan are already allocated.

An executor carries out a `StepPlan` in this order:

    1. blocks_to_swap_out   (gpu_block, cpu_block)   copy out BEFORE anything overwrites the GPU block
    2. blocks_to_swap_in    (cpu_block, gpu_block)
    3. blocks_to_copy       (src, dst)               copy-on-write and fork copies
    4. one forward pass over every fed entry, then sample one token for every entry with `sample`

Token ranges of one sequence in a step (K/V is written into block_table for every fed token):

    |<---- num_computed_tokens ---->|<-- num_new_tokens -->|
     K/V already in the cache         fed this step          -> sampled after the last one, if `sample`
                                                                (a chunk that stops short of the end samples nothing)

Entries are split by what the sequence is doing: `prefills` compute a prompt (or, after a preemption by
recompute, prompt + generated tokens), whole or a chunk; `decodes` feed the last sampled token. A v1 step
mixes both; a v0 step has only one kind.

NOTE: the siblings of a group (n samples, k beams) share the prompt, so it is computed ONCE, by the group's
leader. When the leader's last prompt token is computed, each sibling comes as a *sample-only* entry
(num_computed_tokens = prompt_len, num_new_tokens = 0, no block table yet) that samples its own token from
the leader's logits; the scheduler forks it from the leader when the step is reported. A sample-only
entry always follows its leader's entry in `prefills`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from .kv.base import BlockCopy


class StepShape(NamedTuple):
    """What a cost model prices a step by (sim/cost.py: `step_time(*shape)`)."""

    num_prefill_tokens: int  # prompt (or recompute) tokens fed, a verify entry's drafts included
    num_decode_seqs: int  # sequences that decode (one token each, before any drafts)
    num_context_tokens: int  # K/V the attention reads (StepPlan.num_context_tokens)
    num_prefill_pairs: int = 0  # query-key pairs of the prompt chunks' (and drafts') attention
    num_shared_context_tokens: int = 0  # of the K/V read, what another sequence of the step reads too


@dataclass(slots=True)
class ScheduledSeq:
    seq_id: int
    request_id: int
    num_computed_tokens: int  # tokens whose K/V is already in the cache before this step
    num_new_tokens: int  # tokens fed this step: a prompt / recompute chunk, 1 for a decode, 0 sample-only
    block_table: list[int]  # the sequence's block table after this step's allocations ([] sample-only)
    sample: bool = True  # samples a token after this step (False: a chunk that does not reach the end)
    # speculative decoding: of num_new_tokens, the last ones are draft tokens fed to be verified (their slots are the
    # KV manager's lookahead slots); the step samples 1 + the drafts it accepts (StepOutcome.num_accepted)
    num_draft_tokens: int = 0


@dataclass(slots=True)
class StepPlan:
    prefills: list[ScheduledSeq] = field(default_factory=list)  # prompt / recompute chunks (+ sample-only siblings)
    decodes: list[ScheduledSeq] = field(default_factory=list)  # feed the last sampled token, then sample
    blocks_to_swap_out: list[BlockCopy] = field(default_factory=list)  # (gpu_block, cpu_block): do first
    blocks_to_swap_in: list[BlockCopy] = field(default_factory=list)  # (cpu_block, gpu_block)
    blocks_to_copy: list[BlockCopy] = field(default_factory=list)  # (src, dst), before the forward pass
    preempted: list[int] = field(default_factory=list)  # request ids preempted while building this plan
    num_draft_tokens: int = 0  # the decodes' draft tokens (speculative decoding), fed besides their last token

    @property
    def num_batched_tokens(self) -> int:
        """Tokens the forward pass processes (a shared prompt counts once; a verify entry 1 + its drafts)."""
        return sum(s.num_new_tokens for s in self.prefills) + len(self.decodes) + self.num_draft_tokens

    @property
    def num_draft_pairs(self) -> int:
        """Query-key pairs of the draft tokens' attention: a verify entry after c cached tokens feeds its last token
        and d drafts, the j-th draft attending to c + 1 + j keys (as a chunk does; sim.cost prices a verify entry as a
        decode plus a d-token chunk)."""
        if not self.num_draft_tokens:
            return 0
        return sum(s.num_draft_tokens * (s.num_computed_tokens + 1) + s.num_draft_tokens * (s.num_draft_tokens + 1) // 2
                   for s in self.decodes)  # fmt: skip

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.prefills)

    @property
    def num_decode_seqs(self) -> int:
        """Sequences that decode in the step (the cost model's decode term)."""
        return len(self.decodes)

    @property
    def num_seqs(self) -> int:
        """Sequences in the step (sample-only siblings included)."""
        return len(self.prefills) + len(self.decodes)

    @property
    def entries(self) -> list[ScheduledSeq]:
        """Every entry: prefills, then decodes."""
        return self.prefills + self.decodes

    @property
    def num_context_tokens(self) -> int:
        """Sum over fed entries of num_computed + num_new: the K/V the attention reads. Sample-only entries
        read nothing of their own (their group's fed entry already did)."""
        return sum(s.num_computed_tokens + s.num_new_tokens for s in self.entries if s.num_new_tokens)

    @property
    def num_prefill_pairs(self) -> int:
        """Query-key pairs of the prompt chunks' attention: a chunk of k tokens after c cached ones has its j-th token
        (j = 1..k) attend to c + j keys, k * c + k * (k + 1) / 2 pairs in all. Decodes count none (their attention
        is num_context_tokens, one query each). What makes a long prompt cost more than its tokens (sim.cost)."""
        return sum(s.num_new_tokens * s.num_computed_tokens + s.num_new_tokens * (s.num_new_tokens + 1) // 2
                   for s in self.prefills)

    def shape(self, num_shared_context_tokens: int = 0) -> StepShape:
        """The step as a cost model prices it (`num_shared_context_tokens`: when the model reads them, else 0). A verify
        entry's drafts are priced as a chunk after its decode."""
        prefill, pairs = self.num_prefill_tokens, self.num_prefill_pairs
        if self.num_draft_tokens:
            prefill, pairs = prefill + self.num_draft_tokens, pairs + self.num_draft_pairs
        return StepShape(prefill, self.num_decode_seqs, self.num_context_tokens, pairs, num_shared_context_tokens)

    def num_shared_context_tokens(self, block_size: int) -> int:
        """Of num_context_tokens, those read from a block that an earlier fed entry of this step also reads: a prompt
        shared by n samples or k beams, a cached system prompt. On a CPU a block read twice in one pass is read the
        second time from cache, at about half the cost (sim.cost.PiecewiseCostModel.d_shared). O(blocks read)."""
        return shared_context_tokens(((s.block_table, s.num_computed_tokens + s.num_new_tokens)
                                      for s in self.entries if s.num_new_tokens), block_size)

    @property
    def is_empty(self) -> bool:
        """Nothing to run and nothing to copy: an executor may skip the step."""
        work = (self.prefills, self.decodes, self.blocks_to_swap_out, self.blocks_to_swap_in, self.blocks_to_copy)
        return not any(work)

    def request_ids(self) -> list[int]:
        """The requests with a sequence in this step, in plan order, each once."""
        return list(dict.fromkeys(s.request_id for s in self.entries))


def shared_context_tokens(reads, block_size: int) -> int:
    """For (block_table, tokens read) per sequence, in order: the tokens read from a block an earlier sequence read
    (StepPlan.num_shared_context_tokens; the fast-forward counts a run's the same way)."""
    seen: set[int] = set()
    shared = 0
    for table, read in reads:
        for j, block in enumerate(table[:-(-read // block_size)]):
            if block in seen:
                shared += min(block_size, read - j * block_size)
            else:
                seen.add(block)
    return shared


@dataclass(slots=True)
class StepOutcome:
    """What the executor reports after running a plan (the simulator from true lengths, the engine from tokens)."""

    finished_seq_ids: set[int] = field(default_factory=set)  # produced their last token (EOS / max tokens / length)
    # beam-search request_id -> parent seq id of each of the k surviving beams; a parent listed m times is
    # forked m - 1 times, an unlisted beam is freed.
    beam_parents: dict[int, list[int]] = field(default_factory=dict)
    # speculative decoding: seq id -> how many of its entry's draft tokens were accepted (0 .. num_draft_tokens), for
    # every entry with drafts; it sampled 1 + that many tokens (the accepted drafts and the target's next token)
    num_accepted: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class StepResult:
    finished_request_ids: list[int]  # requests whose every sequence has now finished
    # request_id -> seq ids of the k surviving beams, in the order of outcome.beam_parents[request_id]:
    # the first occurrence of a parent keeps its id, later ones are new (forked) ids
    new_beam_seq_ids: dict[int, list[int]]
