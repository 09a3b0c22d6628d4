"""Per-sequence and per-request state as the scheduler tracks it (vLLM v0's `Sequence` / `SequenceGroup`).

Kwon et al., SOSP 2023, section 4.4-4.5: a request is a *sequence group*; parallel sampling (n) and
beam search (k) run several sequences that share the prompt, and the group is the unit of scheduling:
it is admitted, preempted, swapped and resumed all-or-nothing.

A sequence's life (the group moves all its live sequences together):

    WAITING --admit--> RUNNING --finish--> FINISHED
       ^                 |   ^
       +--- recompute ---+   |
                swap out |   | swap in
                         v   |
                        SWAPPED

KV lengths (the scheduler/executor contract): a sequence that has sampled g output tokens holds prompt_len + g - 1
K/V entries after its step (the last sampled token is fed by the next decode); it ends holding
final_len = prompt_len + output_len - 1.

The functions at the end do what a group needs from the KV manager, in terms of its protocol: re-choose beams
(free, then fork), and answer the scheduler's memory questions (will it ever fit, how many blocks its next
appends take). How long a run of plain decodes memory allows is sim/decode_run.py's question.
"""
from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .kv.base import KVManager
from .plan import ScheduledSeq
from .request import Request


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
    status: SequenceStatus = SequenceStatus.WAITING

    @property
    def final_len(self) -> int:
        """K/V entries it holds when it finishes (the last sampled token is never fed back)."""
        return self.prompt_len + self.output_len - 1

    @property
    def prefill_len(self) -> int:
        """Tokens a prefill must feed: the prompt, plus (after preemption by recompute) every token generated so far."""
        return self.prompt_len + self.num_generated

    @property
    def is_live(self) -> bool:
        return self.status is not SequenceStatus.FINISHED


@dataclass(slots=True)
class SequenceGroup:
    request: Request
    # The current sequences (live and finished; dropped beams are removed), in beam order. NOTE: replace it
    # with set_seqs() and finish sequences with finish(), which keep the cached live tuple in step.
    seqs: list[Sequence]
    arrival_order: int  # position in add_request order: the FCFS key
    status: SequenceStatus = SequenceStatus.WAITING
    # Admitted once with a shared prompt (True until the first preemption by recompute); afterwards every live
    # sequence is re-admitted alone. NOTE: that loses prompt sharing, an approximation (vLLM v0 forbade
    # recompute for multi-sequence groups and swapped them instead).
    shares_prompt: bool = True
    pending_copies: list[tuple[int, int]] = field(default_factory=list)  # beam-fork copies for the next plan
    # NOTE: the live sequences and their ids, cached: the scheduler asks for them several times per sequence
    # and step, and they change only when a sequence finishes or beams are re-chosen (finish, set_seqs).
    live: tuple[Sequence, ...] = field(init=False, repr=False, compare=False)
    live_seq_ids: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._refresh_live()

    def _refresh_live(self) -> None:
        self.live = tuple(s for s in self.seqs if s.is_live)
        self.live_seq_ids = tuple(s.seq_id for s in self.live)

    @property
    def request_id(self) -> int:
        return self.request.request_id

    @property
    def is_beam_search(self) -> bool:
        return self.request.beam_width > 1

    def live_seqs(self) -> list[Sequence]:
        return list(self.live)

    def live_ids(self) -> list[int]:
        return list(self.live_seq_ids)

    def prefill_lens(self) -> list[int]:
        """Tokens each admission's prefill feeds: the shared prompt once, or (after recompute) each live sequence's."""
        return [self.request.prompt_len] if self.shares_prompt else [s.prefill_len for s in self.live]

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

    def finish(self, seqs: Iterable[Sequence]) -> None:
        """Mark these sequences of the group FINISHED (the group's own status is the caller's)."""
        for seq in seqs:
            seq.status = SequenceStatus.FINISHED
        self._refresh_live()

    def set_seqs(self, seqs: list[Sequence]) -> None:
        """Replace the group's sequences (beam re-selection)."""
        self.seqs = seqs
        self._refresh_live()


