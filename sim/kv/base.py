"""The KV contract: what every KV-cache manager answers, whatever its policy, and the five-share breakdown.

A KV manager sits between the scheduler and physical memory (docs/ARCHITECTURE.md, "The KV contract"). It
is the ONLY way the scheduler touches memory, in the shape of vLLM v1's `KVCacheManager`
(vllm/v1/core/kv_cache_manager.py): the scheduler names sequences by integer ids it chooses and asks for
slots for the tokens it is about to compute; the manager keeps, per sequence, a block table and a token
count, and answers with the copies to make or `None`. Everything policy-specific (block arithmetic,
copy-on-write, reservations, the watermark, swap space, prefix caching) lives behind these methods, so a new policy is one file in `sim/kv/`.

KV cache groups. Every manager keeps one or more KV cache groups (vLLM's `KVCacheGroupSpec`): `windows` gives each
group's attention window (None: full attention), and `group_tables(seq_id)` a sequence's table in every group. A
policy that treats every layer as full attention has one group, `(None,)`, and its table is `block_table`; the hybrid
policy has one full group and several sliding ones. Which model layers a group serves follows from the windows alone
(`sim.kv.groups.layer_groups`), so an engine lays out its cache tensors without knowing the policy.

A sequence's tokens, as the scheduler sees them when it asks for slots:

    |<------ num_computed_tokens ------>|<-- num_new_tokens -->|
    |  cached (prefix hit) | computed   |  computed this step  |        allocate_slots makes the table
                                                                         cover all of them

Speculative decoding (Leviathan et al., ICML 2023; vLLM v1's `num_lookahead_tokens` in `allocate_slots`). A verify
step feeds a decoding sequence its last sampled token plus k draft tokens; the drafts get LOOKAHEAD slots, the last
`num_lookahead_tokens[i]` of the tokens allocated, whose K/V the verify pass writes. They count as the sequence's
tokens (token states) while they exist, and no prefix cache ever registers them. When the step is reported,
`rollback(seq_id, num_tokens)` keeps the accepted drafts (their full blocks may be cached then) and gives back the
rest, blocks past the new end included:

    |<-- num_tokens before -->| t |<--- k lookahead --->|      allocate_slots([1], num_lookahead_tokens=[k])
    |<-- num_tokens before -->| t | d1 d2 |  d3 .. dk   |      rollback to before + 1 + 2: d1 d2 accepted

A manager refuses (ValueError) to allocate for a sequence whose lookahead is not rolled back yet, and a rollback
outside [num_tokens - lookahead, num_tokens].

Out of memory is an answer: `allocate_slots`, `fork` and `swap_*` return `None` and change nothing.
Each has a check-first partner (`can_allocate_slots`, `can_swap_out`, `can_swap_in`) that answers the
same question without changing anything. A broken invariant raises.

The memory breakdown (after the paper's Figure 2) splits every token slot of the pool into exactly one
of five kinds. Counts are integers, so the shares always sum to 1:

    slot kind               holds a token?   what it is
    token_states            yes              K/V of a token already computed
    reservation             no               set aside for a token a live sequence WILL compute
    internal_fragmentation  no               set aside beyond the sequence's true final length
    external_fragmentation  no               nobody asked for it: allocator rounding slack, plus free
                                             slots while a request waits that cannot be admitted
    free                    no               free while nothing waits (idle capacity, not waste)
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple, Protocol, Sequence

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

    def counts(self) -> tuple[int, int, int, int, int]:
        """The five counts in SHARE_NAMES order."""
        return (self.token_states, self.reservation, self.internal_fragmentation, self.external_fragmentation,
                self.free)

    def with_waiting(self) -> "MemoryBreakdown":
        """The same memory seen while a request waits: free slots it cannot use count as external waste."""
        return MemoryBreakdown(*as_seen(self.counts(), True))


def as_seen(counts: tuple[int, ...], waiting: bool) -> tuple[int, ...]:
    """Five raw counts as the breakdown reports them: while a request waits, free slots are external waste."""
    if not waiting:
        return counts
    tokens, reservation, internal, external, free = counts
    return (tokens, reservation, internal, external + free, 0)


def cdiv(a: int, b: int) -> int:
    """Ceiling division: the blocks of `b` slots that `a` tokens take (cdiv(6, 4) == 2, cdiv(0, 4) == 0)."""
    return -(-a // b)


class SlotSegment(NamedTuple):
    """A run of held slots of one kind (slot_segments): what the memory-map figure draws."""

    seq_id: int  # the owner (a shared block: its first owner)
    start: int  # first slot
    end: int  # one past the last slot
    kind: int  # an index of SHARE_NAMES


BlockCopy = tuple[int, int]  # (src_block, dst_block): copy a block's K/V before the step writes into dst


@dataclass(slots=True, frozen=True)
class NewSequence:
    """What a manager is told about a sequence the first time slots are asked for it (admission, or
    re-admission after a preemption by recompute)."""

    prompt_len: int  # its prompt: the contiguous rules reserve from it
    final_len: int  # K/V entries it holds when it finishes: where reservation ends and internal frag. begins
    token_ids: Sequence[int] | None = None  # ids of its first tokens (the prompt), the prefix cache's keys
    num_cached_tokens: int = 0  # leading tokens a prefix-cache lookup found (get_computed_tokens): not recomputed
    # Siblings that will be forked from it once its prompt is computed (parallel sampling, beam search), by
    # final length. A paged manager shares blocks then and needs nothing now; a contiguous one reserves
    # their runs now, as Orca reserves for every sequence at admission.
    fork_final_lens: tuple[int, ...] = ()
    # No prefix-cache lookup for it (Request.skip_reading_prefix_cache): num_cached_tokens is 0, and a paged
    # manager neither looks its blocks up nor counts it in its prefix-cache stats; its full blocks are still cached.
    skip_reading_prefix_cache: bool = False

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.final_len < self.prompt_len:
            raise ValueError(f"expected 1 <= prompt_len <= final_len, got {self.prompt_len}, {self.final_len}")
        if self.token_ids is not None and len(self.token_ids) > self.final_len:
            raise ValueError(f"{len(self.token_ids)} token_ids for a sequence of final length {self.final_len}")
        if self.num_cached_tokens < 0:
            raise ValueError(f"num_cached_tokens must be >= 0, got {self.num_cached_tokens}")
        if self.skip_reading_prefix_cache and self.num_cached_tokens:
            raise ValueError(f"num_cached_tokens must be 0 when skipping the prefix cache, got {self.num_cached_tokens}")
        if any(f < self.prompt_len for f in self.fork_final_lens):
            raise ValueError(f"fork_final_lens must each be >= prompt_len {self.prompt_len}, got {self.fork_final_lens}")


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache lookups of admitted sequences, counted when they are admitted (as vLLM v1 counts them)."""

    queried_blocks: int = 0  # full blocks of known prompt tokens that could have hit
    hit_blocks: int = 0
    queried_tokens: int = 0  # tokens of the admitted sequences
    hit_tokens: int = 0  # of which already in the cache (not computed again)
    # the CPU offload tier (sim/kv/offload.py; all 0 without one): of the hits above, those reloaded from CPU memory
    cpu_hit_blocks: int = 0
    cpu_hit_tokens: int = 0
    offloaded_blocks: int = 0  # evicted GPU blocks copied to the tier
    reloaded_blocks: int = 0  # tier blocks copied back to the GPU (a block two admitted sequences share: once)


