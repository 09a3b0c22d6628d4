"""The ref-counted block allocator with one rule broken (tests/notebooks/test_grader.py grades each)."""

from __future__ import annotations


def free_not_all_or_nothing(base):
    class FreeNotAllOrNothing(base):
        def free(self, block_ids):  # checks each block as it goes: free([0, 0]) frees block 0, then raises
            for b in block_ids:
                if self.ref_counts[b] == 0:
                    raise RuntimeError(f"cannot free block {b}: it is free")
                self.ref_counts[b] -= 1
                if self.ref_counts[b] == 0:
                    self.free_blocks.append(b)

    return FreeNotAllOrNothing


def share_not_all_or_nothing(base):
    class ShareNotAllOrNothing(base):
        def share(self, block_ids):  # share([0, 3]) with 3 free: block 0 gains an owner, then it raises
            for b in block_ids:
                if self.ref_counts[b] == 0:
                    raise RuntimeError(f"cannot share block {b}: it is free")
                self.ref_counts[b] += 1

    return ShareNotAllOrNothing


def copy_keeps_writer(base):
    class CopyKeepsWriter(base):
        def copy_on_write(self, block_id):  # hands out a copy but the writer keeps its reference to the shared block
            if self.ref_counts[block_id] == 1:
                return block_id
            fresh = self.allocate(1)
            return None if fresh is None else fresh[0]

    return CopyKeepsWriter


def copy_drops_before_allocating(base):
    class CopyDropsBeforeAllocating(base):
        def copy_on_write(self, block_id):  # drops the writer's reference, then finds no free block
            if self.ref_counts[block_id] == 1:
                return block_id
            self.ref_counts[block_id] -= 1
            fresh = self.allocate(1)
            return None if fresh is None else fresh[0]

    return CopyDropsBeforeAllocating


PLANTED = [
    (
        "free-not-all-or-nothing",
        free_not_all_or_nothing,
        (),
        [
            "free([0, 0]) raised RuntimeError",
            "but changed the allocator: num_free_blocks 1 -> 2; ref counts [1, 1, 0] -> [0, 1, 0]",
            "A refused call must change nothing (all-or-nothing)",
        ],
    ),
    (
        "share-not-all-or-nothing",
        share_not_all_or_nothing,
        ("rule",),
        [
            "share([",
            "raised RuntimeError (cannot share block",
            "but changed the allocator: ref counts",
            "A refused call must change nothing (all-or-nothing)",
        ],
    ),
    (
        "copy-keeps-writer",
        copy_keeps_writer,
        (),
        ["ref_count(0) after copy_on_write(0): the writer dropped its reference: expected 1, found 2"],
    ),
    (
        "copy-drops-before-allocating",
        copy_drops_before_allocating,
        (),
        ["ref_count(0) after copy_on_write(0) returned None: nothing may change: expected 2, found 1"],
    ),
]
