"""The beam copy-on-write lab's solution with one rule broken (tests/notebooks/test_grader.py grades each)."""

from __future__ import annotations


def _append(self, beam_id, token, *, copy_when_shared=True, copy_contents=True, copy_full=False):
    """The solution's append_slot with a switch per bug."""
    table, n, bs = self.block_tables[beam_id], self.num_tokens[beam_id], self.block_size
    if copy_full and n % bs == 0 and table and self.allocator.ref_count(table[-1]) > 1:
        copy = self.allocator.copy_on_write(table[-1])  # "the last block is shared": copied though it is full
        if copy is None:
            return None
        self.kv[copy][:] = self.kv[table[-1]]
        table[-1] = copy
    if n % bs == 0:
        fresh = self.allocator.allocate(1)
        if fresh is None:
            return None
        table.append(fresh[0])
    elif copy_when_shared and self.allocator.ref_count(table[-1]) > 1:
        copy = self.allocator.copy_on_write(table[-1])
        if copy is None:
            return None
        if copy_contents:
            self.kv[copy][:] = self.kv[table[-1]]
        table[-1] = copy
    self.kv[table[-1]][n % bs] = token
    self.num_tokens[beam_id] = n + 1
    return table[-1] * bs + n % bs


def writes_into_shared_block(base):
    class WritesIntoSharedBlock(base):
        def append_slot(self, beam_id, token):  # no copy-on-write: the sibling sees the token too
            return _append(self, beam_id, token, copy_when_shared=False)

    return WritesIntoSharedBlock


def copy_forgets_contents(base):
    class CopyForgetsContents(base):
        def append_slot(self, beam_id, token):  # takes a fresh block for the copy but never copies the K/V into it
            return _append(self, beam_id, token, copy_contents=False)

    return CopyForgetsContents


def copies_full_shared_block(base):
    class CopiesFullSharedBlock(base):
        def append_slot(self, beam_id, token):  # copies a shared last block even when it is full
            return _append(self, beam_id, token, copy_full=True)

    return CopiesFullSharedBlock


def fork_shares_the_list(base):
    class ForkSharesTheList(base):
        def fork(self, parent_id, child_id):  # the child gets the parent's very list object, not a copy
            self.allocator.share(self.block_tables[parent_id])
            self.block_tables[child_id] = self.block_tables[parent_id]
            self.num_tokens[child_id] = self.num_tokens[parent_id]

    return ForkSharesTheList


def free_keeps_shared_blocks(base):
    class FreeKeepsSharedBlocks(base):
        def free(self, beam_id):  # drops only the blocks it owns alone: shared ones keep the pruned beam's reference
            table = self.block_tables.pop(beam_id)
            self.allocator.free([b for b in table if self.allocator.ref_count(b) == 1])
            del self.num_tokens[beam_id]

    return FreeKeepsSharedBlocks


def counts_token_before_allocating(base):
    class CountsTokenBeforeAllocating(base):
        def append_slot(self, beam_id, token):  # counts the token first; out of memory at a block boundary keeps it
            n = self.num_tokens[beam_id]
            self.num_tokens[beam_id] = n + 1
            if n % self.block_size == 0 and not self.allocator.can_allocate(1):
                return None
            self.num_tokens[beam_id] = n
            return base.append_slot(self, beam_id, token)

    return CountsTokenBeforeAllocating


PLANTED = [
    (
        "writes-into-shared-block",
        writes_into_shared_block,
        (),
        [
            "copy it first, so the sibling keeps its own tokens",
            "append_slot(1, 20) with 6 tokens (shared last block): "
            "needs a copy of the shared last block; expected 1 block(s) taken, found 0",
        ],
    ),
    (
        "copy-forgets-contents",
        copy_forgets_contents,
        (),
        [
            "after append_slot(1, 20): beam 1 read back through its block table [0, 2]: expected [10, 11, 12, 13, 14, 15, "
            "20], found [10, 11, 12, 13, None, None, 20]"
        ],
    ),
    (
        "copies-full-shared-block",
        copies_full_shared_block,
        (),
        ["its full shared blocks are never copied", "append_slot(1, 20): a full block is never copied or moved"],
    ),
    (
        "fork-shares-the-list",
        fork_shares_the_list,
        (),
        [
            "after append_slot(1, 20): beam 0: expected 4 tokens in 1 block(s), found num_tokens 4 and block table [0, 1]"
        ],
    ),
    (
        "free-keeps-shared-blocks",
        free_keeps_shared_blocks,
        (),
        [
            "when the last beam goes no block is left in use",
            "after free(0): ref_count(",
            "(the block tables holding it)",
        ],
    ),
    (
        "counts-token-before-allocating",
        counts_token_before_allocating,
        ("model",),
        ["random programs", "after the refused append_slot(", "found num_tokens"],
    ),
]
