"""Runs of plain decode steps in a paged pool, in closed form: how long one can last, and what it does to memory.

The simulator's fast-forward (sim/fastforward.py) jumps over runs of identical decode steps: every running
sequence appends one token per step, nothing is admitted, copied or finished. It asks the KV manager two
questions through the KV contract (`max_decode_steps`, `advance_decodes`); for the paged manager this module
answers them without stepping, and `tests/sim/test_fastforward.py` checks every answer against stepping.

How long. Free memory only shrinks during such a run, so a run is cut where the appends would need more blocks
than are free. Only tokens that open a block take one; a sequence whose last block has r empty slots opens
blocks at steps r + 1, r + 1 + B, r + 1 + 2B, ... (B = block_size). Over k = q*B + m steps, S sequences
therefore open q*S blocks plus one for each sequence with r < m:

    B = 4, empty slots r = 3, 0, 1    step  1 2 3 4 5 6 7 8
                                      r=0   o       o          o = this step opens a block
                                      r=1     o       o
                                      r=3         o       o

With F free blocks the longest run is the largest k whose count fits: q = F // S whole rounds of B steps, and
then as many steps m as the L = F - q*S blocks left allow, m = (the (L+1)-th smallest r), the step just before
the sequence that would need block L + 1 opens it.

What memory moves. Every step writes one token per sequence into a slot set aside for it: token_states += S,
reservation -= S. When a sequence's token opens a block, B slots leave `free`: the token takes one and the
other B - 1 are `reservation`, except in the sequence's final block, where the slots up to its final length
are reservation and the rest internal fragmentation:

    positions   ... | p  p+1 ... final-1 | final ... p+B-1 |     p = the final block's first position
                      token  reservation    internal frag.
"""
from __future__ import annotations

from typing import Sequence

from ..blocks import BlockAllocator
from .base import cdiv


def run_capacity(tokens: Sequence[int], block_size: int, num_free_blocks: int) -> int:
    """The most decode steps sequences holding `tokens` tokens can take, one token each per step, before their
    appends need more than `num_free_blocks` new blocks (no copy-on-write; see the module docstring)."""
    if not tokens:
        raise ValueError("tokens must name at least one sequence (with none, any run fits)")
    rounds, left = divmod(num_free_blocks, len(tokens))
    empty = sorted(-n % block_size for n in tokens)  # r: empty slots in each sequence's last block
    return rounds * block_size + empty[left]


def max_decode_steps(allocator: BlockAllocator, block_size: int, seqs: Sequence, limit: int) -> int:
    """At most `limit` steps; 0 if a sequence's partly filled last block is shared (its next write copies).
    `seqs`: objects with `.num_tokens` and `.block_table`."""
    if limit < 1:
        return 0
    if not seqs:
        return limit
    for seq in seqs:
        if seq.num_tokens % block_size and allocator.ref_count(seq.block_table[-1]) > 1:
            return 0
    return min(limit, run_capacity([s.num_tokens for s in seqs], block_size, allocator.num_free_blocks))


def append_decode_steps(allocator: BlockAllocator, block_size: int, seqs: Sequence, num_steps: int) -> None:
    """`num_steps` decode steps at once, each appending one token to every sequence in order: the same end state
    and block ids as that many rounds of one-token appends. Room is checked by the caller.

    A sequence whose last block has r empty slots opens blocks at steps r + 1, r + 1 + B, ... Ordered by
    (step, position), the openings go round after round through the sequences sorted by (r, position), so
    with the fresh blocks taken from the free queue at once, the p-th of that order gets blocks p, p + S, ...

        B = 4, 6 steps, a (r = 2) then b (r = 0):  order b, a;  fresh [5, 9, 2]
        b opens at steps 1 and 5 -> +[5, 2];  a at step 3 -> +[9]
    """
    bs = block_size
    new = [cdiv(s.num_tokens + num_steps, bs) - len(s.block_table) for s in seqs]
    fresh = allocator.allocate(sum(new))
    if fresh is None:
        raise RuntimeError(f"expected {sum(new)} free blocks for {num_steps} decode steps, found fewer")
    order = sorted(range(len(seqs)), key=lambda j: -seqs[j].num_tokens % bs)  # stable: ties keep position
    for p, j in enumerate(order):
        seqs[j].block_table += fresh[p :: len(seqs)]
        seqs[j].num_tokens += num_steps


def decode_run_counts(start: tuple[int, ...], block_size: int, seqs: Sequence[tuple[int, int]],
                      num_steps: int) -> list[tuple[int, ...]]:  # fmt: skip
    """The pool's five raw slot counts during each step of a run, from the counts `start` before it.
    `seqs`: (num_tokens, final_len) per sequence. O(seqs + num_steps)."""
    tokens, reservation, internal, external, free = start
    num_seqs, bs = len(seqs), block_size
    opening = [0] * bs  # opening[m]: sequences that open a block at every step j with j % B == m
    to_internal: dict[int, int] = {}  # step -> slots of newly opened final blocks that are internal frag.
    for n, final in seqs:
        opening[(-n) % bs] += 1
        last_open = (final - 1) // bs * bs  # first position of the final block
        if 0 <= last_open - n < num_steps:
            to_internal[last_open - n] = to_internal.get(last_open - n, 0) + bs - (final - last_open)
    counts = []
    for j in range(num_steps):
        opened = opening[j % bs] * bs
        moved = to_internal.get(j, 0)
        tokens += num_seqs
        reservation += opened - num_seqs - moved
        internal += moved
        free -= opened
        counts.append((tokens, reservation, internal, external, free))
    return counts
