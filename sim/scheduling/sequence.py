"""Per-sequence and per-request state as the scheduler tracks it.

A request is a *sequence group* (Kwon et al., SOSP 2023, sections 4.4-4.5): parallel sampling (n) and beam
search (k) run several sequences that share the prompt, and the group is the unit of admission and
preemption. Each sequence follows vLLM v1's accounting (vllm/v1/request.py): its `num_computed_tokens`
catch up with its `num_tokens` (prompt + sampled tokens); a step feeds some of the missing tokens, and a
step that feeds the last of them samples one more token. There is no prefill phase and no decode phase:

    prompt 6, chunks of 4:   step 1 feeds t0..t3 (no sample)   step 2 feeds t4 t5, samples t6
                             step 3 feeds t6, samples t7       ... one token behind while decoding

A group's siblings share the prompt: only the first sequence (the leader) computes it; when its last prompt
token is computed, the siblings sample from the same logits and are forked from the leader (vLLM v0 forked
sequences the same way). Until then `forked` is False and only the leader holds KV memory.

A sequence's life (the group moves all its live sequences together):

    WAITING --admit--> RUNNING --finish--> FINISHED
       ^                 |   ^
       +--- recompute ---+   |                  recompute: its K/V is dropped and num_computed_tokens
                swap out |   | swap in          returns to 0; it is computed again, sampled tokens included
                         v   |
                        SWAPPED

KV lengths: a sequence that has sampled g output tokens holds up to prompt_len + g - 1 K/V entries (the last
sampled token is fed by the next step); it ends holding final_len = prompt_len + output_len - 1.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..base.request import Request


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # holds no GPU memory: never admitted, or preempted by recompute
    RUNNING = "running"  # its K/V is in GPU blocks
    SWAPPED = "swapped"  # its K/V is in CPU blocks (preempted by swap)
    FINISHED = "finished"  # done; its memory is freed


@dataclass(slots=True)
class Sequence:
    seq_id: int  # chosen by the scheduler, unique per scheduler instance
    request_id: int
    prompt_len: int
    output_len: int  # tokens it will generate (true length in the simulator, max_tokens in the engine)
    num_generated: int = 0  # output tokens sampled so far
    num_computed_tokens: int = 0  # leading tokens whose K/V is in the cache (vLLM's num_computed_tokens)
    prefilling: bool = True  # (re)admitted and not sampled since: its work is a prompt (or recompute) chunk
    status: SequenceStatus = SequenceStatus.WAITING

    @property
    def num_tokens(self) -> int:
        """Tokens the sequence consists of: the prompt and every token sampled so far."""
        return self.prompt_len + self.num_generated

    @property
    def final_len(self) -> int:
        """K/V entries it holds when it finishes (the last sampled token is never fed back)."""
        return self.prompt_len + self.output_len - 1

    @property
    def is_live(self) -> bool:
        return self.status is not SequenceStatus.FINISHED


@dataclass(slots=True)
class SequenceGroup:
    request: Request
    # The current sequences (live and finished; dropped beams are removed), in beam order; seqs[0] is the
    # leader. NOTE: replace it with set_seqs() and finish sequences with finish(), which keep `live` in step.
    seqs: list[Sequence]
    arrival_order: int  # position in add_request order: the FCFS key
    status: SequenceStatus = SequenceStatus.WAITING
    forked: bool = False  # the siblings have been forked from the leader (always True for a lone sequence)
    pending_copies: list[tuple[int, int]] = field(default_factory=list)  # fork copies for the next plan
    # Its place in the scheduler's queues (running, swapped, waiting, and who is preempted last): arrival_order under
    # FCFS; (request.priority, arrival_order) under priority scheduling. None: arrival_order.
    queue_key: int | tuple[int, int] | None = None
    live: tuple[Sequence, ...] = field(init=False, repr=False, compare=False)  # cached: asked often

    def __post_init__(self) -> None:
        self.forked = self.forked or len(self.seqs) == 1
        if self.queue_key is None:
            self.queue_key = self.arrival_order
        self._refresh_live()

    def _refresh_live(self) -> None:
        self.live = tuple(s for s in self.seqs if s.is_live)

    @property
    def request_id(self) -> int:
        return self.request.request_id

    @property
    def is_beam_search(self) -> bool:
        return self.request.beam_width > 1

    @property
    def kv_seqs(self) -> tuple[Sequence, ...]:
        """The sequences that hold (or will hold) KV memory of their own: all live ones once forked, else the leader."""
        return self.live if self.forked else self.live[:1]

    @property
    def siblings_to_fork(self) -> tuple[Sequence, ...]:
        return () if self.forked else self.live[1:]

    @property
    def num_seqs(self) -> int:
        """Sequences that run at once (max_num_seqs counts siblings before they are forked)."""
        return len(self.live)

    @property
    def num_computed_tokens(self) -> int:
        return sum(s.num_computed_tokens for s in self.kv_seqs)

    @property
    def is_finished(self) -> bool:
        return not self.live

    def set_status(self, status: SequenceStatus) -> None:
        """Move the group and all its live sequences to `status`."""
        self.status = status
        for seq in self.live:
            seq.status = status
        if status is SequenceStatus.FINISHED:
            self._refresh_live()

    def finish(self, seqs) -> None:
        """Mark these sequences of the group FINISHED (the group's own status is the caller's)."""
        for seq in seqs:
            seq.status = SequenceStatus.FINISHED
        self._refresh_live()

    def set_seqs(self, seqs: list[Sequence]) -> None:
        """Replace the group's sequences (beam re-selection)."""
        self.seqs = seqs
        self._refresh_live()


def split_budget(group: SequenceGroup, needs: list[int], budget: int | None) -> list[int]:
    """Tokens each of the group's sequences computes this step, out of `budget` (None: no limit).

    In order, each takes what it needs while the budget lasts (a chunk of the one where it runs out). NOTE:
    the beams of a beam search must sample in the same step, so when the budget cannot finish them all,
    none is given its last token: they catch up in chunks, then take one step together.
    """
    if budget is None or sum(needs) <= budget:
        return needs
    counts, left = [], budget
    for need in needs:
        counts.append(min(need, left))
        left -= counts[-1]
    if group.is_beam_search:
        counts = [min(c, need - 1) for c, need in zip(counts, needs)]
    return counts


def queue_copies(group: SequenceGroup, copies: list[tuple[int, int]]) -> None:
    """Add fork copies to those the group's next plan applies, as if applied one after another.

    An executor applies a plan's copies at once, every source read before any write (reference/engine/kv_cache.py,
    like vLLM's copy kernel). So a copy whose source is an earlier pending copy's destination (a beam forked
    from a beam whose own fork copy has not landed yet) is routed from that copy's source instead; a copy onto
    a destination already pending replaces it; a copy of a block onto itself is dropped."""
    origin = {dst: src for src, dst in group.pending_copies}  # dst -> the block whose content it will hold
    for src, dst in copies:
        origin.pop(dst, None)
        src = origin.get(src, src)
        if src != dst:
            origin[dst] = src
    group.pending_copies = [(src, dst) for dst, src in origin.items()]
