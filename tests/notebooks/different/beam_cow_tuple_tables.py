"""Lab 12, correct but different: block tables are immutable tuples, so a fork hands the child the parent's
table as it is, and a write builds a new tuple (the spec fixes the tables' contents, not their type)."""

from sim.kv.blocks import BlockAllocator


class MyBeamTables:
    def __init__(self, num_blocks, block_size):
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.block_size = block_size
        self.kv = [[None] * block_size for _ in range(num_blocks)]
        self.block_tables = {}
        self.num_tokens = {}

    def new_beam(self, beam_id):
        self.block_tables[beam_id] = ()
        self.num_tokens[beam_id] = 0

    def fork(self, parent_id, child_id):
        self.allocator.share(list(self.block_tables[parent_id]))
        self.block_tables[child_id] = self.block_tables[parent_id]  # immutable: safe to hand over as it is
        self.num_tokens[child_id] = self.num_tokens[parent_id]

    def append_slot(self, beam_id, token):
        table, n, bs = self.block_tables[beam_id], self.num_tokens[beam_id], self.block_size
        if n % bs == 0:
            fresh = self.allocator.allocate(1)
            if fresh is None:
                return None
            table = table + (fresh[0],)
        elif self.allocator.ref_count(table[-1]) > 1:
            copy = self.allocator.copy_on_write(table[-1])
            if copy is None:
                return None
            self.kv[copy][:] = self.kv[table[-1]]
            table = table[:-1] + (copy,)
        self.kv[table[-1]][n % bs] = token
        self.block_tables[beam_id] = table
        self.num_tokens[beam_id] = n + 1
        return table[-1] * bs + n % bs

    def free(self, beam_id):
        self.allocator.free(list(self.block_tables.pop(beam_id)))
        del self.num_tokens[beam_id]