def reselect_beams(
    kv: KVManager, group: SequenceGroup, parents: list[int], new_seq: Callable[[int], Sequence]
) -> list[Sequence]:
    """One beam-search step's bookkeeping (paper 4.4): keep the k beams `parents` names. Unlisted beams are
    freed FIRST (their memory makes room), then each repeated parent is forked: its first occurrence keeps the
    parent's id, later ones get a new sequence from `new_seq(num_generated)`. The fork's copies (contiguous
    policies copy; paged ones share) wait in group.pending_copies for the next plan. Returns the dropped beams.
    """
    live = {s.seq_id: s for s in group.live}
    width = group.request.beam_width
    valid = group.is_beam_search and group.status is SequenceStatus.RUNNING and len(parents) == width
    if not valid or not set(parents) <= live.keys():
        raise ValueError(
            f"beam_parents[{group.request_id}]: expected {width} of the running beams {sorted(live)}, got {parents}"
        )
    dropped = [seq for seq_id, seq in live.items() if seq_id not in parents]
    for seq in dropped:
        kv.free(seq.seq_id)
        seq.status = SequenceStatus.FINISHED
    beams: list[Sequence] = []
    for i, parent_id in enumerate(parents):
        beam = live[parent_id]
        if parent_id in parents[:i]:  # a repeated parent: fork a new beam from it
            beam = new_seq(beam.num_generated)
            beam.status = SequenceStatus.RUNNING
            copies = kv.fork(parent_id, beam.seq_id, beam.final_len)
            if copies is None:
                raise RuntimeError(f"fork of seq {parent_id}: expected room once dropped beams are freed, found none")
            group.pending_copies += copies
        beams.append(beam)
    group.set_seqs(beams)  # refreshes the cached live tuple: dropped beams are gone, forks are in
    return dropped


# --- what a group's memory needs, asked in KV-protocol terms (the scheduler's arithmetic) ------------------
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def never_fits(kv: KVManager, request: Request, watermark_blocks: int = 0) -> str | None:
    """Why the request's group could not run even alone in an empty pool (paged: keeping `watermark_blocks`
    free at admission), or None if it could.

    NOTE: a group of several sequences is checked WITHOUT prompt sharing, because after a preemption by
    recompute each sequence is re-admitted alone; this over-rejects only groups within a factor n of the pool.
    """
    final, n = request.total_len - 1, request.num_seqs
    if kv.policy == "paged":
        need, usable = n * _cdiv(final, kv.block_size), kv.num_blocks - watermark_blocks
        if need > usable:
            return f"{n} sequence(s) of final length {final} need {need} blocks (allowed: <= {usable} of {kv.num_blocks})"
        return None
    # Contiguous: each sequence reserves its own run by the policy's rule; try the runs on an empty allocator.
    try:
        reserved = kv.reserved_tokens(request.prompt_len, final)
    except ValueError as err:
        return str(err)
    trial = type(kv.allocator)(kv.num_blocks)
    if any(trial.allocate(_cdiv(reserved, kv.block_size)) is None for _ in range(n)):
        return f"{n} reservation(s) of {reserved} tokens do not fit the pool of {kv.num_slots} slots even when empty"
    return None


def blocks_to_grow(kv: KVManager, seq_ids: list[int], num_tokens: int) -> int:
    """Paged: free blocks that appending `num_tokens` to each sequence (in turn) takes.

    A sequence needs the new blocks its tokens open, plus a copy of its partly filled last block if that
    block is shared. Owners of a shared block copy in turn and the last one writes in place, so m owners
    take m - 1 copies. NOTE: only siblings share a partly filled block (a prefix cache shares full blocks
    only), so the tables of the group's own sequences tell which last blocks are shared.
    """
    bs = kv.block_size
    if len(seq_ids) == 1:  # the common case, made cheap: a lone sequence shares no partly filled block
        n = kv.num_tokens(seq_ids[0])
        return _cdiv(n + num_tokens, bs) - _cdiv(n, bs)
    need, owners = 0, Counter()
    for seq_id in seq_ids:
        n = kv.num_tokens(seq_id)
        need += _cdiv(n + num_tokens, bs) - _cdiv(n, bs)
        if n % bs:
            owners[kv.block_table(seq_id)[-1]] += 1
    return need + sum(m - 1 for m in owners.values())


def fits_swap_in(kv: KVManager, seq_ids: list[int], watermark_blocks: int = 0) -> bool:
    """Room for a swapped group's blocks AND this step's appends, leaving `watermark_blocks` free (vLLM's
    can_swap_in reserves one block per sequence; here the need is exact). Sharing inside the group survives a
    swap, so its CPU tables tell the need."""
    need = len({b for i in seq_ids for b in kv.block_table(i)}) + blocks_to_grow(kv, seq_ids, 1)
    return kv.can_swap_in(seq_ids) and need + watermark_blocks <= kv.num_free_blocks


def sibling_entry(kv: KVManager, first: ScheduledSeq, seq_id: int) -> ScheduledSeq:
    """The prefill entry of a sibling admitted with `first` (n samples or k beams of one prompt).

    Sharing the first sequence's prompt blocks (paged), it only samples from the same logits: vLLM v0 computes
    a shared prompt once. With blocks of its own (a contiguous reservation: Orca shares nothing), it is fed
    the whole prompt, or its K/V would never be written.
    """
    table, prompt_len = kv.block_table(seq_id), first.num_computed_tokens + first.num_new_tokens
    if table == first.block_table:
        return ScheduledSeq(seq_id, first.request_id, prompt_len, 0, table)
    return ScheduledSeq(seq_id, first.request_id, 0, prompt_len, table)
