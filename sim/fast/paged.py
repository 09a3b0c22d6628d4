"""The fast plane's paged pool: runs of plain decode steps in closed form, and their lazy form (`DecodeEpoch`).

The fast plane (sim/fast/) jumps over runs of identical decode steps: every running sequence appends one token per
step, nothing is admitted, copied or finished. For a paged pool (sim/kv/paged.py, and the radix pool built on it)
this module says how long such a run can last and applies it without stepping (`PagedRuns`), through the manager's
own records (`PagedKVManager.seq_state`: block_table, num_tokens, final_len, token_ids) and its `allocator`, growing
each record exactly as allocate_slots(ids, [1, ...]) would step by step: the same block ids, in the same order
(docs/ARCHITECTURE.md, "The fast plane"). `tests/sim/test_fastforward.py` and the KV state machine
(sim/testing/kv.py) check every answer against stepping.

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

import bisect
from typing import Any, Sequence

from ..kv.blocks import BlockAllocator
from ..kv.paged import PagedKVManager


def run_capacity(tokens: Sequence[int], block_size: int, num_free_blocks: int) -> int:
    """The most decode steps sequences holding `tokens` tokens can take, one token each per step, before their
    appends need more than `num_free_blocks` new blocks (no copy-on-write; see the module docstring)."""
    if not tokens:
        raise ValueError("tokens must name at least one sequence (with none, any run fits)")
    rounds, left = divmod(num_free_blocks, len(tokens))
    empty = sorted(-n % block_size for n in tokens)  # r: empty slots in each sequence's last block
    return rounds * block_size + empty[left]


def max_decode_steps(allocator: Any, block_size: int, seqs: Sequence, limit: int) -> int:
    """At most `limit` steps; 0 if a sequence's partly filled last block is shared (its next write copies).
    `seqs`: objects with `.num_tokens` and `.block_table`; `allocator`: a BlockAllocator or any with its methods (radix's
    page pool, a plugged one)."""
    if limit < 1:
        return 0
    if not seqs:
        return limit
    for seq in seqs:
        if seq.num_tokens % block_size and allocator.ref_count(seq.block_table[-1]) > 1:
            return 0
    return min(limit, run_capacity([s.num_tokens for s in seqs], block_size, allocator.num_free_blocks))


def advance(allocator: Any, block_size: int, seqs: Sequence, num_steps: int,
            start: tuple[int, ...]) -> list[tuple[int, ...]]:
    """`num_steps` decode steps at once, each appending one token to every sequence in order: the same end state and
    block ids as that many rounds of one-token appends (room checked by the caller). Returns the pool's five raw slot
    counts during each step, from the counts `start` before the run. `seqs`: objects with `.num_tokens`,
    `.final_len` and `.block_table`, none of whose partly filled last block is shared. One run of a DecodeEpoch
    (below) over them.

    Block ids. A sequence whose last block has r empty slots opens blocks at steps r + 1, r + 1 + B, ... Ordered
    by (step, position), the openings go round after round through the sequences sorted by (r, position):

        B = 4, 6 steps, a (r = 2) then b (r = 0):  order b, a;  fresh [5, 9, 2]
        b opens at steps 1 and 5 -> +[5, 2];  a at step 3 -> +[9]
    """
    epoch = DecodeEpoch(allocator, block_size, start)
    for i, seq in enumerate(seqs):
        if not epoch.join(i, seq, num_steps - 1, i):
            raise RuntimeError(f"advance: sequence {i}'s partly filled last block is shared (its next write copies)")
    counts = epoch.advance(num_steps)
    epoch.close()
    return counts


class PagedRuns:
    """Runs of plain decode steps over a paged manager's sequences (the fast plane's run-by-run path): how many memory
    allows (`max_decode_steps`) and all of them at once (`advance_decodes`), each step as one
    allocate_slots(group, [1, ...]) per group of `seq_groups`, in order (the groups only order the sequences here)."""

    def __init__(self, kv: PagedKVManager) -> None:
        self.kv = kv

    def _states(self, seq_groups: Sequence[Sequence[int]]) -> list:
        """The records of these live, on-GPU sequences, the groups concatenated."""
        state = self.kv.seq_state
        seqs = []
        for ids in seq_groups:
            for seq_id in ids:
                seq = state(seq_id)
                if seq is None:
                    raise KeyError(f"sequence {seq_id} is not live")
                seqs.append(seq)
        if any(s.swapped for s in seqs):
            raise RuntimeError(f"sequences {[i for ids in seq_groups for i in ids if state(i).swapped]} are swapped out")
        return seqs

    def max_decode_steps(self, seq_groups: Sequence[Sequence[int]], limit: int, waiting: bool = False) -> int:
        """Free blocks only shrink during a run (nothing is freed), so `waiting` holds by construction, and the groups
        allocate the same blocks as one call with all of them: they are just concatenated."""
        return max_decode_steps(self.kv.allocator, self.kv.block_size, self._states(seq_groups), limit)

    def advance_decodes(self, seq_groups: Sequence[Sequence[int]], num_steps: int,
                        checked: bool = False) -> list[tuple[int, ...]]:
        """Apply `num_steps` steps; the pool's five raw counts during each. `checked`: the caller has just asked
        max_decode_steps for these ids (skips asking again)."""
        seqs = self._states(seq_groups)
        if len(set(map(id, seqs))) != len(seqs):
            raise ValueError(f"duplicate sequence ids {[i for ids in seq_groups for i in ids]}")
        if not checked and self.max_decode_steps(seq_groups, num_steps) < num_steps:
            raise RuntimeError(f"advance_decodes: expected room for {num_steps} plain decode steps, found less")
        kv = self.kv
        counts = advance(kv.allocator, kv.block_size, seqs, num_steps, kv.breakdown().counts())
        for seq_id, seq in zip((i for ids in seq_groups for i in ids), seqs):
            if seq.token_ids is not None:
                kv.register_blocks(seq_id)
        return counts


def opens_epochs(kv) -> bool:
    """Can a decode epoch run over this manager? A paged pool of its own BlockAllocator without prefix caching (every
    full block would be registered; a student's allocator offers no more than lab 03's methods)."""
    return (isinstance(kv, PagedKVManager) and not kv.enable_prefix_caching
            and type(kv.allocator) is BlockAllocator)


def partly_filled_and_shared(kv: PagedKVManager, seqs) -> bool:
    """Is some sequence's partly filled last block shared (its next write copies: no run, no epoch for it)?"""
    bs, ref_count = kv.block_size, kv.allocator.ref_count
    return any(s.num_tokens % bs and ref_count(s.block_table[-1]) > 1 for s in seqs)


