"""Swapping (Kwon et al., SOSP 2023, section 4.5): a preempted group's blocks move to CPU memory and come back when GPU
memory allows, keeping the sharing inside the group.

The paged managers (sim/kv/paged.py) decide when a swap fits; the two functions here move the blocks. While a sequence
is swapped out its block table holds CPU block ids. `seqs` is a manager's own record of its live sequences (seq id
-> a record with `block_table` and `swapped`, as sim.kv.paged.SeqState).
"""
from __future__ import annotations

from typing import Sequence

from .base import BlockCopy


def distinct_blocks(seqs: dict, seq_ids: Sequence[int], swapped: bool) -> list[int]:
    """The distinct blocks the group's tables point at, in first-seen order; checks every id's location."""
    seen: dict[int, None] = {}
    for seq_id in seq_ids:
        seq = seqs.get(seq_id)
        if seq is None:
            raise KeyError(f"sequence {seq_id} is not live")
        if seq.swapped != swapped:
            where = {True: "swapped out", False: "on the GPU"}
            raise RuntimeError(f"sequence {seq_id} is {where[seq.swapped]}, expected it {where[swapped]}")
        seen.update(dict.fromkeys(seq.block_table))
    if len(set(seq_ids)) != len(seq_ids):
        raise ValueError(f"duplicate sequence ids {list(seq_ids)}")
    return list(seen)


def move_blocks(seqs: dict, seq_ids: Sequence[int], swapped: bool, src_pool, dst_pool) -> list[BlockCopy] | None:
    """Copy the group's distinct blocks from `src_pool` to `dst_pool` (block allocators; None: no such pool): a swap
    out (`swapped` False: the group is on the GPU) or in (`swapped` True), keeping sharing inside the group: returns (src block, dst block) copies, or None if `dst_pool` is short.

    A block shared inside the group is copied once and stays shared. A block also held by a sequence outside the
    group (a cached prefix, a beam left running) is copied too, and stays behind for its other owners: the group only
    drops its references there.
    NOTE: exception-safe (the scheduler aborts the group if a call raises): each sequence moves whole (its old blocks
    freed, then its table switched), and the new blocks of the sequences not yet moved are given back."""
    blocks = distinct_blocks(seqs, seq_ids, swapped)
    if dst_pool is None:
        return None
    fresh = dst_pool.allocate(len(blocks))
    if fresh is None:
        return None
    mapping = dict(zip(blocks, fresh))
    moving = [seqs[i] for i in seq_ids]
    tables = [[mapping[b] for b in seq.block_table] for seq in moving]
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
        for seq, table in zip(moving, tables):
            src_pool.free(seq.block_table[::-1])
            seq.block_table, seq.swapped = table, not swapped
            moved += 1
    except BaseException:
        dst_pool.free([b for table in tables[moved:] for b in table])
        raise
    return list(mapping.items())
