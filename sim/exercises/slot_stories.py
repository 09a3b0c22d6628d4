"""Narrated examples for the contiguous-memory exercises: first-fit and the buddy system.

Each example is a short story on a tiny slot space, told through `Story` so a failure prints the
steps that led to it. `make(num_slots)` builds the student's allocator. The stories follow the
paper's picture of contiguous KV memory (vLLM paper section 3, Figure 3): runs of consecutive slots,
holes between them, and requests that fail although enough slots are free in total.
"""
from __future__ import annotations

from .report import Story

# --- first-fit -----------------------------------------------------------------------------------


def first_fit_lowest_hole(make, t: Story) -> None:
    """allocations go to the lowest-addressed hole that is long enough"""
    a = make(16)
    starts = [t.do(a, "allocate", n) for n in (4, 2, 2, 2)]
    t.expect("four runs of 4, 2, 2, 2 slots start at", starts, [0, 4, 6, 8])
    t.do(a, "free", 0)
    t.do(a, "free", 6)
    t.say("holes of different sizes: [0, 4) of 4 slots, [6, 8) of 2, [10, 16) of 6")
    t.expect("allocate(2): the lowest hole that fits, not the smallest one ([6, 8), best fit) nor the largest "
             "([10, 16), worst fit)", t.do(a, "allocate", 2), 0)
    t.expect("allocate(4): [2, 4) and [6, 8) are too short, so", t.do(a, "allocate", 4), 10)
    t.expect("free_runs()", a.free_runs(), [(2, 2), (6, 2), (14, 2)])
    t.expect("num_free_slots", a.num_free_slots, 6)
    t.expect("largest_free_run", a.largest_free_run, 2)
    t.expect("allocated_size(0)", a.allocated_size(0), 2)


def first_fit_out_of_memory(make, t: Story) -> None:
    """out of memory is an answer: allocate returns None and changes nothing"""
    a = make(8)
    t.expect("allocate(5)", t.do(a, "allocate", 5), 0)
    t.expect("allocate(4) with 3 slots free", t.do(a, "allocate", 4), None)
    t.expect("free_runs() after the refused allocate", a.free_runs(), [(5, 3)])
    t.expect("num_free_slots", a.num_free_slots, 3)


def first_fit_coalesces(make, t: Story) -> None:
    """free merges a run with free neighbours on both sides"""
    a = make(12)
    first, middle, last = t.do(a, "allocate", 4), t.do(a, "allocate", 4), t.do(a, "allocate", 4)
    t.expect("the three runs start at", [first, middle, last], [0, 4, 8])
    t.do(a, "free", 0)
    t.do(a, "free", 8)
    t.expect("free_runs() with the middle run still used", a.free_runs(), [(0, 4), (8, 4)])
    t.expect("largest_free_run: 8 slots are free, but not in one run", a.largest_free_run, 4)
    t.expect("allocate(6): external fragmentation", t.do(a, "allocate", 6), None)
    t.do(a, "free", 4)
    t.expect("free_runs() after freeing the middle: one run again", a.free_runs(), [(0, 12)])
    t.expect("largest_free_run", a.largest_free_run, 12)


def bad_input_raises(make, t: Story) -> None:
    """allocate(0) raises ValueError; freeing an offset that starts no allocation raises RuntimeError"""
    a = make(8)
    t.raises(ValueError, a, "allocate", 0)
    start = t.do(a, "allocate", 2)
    t.ensure(isinstance(start, int), f"allocate(2) on an empty space: expected a start offset, found {start!r}")
    inside = start + 1  # inside the allocation, but not its start (whichever offset allocate chose)
    err = t.raises(RuntimeError, a, "free", inside)
    t.ensure(str(inside) in str(err), f"the error should name the offset {inside}, found {str(err)!r}")
    t.expect("num_free_slots after the refused free", a.num_free_slots, 6)


# --- buddy ---------------------------------------------------------------------------------------


def buddy_rounds_up(make, t: Story) -> None:
    """a request is rounded up to a power of two; the rest of the space stays in aligned halves"""
    a = make(16)
    t.expect("allocate(3)", t.do(a, "allocate", 3), 0)
    t.expect("allocated_size(0): 3 rounded up to a power of two", a.allocated_size(0), 4)
    t.expect("num_free_slots", a.num_free_slots, 12)
    t.expect("free_runs(): [0, 16) was split into 8 + 4 + 4", a.free_runs(), [(4, 4), (8, 8)])


