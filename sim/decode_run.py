"""Runs of identical decode steps: how long one is guaranteed to last, and applying it in one go.

DESIGN.md, layer 6: between events, decode steps are deterministic, so the simulator may jump over a run of
them, provided the jump leaves exactly the state that stepping token by token would. A step of the run is a
*plain decode*: the same running groups each append one token per live sequence, and nothing is admitted,
swapped, preempted, copied or finished. The scheduler asks this module two questions (how long a run memory
and lengths allow; could the first waiting group be admitted now) and has it apply the run.

Free memory only shrinks during such a run, so a run is cut where the appends would need more blocks than are
free. In a paged pool only tokens that open a block take one; a sequence whose last block has r empty slots
opens blocks at steps r + 1, r + 1 + B, r + 1 + 2B, ... (B = block_size). Over k = q*B + m steps, S sequences
therefore open q*S blocks plus one for each sequence with r < m:

    B = 4, empty slots r = 3, 0, 1    step  1 2 3 4 5 6 7 8
                                      r=0   o       o          o = this step opens a block
                                      r=1     o       o
                                      r=3         o       o

With F free blocks the longest run is the largest k whose count fits: q = F // S whole rounds of B steps, and
then as many steps m as the L = F - q*S blocks left allow, m = (the (L+1)-th smallest r), the step just before
the sequence that would need block L + 1 opens it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from .kv.base import KVManager

if TYPE_CHECKING:  # annotations only: the scheduler's records
    from .sequence import SequenceGroup


@dataclass(frozen=True, slots=True)
class RunMemo:
    """A scheduler's last decode_run_length answer and the state it was for. NOTE: the loop asks for a run and
    then advances by it, and advance_decode_run checks the run again: the memo makes that second ask free."""

    state: tuple[int, int] = (-1, -1)  # (the scheduler's state counter, free blocks)
    asked: int = 0  # max_steps of that question
    answer: int = 0

    def get(self, state: tuple[int, int], max_steps: int) -> int | None:
        """The answer for max_steps in `state` if the memo implies it, else None. A run cut short of what was
        asked is cut there for any max_steps; a run as long as asked answers every shorter question."""
        if state != self.state or (self.answer >= self.asked and max_steps > self.asked):
            return None
        return min(max_steps, self.answer)


def shares_partial_last_block(kv: KVManager, seq_ids: Sequence[int]) -> bool:
    """Paged: does any of these sibling sequences end in a partly filled block it shares (the next write copies)?"""
    if len(seq_ids) < 2 or kv.policy != "paged":
        return False
    last = [kv.block_table(i)[-1] for i in seq_ids if kv.num_tokens(i) % kv.block_size]
    return len(set(last)) < len(last)


def paged_run_capacity(tokens: Sequence[int], block_size: int, num_free_blocks: int) -> int:
    """The most decode steps sequences holding `tokens` tokens can take, one token each per step, before their
    appends need more than `num_free_blocks` new blocks (no copy-on-write; see the module docstring)."""
    if not tokens:
        raise ValueError("tokens must name at least one sequence (with none, any run fits)")
    rounds, left = divmod(num_free_blocks, len(tokens))
    empty = sorted(-n % block_size for n in tokens)  # r: empty slots in each sequence's last block
    return rounds * block_size + empty[left]


def max_plain_run(kv: KVManager, groups: Sequence[SequenceGroup], max_steps: int) -> int:
    """The largest k <= max_steps such that k decode steps of these running groups copy nothing (no beam
    search, no pending fork copy, no shared partly filled last block), finish nothing (each sequence stops
    one step short of output_len) and find memory for every append (free memory only shrinks meanwhile)."""
    for g in groups:
        if g.is_beam_search or g.pending_copies or shares_partial_last_block(kv, g.live_seq_ids):
            return 0
    limit = max_steps
    for g in groups:
        for s in g.live:
            limit = min(limit, s.output_len - s.num_generated - 1)
    if limit <= 0:
        return 0
    ids = [i for g in groups for i in g.live_seq_ids]
    if kv.policy == "paged":  # no shared partly filled block (checked above): only the blocks tokens open count
        tokens = [kv.num_tokens(i) for i in ids]
        return min(limit, paged_run_capacity(tokens, kv.block_size, kv.num_free_blocks)) if ids else limit
    # contiguous: each sequence grows inside its own reservation, which usually holds the whole run
    fits = lambda k: all(kv.can_append(i, k) for i in ids)  # noqa: E731
    if fits(limit):
        return limit
    lo, hi = 0, limit - 1  # binary search: fits is monotone in k, fits(0) holds and fits(limit) does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def group_may_fit(kv: KVManager, group: SequenceGroup) -> bool:
    """Memory only: could `group` (waiting) be admitted now? True when unsure.

    A group preempted by recompute is re-admitted one sequence at a time, each alone and without token ids
    (so without prefix-cache hits). Paged, that takes ceil(prefill_len / block_size) free blocks per
    sequence, an exact count; contiguous, several reservations may or may not fit side by side (unsure).
    """
    live = group.live
    req = group.request
    if group.shares_prompt:
        return kv.can_admit(req.prompt_len, [s.final_len for s in live], req.prompt_token_ids)
    if kv.policy == "paged":
        bs = kv.block_size
        return sum(-(-s.prefill_len // bs) for s in live) <= kv.num_free_blocks
    return len(live) > 1 or kv.can_admit(live[0].prefill_len, [live[0].final_len])


def append_in_step_order(kv: KVManager, seq_ids: Sequence[int], num_steps: int) -> None:
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
    # NOTE: sim's PagedKVManager does this in one call, allocating all the run's blocks at once in step order
    # (append_decode_steps); the loop below does the same with the protocol alone, for any other paged manager.
    bulk = getattr(kv, "append_decode_steps", None)
    if bulk is not None:
        if bulk(seq_ids, num_steps) != []:
            raise RuntimeError(f"seqs {list(seq_ids)}: expected plain appends (room checked, no copy), found otherwise")
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


def advance_groups(kv: KVManager, groups: Sequence[SequenceGroup], num_steps: int) -> None:
    """Apply `num_steps` plain decode steps to these running groups (checked by the caller): every live
    sequence appends num_steps tokens, in step order, and has sampled num_steps more."""
    append_in_step_order(kv, [i for g in groups for i in g.live_seq_ids], num_steps)
    for group in groups:
        for seq in group.live:
            seq.num_generated += num_steps
