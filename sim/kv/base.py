"""What every KV-cache manager answers, whatever its policy, and the five-share memory breakdown.

A KV manager sits between the scheduler and physical memory (DESIGN.md layer 2). The scheduler names
sequences by integer ids it chooses; the manager keeps, per sequence, a block table and a token count,
and asks its allocator for memory. Two families implement this protocol:

- `paged` (vLLM): blocks allocated on demand, shared between sequences with reference counts,
  copy-on-write on the first write into a shared block, optional prefix caching.
- `contiguous` (the paper's Orca baselines): each sequence reserves one run of consecutive slots at
  admission, sized by a reservation rule (`max`, `pow2`, `oracle`).

Out of memory is an answer: `admit`, `append_slots`, `fork` and `swap_*` return `None` and change
nothing. A broken invariant raises.

The memory breakdown (DESIGN.md, after the paper's Figure 2) splits every token slot of the pool
into exactly one of five kinds. Counts are integers, so the shares always sum to 1:

    slot kind               holds a token?   what it is
    token_states            yes              K/V of a token already computed
    reservation             no               set aside for a token a live sequence WILL generate
    internal_fragmentation  no               set aside beyond the sequence's true final length
    external_fragmentation  no               nobody asked for it: allocator rounding slack, plus free
                                             slots while a request waits that cannot be admitted
    free                    no               free while nothing waits (idle capacity, not waste)
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Protocol, Sequence

SHARE_NAMES = ("token_states", "reservation", "internal_fragmentation", "external_fragmentation", "free")


@dataclass(slots=True, frozen=True)
class MemoryBreakdown:
    """The pool split into five kinds of token slot (counts of slots, not bytes)."""

    token_states: int
    reservation: int
    internal_fragmentation: int
    external_fragmentation: int
    free: int

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def shares(self) -> dict[str, float]:
        """Each kind as a fraction of the whole pool; the five sum to 1."""
        total = self.total
        return {name: getattr(self, name) / total for name in SHARE_NAMES}

    def with_waiting(self) -> "MemoryBreakdown":
        """The same memory seen while a request waits: free slots it cannot use count as external waste."""
        return MemoryBreakdown(
            self.token_states,
            self.reservation,
            self.internal_fragmentation,
            self.external_fragmentation + self.free,
            0,
        )


BlockCopy = tuple[int, int]  # (src_block, dst_block): copy a block's K/V before the step writes into dst


class KVManager(Protocol):
    """The protocol every policy implements. Sequence ids are chosen by the caller."""

    policy: str  # "paged", "max", "pow2" or "oracle"
    block_size: int  # tokens per block (contiguous policies in the simulator use 1: a block is a slot)
    num_blocks: int  # blocks in the GPU pool

    @property
    def num_slots(self) -> int: ...  # num_blocks * block_size token slots

    @property
    def num_free_blocks(self) -> int: ...

    # --- admission of a sequence group that shares one prompt -----------------------------------
    def can_admit(
        self, prompt_len: int, final_lens: Sequence[int], prompt_token_ids: Sequence[int] | None = None
    ) -> bool: ...

    def admit(
        self,
        seq_ids: Sequence[int],
        prompt_len: int,
        final_lens: Sequence[int],
        prompt_token_ids: Sequence[int] | None = None,
    ) -> int | None:
        """Give every sequence of a group KV for the prompt (each then holds `prompt_len` tokens).
        `final_lens[i]` is sequence i's true final length (prompt + output). Returns how many prompt
        tokens already have their K/V in the cache (prefix-cache hits; 0 without caching), or None
        with nothing changed when memory is short."""
        ...

    # --- growth, sharing, release -----------------------------------------------------------------
    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool: ...

    def append_slots(self, seq_id: int, num_tokens: int = 1) -> list[BlockCopy] | None:
        """Make room for `num_tokens` more tokens; returns the copies (copy-on-write) the executor
        must do before writing, or None with nothing changed."""
        ...

    def fork(self, parent_id: int, child_id: int, final_len: int) -> list[BlockCopy] | None:
        """A new sequence starting as a copy of the parent (beam search). Paged shares blocks and
        returns []; contiguous reserves a new run and returns the copies to make; None if no memory."""
        ...

    def free(self, seq_id: int) -> None: ...

    # --- what the executor and the metrics read ---------------------------------------------------
    def block_table(self, seq_id: int) -> list[int]: ...

    def num_tokens(self, seq_id: int) -> int: ...

    def breakdown(self, waiting: bool = False) -> MemoryBreakdown: ...

    def check_invariants(self) -> None: ...
