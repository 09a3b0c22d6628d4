"""The paged KV manager: vLLM's block tables over a shared pool of fixed-size blocks.

Kwon et al., SOSP 2023: section 4.2 (blocks allocated on demand, a block table per sequence),
4.4 (parallel sampling and beam search share blocks by reference count, copy-on-write on the first
write into a shared block; prefix sharing), 4.5 (preemption by swapping blocks to CPU memory).
Prefix caching follows vLLM's automatic prefix caching (full blocks only, named by a chained hash).

A sequence with `num_tokens` tokens holds ceil(num_tokens / block_size) blocks; only its last block
may be partly filled. For block_size 4 and 6 tokens:

    logical block     0                1
    block_table      [7,               3]
    slots            t0 t1 t2 t3  |  t4 t5 .  .        the two empty slots of block 3 are the only
                                                       memory this sequence holds beyond its tokens

Every `admit`/`append_slots`/`swap_*` is all-or-nothing: on out-of-memory it returns None and changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..blocks import BlockAllocator, hash_block_tokens
from .base import BlockCopy, MemoryBreakdown


@dataclass(slots=True)
class _SeqState:
    block_table: list[int]  # GPU block ids, or CPU block ids while swapped out
    num_tokens: int  # tokens whose K/V the sequence holds (or will hold after the current step)
    final_len: int  # the sequence's true final length, prompt + output (for the memory breakdown)
    swapped: bool = False


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class PagedKVManager:
    """Block tables for sequences named by integer ids, over a GPU `BlockAllocator` (+ optional CPU swap space)."""

    policy = "paged"

    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False, num_cpu_blocks: int = 0
    ) -> None:
        if num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_cpu_blocks}")
        self.allocator = BlockAllocator(num_blocks, block_size, enable_prefix_caching)
        self.cpu_allocator = BlockAllocator(num_cpu_blocks, block_size) if num_cpu_blocks else None
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self._seqs: dict[int, _SeqState] = {}

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    # --- admission --------------------------------------------------------------------------------
    def _plan_admission(self, prompt_len: int, prompt_token_ids: Sequence[int] | None) -> tuple[list[int], int, int]:
        """(hashes of the full prompt blocks, leading cache hits, blocks the admission takes from the free queue).

        NOTE: like vLLM, only blocks lying wholly inside the first prompt_len - 1 tokens may hit, so the last
        prompt token is always recomputed (the step needs its logits) and never written into a shared block.
        """
        num_prompt_blocks = _cdiv(prompt_len, self.block_size)
        if not self.enable_prefix_caching or prompt_token_ids is None:
            return [], 0, num_prompt_blocks
        hashes, parent = [], None
        for i in range(prompt_len // self.block_size):
            parent = hash_block_tokens(parent, prompt_token_ids[i * self.block_size : (i + 1) * self.block_size])
            hashes.append(parent)
        num_hits, revived = 0, 0
        for block_hash in hashes[: (prompt_len - 1) // self.block_size]:
            block_id = self.allocator.cached_block(block_hash)
            if block_id is None:
                break
            num_hits += 1
            revived += self.allocator.ref_count(block_id) == 0  # a freed cached block leaves the free queue
        return hashes, num_hits, num_prompt_blocks - num_hits + revived

    def _check_group(self, prompt_len: int, final_lens: Sequence[int], prompt_token_ids: Sequence[int] | None) -> None:
        if prompt_len < 1:
            raise ValueError(f"prompt_len must be >= 1, got {prompt_len}")
        if not final_lens or min(final_lens) < prompt_len:
            raise ValueError(
                f"final_lens must be non-empty and each >= prompt_len {prompt_len}, got {list(final_lens)}"
            )
        if prompt_token_ids is not None and len(prompt_token_ids) != prompt_len:
            raise ValueError(f"expected {prompt_len} prompt_token_ids, got {len(prompt_token_ids)}")

    def can_admit(
        self, prompt_len: int, final_lens: Sequence[int], prompt_token_ids: Sequence[int] | None = None
    ) -> bool:
        self._check_group(prompt_len, final_lens, prompt_token_ids)
        return self.allocator.can_allocate(self._plan_admission(prompt_len, prompt_token_ids)[2])

    def admit(
        self,
        seq_ids: Sequence[int],
        prompt_len: int,
        final_lens: Sequence[int],
        prompt_token_ids: Sequence[int] | None = None,
    ) -> int | None:
        """Give the group one set of prompt blocks, shared by all its sequences (paper 4.4, parallel sampling).

        Returns the prompt tokens whose K/V is already cached (always <= prompt_len - 1), or None if out of memory.
        """
        self._check_group(prompt_len, final_lens, prompt_token_ids)
        if len(seq_ids) != len(final_lens) or len(set(seq_ids)) != len(seq_ids):
            raise ValueError(
                f"expected one final_len per distinct seq id, got ids {list(seq_ids)}, final_lens {list(final_lens)}"
            )
        for seq_id in seq_ids:
            if seq_id in self._seqs:
                raise ValueError(f"sequence {seq_id} is already live")
        hashes, num_hits, num_needed = self._plan_admission(prompt_len, prompt_token_ids)
        if not self.allocator.can_allocate(num_needed):
            return None
        # Hits first: reviving a freed cached block must happen before allocate() could evict it.
        table = [self.allocator.lookup(block_hash) for block_hash in hashes[:num_hits]]
        if num_hits < min(len(hashes), (prompt_len - 1) // self.block_size):
            self.allocator.lookup(hashes[num_hits])  # the first miss, counted; it returns None
        table += self.allocator.allocate(_cdiv(prompt_len, self.block_size) - num_hits)
        # NOTE: the new full prompt blocks are registered now, at admission, because the admitting step
        # computes the whole prompt's K/V; a later request in the same step could already hit them.
        for i in range(num_hits, len(hashes)):
            self.allocator.cache_block(table[i], hashes[i])
        for _ in range(len(seq_ids) - 1):
            self.allocator.share(table)
        for seq_id, final_len in zip(seq_ids, final_lens):
            self._seqs[seq_id] = _SeqState(list(table), prompt_len, final_len)
        return num_hits * self.block_size

    # --- growth, sharing, release -----------------------------------------------------------------
    def _blocks_for_append(self, seq: _SeqState, num_tokens: int) -> tuple[bool, int]:
        """(must the last block be copied first, new blocks to allocate) for appending `num_tokens`."""
        n, bs = seq.num_tokens, self.block_size
        copy = n % bs != 0 and num_tokens > 0 and self.allocator.ref_count(seq.block_table[-1]) > 1
        return copy, -(-(n + num_tokens) // bs) - len(seq.block_table)

    def _gpu_seq(self, seq_id: int) -> _SeqState:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise KeyError(f"sequence {seq_id} is not live")
        if seq.swapped:
            raise RuntimeError(f"sequence {seq_id} is swapped out; swap it in first")
        return seq

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        copy, new = self._blocks_for_append(self._gpu_seq(seq_id), num_tokens)
        return self.allocator.can_allocate(copy + new)

    def append_slots(self, seq_id: int, num_tokens: int = 1) -> list[BlockCopy] | None:
        """Room for `num_tokens` more tokens: the same end state as `num_tokens` appends of one token.

            before (block_size 4, 6 tokens, block 3 shared with a sibling):   [7, 3]   t4 t5 . .
            append 3:  copy-on-write 3 -> 9 (returned as (3, 9)), then a new block 5:  [7, 9, 5]  t4 t5 t6 t7 | t8 . . .

        Only the first write can hit a shared block: after the copy the last block is exclusive, and
        blocks allocated for later tokens are new. So one copy at most, then plain allocation.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        seq = self._gpu_seq(seq_id)
        copy, new = self._blocks_for_append(seq, num_tokens)
        if not (copy or new):  # the common case: the tokens fit the last block, which is this sequence's alone
            seq.num_tokens += num_tokens
            return []
        if not self.allocator.can_allocate(copy + new):
            return None
        copies: list[BlockCopy] = []
        if copy:
            src = seq.block_table[-1]
            dst = self.allocator.copy_on_write(src)
            seq.block_table[-1] = dst
            copies.append((src, dst))
        seq.block_table += self.allocator.allocate(new)
        seq.num_tokens += num_tokens
        return copies

    def append_decode_steps(self, seq_ids: Sequence[int], num_steps: int) -> list[BlockCopy] | None:
        """`num_steps` decode steps at once, each appending one token to every sequence in `seq_ids` order: the
        same end state and block ids as that many rounds of append_slots(i, 1). Returns [] (no copies), or None
        with nothing changed if memory is short; a shared partly filled last block (a copy) raises.

        A sequence whose last block has r empty slots opens blocks at steps r + 1, r + 1 + B, ... Ordered by
        (step, position), the openings go round after round through the sequences sorted by (r, position), so
        with the fresh blocks taken from the free queue at once, the p-th of that order gets blocks p, p + S, ...

            B = 4, 6 steps, a (r = 2) then b (r = 0):  order b, a;  fresh [5, 9, 2]
            b opens at steps 1 and 5 -> +[5, 2];  a at step 3 -> +[9]
        """
        if num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {num_steps}")
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"duplicate sequence ids {list(seq_ids)}")
        seqs, bs = [self._gpu_seq(i) for i in seq_ids], self.block_size
        new = [-(-(s.num_tokens + num_steps) // bs) - len(s.block_table) for s in seqs]
        for seq_id, seq in zip(seq_ids, seqs):
            if num_steps and seq.num_tokens % bs and self.allocator.ref_count(seq.block_table[-1]) > 1:
                raise RuntimeError(f"sequence {seq_id}: expected an exclusive last block (no copy), found it shared")
        fresh = self.allocator.allocate(sum(new))
        if fresh is None:
            return None
        order = sorted(range(len(seqs)), key=lambda j: -seqs[j].num_tokens % bs)  # stable: ties keep position
        for p, j in enumerate(order):
            seqs[j].block_table += fresh[p :: len(seqs)]
            seqs[j].num_tokens += num_steps
        return []

    def fork(self, parent_id: int, child_id: int, final_len: int) -> list[BlockCopy] | None:
        """The child points at every block of the parent (one more reference each); nothing is copied yet."""
        parent = self._gpu_seq(parent_id)
        if child_id in self._seqs:
            raise ValueError(f"sequence {child_id} is already live")
        self.allocator.share(parent.block_table)
        self._seqs[child_id] = _SeqState(list(parent.block_table), parent.num_tokens, final_len)
        return []

    def free(self, seq_id: int) -> None:
        """Drop the sequence's references. NOTE: tail blocks first, as vLLM does: they go to the front of the
        free queue and are evicted first, while the prompt's head blocks (the most shareable) stay cached longest."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            raise KeyError(f"sequence {seq_id} is not live")
        allocator = self.cpu_allocator if seq.swapped else self.allocator
        allocator.free(reversed(seq.block_table))

    def block_table(self, seq_id: int) -> list[int]:
        """A copy of the sequence's block table (CPU block ids while it is swapped out)."""
        return list(self._seqs[seq_id].block_table)

    def num_tokens(self, seq_id: int) -> int:
        return self._seqs[seq_id].num_tokens

    def is_swapped(self, seq_id: int) -> bool:
        return self._seqs[seq_id].swapped

    @property
    def seq_ids(self) -> list[int]:
        return list(self._seqs)

    # --- swapping (paper 4.5) -----------------------------------------------------------------------
    def _distinct_blocks(self, seq_ids: Sequence[int], swapped: bool) -> list[int]:
        """The distinct blocks the group's tables point at, in first-seen order; checks every id's location."""
        seen: dict[int, None] = {}
        for seq_id in seq_ids:
            seq = self._seqs.get(seq_id)
            if seq is None:
                raise KeyError(f"sequence {seq_id} is not live")
            if seq.swapped != swapped:
                where = {True: "swapped out", False: "on the GPU"}
                raise RuntimeError(f"sequence {seq_id} is {where[seq.swapped]}, expected it {where[swapped]}")
            seen.update(dict.fromkeys(seq.block_table))
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"duplicate sequence ids {list(seq_ids)}")
        return list(seen)

    def can_swap_out(self, seq_ids: Sequence[int]) -> bool:
        blocks = self._distinct_blocks(seq_ids, swapped=False)
        return self.cpu_allocator is not None and self.cpu_allocator.can_allocate(len(blocks))

    def swap_out(self, seq_ids: Sequence[int]) -> list[BlockCopy] | None:
        """Move the group's blocks to CPU memory: returns (gpu_block, cpu_block) copies, or None if CPU memory is short.

        A block shared inside the group is copied once and stays shared on the CPU. A block also held by a
        sequence outside the group (a cached prefix, a beam left running) is copied too, and stays on the GPU
        for its other owners: the group only drops its references there.
        """
        return self._move(seq_ids, swapped=False)

    def can_swap_in(self, seq_ids: Sequence[int]) -> bool:
        return self.allocator.can_allocate(len(self._distinct_blocks(seq_ids, swapped=True)))

    def swap_in(self, seq_ids: Sequence[int]) -> list[BlockCopy] | None:
        """Bring a swapped group back: returns (cpu_block, gpu_block) copies, or None if GPU memory is short.

        NOTE: blocks come back as fresh GPU blocks, not re-registered in the prefix cache (a simplification).
        """
        return self._move(seq_ids, swapped=True)

    def _move(self, seq_ids: Sequence[int], swapped: bool) -> list[BlockCopy] | None:
        """Copy the group's distinct blocks from one pool to the other, keeping sharing inside the group."""
        src_pool, dst_pool = (self.cpu_allocator, self.allocator) if swapped else (self.allocator, self.cpu_allocator)
        blocks = self._distinct_blocks(seq_ids, swapped)
        if dst_pool is None:
            return None
        fresh = dst_pool.allocate(len(blocks))
        if fresh is None:
            return None
        mapping = dict(zip(blocks, fresh))
        # Each dst block came with one reference; a block shared by k group members needs k - 1 more.
        extra_refs: list[int] = []
        seen: set[int] = set()
        for seq_id in seq_ids:
            seq = self._seqs[seq_id]
            src_pool.free(reversed(seq.block_table))
            seq.block_table = [mapping[b] for b in seq.block_table]
            seq.swapped = not swapped
            extra_refs += [b for b in seq.block_table if b in seen]
            seen.update(seq.block_table)
        dst_pool.share(extra_refs)
        return list(mapping.items())

    # --- accounting -----------------------------------------------------------------------------------
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

    def check_invariants(self) -> None:
        """Raise RuntimeError (expected vs found) unless ref counts equal the references the block tables hold,
        every table is as long as its tokens need, owners of a shared block agree on its fill, and the
        fast `breakdown` equals a block-by-block recount."""
        self.allocator.check_invariants()
        if self.cpu_allocator is not None:
            self.cpu_allocator.check_invariants()
        bs = self.block_size
        refs: dict[bool, dict[int, int]] = {False: {}, True: {}}  # swapped? -> block -> references
        fill: dict[int, tuple[int, int]] = {}  # GPU block -> (filled, reach)
        for seq_id, seq in self._seqs.items():
            n = len(seq.block_table)
            if not (n - 1) * bs < seq.num_tokens <= n * bs or len(set(seq.block_table)) != n:
                raise RuntimeError(
                    f"sequence {seq_id}: expected {_cdiv(seq.num_tokens, bs)} distinct blocks for "
                    f"{seq.num_tokens} tokens, found block table {seq.block_table}"
                )
            for i, b in enumerate(seq.block_table):
                refs[seq.swapped][b] = refs[seq.swapped].get(b, 0) + 1
                if seq.swapped:
                    continue
                filled = min(bs, seq.num_tokens - i * bs)
                reach = max(filled, min(bs, seq.final_len - i * bs))
                if b in fill and fill[b][0] != filled:
                    raise RuntimeError(f"block {b}: owners disagree on its fill ({fill[b][0]} vs {filled} tokens)")
                fill[b] = (filled, max(reach, fill.get(b, (0, 0))[1]))
        for pool, held, name in ((self.allocator, refs[False], "GPU"), (self.cpu_allocator, refs[True], "CPU")):
            size = 0 if pool is None else pool.num_blocks
            for b in set(range(size)) | set(held):
                found = pool.ref_count(b) if b < size else None
                if found != held.get(b, 0):
                    raise RuntimeError(f"{name} block {b}: expected ref count {held.get(b, 0)} (owners), found {found}")
        expected = MemoryBreakdown(
            token_states=sum(f for f, _ in fill.values()),
            reservation=sum(r - f for f, r in fill.values()),
            internal_fragmentation=sum(bs - r for _, r in fill.values()),
            external_fragmentation=0,
            free=self.allocator.num_free_blocks * bs,
        )
        if self.breakdown() != expected:
            raise RuntimeError(f"expected breakdown {expected} (block by block), found {self.breakdown()}")

    def __repr__(self) -> str:
        return (
            f"PagedKVManager(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"seqs={len(self._seqs)}, free_blocks={self.num_free_blocks})"
        )