@dataclass(slots=True)
class Allocation:
    """The answer to a successful allocate_slots."""

    copies: list[BlockCopy]  # copy-on-write: (src, dst) pairs the executor copies before the step writes


class KVManager(Protocol):
    """The protocol every policy implements. Sequence ids are chosen by the caller."""

    policy: str  # the policy's name, for display ("paged", "max", ...); never tested outside sim/kv
    block_size: int  # tokens per block (the contiguous policies in the simulator use 1: a block is a slot)
    num_blocks: int  # blocks in the GPU pool
    num_cpu_blocks: int  # CPU swap space in blocks; 0 = this manager cannot swap
    enable_prefix_caching: bool  # whether this manager caches prefixes (the option, or always where it is the policy)
    # KV cache groups: each group's attention window, None = full attention; (None,) for a policy that keeps every
    # layer as full attention (one group, whose table is block_table)
    windows: tuple[int | None, ...]

    @property
    def num_slots(self) -> int: ...  # num_blocks * block_size token slots

    @property
    def num_free_blocks(self) -> int: ...

    # --- what the scheduler asks before admitting ---------------------------------------------------
    def check_request(self, prompt_len: int, final_len: int, num_seqs: int) -> str | None:
        """Why a request of `num_seqs` sequences of this final length could never run, even alone in an empty
        pool (one line, for the user), or None if it could."""
        ...

    def get_computed_tokens(self, token_ids: Sequence[int] | None, num_tokens: int) -> int:
        """Prefix-cache lookup, changing nothing: how many leading tokens of a sequence of `num_tokens` tokens
        (whose first ids are `token_ids`) already have their K/V in the pool. Never all of them: the last
        token is always computed (its logits are sampled). 0 without a prefix cache."""
        ...

    # --- slots for the tokens a step computes ---------------------------------------------------------
    def can_allocate_slots(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int],
                           new: Sequence[NewSequence] | None = None, *,
                           num_lookahead_tokens: Sequence[int] | None = None) -> bool: ...

    def allocate_slots(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int],
                       new: Sequence[NewSequence] | None = None, *,
                       num_lookahead_tokens: Sequence[int] | None = None) -> Allocation | None:
        """Room for `num_new_tokens[i]` more tokens in sequence `seq_ids[i]`, for all of them or none.

        With `new` (one per id), the sequences are not live yet: they are admitted now, each starting with
        its `num_cached_tokens` prefix-cache hits. Returns the copy-on-write copies to make, or None with
        nothing changed when memory is short (for new sequences: when admitting them would leave less
        than the manager's watermark free). `num_lookahead_tokens[i]`: that many more slots for draft tokens
        (speculative decoding, running sequences only), kept or given back by `rollback`."""
        ...

    def rollback(self, seq_id: int, num_tokens: int) -> None:
        """Shrink the sequence to its first `num_tokens` tokens after a verify step: the accepted drafts stay (now
        ordinary tokens), the rejected ones' slots go, blocks wholly past the new end back to the pool. `num_tokens`
        from the tokens before its lookahead slots to all of them (ValueError otherwise; nothing changed)."""
        ...

    def fork(self, parent_id: int, child_id: int, final_len: int) -> list[BlockCopy] | None:
        """A new sequence starting as a copy of the parent. Paged shares blocks and returns []; contiguous
        takes a run (reserved at the parent's admission, or a new one) and returns the copies to make."""
        ...

    def free(self, seq_id: int) -> None: ...

    def uncache(self, block_ids: Sequence[int]) -> None:
        """Unregister these blocks from the prefix cache (a failed step never wrote their K/V); no-op without one."""
        ...

    # --- swapping (paper 4.5); managers with num_cpu_blocks == 0 answer False / None ------------------
    def can_swap_out(self, seq_ids: Sequence[int]) -> bool: ...

    def swap_out(self, seq_ids: Sequence[int]) -> list[BlockCopy] | None: ...

    def can_swap_in(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int]) -> bool:
        """Room to bring the sequences back AND then allocate `num_new_tokens` for them (watermark kept)."""
        ...

    def swap_in(self, seq_ids: Sequence[int]) -> list[BlockCopy] | None: ...

    # --- what the executor and the metrics read ---------------------------------------------------
    def block_table(self, seq_id: int) -> list[int]: ...

    def group_tables(self, seq_id: int) -> list[list[int | None]]:
        """The sequence's table in every KV cache group (`windows` order), position-indexed: entry i holds positions
        i*block_size .. (i+1)*block_size - 1, None where a sliding group has freed it. One group: [block_table]."""
        ...

    def num_tokens(self, seq_id: int) -> int: ...

    def breakdown(self, waiting: bool = False) -> MemoryBreakdown: ...

    def slot_segments(self) -> list[SlotSegment]:
        """The breakdown slot by slot: (seq id, first slot, end slot, kind as an index of SHARE_NAMES) for every
        held slot; slots not listed are free. What the memory-map figure draws."""
        ...

    def prefix_cache_stats(self) -> PrefixCacheStats:
        """What admissions found in the prefix cache so far (all zeros without one)."""
        ...

    def take_tier_copies(self) -> list:
        """The CPU offload tier's block copies (sim.kv.offload.TierCopy) decided since the last call, in the order an
        executor makes them, before the step's swap-ins and copies; [] for a manager without a tier."""
        ...

    @property
    def seq_ids(self) -> list[int]: ...  # the live sequences

    gather_block_size: int | None  # the block an attention kernel gathers K/V by; None: one contiguous run

    def check_invariants(self) -> None: ...
