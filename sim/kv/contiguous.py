"""The paper's Orca baselines: every sequence reserves ONE contiguous run of KV memory at admission.

vLLM paper, section 6.1 and Figure 2. Before PagedAttention, serving systems stored a sequence's
KV cache in consecutive memory, so they had to reserve, up front, room for the longest the sequence
might become. How much they reserve is the reservation rule (in tokens, for a sequence with
`prompt_len` prompt tokens and a true final length `final_len`, output = final_len - prompt_len):

    max      the model's maximum sequence length (2048 for OPT)          Orca (Max)
    pow2     prompt_len + (output rounded up to a power of two: 25 -> 32)  Orca (Pow2)
    oracle   exactly final_len (knows the output length in advance)       Orca (Oracle)

The reservation becomes ceil(tokens / block_size) blocks, and the slot allocator may round it up
again (a buddy allocator hands out powers of two). One sequence's run, in blocks:

    start                                                         start + A
    |  tokens (t)  |  reservation  |  internal frag.  |  external frag.  |
                   t               f                  R                  A*block_size   (in tokens)

The run is reserved when slots are first asked for the sequence (its first prompt chunk); later chunks and
decode tokens fill it. A group's siblings (parallel samples, beams) get their runs at the same moment,
waiting for the fork that copies the prompt into them (`NewSequence.fork_final_lens`).

NOTE: a sequence can never grow past its reservation (`allocate_slots` returns None): moving a run
would mean copying it, which these systems did not do. Every rule reserves at least final_len, so a
scheduler that stops each sequence at its final length never hits that wall, and contiguous
sequences are never preempted. The simulator uses block_size=1 (a block is one token slot).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .base import Allocation, BlockCopy, MemoryBreakdown, NewSequence, SlotSegment, as_seen, cdiv
from .checks import check_request_args, check_rollback, no_pending_lookahead, with_lookahead
from .no_sharing import NoPrefixCache, NoSwapSpace
from .slots import ALLOCATORS

RESERVE_RULES = ("max", "pow2", "oracle")


@dataclass(slots=True)
class _Run:
    start: int  # first block of the run (the allocator's offset)
    prompt_len: int
    final_len: int  # true final length, prompt + output - 1
    reserved_tokens: int  # R: what the reservation rule set aside, in tokens
    num_tokens: int = 0  # t: tokens whose K/V the run holds
    forks: list["_Run"] = field(default_factory=list)  # runs reserved for siblings not forked yet (empty)
    num_lookahead: int = 0  # the last of num_tokens that are lookahead slots (drafts), until rollback


def next_power_of_two(n: int) -> int:
    """Smallest power of two >= n, and 0 for 0 (an output of 0 tokens reserves nothing)."""
    return 0 if n == 0 else 1 << (n - 1).bit_length()


class ContiguousKVManager(NoSwapSpace, NoPrefixCache):
    """KV manager for the contiguous policies `max`, `pow2` and `oracle` (see the module docstring)."""

    # NOTE: contiguous policies reserve everything at admission, so a running sequence never needs more memory and
    # is never preempted; the baselines therefore have no CPU swap space (NoSwapSpace answers the swap questions).
    # no prefix cache (NoPrefixCache): Orca shares nothing
    windows: tuple[int | None, ...] = (None,)  # every layer full attention in one run per sequence: one KV cache group
    gather_block_size = None  # attention reads each sequence's K/V as one run

    def __init__(
        self, num_blocks: int, block_size: int, reserve: str = "max", allocator: str = "buddy", max_seq_len: int = 2048
    ):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if reserve not in RESERVE_RULES:
            raise ValueError(f"reserve must be one of {', '.join(RESERVE_RULES)}, got {reserve!r}")
        if allocator not in ALLOCATORS:
            raise ValueError(f"allocator must be one of {', '.join(ALLOCATORS)}, got {allocator!r}")
        if max_seq_len < 1:
            raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
        self.policy = reserve
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_seq_len = max_seq_len
        self.allocator = ALLOCATORS[allocator](num_blocks)  # works in blocks
        self._seqs: dict[int, _Run] = {}

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_slots

    # --- the reservation rule ----------------------------------------------------------------------
    def reserved_tokens(self, prompt_len: int, final_len: int) -> int:
        """Tokens the rule sets aside for a sequence (before block and allocator rounding)."""
        if prompt_len < 1:
            raise ValueError(f"prompt_len must be >= 1, got {prompt_len}")
        if final_len < prompt_len:
            raise ValueError(f"final_len must be >= prompt_len ({prompt_len}), got {final_len}")
        if self.policy == "max":
            if final_len > self.max_seq_len:
                raise ValueError(f"final_len {final_len} exceeds max_seq_len {self.max_seq_len}: cannot be served")
            return self.max_seq_len
        if self.policy == "pow2":
            return prompt_len + next_power_of_two(final_len - prompt_len)
        return final_len

    def _num_blocks_for(self, tokens: int) -> int:
        return cdiv(tokens, self.block_size)

    # --- what the scheduler asks before admitting -----------------------------------------------------
    def check_request(self, prompt_len: int, final_len: int, num_seqs: int) -> str | None:
        """Each sequence reserves its own run by the rule: try the runs on an empty allocator."""
        try:
            reserved = self.reserved_tokens(prompt_len, final_len)
        except ValueError as err:
            return str(err)
        trial = type(self.allocator)(self.num_blocks)
        if any(trial.allocate(self._num_blocks_for(reserved)) is None for _ in range(num_seqs)):
            return f"{num_seqs} reservation(s) of {reserved} tokens do not fit the pool of {self.num_slots} slots even when empty"
        return None

    # --- slots for the tokens a step computes ---------------------------------------------------------
    def _sizes(self, new: Sequence[NewSequence]) -> list[int]:
        """Blocks of every run an admission reserves: each sequence's, then its siblings'."""
        sizes = []
        for spec in new:
            if spec.num_cached_tokens:
                raise ValueError(f"a contiguous manager has no prefix cache, got num_cached_tokens {spec.num_cached_tokens}")
            for final_len in (spec.final_len, *spec.fork_final_lens):
                sizes.append(self._num_blocks_for(self.reserved_tokens(spec.prompt_len, final_len)))
        return sizes

    def can_allocate_slots(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int],
                           new: Sequence[NewSequence] | None = None, *,
                           num_lookahead_tokens: Sequence[int] | None = None) -> bool:
        if num_lookahead_tokens is not None:
            num_new_tokens = self._with_lookahead(seq_ids, num_new_tokens, new, num_lookahead_tokens)[0]
        if (new is not None and len(new) == len(seq_ids) == len(num_new_tokens) == 1 and not new[0].fork_final_lens
                and seq_ids[0] not in self._seqs and num_new_tokens[0] >= 0 and not new[0].num_cached_tokens):
            return self._can_admit_one(num_new_tokens[0], new[0])  # the common admission, made cheap
        check_request_args(seq_ids, num_new_tokens, new)
        if new is None:
            return all(self._run(i).num_tokens + k <= self._run(i).reserved_tokens for i, k in zip(seq_ids, num_new_tokens))
        if any(i in self._seqs for i in seq_ids):
            raise ValueError(f"seq_ids {list(seq_ids)} must not be live already")
        if any(k > self.reserved_tokens(s.prompt_len, s.final_len) for s, k in zip(new, num_new_tokens)):
            return False
        sizes = self._sizes(new)
        if len(sizes) == 1:  # exact for both allocators: one run fits iff it fits the largest free run
            return sizes[0] <= self.allocator.largest_free_run
        if sum(sizes) > self.allocator.num_free_slots:
            return False
        trial = self.allocator.copy()  # NOTE: a throwaway copy, so the answer matches allocate_slots exactly
        return all(trial.allocate(size) is not None for size in sizes)

    def _can_admit_one(self, count: int, spec: NewSequence) -> bool:
        reserved = self.reserved_tokens(spec.prompt_len, spec.final_len)
        # exact for both allocators: one run fits iff it fits the largest free run
        return count <= reserved and self._num_blocks_for(reserved) <= self.allocator.largest_free_run

    def _with_lookahead(self, seq_ids, num_new_tokens, new, num_lookahead_tokens):
        """(tokens each sequence grows by, drafts included; the drafts, or None), checked (checks.with_lookahead)."""
        return with_lookahead(seq_ids, num_new_tokens, new, num_lookahead_tokens,
                              lambda seq_id: self._run(seq_id).num_lookahead)

    def allocate_slots(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int],
                       new: Sequence[NewSequence] | None = None, *,
                       num_lookahead_tokens: Sequence[int] | None = None) -> Allocation | None:
        """Room inside a reservation costs nothing and copies nothing; past it, None (see NOTE above). New
        sequences reserve their runs (and their siblings') first, all or nothing. Lookahead slots (a verify step's
        drafts) are slots of the reservation like any other: the reservation covers the final length already, and
        the scheduler never asks for drafts past it; `rollback` turns the rejected ones back into reservation."""
        if num_lookahead_tokens is not None:
            num_new_tokens, lookahead = self._with_lookahead(seq_ids, num_new_tokens, new, num_lookahead_tokens)
            if lookahead is not None:
                if not self.can_allocate_slots(seq_ids, num_new_tokens):
                    return None
                for seq_id, k, la in zip(seq_ids, num_new_tokens, lookahead):
                    self._seqs[seq_id].num_tokens += k
                    self._seqs[seq_id].num_lookahead = la
                return Allocation([])
        if new is None and len(seq_ids) == 1 and num_new_tokens[0] >= 0:  # the hot path: one sequence grows
            run = self._run(seq_ids[0])
            no_pending_lookahead(seq_ids[0], run.num_lookahead)
            if run.num_tokens + num_new_tokens[0] > run.reserved_tokens:
                return None
            run.num_tokens += num_new_tokens[0]
            return Allocation([])
        if not self.can_allocate_slots(seq_ids, num_new_tokens, new):
            return None
        if new is not None:
            sizes = iter(self._sizes(new))  # every run fits: checked just above
            # NOTE: each run joins its sequence as soon as it is taken (the sequence's own run registers it): should
            # an allocation raise (it then changes nothing), free(seq_id) gives back every run taken before it.
            for seq_id, spec in zip(seq_ids, new):
                for i, f in enumerate((spec.final_len, *spec.fork_final_lens)):
                    run = _Run(self.allocator.allocate(next(sizes)), spec.prompt_len, f,
                               self.reserved_tokens(spec.prompt_len, f))
                    if i:
                        self._seqs[seq_id].forks.append(run)
                    else:
                        self._seqs[seq_id] = run
        for seq_id, k in zip(seq_ids, num_new_tokens):
            self._seqs[seq_id].num_tokens += k
        return Allocation([])

    def rollback(self, seq_id: int, num_tokens: int) -> None:
        """Keep the first `num_tokens` tokens (the contract in base.py): the rejected drafts' slots stay in the run,
        reserved for the tokens that will take their place."""
        run = self._run(seq_id)
        check_rollback(seq_id, num_tokens, run.num_tokens, run.num_lookahead)
        run.num_tokens, run.num_lookahead = num_tokens, 0

    def fork(self, parent_id: int, child_id: int, final_len: int) -> list[BlockCopy] | None:
        """The child takes a run reserved for it at the parent's admission (or, for a beam, a new one by the
        rule) and the executor copies the parent's filled blocks into it, block i to block i."""
        parent = self._run(parent_id)
        no_pending_lookahead(parent_id, parent.num_lookahead)
        if child_id in self._seqs:
            raise ValueError(f"child seq_id {child_id} is already live")
        if final_len < parent.num_tokens:
            raise ValueError(f"final_len must be >= the parent's {parent.num_tokens} tokens, got {final_len}")
        child = next((run for run in parent.forks if run.final_len == final_len), None)
        if child is not None:
            parent.forks.remove(child)
        else:
            reserved = self.reserved_tokens(parent.prompt_len, final_len)
            start = self.allocator.allocate(self._num_blocks_for(reserved))
            if start is None:
                return None
            child = _Run(start, parent.prompt_len, final_len, reserved)
        child.num_tokens = parent.num_tokens
        self._seqs[child_id] = child
        return [(parent.start + i, child.start + i) for i in range(self._num_blocks_for(parent.num_tokens))]

    def free(self, seq_id: int) -> None:
        """Give back the sequence's run and those reserved for its siblings not forked yet.

        NOTE: the siblings' runs first, each leaving the list as it is freed, then the sequence's own, and the entry
        last: should the allocator raise (it then changes nothing), the sequence stays live holding exactly the runs
        not yet given back, and a later free gives those back (the scheduler aborts the request). The order of frees
        changes nothing else: both allocators coalesce to the same free runs whatever the order."""
        run = self._run(seq_id)
        while run.forks:
            self.allocator.free(run.forks[0].start)
            del run.forks[0]
        self.allocator.free(run.start)
        del self._seqs[seq_id]

    # --- what the executor and the metrics read ----------------------------------------------------
    def block_table(self, seq_id: int) -> list[int]:
        """The blocks that hold tokens: the used prefix of the run, like a paged table ([40, 41, 42])."""
        run = self._run(seq_id)
        return list(range(run.start, run.start + self._num_blocks_for(run.num_tokens)))

    def group_tables(self, seq_id: int) -> list[list[int | None]]:
        """One KV cache group (`windows`): its table is the block table."""
        return [self.block_table(seq_id)]

    def num_tokens(self, seq_id: int) -> int:
        return self._run(seq_id).num_tokens

    @property
    def seq_ids(self) -> list[int]:
        return list(self._seqs)

    def _runs(self):
        for seq_id, run in self._seqs.items():
            yield seq_id, run
            for fork in run.forks:
                yield seq_id, fork

    def slot_segments(self) -> list[SlotSegment]:
        """(seq id, first slot, end slot, kind) of every held slot, kinds as indices of SHARE_NAMES; a run
        reserved for a sibling not forked yet belongs to its parent. The breakdown, slot by slot."""
        segments, bs = [], self.block_size
        for seq_id, run in self._runs():
            start, size = run.start * bs, self.allocator.allocated_size(run.start) * bs
            reach = max(run.final_len, run.num_tokens)
            for kind, lo, hi in ((0, 0, run.num_tokens), (1, run.num_tokens, reach), (2, reach, run.reserved_tokens),
                                 (3, run.reserved_tokens, size)):
                if hi > lo:
                    segments.append(SlotSegment(seq_id, start + lo, start + hi, kind))
        return segments

    def breakdown(self, waiting: bool = False) -> MemoryBreakdown:
        """Exact slot counts; per run t + (f - t) + (R - f) + (A*block_size - R) = its size."""
        tokens = reservation = internal = external = 0
        for _, run in self._runs():
            # NOTE: a caller may append past the true final length (e.g. the engine's final_len is only
            # max_tokens); those tokens are states, and the overshoot comes out of internal fragmentation.
            filled_to = max(run.final_len, run.num_tokens)
            tokens += run.num_tokens
            reservation += filled_to - run.num_tokens
            internal += run.reserved_tokens - filled_to
            external += self.allocator.allocated_size(run.start) * self.block_size - run.reserved_tokens
        free = self.allocator.num_free_slots * self.block_size
        return MemoryBreakdown(*as_seen((tokens, reservation, internal, external, free), waiting))

    def check_invariants(self) -> None:
        self.allocator.check_invariants()
        used, starts = 0, set()
        for seq_id, run in self._runs():
            size = self.allocator.allocated_size(run.start)  # raises if the run is not allocated
            used += size
            starts.add(run.start)
            if size * self.block_size < run.reserved_tokens:
                raise RuntimeError(f"seq {seq_id}: expected a run of >= {run.reserved_tokens} tokens, found {size} blocks")
            if not 0 <= run.num_tokens <= run.reserved_tokens:
                raise RuntimeError(
                    f"seq {seq_id}: expected 0 <= tokens <= {run.reserved_tokens}, found {run.num_tokens}"
                )
        if used != self.num_blocks - self.allocator.num_free_slots:
            raise RuntimeError(
                f"allocated blocks: expected {self.num_blocks - self.allocator.num_free_slots}, found {used} owned by sequences"
            )
        if len(starts) != sum(1 for _ in self._runs()):
            raise RuntimeError("two sequences own the same run")

    def _run(self, seq_id: int) -> _Run:
        if seq_id not in self._seqs:
            raise KeyError(f"sequence {seq_id} is not live")
        return self._seqs[seq_id]

    def seq_state(self, seq_id: int) -> _Run | None:
        """The manager's own record of a live sequence (None if it holds none): its run's `reserved_tokens`,
        `num_tokens` and `final_len`, what the fast plane reads and grows (docs/ARCHITECTURE.md, "The fast plane")."""
        return self._seqs.get(seq_id)

    def __repr__(self) -> str:
        return (
            f"ContiguousKVManager(reserve={self.policy!r}, allocator={type(self.allocator).__name__}, "
            f"num_blocks={self.num_blocks}, block_size={self.block_size}, seqs={len(self._seqs)}, "
            f"free_blocks={self.num_free_blocks})"
        )
