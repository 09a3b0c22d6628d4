"""Solution to lab 12: copy-on-write block tables for beam search (notebooks/exercises/12_beam_cow.ipynb).

vLLM paper, section 4.4: beams share the blocks of their common prefix through their block tables, with reference
counts. A fork copies the TABLE, not the blocks. Before a beam writes into a block it shares (its partly filled last
block), it gets its own copy; a full block is never written again, so it stays shared until every beam drops it.
"""
from __future__ import annotations

from sim.kv.blocks import BlockAllocator


class MyBeamTables:
    def __init__(self, num_blocks: int, block_size: int):
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.block_size = block_size
        self.kv = [[None] * block_size for _ in range(num_blocks)]  # the fake KV store: kv[block][offset] = token
        self.block_tables = {}  # beam id -> its block table (physical block ids)
        self.num_tokens = {}  # beam id -> tokens it holds

    def new_beam(self, beam_id: int) -> None:
        self.block_tables[beam_id] = []
        self.num_tokens[beam_id] = 0

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child points at every block of the parent: one more reference each, nothing copied."""
        table = self.block_tables[parent_id]
        self.allocator.share(table)
        self.block_tables[child_id] = list(table)  # its own list: the tables diverge from here
        self.num_tokens[child_id] = self.num_tokens[parent_id]

    def append_slot(self, beam_id: int, token: int) -> int | None:
        """Write `token` after the beam's last one; the slot written, or None (nothing changed) if no block is free."""
        table, n, bs = self.block_tables[beam_id], self.num_tokens[beam_id], self.block_size
        if n % bs == 0:  # the last block is full (or there is none): open a new one
            fresh = self.allocator.allocate(1)
            if fresh is None:
                return None
            table.append(fresh[0])
        elif self.allocator.ref_count(table[-1]) > 1:  # a shared, partly filled block: copy it first
            copy = self.allocator.copy_on_write(table[-1])
            if copy is None:
                return None
            self.kv[copy][:] = self.kv[table[-1]]
            table[-1] = copy
        self.kv[table[-1]][n % bs] = token
        self.num_tokens[beam_id] = n + 1
        return table[-1] * bs + n % bs

    def free(self, beam_id: int) -> None:
        """Drop the beam: one reference less to each of its blocks."""
        self.allocator.free(self.block_tables.pop(beam_id))
        del self.num_tokens[beam_id]
