"""The paged KV manager: vLLM's block tables over a shared pool of fixed-size blocks.

Kwon et al., SOSP 2023: section 4.2 (blocks allocated on demand, a block table per sequence),
4.4 (parallel sampling and beam search share blocks by reference count, copy-on-write on the first
write into a shared block), 4.5 (preemption by swapping blocks to CPU memory). Prefix caching follows
vLLM's automatic prefix caching (full blocks only, named by a chained hash, registered as soon as the
step that computes them is scheduled).

A sequence with `num_tokens` tokens holds ceil(num_tokens / block_size) blocks; only its last block
may be partly filled. For block_size 4 and 6 tokens:

    logical block     0                1
    block_table      [7,               3]
    slots            t0 t1 t2 t3  |  t4 t5 .  .        the two empty slots of block 3 are the only
                                                       memory this sequence holds beyond its tokens

`allocate_slots` grows tables chunk by chunk (a whole prompt, a chunk of one, or one decode token) and is
all-or-nothing over the sequences it is given; on out-of-memory it returns None and changes nothing.
The manager is one class, in the contract's order: admission and allocation, swapping (the block moves themselves in
sim/kv/swap.py), what the executor and the metrics read (the memory breakdown; slot by slot in sim/kv/views.py), then
the invariants (checked the slow way in sim/kv/invariants.py). A student's own block allocator plugs in through
sim/kv/plug.py. (The simulator's fast plane, sim/fast/paged.py, applies
runs of decode steps to the records `seq_state` gives, in closed form; docs/ARCHITECTURE.md, "The fast plane".)
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, NamedTuple, Sequence

from .base import Allocation, BlockCopy, MemoryBreakdown, NewSequence, PrefixCacheStats, SlotSegment, cdiv
from .blocks import BlockAllocator, hash_block_tokens
from .checks import check_lookahead, check_request_args, check_rollback, no_pending_lookahead
from .invariants import check_paged_invariants
from .offload import CpuOffloadTier, TierCopy
from .plug import plugged_allocator
from .swap import distinct_blocks, move_blocks
from .views import paged_slot_segments

TIER_HIT = -1  # a table entry that the offload tier's reload fills, in the same allocate_slots (_reload)


@dataclass(slots=True)
class SeqState:
    """What the manager keeps per sequence (public: the radix manager extends it with its tree lock)."""

    block_table: list[int]  # GPU block ids, or CPU block ids while swapped out
    num_tokens: int  # tokens whose K/V the sequence holds (or will hold after the current step)
    final_len: int  # the sequence's true final length (for the memory breakdown)
    token_ids: Sequence[int] | None = None  # its known first token ids (the prompt): prefix-cache keys
    hashes: list[int] = field(default_factory=list)  # chained hashes of its first full known blocks, registered
    swapped: bool = False
    num_lookahead: int = 0  # the last of num_tokens that are lookahead slots (drafts), until rollback; never cached


class Lookup(NamedTuple):
    """What a prefix-cache lookup of a sequence's known tokens finds."""

    hashes: list[int]  # chained hashes of its full blocks that may hit (never the block of its last token)
    hits: int  # how many leading ones are cached (on the GPU, or in the offload tier)


NO_PREFIX_CACHE = Lookup([], 0)  # every lookup of a pool without a prefix cache (nothing to hit, nothing registered)


class AdmissionNeed(NamedTuple):
    """What admitting new sequences takes from the pool (`_admission_need`)."""

    lookups: list  # per sequence, what its lookup found (a Lookup; the radix manager's own kind)
    blocks: int  # blocks taken from the free ones (fresh, revived cached ones, offload-tier reloads)
    watermark_blocks: int  # blocks the watermark counts: every block, hits too (as vLLM v0 counted)


