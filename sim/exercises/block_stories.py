"""Narrated examples for the block-allocator exercises: reference counts, copy-on-write, the prefix cache.

Each example is a short story on a pool of a few blocks, told through `Story` so a failure prints the
steps that led to it. `make(num_blocks, block_size)` builds the student's allocator. The stories follow
the paper: blocks and block tables (vLLM paper section 4.2), sharing by reference counts and
copy-on-write for parallel sampling and beam search (4.4), and vLLM's automatic prefix caching, whose
freed cached blocks are evicted last, least recently freed first (freed uncached blocks are reused first).
"""
from __future__ import annotations

from .report import Story

# --- reference counts and copy-on-write ----------------------------------------------------------


def allocate_distinct_blocks(make, t: Story) -> None:
    """allocate hands out distinct free blocks, each with one owner"""
    a = make(4, 16)
    t.expect("num_free_blocks of a new pool", a.num_free_blocks, 4)
    table = t.blocks(a, 3)
    t.ensure(all(0 <= b < 4 for b in table), f"block ids must lie in 0..3, found {table}")
    t.expect("ref counts of the new blocks", [a.ref_count(b) for b in table], [1, 1, 1])
    t.expect("num_free_blocks", a.num_free_blocks, 1)
    t.expect("num_used_blocks", a.num_used_blocks, 3)


def out_of_memory_changes_nothing(make, t: Story) -> None:
    """out of memory is an answer: allocate returns None and changes nothing"""
    a = make(3, 16)
    t.blocks(a, 2)
    t.expect("can_allocate(2) with 1 block free", a.can_allocate(2), False)
    t.expect("can_allocate(1)", a.can_allocate(1), True)
    t.expect("allocate(2) with 1 block free", t.do(a, "allocate", 2), None)
    t.expect("num_free_blocks after the refused allocate", a.num_free_blocks, 1)


def share_and_free_count_owners(make, t: Story) -> None:
    """parallel sampling: two sequences share a prompt's blocks; a block is free only when both let go"""
    a = make(4, 16)
    table = t.blocks(a, 2)
    t.do(a, "share", table)
    t.say(f"fork: both sequences now point at blocks {table}")
    t.expect(f"ref counts of {table} after share", [a.ref_count(b) for b in table], [2, 2])
    t.expect("num_free_blocks: sharing takes no new block", a.num_free_blocks, 2)
    t.do(a, "free", table)
    t.expect(f"ref counts of {table} after one owner frees", [a.ref_count(b) for b in table], [1, 1])
    t.expect("num_free_blocks: the other owner still holds them", a.num_free_blocks, 2)
    t.do(a, "free", table)
    t.expect(f"ref counts of {table} after the last owner frees", [a.ref_count(b) for b in table], [0, 0])
    t.expect("num_free_blocks", a.num_free_blocks, 4)


def copy_on_write_shared(make, t: Story) -> None:
    """copy-on-write: the first writer into a shared block gets its own copy; an exclusive block is written in place"""
    a = make(4, 16)
    [block] = t.blocks(a, 1)
    t.do(a, "share", [block])
    fresh = t.do(a, "copy_on_write", block)
    t.ensure(fresh is not None and fresh != block, f"copy_on_write({block}) of a shared block: expected a new block, "
             f"found {fresh!r}")
    t.expect(f"ref_count({block}) after copy_on_write({block}): the writer dropped its reference",
             a.ref_count(block), 1)
    t.expect(f"ref_count({fresh}): the writer's copy", a.ref_count(fresh), 1)
    t.expect("num_free_blocks", a.num_free_blocks, 2)
    t.expect(f"copy_on_write({block}) now that one owner is left", t.do(a, "copy_on_write", block), block)
    t.expect(f"ref_count({block})", a.ref_count(block), 1)


def copy_on_write_out_of_memory(make, t: Story) -> None:
    """copy-on-write with no free block returns None and changes nothing"""
    a = make(1, 16)
    [block] = t.blocks(a, 1)
    t.do(a, "share", [block])
    t.expect(f"copy_on_write({block}) with no free block", t.do(a, "copy_on_write", block), None)
    t.expect(f"ref_count({block}) after copy_on_write({block}) returned None: nothing may change",
             a.ref_count(block), 2)


def misuse_raises(make, t: Story) -> None:
    """freeing a free block raises RuntimeError; one call may free a block twice if it has two owners"""
    a = make(2, 16)
    t.raises(RuntimeError, a, "free", [0])
    t.raises(Exception, a, "share", [0])
    t.expect("num_free_blocks after the refused calls", a.num_free_blocks, 2)
    [block] = t.blocks(a, 1)
    t.do(a, "share", [block])
    t.do(a, "free", [block, block])
    t.expect(f"ref_count({block}) after free([{block}, {block}])", a.ref_count(block), 0)
    t.expect("num_free_blocks", a.num_free_blocks, 2)


