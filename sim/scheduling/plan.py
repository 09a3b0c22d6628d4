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

from ..kv.base import BlockCopy


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
    def is_empty(self) -> bool:
        """Nothing to run and nothing to copy: an executor may skip the step."""
        work = (self.prefills, self.decodes, self.blocks_to_swap_out, self.blocks_to_swap_in, self.blocks_to_copy)
        return not any(work)

    def request_ids(self) -> list[int]:
        """The requests with a sequence in this step, in plan order, each once."""
        return list(dict.fromkeys(s.request_id for s in self.entries))


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
