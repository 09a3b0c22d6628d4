"""The paper's Orca baselines: every sequence reserves ONE contiguous run of KV memory at admission.

vLLM paper, section 6.1 and Figure 2. Before PagedAttention, serving systems stored a sequence's
KV cache in consecutive memory, so they had to reserve, up front, room for the longest the sequence
might become. How much they reserve is the reservation rule (in tokens, for a sequence with
`prompt_len` prompt tokens and a true final length `final_len`, output = final_len - prompt_len):

    max      the model's maximum sequence length (2048 for OPT)          Orca (Max)
    pow2     prompt_len + output rounded up to a power of two (25 -> 32)  Orca (Pow2)
    oracle   exactly final_len (knows the output length in advance)       Orca (Oracle)

The reservation becomes ceil(tokens / block_size) blocks, and the slot allocator may round it up
again (a buddy allocator hands out powers of two). One sequence's run, in blocks:

    start                                                         start + A
    |  tokens (t)  |  reservation  |  internal frag.  |  external frag.  |
                   t               f                  R                  A*block_size   (in tokens)

NOTE: a sequence can never grow past its reservation (`append_slots` returns None): moving a run
would mean copying it, which these systems did not do. Every rule reserves at least final_len, so a
scheduler that stops each sequence at its final length never hits that wall, and contiguous
sequences are never preempted. The simulator uses block_size=1 (a block is one token slot).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..slots import ALLOCATORS
from .base import BlockCopy, MemoryBreakdown

RESERVE_RULES = ("max", "pow2", "oracle")


@dataclass(slots=True)
class _SeqState:
    start: int  # first block of the sequence's run (the allocator's offset)
    prompt_len: int
    final_len: int  # true final length, prompt + output
    reserved_tokens: int  # R: what the reservation rule set aside, in tokens
    num_tokens: int  # t: tokens whose K/V the run holds


def next_power_of_two(n: int) -> int:
    """Smallest power of two >= n, and 0 for 0 (an output of 0 tokens reserves nothing)."""
    return 0 if n == 0 else 1 << (n - 1).bit_length()


class ContiguousKVManager:
    """KV manager for the contiguous policies `max`, `pow2` and `oracle` (see the module docstring)."""

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
        self._seqs: dict[int, _SeqState] = {}

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
        return -(-tokens // self.block_size)

    # --- admission ---------------------------------------------------------------------------------
    def can_admit(
        self, prompt_len: int, final_lens: Sequence[int], prompt_token_ids: Sequence[int] | None = None
    ) -> bool:
        sizes = self._group_sizes(prompt_len, final_lens, prompt_token_ids)
        if len(sizes) == 1:  # exact for both allocators: one request fits iff it fits the largest run
            return sizes[0] <= self.allocator.largest_free_run
        if sum(sizes) > self.allocator.num_free_slots:
            return False
        trial = self.allocator.copy()  # NOTE: a throwaway copy, so the answer matches admit exactly
        return all(trial.allocate(size) is not None for size in sizes)

    def admit(
        self,
        seq_ids: Sequence[int],
        prompt_len: int,
        final_lens: Sequence[int],
        prompt_token_ids: Sequence[int] | None = None,
    ) -> int | None:
        """One reservation PER sequence: Orca shares nothing, each run holds its own copy of the prompt's
        K/V. All or nothing; returns 0 (no prefix caching) or None with nothing changed."""
        if len(seq_ids) != len(final_lens):
            raise ValueError(f"{len(seq_ids)} seq_ids for {len(final_lens)} final_lens: expected equal counts")
        if len(set(seq_ids)) != len(seq_ids) or any(s in self._seqs for s in seq_ids):
            raise ValueError(f"seq_ids {list(seq_ids)} must be distinct and not already live")
        sizes = self._group_sizes(prompt_len, final_lens, prompt_token_ids)
        starts: list[int] = []
        for size in sizes:
            start = self.allocator.allocate(size)
            if start is None:
                for done in reversed(starts):  # roll back: freeing in reverse restores the allocator exactly
                    self.allocator.free(done)
                return None
            starts.append(start)
        for seq_id, start, final_len in zip(seq_ids, starts, final_lens):
            reserved = self.reserved_tokens(prompt_len, final_len)
            self._seqs[seq_id] = _SeqState(start, prompt_len, final_len, reserved, prompt_len)
        return 0

    def _group_sizes(
        self, prompt_len: int, final_lens: Sequence[int], prompt_token_ids: Sequence[int] | None
    ) -> list[int]:
        if len(final_lens) < 1:
            raise ValueError("final_lens must name at least one sequence")
        if prompt_token_ids is not None and len(prompt_token_ids) != prompt_len:
            raise ValueError(f"{len(prompt_token_ids)} prompt_token_ids for prompt_len {prompt_len}")
        return [self._num_blocks_for(self.reserved_tokens(prompt_len, f)) for f in final_lens]

    # --- growth, sharing, release ------------------------------------------------------------------
    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        seq = self._seq(seq_id)
        return seq.num_tokens + num_tokens <= seq.reserved_tokens

    def append_slots(self, seq_id: int, num_tokens: int = 1) -> list[BlockCopy] | None:
        """Room inside the reservation costs nothing and copies nothing; past it, None (see NOTE above)."""
        if not self.can_append(seq_id, num_tokens):
            return None
        self._seqs[seq_id].num_tokens += num_tokens
        return []

    def fork(self, parent_id: int, child_id: int, final_len: int) -> list[BlockCopy] | None:
        """A child reserves its own run (rule applied to the parent's prompt and the child's final_len)
        and the executor copies the parent's filled blocks into it, block i to block i."""
        parent = self._seq(parent_id)
        if child_id in self._seqs:
            raise ValueError(f"child seq_id {child_id} is already live")
        if final_len < parent.num_tokens:
            raise ValueError(f"final_len must be >= the parent's {parent.num_tokens} tokens, got {final_len}")
        reserved = self.reserved_tokens(parent.prompt_len, final_len)
        start = self.allocator.allocate(self._num_blocks_for(reserved))
        if start is None:
            return None
        self._seqs[child_id] = _SeqState(start, parent.prompt_len, final_len, reserved, parent.num_tokens)
        used = self._num_blocks_for(parent.num_tokens)
        return [(parent.start + i, start + i) for i in range(used)]

    def free(self, seq_id: int) -> None:
        seq = self._seq(seq_id)
        self.allocator.free(seq.start)
        del self._seqs[seq_id]

    # NOTE: contiguous policies reserve everything at admission, so a running sequence never needs more
    # memory and is never preempted; the baselines therefore have no CPU swap space. These answers keep
    # the protocol uniform for a scheduler that asks.
    def can_swap_out(self, seq_ids: Sequence[int]) -> bool:
        return False

    def swap_out(self, seq_ids: Sequence[int]) -> list[BlockCopy] | None:
        return None

    def can_swap_in(self, seq_ids: Sequence[int]) -> bool:
        return False

    def swap_in(self, seq_ids: Sequence[int]) -> list[BlockCopy] | None:
        return None

    def is_swapped(self, seq_id: int) -> bool:
        return False

    # --- what the executor and the metrics read ----------------------------------------------------
    def block_table(self, seq_id: int) -> list[int]:
        """The blocks that hold tokens: the used prefix of the run, like a paged table ([40, 41, 42])."""
        seq = self._seq(seq_id)
        return list(range(seq.start, seq.start + self._num_blocks_for(seq.num_tokens)))

    def num_tokens(self, seq_id: int) -> int:
        return self._seq(seq_id).num_tokens

    @property
    def seq_ids(self) -> list[int]:
        return list(self._seqs)

    def breakdown(self, waiting: bool = False) -> MemoryBreakdown:
        """Exact slot counts; per sequence t + (f - t) + (R - f) + (A*block_size - R) = its run."""
        tokens = reservation = internal = external = 0
        for seq in self._seqs.values():
            # NOTE: a caller may append past the true final length (e.g. the engine's final_len is only
            # max_tokens); those tokens are states, and the overshoot comes out of internal fragmentation.
            filled_to = max(seq.final_len, seq.num_tokens)
            tokens += seq.num_tokens
            reservation += filled_to - seq.num_tokens
            internal += seq.reserved_tokens - filled_to
            external += self.allocator.allocated_size(seq.start) * self.block_size - seq.reserved_tokens
        free = self.allocator.num_free_slots * self.block_size
        result = MemoryBreakdown(tokens, reservation, internal, external, free)
        return result.with_waiting() if waiting else result

    def check_invariants(self) -> None:
        self.allocator.check_invariants()
        used = 0
        for seq_id, seq in self._seqs.items():
            size = self.allocator.allocated_size(seq.start)  # raises if the run is not allocated
            used += size
            if size * self.block_size < seq.reserved_tokens:
                raise RuntimeError(f"seq {seq_id}: expected a run of >= {seq.reserved_tokens} tokens, found {size} blocks")
            if not seq.prompt_len <= seq.num_tokens <= seq.reserved_tokens:
                raise RuntimeError(
                    f"seq {seq_id}: expected prompt {seq.prompt_len} <= tokens <= {seq.reserved_tokens}, found {seq.num_tokens}"
                )
        if used != self.num_blocks - self.allocator.num_free_slots:
            raise RuntimeError(
                f"allocated blocks: expected {self.num_blocks - self.allocator.num_free_slots}, found {used} owned by sequences"
            )
        if len({seq.start for seq in self._seqs.values()}) != len(self._seqs):
            raise RuntimeError("two sequences own the same run")

    def _seq(self, seq_id: int) -> _SeqState:
        if seq_id not in self._seqs:
            raise KeyError(f"sequence {seq_id} is not live")
        return self._seqs[seq_id]

    def __repr__(self) -> str:
        return (
            f"ContiguousKVManager(reserve={self.policy!r}, allocator={type(self.allocator).__name__}, "
            f"num_blocks={self.num_blocks}, block_size={self.block_size}, seqs={len(self._seqs)}, "
            f"free_blocks={self.num_free_blocks})"
        )
