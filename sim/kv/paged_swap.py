"""Swapping for the paged KV manager (Kwon et al., SOSP 2023, section 4.5): a preempted group's blocks move to
CPU memory and come back when GPU memory allows, keeping the sharing inside the group.

A mixin of `PagedKVManager` (sim/kv/paged.py), which owns the state it reads: `self._seqs` (seq id -> its
block table, token count, `swapped` flag), `self.allocator` (GPU blocks), `self.cpu_allocator` (CPU blocks or
None) and `self.watermark_blocks`. While a sequence is swapped out its block table holds CPU block ids.
"""
from __future__ import annotations

from typing import Sequence

from .base import BlockCopy


class PagedSwapSpace:
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

    def can_swap_in(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int]) -> bool:
        """Room for the group's blocks AND the growth that follows, leaving the watermark free (vLLM v0's
        can_swap_in reserves one block per sequence; here the need is exact). Sharing inside the group
        survives a swap, so the CPU tables and reference counts tell the growth."""
        blocks = self._distinct_blocks(seq_ids, swapped=True)
        seqs = [self._seqs[i] for i in seq_ids]
        grow = self._growth([(s.block_table, s.num_tokens) for s in seqs], num_new_tokens, self.cpu_allocator.ref_count)
        return len(blocks) + grow + self.watermark_blocks <= self.allocator.num_free_blocks

    def swap_in(self, seq_ids: Sequence[int]) -> list[BlockCopy] | None:
        """Bring a swapped group back: returns (cpu_block, gpu_block) copies, or None if GPU memory is short.

        NOTE: blocks come back as fresh GPU blocks, not re-registered in the prefix cache (a simplification).
        """
        return self._move(seq_ids, swapped=True)

    def _move(self, seq_ids: Sequence[int], swapped: bool) -> list[BlockCopy] | None:
        """Copy the group's distinct blocks from one pool to the other, keeping sharing inside the group.

        NOTE: exception-safe (the scheduler aborts the group if a call raises): each sequence moves whole (its old
        blocks freed, then its table switched), and the new blocks of the sequences not yet moved are given back."""
        src_pool, dst_pool = (self.cpu_allocator, self.allocator) if swapped else (self.allocator, self.cpu_allocator)
        blocks = self._distinct_blocks(seq_ids, swapped)
        if dst_pool is None:
            return None
        fresh = dst_pool.allocate(len(blocks))
        if fresh is None:
            return None
        mapping = dict(zip(blocks, fresh))
        seqs = [self._seqs[i] for i in seq_ids]
        tables = [[mapping[b] for b in seq.block_table] for seq in seqs]
        # Each dst block came with one reference; a block shared by k group members needs k - 1 more.
        extra_refs: list[int] = []
        seen: set[int] = set()
        for table in tables:
            extra_refs += [b for b in table if b in seen]
            seen.update(table)
        try:
            dst_pool.share(extra_refs)
        except BaseException:
            dst_pool.free(fresh)
            raise
        moved = 0
        try:
            for seq, table in zip(seqs, tables):
                src_pool.free(reversed(seq.block_table))
                seq.block_table, seq.swapped = table, not swapped
                moved += 1
        except BaseException:
            dst_pool.free([b for table in tables[moved:] for b in table])
            raise
        return list(mapping.items())
