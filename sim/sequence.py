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
appends take, how long a run of plain decodes memory allows).
"""
from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from .kv.base import KVManager
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
    seqs: list[Sequence]  # the current sequences (live and finished; dropped beams are removed), in beam order
    arrival_order: int  # position in add_request order: the FCFS key
    status: SequenceStatus = SequenceStatus.WAITING
    # Admitted once with a shared prompt (True until the first preemption by recompute); afterwards every live
    # sequence is re-admitted alone. NOTE: that loses prompt sharing, an approximation (vLLM v0 forbade
    # recompute for multi-sequence groups and swapped them instead).
    shares_prompt: bool = True
    pending_copies: list[tuple[int, int]] = field(default_factory=list)  # beam-fork copies for the next plan

    @property
    def request_id(self) -> int:
        return self.request.request_id

    @property
    def is_beam_search(self) -> bool:
        return self.request.beam_width > 1

    def live_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs if s.is_live]

    def live_ids(self) -> list[int]:
        return [s.seq_id for s in self.seqs if s.is_live]

    def prefill_lens(self) -> list[int]:
        """Tokens each admission's prefill feeds: the shared prompt once, or (after recompute) each live sequence's."""
        return [self.request.prompt_len] if self.shares_prompt else [s.prefill_len for s in self.live_seqs()]

    @property
    def is_finished(self) -> bool:
        return not any(s.is_live for s in self.seqs)

    def set_status(self, status: SequenceStatus) -> None:
        """Move the group and all its live sequences to `status`."""
        self.status = status
        for seq in self.seqs:
            if seq.is_live:
                seq.status = status


def reselect_beams(
    kv: KVManager, group: SequenceGroup, parents: list[int], new_seq: Callable[[int], Sequence]
) -> list[Sequence]:
    """One beam-search step's bookkeeping (paper 4.4): keep the k beams `parents` names. Unlisted beams are
    freed FIRST (their memory makes room), then each repeated parent is forked: its first occurrence keeps the
    parent's id, later ones get a new sequence from `new_seq(num_generated)`. The fork's copies (contiguous
    policies copy; paged ones share) wait in group.pending_copies for the next plan. Returns the dropped beams.
    """
    live = {s.seq_id: s for s in group.live_seqs()}
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
    group.seqs = beams
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
    bs, need, owners = kv.block_size, 0, Counter()
    for seq_id in seq_ids:
        n = kv.num_tokens(seq_id)
        need += _cdiv(n + num_tokens, bs) - _cdiv(n, bs)
        if n % bs and len(seq_ids) > 1:
            owners[kv.block_table(seq_id)[-1]] += 1
    return need + sum(m - 1 for m in owners.values())


def shares_partial_last_block(kv: KVManager, seq_ids: list[int]) -> bool:
    """Paged: does any of these sibling sequences end in a partly filled block it shares (the next write copies)?"""
    if len(seq_ids) < 2 or kv.policy != "paged":
        return False
    last = [kv.block_table(i)[-1] for i in seq_ids if kv.num_tokens(i) % kv.block_size]
    return len(set(last)) < len(last)


def append_in_step_order(kv: KVManager, seq_ids: list[int], num_steps: int) -> None:
    """Append `num_steps` tokens to each sequence, allocating in the order `num_steps` single steps would
    (step by step, sequences in the given order), so the block ids handed out are the same. Only a token that
    opens a block allocates, so this jumps from one block-opening token to the next. Expects no copy-on-write.

        block_size 4, seq a at 3 tokens, seq b at 1, 6 steps:  a opens blocks at steps 2 and 6, b at step 4
        -> a +2 (new block), b +4 (new block), a +4 (new block), then top both up to +6
    """
    if kv.policy != "paged":  # contiguous: every token lands inside the sequence's reservation; nothing allocates
        for seq_id in seq_ids:
            kv.append_slots(seq_id, num_steps)
        return
    bs = kv.block_size
    start = [kv.num_tokens(i) for i in seq_ids]
    # step s (1-based) writes token position start + s - 1; it opens a block when that position % bs == 0
    events = sorted((s, j) for j, n in enumerate(start) for s in range((-n) % bs + 1, num_steps + 1, bs))
    done = list(start)
    for step, j in events + [(num_steps, j) for j in range(len(seq_ids))]:
        if start[j] + step > done[j]:
            if kv.append_slots(seq_ids[j], start[j] + step - done[j]) != []:
                raise RuntimeError(f"seq {seq_ids[j]}: expected a plain append (room checked, no copy), found otherwise")
            done[j] = start[j] + step


def fits_swap_in(kv: KVManager, seq_ids: list[int], watermark_blocks: int = 0) -> bool:
    """Room for a swapped group's blocks AND this step's appends, leaving `watermark_blocks` free (vLLM's
    can_swap_in reserves one block per sequence; here the need is exact). Sharing inside the group survives a
    swap, so its CPU tables tell the need."""
    need = len({b for i in seq_ids for b in kv.block_table(i)}) + blocks_to_grow(kv, seq_ids, 1)
    return kv.can_swap_in(seq_ids) and need + watermark_blocks <= kv.num_free_blocks


def max_plain_run(kv: KVManager, groups: list[SequenceGroup], max_steps: int) -> int:
    """The largest k <= max_steps such that k decode steps of these running groups copy nothing (no beam
    search, no pending fork copy, no shared partly filled last block), finish nothing (each sequence stops
    one step short of output_len) and find memory for every append (free memory only shrinks meanwhile)."""
    if any(g.is_beam_search or g.pending_copies or shares_partial_last_block(kv, g.live_ids()) for g in groups):
        return 0
    live = [s for g in groups for s in g.live_seqs()]
    ids, tokens, bs = [s.seq_id for s in live], [kv.num_tokens(s.seq_id) for s in live], kv.block_size
    limit = min([max_steps] + [s.output_len - s.num_generated - 1 for s in live])
    if kv.policy == "paged":  # no shared partly filled block (checked above): only the blocks tokens open count
        fits = lambda k: sum(_cdiv(n + k, bs) - _cdiv(n, bs) for n in tokens) <= kv.num_free_blocks  # noqa: E731
    else:  # contiguous: each sequence grows inside its own reservation
        fits = lambda k: all(kv.can_append(i, k) for i in ids)  # noqa: E731
    lo, hi = 0, max(limit, 0)  # binary search: fits is monotone in k and fits(0) holds
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo
