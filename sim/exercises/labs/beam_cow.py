"""Lab: copy-on-write block tables for beam search (notebook 12), vLLM paper section 4.4.

The student writes the block-TABLE half of beam search over the project's ref-counted allocator (`sim.kv.blocks.
BlockAllocator`): `fork` (a child shares every block of its parent), `append_slot` (copy the last block first if
it is shared and partly filled; open a new block when it is full) and `free`. Tokens go into a fake KV store,
`kv[block][offset]`, so a beam's tokens can be read back through its table.

The oracle is simple and exact: the true token list of every beam, kept beside the student's class, and the
allocator's own accounting (`Beams`, _beam_cow_oracle.py, shared with the random programs of
_beam_cow_machines.py). After every step each beam read back through its table must equal its true tokens,
every block's reference count must equal the number of tables holding it, a full block must never be copied,
and when every beam is freed no block may be left in use.
"""
from __future__ import annotations

from typing import Any, Callable

from ..referee import NO_RULES
from ..registry import Exercise, MachineCheck
from ..report import Story
from ._beam_cow_oracle import Beams

# --- narrated examples ------------------------------------------------------------------------------


def fork_shares_every_block(make, t: Story) -> None:
    """fork: the child points at every block of its parent, and each block gains one owner"""
    b = Beams(make(8, 4), t)
    b.new_beam(0, [10, 11, 12, 13, 14, 15])
    b.fork(0, 1)
    t.say(f"both beams point at {b.obj.block_tables[0]}")


def shared_partial_block_is_copied(make, t: Story) -> None:
    """append into a shared, partly filled last block: copy it first, so the sibling keeps its own tokens"""
    b = Beams(make(8, 4), t)
    b.new_beam(0, [10, 11, 12, 13, 14, 15])
    b.fork(0, 1)
    b.append(1, 20)
    t.say("beam 1 now writes into its own copy of the last block; beam 0 still reads [10 .. 15]")
    b.append(0, 30)
    t.say("beam 0's last block has one owner now: it writes in place, no copy")


def full_shared_block_stays_shared(make, t: Story) -> None:
    """at a block boundary a beam opens a new block: its full shared blocks are never copied"""
    b = Beams(make(8, 4), t)
    b.new_beam(0, [10, 11, 12, 13])
    b.fork(0, 1)
    b.append(1, 20)
    b.append(0, 30)
    t.say("block 0 stays shared by both beams; each beam opened a block of its own")


def out_of_memory_changes_nothing(make, t: Story) -> None:
    """no free block for a copy: append_slot returns None and changes nothing"""
    b = Beams(make(2, 2), t)
    b.new_beam(0, [10, 11, 12])
    b.fork(0, 1)
    b.append(1, 20)
    t.say("both blocks are in use and beam 1's last block is shared")


def pruned_beams_leave_no_block(make, t: Story) -> None:
    """beam search prunes: freeing beams drops their references, and when the last beam goes no block is left in use"""
    b = Beams(make(8, 2), t)
    b.new_beam(0, [10, 11, 12])
    b.fork(0, 1)
    b.fork(0, 2)
    b.append(1, 20)
    b.append(2, 21)
    b.free(0)
    t.say("beam 0 pruned: its blocks live on in beams 1 and 2")
    b.free(1)
    b.free(2)


EXAMPLES = (fork_shares_every_block, shared_partial_block_is_copied, full_shared_block_stays_shared,
            out_of_memory_changes_nothing, pruned_beams_leave_no_block)


def _lazy(**options: Any) -> Callable[[Callable[..., Any], int, int], type]:
    """A machine builder imported only when a check runs (hypothesis is a dev dependency)."""

    def build(make: Callable[..., Any], max_examples: int, steps: int) -> type:
        from ._beam_cow_machines import beam_program_test

        return beam_program_test(make, max_examples, steps, **options)

    return build


EXERCISE = Exercise(
    "copy-on-write block tables for beam search: fork, append a token, free a beam (paper section 4.4)",
    "YourClass(num_blocks, block_size)", "MyBeamTables",
    (4, 2), {"fork": (0, 1), "append_slot": (0, 7), "free": (0,)},
    ("allocator", "block_size", "kv", "block_tables", "num_tokens", "new_beam", "fork", "append_slot", "free"),
    NO_RULES, EXAMPLES,
    (
        MachineCheck("model", "random programs: {n} programs of forks, appends and frees, every beam read back "
                     "through its table", _lazy(), 4.0, "visible"),
        MachineCheck("rule", "beam search: {n} runs of width-k steps (every beam appends, the best fork, the rest are "
                     "pruned)", _lazy(beam_search=True), 3.0, "hidden"),
        MachineCheck("long", "long programs: {n} random programs of 60 steps in bigger pools", _lazy(big=True), 2.0,
                     "hidden", scale=2, steps=60),
    ),
    "12_beam_cow", "beam_cow",
)