def buddy_splits_down(make, t: Story) -> None:
    """allocate(1) splits the space in halves until a block of one slot is left"""
    a = make(16)
    t.expect("allocate(1)", t.do(a, "allocate", 1), 0)
    t.expect("free_runs(): one free half of every size", a.free_runs(), [(1, 1), (2, 2), (4, 4), (8, 8)])
    t.expect("largest_free_run", a.largest_free_run, 8)
    t.expect("allocate(2): the free block of 2 slots, no new split", t.do(a, "allocate", 2), 2)


def buddy_merges(make, t: Story) -> None:
    """free merges a block with its buddy while the buddy is free, all the way up"""
    a = make(16)
    left, right = t.do(a, "allocate", 4), t.do(a, "allocate", 4)
    t.expect("the two blocks of 4 start at", [left, right], [0, 4])
    t.do(a, "free", 0)
    t.expect("free_runs(): block 0's buddy (4) is used, so no merge yet", a.free_runs(), [(0, 4), (8, 8)])
    t.do(a, "free", 4)
    t.expect("free_runs(): 0+4 merge into 8, which merges with 8 into 16", a.free_runs(), [(0, 16)])
    t.expect("num_free_slots", a.num_free_slots, 16)


def buddy_neighbours_are_not_buddies(make, t: Story) -> None:
    """two free neighbours that are not buddies do not merge: a request for 8 fails with 8 slots free"""
    a = make(16)
    starts = [t.do(a, "allocate", 4) for _ in range(4)]
    t.expect("four blocks of 4 start at", starts, [0, 4, 8, 12])
    t.do(a, "free", 4)
    t.do(a, "free", 8)
    t.expect("free_runs(): 4 and 8 touch, but 4's buddy is 0 and 8's is 12", a.free_runs(), [(4, 4), (8, 4)])
    t.expect("largest_free_run", a.largest_free_run, 4)
    t.expect("allocate(8) with 8 free slots in two blocks", t.do(a, "allocate", 8), None)


def buddy_lowest_block_first(make, t: Story) -> None:
    """allocate takes the lowest-addressed free block of the smallest order that fits, at a multiple of its size"""
    a = make(16)
    starts = [t.do(a, "allocate", 4) for _ in range(4)]
    t.expect("four blocks of 4 start at", starts, [0, 4, 8, 12])
    t.do(a, "free", 12)
    t.do(a, "free", 4)
    t.say("free blocks of 4 slots at 4 and 12; none smaller, none larger")
    t.expect("allocate(2): the lower one, split into 4 + 6", t.do(a, "allocate", 2), 4)
    t.expect("free_runs()", a.free_runs(), [(6, 2), (12, 4)])
    t.expect("allocate(1): the block of 2 at 6 is the smallest that fits, so", t.do(a, "allocate", 1), 6)
    for start in (0, 4, 6, 8):
        size = a.allocated_size(start)
        t.ensure(start % size == 0, f"allocated_size({start}) is {size}: a block of {size} slots must start at a "
                 f"multiple of {size}")


def buddy_out_of_memory(make, t: Story) -> None:
    """allocate(5) takes the whole space of 8 (rounded up to 8); then even allocate(1) is refused"""
    a = make(8)
    t.expect("allocate(5)", t.do(a, "allocate", 5), 0)
    t.expect("allocated_size(0)", a.allocated_size(0), 8)
    t.expect("allocate(1) with nothing free", t.do(a, "allocate", 1), None)
    t.expect("free_runs()", a.free_runs(), [])
    t.expect("largest_free_run", a.largest_free_run, 0)


FIRST_FIT_EXAMPLES = (first_fit_lowest_hole, first_fit_out_of_memory, first_fit_coalesces, bad_input_raises)
BUDDY_EXAMPLES = (buddy_rounds_up, buddy_splits_down, buddy_merges, buddy_neighbours_are_not_buddies,
                  buddy_lowest_block_first, buddy_out_of_memory, bad_input_raises)