class PagedKVManager:
    """Block tables for sequences named by integer ids, over a GPU `BlockAllocator` (+ optional CPU swap space).

    `watermark`: the share of GPU blocks an admission must leave free, so that a sequence just admitted is not
    preempted at once by its elders' growth (vLLM v0's block-manager watermark, 0.01 there; 0 = off).
    Every layer is kept as full attention: one KV cache group, whose table is `block_table`.
    `block_allocator`: the GPU pool's allocator is `block_allocator(num_blocks, block_size)` instead of a
    `BlockAllocator` (a student's, lab 03: the manager calls only the methods that lab specifies; see
    `plugged_allocator`). The CPU swap pool is always a `BlockAllocator`.
    `num_offload_blocks`: a CPU offload tier of that many blocks for the prefix cache (sim/kv/offload.py: evicted
    cached blocks are kept there and reloaded on a hit; needs prefix caching and the own BlockAllocator; 0 = none).
    It is apart from the swap space: swapping is for preemption, the tier for evicted prefixes.
    """

    policy = "paged"
    windows: tuple[int | None, ...] = (None,)  # one KV cache group, full attention
    offload: CpuOffloadTier | None = None  # the CPU offload tier of the prefix cache, if any

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 num_cpu_blocks: int = 0, watermark: float = 0.0, *,
                 block_allocator: Callable[[int, int], Any] | None = None,
                 num_offload_blocks: int = 0) -> None:
        if num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_cpu_blocks}")
        if num_offload_blocks < 0:
            raise ValueError(f"num_offload_blocks must be >= 0, got {num_offload_blocks}")
        if num_offload_blocks and not enable_prefix_caching:
            raise ValueError("an offload tier (num_offload_blocks > 0) keeps evicted prefix-cache blocks: it needs "
                             "enable_prefix_caching=True")
        if num_offload_blocks and block_allocator is not None:
            raise ValueError("an offload tier (num_offload_blocks > 0) needs the manager's own BlockAllocator (it is "
                             "told of every eviction), not a block_allocator given")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        if block_allocator is None:  # (Any: a plugged block_allocator, radix's page pool have its methods only)
            self.allocator: Any = BlockAllocator(num_blocks, block_size, enable_prefix_caching)
        else:
            self.allocator = plugged_allocator(block_allocator, num_blocks, block_size, enable_prefix_caching)
        self.cpu_allocator = BlockAllocator(num_cpu_blocks, block_size) if num_cpu_blocks else None
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.watermark_blocks = int(watermark * num_blocks)
        self.gather_block_size = block_size  # the paged kernel gathers K/V block by block through the table
        self._seqs: dict[int, SeqState] = {}
        self._stats = PrefixCacheStats()
        if num_offload_blocks:
            self.offload = CpuOffloadTier(num_offload_blocks)
            self.allocator.on_evict = self._offload

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def _offload(self, block_id: int, block_hash: int) -> None:
        """The GPU pool evicted a cached block: the tier keeps it, unless another GPU block still holds its hash."""
        if self.allocator.cached_block(block_hash) is None:
            self.offload.offload(block_id, block_hash)

    def take_tier_copies(self) -> list[TierCopy]:
        """The offload tier's copies decided since the last call, in the order to make them ([] without a tier)."""
        return [] if self.offload is None else self.offload.take_copies()

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    # --- what the scheduler asks before admitting ---------------------------------------------------
    def check_request(self, prompt_len: int, final_len: int, num_seqs: int) -> str | None:
        """NOTE: several sequences are counted WITHOUT sharing, because after a preemption by recompute each
        is re-admitted alone; this over-rejects only groups within a factor num_seqs of the pool."""
        need, usable = num_seqs * cdiv(final_len, self.block_size), self.num_blocks - self.watermark_blocks
        if need > usable:
            return (f"{num_seqs} sequence(s) of final length {final_len} need {need} blocks "
                    f"(allowed: <= {usable} of {self.num_blocks})")
        return None

    def _prompt_hashes(self, token_ids: Sequence[int], num_blocks: int) -> list[int]:
        """Chained hashes of the first `num_blocks` full blocks of `token_ids`."""
        hashes, parent, bs = [], None, self.block_size
        for i in range(num_blocks):
            parent = hash_block_tokens(parent, token_ids[i * bs : (i + 1) * bs])
            hashes.append(parent)
        return hashes

    def _lookup_blocks(self, token_ids: Sequence[int] | None, num_tokens: int) -> Lookup:
        """The blocks that may hit, and the leading hits. NOTE: like vLLM, only blocks lying wholly inside the first
        num_tokens - 1 tokens may hit, so the last token is always computed and never shared."""
        if not self.enable_prefix_caching:
            return NO_PREFIX_CACHE
        if not token_ids:
            return Lookup([], 0)
        hashes = self._prompt_hashes(token_ids, min(len(token_ids), num_tokens - 1) // self.block_size)
        hits, tier = 0, self.offload
        for block_hash in hashes:  # a block hits on the GPU, else in the offload tier (if any), else the hits end
            if self.allocator.cached_block(block_hash) is None and (tier is None or
                                                                  tier.cached_block(block_hash) is None):
                break
            hits += 1
        return Lookup(hashes, hits)

    def get_computed_tokens(self, token_ids: Sequence[int] | None, num_tokens: int) -> int:
        return self._lookup_blocks(token_ids, num_tokens).hits * self.block_size

    # --- slots for the tokens a step computes ---------------------------------------------------------
    def _gpu_seq(self, seq_id: int) -> SeqState:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise KeyError(f"sequence {seq_id} is not live")
        if seq.swapped:
            raise RuntimeError(f"sequence {seq_id} is swapped out; swap it in first")
        return seq

    def _growth(self, tables: Sequence[tuple[list[int], int]], counts: Sequence[int], refs) -> int:
        """Blocks that appending counts[i] tokens to each (block_table, num_tokens) takes, in turn.

        A sequence takes the blocks its new tokens open, plus a copy of its partly filled last block if that
        block is shared when its turn comes: of m owners that all write, m - 1 copy and the last writes in
        place. `refs(block)` gives a block's current reference count.
        """
        bs, need, left = self.block_size, 0, {}
        for (table, n), k in zip(tables, counts):
            if not k:
                continue
            need += cdiv(n + k, bs) - len(table)
            if n % bs:
                last = table[-1]
                r = left.get(last)
                r = refs(last) if r is None else r
                if r > 1:
                    need += 1
                left[last] = r - 1
        return need

    def _admission_need(self, new: Sequence[NewSequence], counts: Sequence[int]) -> AdmissionNeed:
        """What admitting these new sequences, `counts[i]` tokens each after their hits, takes."""
        bs, found, revived, need, watermark_need = self.block_size, [], set(), 0, 0
        reloaded: set[int] = set()  # hashes hit in the offload tier only: one fresh GPU block each (shared after)
        for spec, k in zip(new, counts):
            total = spec.num_cached_tokens + k
            # the lookup of get_computed_tokens, bounded by this step's tokens (a hit is never the last token)
            lookup = Lookup([], 0) if spec.skip_reading_prefix_cache else self._lookup_blocks(
                spec.token_ids, spec.num_cached_tokens + max(k, 1))
            hashes, hits = lookup
            if spec.num_cached_tokens != hits * bs:
                raise RuntimeError(f"expected num_cached_tokens {spec.num_cached_tokens} to be the cache's current "
                                   f"hits, found {hits * bs} (look up and allocate in the same step)")
            if total > spec.final_len:
                raise ValueError(f"{total} tokens for a sequence of final length {spec.final_len}")
            for block_hash in hashes[:hits]:
                block = self.allocator.cached_block(block_hash)
                if block is None:
                    reloaded.add(block_hash)
                elif self.allocator.ref_count(block) == 0:
                    revived.add(block)  # a freed cached block leaves the free queue when it is hit
            need += cdiv(total, bs) - hits
            watermark_need += cdiv(total, bs)  # NOTE: before hits, as vLLM v0 counted (conservative)
            found.append(lookup)
        return AdmissionNeed(found, need + len(revived) + len(reloaded), watermark_need)

    def can_allocate_slots(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int],
                           new: Sequence[NewSequence] | None = None, *,
                           num_lookahead_tokens: Sequence[int] | None = None) -> bool:
        lookahead = check_lookahead(seq_ids, num_lookahead_tokens, new)
        if lookahead is not None:
            num_new_tokens = self._with_lookahead(seq_ids, num_new_tokens, lookahead)
        if new is None:
            return self._fits(seq_ids, num_new_tokens)
        return self._admission(seq_ids, num_new_tokens, new) is not None

    def _with_lookahead(self, seq_ids, num_new_tokens, lookahead) -> list[int]:
        """The tokens each sequence grows by, drafts included (each checked: no lookahead pending)."""
        for seq_id in seq_ids:
            no_pending_lookahead(seq_id, self._gpu_seq(seq_id).num_lookahead)
        return [k + la for k, la in zip(num_new_tokens, lookahead)]

    def _fits(self, seq_ids, num_new_tokens) -> bool:
        """Room for live sequences to grow by these tokens?"""
        check_request_args(seq_ids, num_new_tokens, None)
        seqs = [self._gpu_seq(i) for i in seq_ids]
        need = self._growth([(s.block_table, s.num_tokens) for s in seqs], num_new_tokens, self.allocator.ref_count)
        return need <= self.allocator.num_free_blocks

    def _admission(self, seq_ids, num_new_tokens, new) -> AdmissionNeed | None:
        """What admitting these new sequences takes, or None if it does not fit or would leave less than the
        watermark free."""
        check_request_args(seq_ids, num_new_tokens, new)
        for seq_id in seq_ids:
            if seq_id in self._seqs:
                raise ValueError(f"sequence {seq_id} is already live")
        need, free = self._admission_need(new, num_new_tokens), self.allocator.num_free_blocks
        if need.blocks > free or (self.watermark_blocks and free - need.watermark_blocks < self.watermark_blocks):
            return None
        return need

    def allocate_slots(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int],
                       new: Sequence[NewSequence] | None = None, *,
                       num_lookahead_tokens: Sequence[int] | None = None) -> Allocation | None:
        """Room for num_new_tokens[i] more tokens in each sequence (see the KV contract in base.py).

            before (block_size 4, 6 tokens, block 3 shared with a sibling):   [7, 3]   t4 t5 . .
            allocate 3:  copy-on-write 3 -> 9 (returned as (3, 9)), then a new block 5:  [7, 9, 5]  t4 t5 t6 t7 | t8 . . .

        Only the first write can hit a shared block: after the copy the last block is exclusive, and blocks
        allocated for later tokens are new. New sequences first take their prefix-cache hits (all of them,
        before any allocation could evict one), then fresh blocks. Full blocks of known token ids are
        registered in the prefix cache as soon as they are allocated: this step computes their K/V. Lookahead slots
        (num_lookahead_tokens) are allocated as tokens but registered only once `rollback` has kept them.
        """
        if num_lookahead_tokens is not None and (lookahead := check_lookahead(seq_ids, num_lookahead_tokens, new)):
            totals = self._with_lookahead(seq_ids, num_new_tokens, lookahead)
            if not self._fits(seq_ids, totals):
                return None
            return Allocation([c for i, k, la in zip(seq_ids, totals, lookahead)
                               for c in self._grow(self._seqs[i], k, la)])
        if new is None and len(seq_ids) == 1:  # the hot path: one sequence grows (a decode, a chunk)
            return self._grow_one(seq_ids[0], num_new_tokens[0])
        if new is None:
            if not self._fits(seq_ids, num_new_tokens):
                return None
            return Allocation([c for i, k in zip(seq_ids, num_new_tokens) for c in self._grow(self._seqs[i], k)])
        need = self._admission(seq_ids, num_new_tokens, new)
        if need is None:
            return None
        found = need.lookups
        # NOTE: each sequence is registered before it takes a block and holds each block as it is taken: should a
        # call below raise, free(seq_id) gives back what it took (the scheduler aborts the request).
        seqs = [SeqState([], spec.num_cached_tokens + k, spec.final_len, spec.token_ids, hashes[:hits])
                for spec, k, (hashes, hits) in zip(new, num_new_tokens, found)]
        self._seqs.update(zip(seq_ids, seqs))
        tier = self.offload
        for seq, (hashes, hits) in zip(seqs, found):  # hits first: reviving must precede any eviction
            for block_hash in hashes[:hits]:
                if tier is not None and self.allocator.cached_block(block_hash) is None:
                    tier.pin(block_hash)  # an offload-tier hit: reloaded below, kept in the tier until then
                    seq.block_table.append(TIER_HIT)
                    continue
                seq.block_table.append(self.allocator.lookup(block_hash))
            if hits < len(hashes):
                self.allocator.lookup(hashes[hits])  # the first miss, counted; it returns None
            self._stats.queried_blocks += len(hashes)
            self._stats.hit_blocks += hits
        for seq, spec, (hashes, hits) in zip(seqs, new, found):
            if tier is not None:
                self._reload(seq, hashes)
            seq.block_table += self.allocator.allocate(cdiv(seq.num_tokens, self.block_size) - hits)
            self._register(seq)
            if self.enable_prefix_caching and not spec.skip_reading_prefix_cache:  # vLLM counts lookups only
                self._stats.queried_tokens += spec.prompt_len
                self._stats.hit_tokens += spec.num_cached_tokens
        if tier is not None:
            tier.unpin_all()
        return Allocation([])

    def _reload(self, seq: SeqState, hashes: list[int]) -> None:
        """Fill the table's offload-tier hits (TIER_HIT) with GPU blocks: the block another sequence of this admission has
        reloaded already (shared), else a fresh block that the tier copies the K/V into, cached under its hash."""
        for i, block in enumerate(seq.block_table):
            if block != TIER_HIT:
                continue
            block_hash = hashes[i]
            shared = self.allocator.cached_block(block_hash)
            if shared is not None:
                shared = self.allocator.lookup(block_hash)
            else:
                [block] = self.allocator.allocate(1)
                self.allocator.cache_block(block, block_hash)
                self.offload.reload(block_hash, block)
                shared = block
            seq.block_table[i] = shared
            self._stats.cpu_hit_blocks += 1  # (a sequence that skips reading the cache has no hits)
            self._stats.cpu_hit_tokens += self.block_size

    def _grow_one(self, seq_id: int, k: int) -> Allocation | None:
        seq = self._seqs.get(seq_id)
        if seq is None or seq.swapped or k < 0 or seq.num_lookahead:
            self._gpu_seq(seq_id)  # raises for an unknown or swapped-out sequence
            no_pending_lookahead(seq_id, seq.num_lookahead)
            raise ValueError(f"num_new_tokens must be >= 0, got {k}")
        n, bs, table = seq.num_tokens, self.block_size, seq.block_table
        if n + k <= len(table) * bs and not (n % bs and k and self.allocator.ref_count(table[-1]) > 1):
            seq.num_tokens = n + k  # the common case: the tokens fit the last block, which is this sequence's alone
            if seq.token_ids is not None:
                self._register(seq)
            return Allocation([])
        need = self._growth([(table, n)], [k], self.allocator.ref_count)
        if need > self.allocator.num_free_blocks:
            return None
        return Allocation(self._grow(seq, k))

    def _grow(self, seq: SeqState, k: int, lookahead: int = 0) -> list[BlockCopy]:
        """Append k tokens to one sequence (room checked by the caller): copy-on-write, then new blocks. The last
        `lookahead` of them are lookahead slots (drafts, not registered until rollback keeps them)."""
        copies: list[BlockCopy] = []
        if seq.num_lookahead:
            raise RuntimeError(f"expected the sequence's {seq.num_lookahead} lookahead slots rolled back before it "
                               "grows")
        if not k:
            return copies
        seq.num_lookahead = lookahead
        if seq.num_tokens % self.block_size and self.allocator.ref_count(seq.block_table[-1]) > 1:
            src = seq.block_table[-1]
            dst = self.allocator.copy_on_write(src)
            seq.block_table[-1] = dst
            copies.append((src, dst))
        seq.num_tokens += k
        seq.block_table += self.allocator.allocate(cdiv(seq.num_tokens, self.block_size) - len(seq.block_table))
        if seq.token_ids is not None:
            self._register(seq)
        return copies

    def _register(self, seq: SeqState) -> None:
        """Register the sequence's newly full blocks of known token ids in the prefix cache."""
        if not self.enable_prefix_caching or seq.token_ids is None:
            return
        bs = self.block_size
        full = min(seq.num_tokens - seq.num_lookahead, len(seq.token_ids)) // bs
        while len(seq.hashes) < full:
            i = len(seq.hashes)
            parent = seq.hashes[-1] if seq.hashes else None
            block_hash = hash_block_tokens(parent, seq.token_ids[i * bs : (i + 1) * bs])
            self.allocator.cache_block(seq.block_table[i], block_hash)
            seq.hashes.append(block_hash)

    def rollback(self, seq_id: int, num_tokens: int) -> None:
        """Keep the first `num_tokens` tokens (see the contract in base.py), after a verify step.

            block_size 4, 5 tokens + 6 lookahead slots:  [7, 3, 8]   t4 d1 d2 d3 | d4 d5 d6 .
            rollback to 7 (d1 d2 accepted):              [7, 3]      t4 d1 d2 .        block 8 back to the pool

        Lookahead slots were never registered in the prefix cache, so no cached block holds a rejected draft; the
        accepted drafts' newly full blocks are registered now. The blocks dropped are this sequence's alone (taken
        for its lookahead after any copy-on-write), and the allocator's free changes nothing should it raise."""
        seq = self._gpu_seq(seq_id)
        check_rollback(seq_id, num_tokens, seq.num_tokens, seq.num_lookahead)
        keep = cdiv(num_tokens, self.block_size)
        if keep < len(seq.block_table):
            self.allocator.free(seq.block_table[keep:][::-1])  # tail first, as free() gives blocks back
            del seq.block_table[keep:]
        seq.num_tokens, seq.num_lookahead = num_tokens, 0
        if seq.token_ids is not None:
            self._register(seq)

    def fork(self, parent_id: int, child_id: int, final_len: int) -> list[BlockCopy] | None:
        """The child points at every block of the parent (one more reference each); nothing is copied yet."""
        parent = self._gpu_seq(parent_id)
        no_pending_lookahead(parent_id, parent.num_lookahead)
        if child_id in self._seqs:
            raise ValueError(f"sequence {child_id} is already live")
        if final_len < parent.num_tokens:
            raise ValueError(f"final_len must be >= the parent's {parent.num_tokens} tokens, got {final_len}")
        self.allocator.share(parent.block_table)
        self._seqs[child_id] = SeqState(list(parent.block_table), parent.num_tokens, final_len, parent.token_ids,
                                         list(parent.hashes))
        return []

    def uncache(self, block_ids: Sequence[int]) -> None:
        self.allocator.uncache(block_ids)

    def free(self, seq_id: int) -> None:
        """Drop the sequence's references. NOTE: tail blocks first, as vLLM does: they go to the front of the
        free queue and are evicted first, while the prompt's head blocks (the most shareable) stay cached longest."""
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise KeyError(f"sequence {seq_id} is not live")
        allocator = self.cpu_allocator if seq.swapped else self.allocator
        allocator.free(seq.block_table[::-1])  # first: should it raise (it then changes nothing), the seq stays
        del self._seqs[seq_id]

    # --- swapping (paper 4.5) -----------------------------------------------------------------------
    # A preempted group's blocks move to CPU memory and come back when GPU memory allows, keeping the sharing
    # inside the group. While a sequence is swapped out its block table holds CPU block ids.
    def can_swap_out(self, seq_ids: Sequence[int]) -> bool:
        blocks = distinct_blocks(self._seqs, seq_ids, swapped=False)
        return self.cpu_allocator is not None and self.cpu_allocator.can_allocate(len(blocks))

    def swap_out(self, seq_ids: Sequence[int]) -> list[BlockCopy] | None:
        """Move the group's blocks to CPU memory: returns (gpu_block, cpu_block) copies, or None if CPU memory is short
        (sim.kv.swap.move_blocks: sharing inside the group is kept; a block held outside it stays on the GPU too)."""
        return move_blocks(self._seqs, seq_ids, False, self.allocator, self.cpu_allocator)

    def can_swap_in(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int]) -> bool:
        """Room for the group's blocks AND the growth that follows, leaving the watermark free (vLLM v0's
        can_swap_in reserves one block per sequence; here the need is exact). Sharing inside the group
        survives a swap, so the CPU tables and reference counts tell the growth."""
        blocks = distinct_blocks(self._seqs, seq_ids, swapped=True)
        seqs = [self._seqs[i] for i in seq_ids]
        grow = self._growth([(s.block_table, s.num_tokens) for s in seqs], num_new_tokens, self.cpu_allocator.ref_count)
        return len(blocks) + grow + self.watermark_blocks <= self.allocator.num_free_blocks

    def swap_in(self, seq_ids: Sequence[int]) -> list[BlockCopy] | None:
        """Bring a swapped group back: returns (cpu_block, gpu_block) copies, or None if GPU memory is short.

        NOTE: blocks come back as fresh GPU blocks, not re-registered in the prefix cache (a simplification).
        """
        return move_blocks(self._seqs, seq_ids, True, self.cpu_allocator, self.allocator)

    # --- what the executor and the metrics read ------------------------------------------------------
    def block_table(self, seq_id: int) -> list[int]:
        """A copy of the sequence's block table (CPU block ids while it is swapped out)."""
        return list(self._seqs[seq_id].block_table)

    def seq_state(self, seq_id: int) -> SeqState | None:
        """The manager's own record of a live sequence (None if it holds none): what the fast plane reads, and grows
        as allocate_slots would (docs/ARCHITECTURE.md, "The fast plane")."""
        return self._seqs.get(seq_id)

    def register_blocks(self, seq_id: int) -> None:
        """Register the sequence's newly full blocks of known token ids in the prefix cache, as allocate_slots does
        for the slots it hands out (for the fast plane, which grows tables itself); no-op without a prefix cache."""
        self._register(self._seqs[seq_id])

    def group_tables(self, seq_id: int) -> list[list[int | None]]:
        """One KV cache group (`windows`): its table is the block table."""
        return [self.block_table(seq_id)]

    def num_tokens(self, seq_id: int) -> int:
        return self._seqs[seq_id].num_tokens

    def is_swapped(self, seq_id: int) -> bool:
        return self._seqs[seq_id].swapped

    @property
    def seq_ids(self) -> list[int]:
        return list(self._seqs)

    def prefix_cache_stats(self) -> PrefixCacheStats:
        stats = replace(self._stats)  # a copy
        if self.offload is not None:
            stats.offloaded_blocks = self.offload.stats.offloaded_blocks
            stats.reloaded_blocks = self.offload.stats.reloaded_blocks
        return stats

    # The memory breakdown (after the paper's Figure 2). Every block but a sequence's last is full, so only
    # partly filled last blocks hold empty slots; each empty slot is reservation if some owner will still
    # write it, else internal fragmentation.
    def slot_segments(self) -> list[SlotSegment]:
        """(seq id, first slot, end slot, kind) of every held GPU slot (sim/kv/views.py): the breakdown slot by slot."""
        return paged_slot_segments(self)

    def breakdown(self, waiting: bool = False) -> MemoryBreakdown:
        """The pool in five kinds of slot, exact from each sequence's true final length; shared blocks count once.

        Every block but a sequence's last is full, so only partly filled last blocks hold empty slots. Each
        empty slot of such a block is `reservation` if some owner will still write it (its final length
        reaches that far), else `internal_fragmentation`. Example, block_size 4, 6 tokens, final length 7:

            last block   t4 t5 r  i        2 token_states, 1 reservation, 1 internal_fragmentation

        Swapped-out sequences hold no GPU memory; freed cached blocks count as free. Cost: O(live sequences).
        """
        bs = self.block_size
        partial: dict[int, list[int]] = {}  # partly filled last block -> [filled, reach over its owners]
        for seq in self._seqs.values():
            filled = seq.num_tokens % bs  # NOTE: the loop is hot (the simulator asks every step): kept lean
            if not filled or seq.swapped:
                continue
            reach = seq.final_len - seq.num_tokens + filled  # the final length, counted from the block's start
            reach = filled if reach < filled else (bs if reach > bs else reach)
            entry = partial.get(seq.block_table[-1])
            if entry is None:
                partial[seq.block_table[-1]] = [filled, reach]
            elif reach > entry[1]:
                entry[1] = reach
        empty = sum(bs - filled for filled, _ in partial.values())
        reservation = sum(reach - filled for filled, reach in partial.values())
        result = MemoryBreakdown(
            token_states=self.allocator.num_used_blocks * bs - empty,
            reservation=reservation,
            internal_fragmentation=empty - reservation,
            external_fragmentation=0,  # blocks are all alike: any free block fits any request
            free=self.allocator.num_free_blocks * bs,
        )
        return result.with_waiting() if waiting else result

    # --- invariants ----------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Ref counts equal the owners in every table (GPU and CPU); each table covers exactly its tokens; the breakdown
        equals a slow block-by-block recount (sim/kv/invariants.py)."""
        check_paged_invariants(self)

    def __repr__(self) -> str:
        return (
            f"PagedKVManager(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"seqs={len(self._seqs)}, free_blocks={self.num_free_blocks})"
        )
