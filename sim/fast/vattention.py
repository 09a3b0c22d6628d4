"""The fast plane's vAttention pools: runs of plain decode steps in closed form, how long one can last, what it does.

The fast plane asks how many identical decode steps memory allows (`max_decode_steps`) and applies them at once
(`advance_decodes`), through the manager's own records (`VAttentionKVManager.seq_state`: num_tokens, final_len,
pages, siblings) and its page allocator; the answers must equal stepping one token at a time, page ids included
(checked by the KV state machine, sim/testing/kv.py). This is sim/fast/paged.py with
two differences: nothing is shared (no copy-on-write ever stops a run), and a sequence with w - 1 siblings not
forked yet maps w pages whenever it opens one (see sim/kv/vattention.py).

How long. A sequence whose last page has r empty slots opens pages at steps r, r + P, r + 2P, ... (0-based, page P
tokens). Over q whole rounds of P steps every sequence opens q times, W = sum of w pages a round; with F free pages
the run lasts q = F // W rounds, then steps up to (not including) the r of the first sequence, in order of r, whose
pages no longer fit the L = F - q*W pages left.

What memory moves. Each step writes one token per sequence into a slot set aside for it (reservation, or internal
fragmentation once past its final length). A page opened at position p takes P free slots: those below the final
length are reservation, the rest internal fragmentation; a sibling's page at the same positions is split by the
sibling's final length.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..kv.vattention import VAttentionKVManager
from .records import records


def run_capacity(seqs: Sequence[tuple[int, int]], page_tokens: int, num_free_pages: int) -> int:
    """The most decode steps sequences given as (num_tokens, pages per opening w) can take before their openings
    need more than `num_free_pages` pages."""
    if not seqs:
        raise ValueError("seqs must name at least one sequence (with none, any run fits)")
    rounds, left = divmod(num_free_pages, sum(w for _, w in seqs))
    for r, w in sorted((-n % page_tokens, w) for n, w in seqs):
        if w > left:
            return rounds * page_tokens + r
        left -= w
    raise AssertionError("unreachable: fewer pages are left than a round takes")


def _openings(seqs: Sequence, page_tokens: int, num_steps: int) -> list[tuple[int, int]]:
    """(step, position in seqs) of every page opening of the run, in the order stepping maps them."""
    found = []
    for j, seq in enumerate(seqs):
        found += [(t, j) for t in range(-seq.num_tokens % page_tokens, num_steps, page_tokens)]
    return sorted(found)


def map_decode_steps(allocator: Any, page_tokens: int, seqs: Sequence, num_steps: int) -> None:
    """`num_steps` decode steps at once, each appending one token to every sequence in order: the same end state and
    page ids as stepping, which maps, step by step and sequence by sequence, a page and then one per sibling.
    Room is checked by the caller. `seqs`: objects with `.num_tokens`, `.pages` and `.siblings` (with `.pages`);
    `allocator`: what allocates the pages (a BlockAllocator or any with its methods)."""
    openings = _openings(seqs, page_tokens, num_steps)
    fresh = allocator.allocate(sum(1 + len(seqs[j].siblings) for _, j in openings))
    if fresh is None:
        raise RuntimeError(f"expected free pages for {num_steps} decode steps, found fewer")
    taken = iter(fresh)
    for _, j in openings:
        seqs[j].pages.append(next(taken))
        for sibling in seqs[j].siblings:
            sibling.pages.append(next(taken))
    for seq in seqs:
        seq.num_tokens += num_steps


def decode_run_counts(start: tuple[int, ...], page_tokens: int, seqs: Sequence,
                      num_steps: int) -> list[tuple[int, ...]]:
    """The pool's five raw slot counts during each step of a run, from the counts `start` before it. `seqs`: objects
    with `.num_tokens`, `.final_len` and `.siblings` (with `.final_len`). O(seqs + steps + pages opened)."""
    tokens, reservation, internal, external, free = start
    bs = page_tokens
    opened: dict[int, list[int]] = {}  # step -> [reservation, internal] its openings add
    past_final = [0] * (num_steps + 1)  # past_final[t]: sequences whose token of step t is past their final length
    for t, j in _openings(seqs, bs, num_steps):
        seq, add = seqs[j], opened.setdefault(t, [0, 0])
        p = seq.num_tokens + t  # the first position of the page
        for final_len in (seq.final_len, *(s.final_len for s in seq.siblings)):
            below = min(bs, max(0, final_len - p))
            add[0] += below
            add[1] += bs - below
    for seq in seqs:
        past_final[min(num_steps, max(0, seq.final_len - seq.num_tokens))] += 1
    counts, past = [], 0
    for t in range(num_steps):
        past += past_final[t]
        if t in opened:
            add = opened[t]
            reservation += add[0]
            internal += add[1]
            free -= add[0] + add[1]
        tokens += len(seqs)
        reservation -= len(seqs) - past
        internal -= past
        counts.append((tokens, reservation, internal, external, free))
    return counts


class VAttentionRuns:
    """Runs of plain decode steps over a vAttention manager's records."""

    def __init__(self, kv: VAttentionKVManager) -> None:
        self.kv = kv

    def max_decode_steps(self, seq_groups: Sequence[Sequence[int]], limit: int, waiting: bool = False) -> int:
        """Pages are only mapped during a run, never unmapped, so `waiting` holds by construction, and the groups map
        the same pages as one call with all of them: they are just concatenated."""
        kv, seqs = self.kv, records(self.kv, seq_groups)
        room = min((kv.max_seq_len - s.num_tokens for s in seqs), default=limit)  # the end of a virtual range
        capacity = run_capacity([(s.num_tokens, 1 + len(s.siblings)) for s in seqs], kv.block_size,
                                kv.allocator.num_free_blocks) if seqs else limit
        return max(0, min(limit, room, capacity))

    def advance_decodes(self, seq_groups: Sequence[Sequence[int]], num_steps: int,
                        checked: bool = False) -> list[tuple[int, ...]]:
        """`checked`: the caller has just asked max_decode_steps for these ids (skips asking again)."""
        kv, seqs = self.kv, records(self.kv, seq_groups)
        if not checked and self.max_decode_steps(seq_groups, num_steps) < num_steps:
            raise RuntimeError(f"advance_decodes: expected room for {num_steps} plain decode steps, found less")
        counts = decode_run_counts(kv.breakdown().counts(), kv.block_size, seqs, num_steps)
        map_decode_steps(kv.allocator, kv.block_size, seqs, num_steps)
        return counts