class DecodeEpoch:
    """Runs of plain decode steps of the same sequences, one run after another, in O(steps + blocks opened) a run
    instead of O(sequences): the KV side of the fast plane's decode epochs (sim/fast/epoch.py opens one). The same
    block ids, end state and counts as `advance` run after run (tests/sim/test_fastforward.py compares every number
    with stepping).

    While it is open, a member's `num_tokens` is stale (its tokens at the epoch's start, or at its joining, minus the
    epoch's steps then: the true count adds the epoch's steps now): only the block tables are kept current, one
    block per opening, so that a sequence that ends is freed with exactly its blocks. A member opens blocks at the
    epoch's steps j with j % B == c (its class: c = the epoch's step plus the empty slots of its last block when it
    joined); each step, one class opens, in plan order (members keyed by the scheduler's order). The pool's counts
    are carried from run to run, and corrected when memory changes otherwise: a member leaving (its partly filled
    last block's empty slots leave the breakdown; its blocks go back to the pool), new sequences allocated (an
    admission: their partly filled last blocks join it): the fast plane reports each such change (`changed`), since
    the manager itself knows nothing of the epoch. Members join between runs (`join`).
    """

    def __init__(self, allocator: Any, block_size: int, start: tuple[int, ...]) -> None:
        """`start`: the pool's raw counts (SHARE_NAMES order)."""
        self.allocator, self.block_size, self.steps = allocator, block_size, 0
        self.by_class: list[list] = [[] for _ in range(block_size)]  # each class's members, in plan order
        self.keys: list[list] = [[] for _ in range(block_size)]  # their plan-order keys
        self.ids: list[list[int]] = [[] for _ in range(block_size)]  # their sequence ids
        # seq id -> (state, its tokens minus the steps when it joined, class, the step its final block opens or None)
        self.members: dict[int, tuple] = {}
        self.to_internal: dict[int, int] = {}  # epoch step -> slots of final blocks opened then that stay unused
        self.ahead = 0  # members of the next step's class whose blocks open_ahead already opened (plan order)
        self.counts = start

    @property
    def num_seqs(self) -> int:
        return len(self.members)

    def join(self, seq_id: int, seq, last: int, key) -> bool:
        """Make `seq` (current, on the GPU, its partly filled last block its own) a member, leaving after epoch step
        `last` (>= the steps applied); `key` orders it among the members as the scheduler's plan does. False (and
        nothing changed) if its partly filled last block is shared: its next write would copy."""
        bs, n, steps = self.block_size, seq.num_tokens, self.steps
        if n % bs and self.allocator.ref_count(seq.block_table[-1]) > 1:
            return False
        c = (steps - n) % bs  # it opens a block at the steps j >= steps with j - steps == its empty slots (mod B)
        at = bisect.bisect(self.keys[c], key)
        if c == steps % bs and at < self.ahead:
            raise RuntimeError("join: a member placed before the blocks open_ahead opened for this step")
        self.keys[c].insert(at, key)
        self.by_class[c].insert(at, seq)
        self.ids[c].insert(at, seq_id)
        final = seq.final_len
        last_open = (final - 1) // bs * bs  # first position of the final block: written at epoch step d
        d = steps + last_open - n
        if steps <= d <= last:
            self.to_internal[d] = self.to_internal.get(d, 0) + bs - (final - last_open)
        else:
            d = None
        self.members[seq_id] = (seq, n - steps, c, d)
        return True

    def max_steps(self, limit: int) -> int:
        """run_capacity over the members as they stand now, from the classes' sizes: O(block_size)."""
        num_seqs = len(self.members)
        if limit < 1 or not num_seqs:
            return max(limit, 0)
        rounds, left = divmod(self.allocator.num_free_blocks + self.ahead, num_seqs)  # (ahead: opened, counted)
        bs, by_class, steps = self.block_size, self.by_class, self.steps
        for r in range(bs):  # r: empty slots in a last block now, ascending; the class opening after r steps
            left -= len(by_class[(steps + r) % bs])
            if left < 0:
                return min(limit, rounds * bs + r)
        raise AssertionError("unreachable: left < num_seqs")

    def advance(self, num_steps: int) -> list[tuple[int, ...]]:
        """Apply `num_steps` steps (room checked by max_steps); the pool's raw counts during each."""
        bs, by_class, steps, num_seqs = self.block_size, self.by_class, self.steps, len(self.members)
        ahead, self.ahead = self.ahead, 0
        fresh = self.allocator.allocate(sum(len(by_class[(steps + j) % bs]) for j in range(num_steps)) - ahead)
        if fresh is None:
            raise RuntimeError(f"expected free blocks for {num_steps} decode steps, found fewer")
        tokens, reservation, internal, external, free = self.counts
        to_internal, counts, i = self.to_internal, [], 0
        for j in range(steps, steps + num_steps):
            opening = by_class[j % bs]
            for seq in opening[ahead:] if j == steps else opening:  # stepping's order: step by step, in plan order
                seq.block_table.append(fresh[i])
                i += 1
            opened = len(opening) * bs
            moved = to_internal.get(j, 0)
            tokens += num_seqs
            reservation += opened - num_seqs - moved
            internal += moved
            free -= opened
            counts.append((tokens, reservation, internal, external, free))
        self.counts = counts[-1]
        self.steps = steps + num_steps
        return counts

    def leave(self, seq_id: int):
        """The member's state, made current and out of the epoch (to be freed next); None if it is no member."""
        member = self.members.get(seq_id)
        if member is None:
            return None
        seq, start, c, d = member
        steps = self.steps
        at = self.ids[c].index(seq_id)
        if c == steps % self.block_size and at < self.ahead:
            raise RuntimeError(f"leave({seq_id}): its block for the coming step is open already (open_ahead)")
        del self.members[seq_id], self.by_class[c][at], self.keys[c][at], self.ids[c][at]
        seq.num_tokens = start + steps
        if d is not None and d >= steps:  # preempted before its final block opened: that block's unused slots go
            moved = self.to_internal.get(d, 0) - (self.block_size - (seq.final_len - 1) % self.block_size - 1)
            if moved:
                self.to_internal[d] = moved
            else:
                self.to_internal.pop(d, None)
        return seq

    def opening(self) -> list[int]:
        """The members that open a block in the next step, in plan order (their sequence ids)."""
        return list(self.ids[self.steps % self.block_size])

    def open_ahead(self, count: int) -> bool:
        """Open now, in one allocation, the blocks of the next `count` members of opening() not yet opened: the calls a
        step makes group by group in plan order, when memory runs out in it and groups are preempted between them
        (sim/fast/epoch.py, DecodeEpochs.preempt); the next advance() then takes the step without opening them again.
        False, and nothing changed, if fewer blocks are free. Those members may not leave before that step."""
        opening = self.by_class[self.steps % self.block_size]
        if self.ahead + count > len(opening):
            raise ValueError(f"open_ahead({count}): only {len(opening) - self.ahead} members left to open a block")
        fresh = self.allocator.allocate(count)
        if fresh is None:
            return False
        for seq, block in zip(opening[self.ahead:self.ahead + count], fresh):
            seq.block_table.append(block)
        self.ahead += count
        return True

    def changed(self, seq, sign: int) -> None:
        """Correct the counts after `seq` (current; its partly filled last block its own) was freed (sign -1) or
        allocated (+1): its last block's empty slots leave or join the breakdown; the blocks are the pool's."""
        bs, n = self.block_size, seq.num_tokens
        tokens, reservation, internal, external, free = self.counts
        filled = n % bs
        if filled:
            reach = min(max(seq.final_len - n + filled, filled), bs)  # as breakdown() clamps it
            reservation += sign * (reach - filled)
            internal += sign * (bs - reach)
        ahead = self.ahead  # blocks opened for the coming step: free until it, in the counts
        self.counts = (
            (self.allocator.num_used_blocks - ahead) * bs - reservation - internal, reservation, internal, external,
            (self.allocator.num_free_blocks + ahead) * bs)

    def close(self) -> None:
        """Make every member's num_tokens current."""
        if self.ahead:
            raise RuntimeError("close: blocks opened ahead for a step that never came (open_ahead without advance)")
        for seq, start, _, _ in self.members.values():
            seq.num_tokens = start + self.steps
        self.members.clear()
