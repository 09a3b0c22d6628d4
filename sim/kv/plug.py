"""A block allocator plugged into the paged manager: a student's own (lab 03, lab 04), checked once.

`PagedKVManager(..., block_allocator=MyAllocator)` runs the paged policy on an allocator the project did not write.
The manager calls only the methods the labs specify (`ALLOCATOR_METHODS`; with prefix caching also
`PREFIX_ALLOCATOR_METHODS`), so `plugged_allocator` checks those once, when the manager is built: a missing method is
one line of TypeError then, not an AttributeError in the middle of a run.
"""
from __future__ import annotations

from typing import Any, Callable

# What the manager calls on its GPU allocator without prefix caching: lab 03's block allocator, exactly.
ALLOCATOR_METHODS = ("num_blocks", "block_size", "num_free_blocks", "num_used_blocks", "can_allocate", "ref_count",
                     "allocate", "share", "free", "copy_on_write", "check_invariants")
# ... and with it: lab 04's cache_block and lookup, and two more (cached_block: a lookup that counts nothing and
# revives nothing; uncache: forget blocks whose K/V will be overwritten, after an abort mid-prompt)
PREFIX_ALLOCATOR_METHODS = ALLOCATOR_METHODS + ("cached_block", "cache_block", "lookup", "uncache")


def plugged_allocator(block_allocator: Callable[[int, int], Any], num_blocks: int, block_size: int,
                      enable_prefix_caching: bool) -> Any:
    """`block_allocator(num_blocks, block_size)`, checked once: its sizes, and every method the manager will call
    (a missing one is one line of TypeError now, not an AttributeError in the middle of a run). Every list it is
    handed is a fresh list (never an iterator), so an allocator may read its argument twice."""
    if not callable(block_allocator):
        raise TypeError(f"block_allocator must be a class or function (num_blocks, block_size) -> an allocator, "
                        f"got {type(block_allocator).__name__}")
    allocator = block_allocator(num_blocks, block_size)
    name = getattr(block_allocator, "__name__", type(allocator).__name__)
    needed = PREFIX_ALLOCATOR_METHODS if enable_prefix_caching else ALLOCATOR_METHODS
    missing = [m for m in needed if not hasattr(allocator, m)]
    if missing:
        why = " (prefix caching is on)" if enable_prefix_caching else ""
        raise TypeError(f"block_allocator {name}: its allocator has no {', '.join(missing)}{why}")
    if (allocator.num_blocks, allocator.block_size) != (num_blocks, block_size):
        raise ValueError(f"block_allocator {name}({num_blocks}, {block_size}) says num_blocks "
                         f"{allocator.num_blocks}, block_size {allocator.block_size}")
    if enable_prefix_caching and not getattr(allocator, "enable_prefix_caching", False):
        raise ValueError(f"block_allocator {name}: prefix caching is on, and its enable_prefix_caching is not True")
    return allocator
