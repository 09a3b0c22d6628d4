"""The paged managers' invariants, checked the slow way: what the tests (and `check_invariants()`) hold them to.

Reference counts equal the owners in every block table (GPU and CPU pools), each table covers exactly its tokens, and
the memory breakdown the manager keeps fast equals a block-by-block recount (`note_fill`, `recounted_breakdown`,
shared with the radix manager's own check).
"""
from __future__ import annotations

from .base import MemoryBreakdown, cdiv


def check_paged_invariants(kv) -> None:
    """Ref counts equal the owners in every table (GPU and CPU); each table covers exactly its tokens;
    the breakdown equals a slow block-by-block recount."""
    kv.allocator.check_invariants()
    if kv.cpu_allocator is not None:
        kv.cpu_allocator.check_invariants()
    if kv.offload is not None:
        kv.offload.check_invariants()
    bs = kv.block_size
    refs: dict[bool, dict[int, int]] = {False: {}, True: {}}
    fill: dict[int, tuple[int, int]] = {}  # GPU block -> (filled slots, slots some owner will reach)
    for seq_id in kv.seq_ids:
        seq = kv.seq_state(seq_id)
        n = cdiv(seq.num_tokens, bs)
        if len(seq.block_table) != n or len(set(seq.block_table)) != n:
            raise RuntimeError(
                f"sequence {seq_id}: expected {n} distinct blocks for "
                f"{seq.num_tokens} tokens, found block table {seq.block_table}"
            )
        for i, b in enumerate(seq.block_table):
            refs[seq.swapped][b] = refs[seq.swapped].get(b, 0) + 1
            if seq.swapped:
                continue
            note_fill(fill, b, seq, i, bs, "block")
    for pool, held, name in ((kv.allocator, refs[False], "GPU"), (kv.cpu_allocator, refs[True], "CPU")):
        size = 0 if pool is None else pool.num_blocks
        for b in set(range(size)) | set(held):
            found = pool.ref_count(b) if b < size else None
            if found != held.get(b, 0):
                raise RuntimeError(f"{name} block {b}: expected ref count {held.get(b, 0)} (owners), found {found}")
    check_breakdown(kv, recounted_breakdown(fill, bs, kv.allocator.num_free_blocks), "block")


def note_fill(fill: dict[int, tuple[int, int]], block: int, seq, i: int, bs: int, word: str) -> None:
    """Record in `fill` (block -> (filled slots, slots some owner will reach)) what logical block `i` of `seq` (its
    num_tokens, final_len) holds in physical `block`; every owner of a shared block must see the same fill."""
    filled = min(bs, seq.num_tokens - i * bs)
    reach = max(filled, min(bs, seq.final_len - i * bs))
    if block in fill and fill[block][0] != filled:
        raise RuntimeError(f"{word} {block}: owners disagree on its fill ({fill[block][0]} vs {filled} tokens)")
    fill[block] = (filled, max(reach, fill.get(block, (0, 0))[1]))


def recounted_breakdown(fill: dict[int, tuple[int, int]], bs: int, num_free_blocks: int) -> MemoryBreakdown:
    """The breakdown a block-by-block recount gives (no external fragmentation: blocks fit anywhere)."""
    return MemoryBreakdown(
        token_states=sum(f for f, _ in fill.values()),
        reservation=sum(r - f for f, r in fill.values()),
        internal_fragmentation=sum(bs - r for _, r in fill.values()),
        external_fragmentation=0,
        free=num_free_blocks * bs,
    )


def check_breakdown(kv, expected: MemoryBreakdown, unit: str) -> None:
    """The breakdown the manager keeps fast against a slow `unit`-by-`unit` recount: RuntimeError naming both if they
    differ. (The paged, radix and hybrid checks compare here: mypyc 2.4.1 compiles `!=` between two instances of a
    Python dataclass inside a compiled module as if they were different, see docs/benchmarks.md.)"""
    found = kv.breakdown()
    if found != expected:
        raise RuntimeError(f"expected breakdown {expected} ({unit} by {unit}), found {found}")