def refused_free_changes_nothing(make, t: Story) -> None:
    """a refused free changes nothing: free([b, b]) on a block with one owner raises and b keeps its owner"""
    a = make(3, 16)
    first, second = t.blocks(a, 2)
    # NOTE: which blocks allocate hands out is the allocator's choice (lowest id first, last freed first ...):
    # the free block named below is the one it did NOT hand out, whatever ids it chose.
    [free] = [b for b in range(3) if b not in (first, second)]
    t.raises(RuntimeError, a, "free", [first, first])
    t.expect(f"ref_count({first}) after the refused free", a.ref_count(first), 1)
    t.raises(RuntimeError, a, "free", [second, free])
    t.say(f"block {free} is free, so the whole call is refused before anything changes")
    t.expect(f"ref_count({second}) after the refused free", a.ref_count(second), 1)
    t.expect("num_free_blocks after the refused calls", a.num_free_blocks, 1)


# --- prefix caching ------------------------------------------------------------------------------


def lookup_finds_cached_block(make, t: Story) -> None:
    """a cached block is found by its hash, and each hit adds an owner"""
    a = make(4, 16)
    [block] = t.blocks(a, 1)
    t.do(a, "cache_block", block, 111)
    t.expect(f"is_cached({block})", a.is_cached(block), True)
    t.expect("lookup(111): a hit", t.do(a, "lookup", 111), block)
    t.expect(f"ref_count({block}) after the hit lookup(111): the new prompt now shares it", a.ref_count(block), 2)
    t.expect("lookup(222): a miss", t.do(a, "lookup", 222), None)
    t.expect("(num_prefix_hits, num_prefix_misses)", (a.num_prefix_hits, a.num_prefix_misses), (1, 1))


def freed_cached_block_survives(make, t: Story) -> None:
    """a freed cached block keeps its K/V: it counts as free, yet a lookup revives it"""
    a = make(2, 16)
    [block] = t.blocks(a, 1)
    t.do(a, "cache_block", block, 7)
    t.do(a, "free", [block])
    t.expect("num_free_blocks: a freed cached block is free", a.num_free_blocks, 2)
    t.expect(f"is_cached({block}) after free", a.is_cached(block), True)
    t.expect("lookup(7)", t.do(a, "lookup", 7), block)
    t.expect(f"ref_count({block}) after the revival", a.ref_count(block), 1)
    t.expect("num_free_blocks after lookup(7): the revived block left the free queue", a.num_free_blocks, 1)


def never_used_blocks_go_first(make, t: Story) -> None:
    """allocate takes never-used blocks before a freed cached one, so the cache lives as long as it can"""
    a = make(3, 16)
    [block] = t.blocks(a, 1)
    t.do(a, "cache_block", block, 5)
    t.do(a, "free", [block])
    other = t.blocks(a, 1)
    t.ensure(block not in other, f"allocate(1): expected a never-used block, not the cached {block}; found {other}")
    t.expect("lookup(5): still cached", t.do(a, "lookup", 5), block)


def lru_eviction(make, t: Story) -> None:
    """when the pool is short, allocate evicts the least recently freed cached block and drops its hash"""
    a = make(3, 16)
    x, y, z = t.blocks(a, 3)
    for block, block_hash in ((x, 1), (y, 2), (z, 3)):
        t.do(a, "cache_block", block, block_hash)
    t.do(a, "free", [y])
    t.do(a, "free", [x])
    t.do(a, "free", [z])
    t.say(f"freed in the order {y}, {x}, {z}: {y} is the least recently freed")
    t.expect("allocate(1)", t.blocks(a, 1), [y])
    t.expect(f"is_cached({y}) after it was handed out again", a.is_cached(y), False)
    t.expect("lookup(2): its hash was evicted", t.do(a, "lookup", 2), None)
    t.expect(f"lookup(1): block {x} is still cached", t.do(a, "lookup", 1), x)
    t.expect("allocate(1): the only free block left", t.blocks(a, 1), [z])
    t.expect("lookup(3): evicted too", t.do(a, "lookup", 3), None)


def a_hash_names_both_copies(make, t: Story) -> None:
    """a prefix computed twice stays cached twice under one hash (as in vLLM v1); a lookup finds the first"""
    a = make(4, 16)
    first, second = t.blocks(a, 2)
    t.do(a, "cache_block", first, 9)
    t.do(a, "cache_block", second, 9)
    t.expect("lookup(9)", t.do(a, "lookup", 9), first)
    t.expect(f"is_cached({second})", a.is_cached(second), True)


def freed_uncached_blocks_go_first(make, t: Story) -> None:
    """a freed block holding no cached prefix is reused first: free puts it at the front of the queue"""
    a = make(4, 16)
    x, y = t.blocks(a, 2)
    t.do(a, "free", [y, x])
    t.say(f"freed {y} then {x}, neither cached: both go to the front, {y} first")
    t.expect("allocate(2)", t.blocks(a, 2), [y, x])


BLOCK_ALLOCATOR_EXAMPLES = (allocate_distinct_blocks, out_of_memory_changes_nothing, share_and_free_count_owners,
                            copy_on_write_shared, copy_on_write_out_of_memory, misuse_raises,
                            refused_free_changes_nothing)
PREFIX_CACHE_EXAMPLES = (lookup_finds_cached_block, freed_cached_block_survives, never_used_blocks_go_first,
                         lru_eviction, a_hash_names_both_copies, freed_uncached_blocks_go_first)
