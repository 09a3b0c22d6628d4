"""Lab: the memory breakdown of a KV pool, the five shares of the vLLM paper's Figure 2 (notebook 05).

The student computes, from a pool's state alone, how many token slots are `token_states`, `reservation`,
`internal_fragmentation`, `external_fragmentation` and `free` (sim/kv/base.py defines them): for a paged pool
(block tables, token counts and true final lengths; a block shared by a fork counts once) and for a contiguous
pool of the paper's Orca baselines (the `max` / `pow2` / `oracle` reservation rules over a buddy allocator).

The oracle is the project's own accounting: every pool state is BUILT by driving the project's KV managers
(`PagedKVManager`, `ContiguousKVManager`) through admissions, growth, forks and frees; the state they end in is
handed to the student, and the answer must equal the manager's own `breakdown()` (_memory_accounting_oracle.py,
shared with the random programs of _memory_accounting_machines.py).
"""
from __future__ import annotations

from typing import Any, Callable

from ..referee import NO_RULES
from ..registry import Exercise, MachineCheck
from ..report import Story
from ._memory_accounting_oracle import ContiguousPool, PagedPool, compare, expected

RULES = ("max", "pow2", "oracle")


def ask(t: Story, student: Any, method: str, pool: PagedPool | ContiguousPool, waiting: bool = False,
        hint: str = "") -> None:
    """Ask the student for the pool's breakdown and compare it with the manager's; `hint` follows a mismatch."""
    found = t.do(student, method, *pool.args(waiting))
    problem = compare(f"{method}() {'while a request waits' if waiting else 'with nothing waiting'}", found,
                      expected(pool, waiting))
    t.ensure(problem is None, f"{problem}{' (' + hint + ')' if hint else ''}")


# --- narrated examples ------------------------------------------------------------------------------


def paged_last_block(make, t: Story) -> None:
    """paged: only a sequence's last block has empty slots: reservation up to its final length, internal frag. after"""
    pool = PagedPool(4, 4)
    pool.admit(6, 7)
    t.say("block size 4, 4 blocks; one sequence with 6 tokens that will end at 7: blocks [t t t t] [t t r i]")
    t.say("expected: token_states 6, reservation 1, internal_fragmentation 1, free 8 (the 2 untouched blocks)")
    ask(t, make(), "paged", pool)


def paged_shared_block_counts_once(make, t: Story) -> None:
    """paged: a block shared by a fork counts once; its empty slots are reserved as far as its furthest owner writes"""
    pool = PagedPool(4, 4)
    parent = pool.admit(6, 7)
    pool.fork(parent, 9)
    t.say("fork: the child shares both blocks of the parent (6 tokens); parent ends at 7, child at 9")
    t.say("expected: token_states 6 (not 12: shared slots count once), reservation 2 (the child writes both "
          "empty slots of the last block), internal_fragmentation 0")
    ask(t, make(), "paged", pool)


def paged_waiting(make, t: Story) -> None:
    """paged: while a request waits that cannot be admitted, free slots count as external fragmentation"""
    pool = PagedPool(4, 4)
    pool.admit(6, 7)
    t.say("the state of the first example, asked with waiting=True: the 8 free slots become external waste")
    ask(t, make(), "paged", pool, waiting=True)


def contiguous_oracle_buddy(make, t: Story) -> None:
    """contiguous: oracle reserves exactly the final length; the buddy allocator rounds the run up to a power of two"""
    pool = ContiguousPool(64, "oracle", 64)
    seq = pool.admit(5, 12)
    pool.grow(seq, 2)
    t.say("64 slots; prompt 5, now 7 tokens, final length 12: oracle reserves 12, the buddy allocator hands out 16")
    t.say("expected: token_states 7, reservation 5, internal_fragmentation 0, external_fragmentation 4, free 48")
    ask(t, make(), "contiguous", pool)


def contiguous_max_and_pow2(make, t: Story) -> None:
    """contiguous: max reserves max_seq_len (in a buddy run: 48 -> 64); pow2 rounds only the output up (25 -> 32)"""
    pool = ContiguousPool(128, "max", 48)
    pool.admit(5, 9)
    t.say("max, max_seq_len 48: prompt 5, final length 9 reserves 48 -> reservation 4, internal_fragmentation 39")
    t.say("48 is no power of two: the buddy allocator rounds the run up to 64 -> external_fragmentation 16, free 64")
    ask(t, make(), "contiguous", pool, hint="under max too, the buddy allocator rounds the reserved run of "
        "max_seq_len slots up to a power of two: 48 -> 64")
    pool = ContiguousPool(128, "pow2", 64)
    pool.admit(7, 32)
    t.say("pow2: prompt 7 + output 25 rounded to 32 reserves 39; the buddy run is 64 -> internal 7, external 25")
    ask(t, make(), "contiguous", pool)


EXAMPLES = (paged_last_block, paged_shared_block_counts_once, paged_waiting, contiguous_oracle_buddy,
            contiguous_max_and_pow2)


def _lazy(**options: Any) -> Callable[[Callable[..., Any], int, int], type]:
    """A machine builder imported only when a check runs (hypothesis is a dev dependency)."""

    def build(make: Callable[..., Any], max_examples: int, steps: int) -> type:
        from ._memory_accounting_machines import pool_program_test

        return pool_program_test(make, max_examples, steps, **options)

    return build


EXERCISE = Exercise(
    "the memory breakdown of a KV pool: token states, reservation, fragmentation, free (paper section 3, Figure 2)",
    "YourClass()", "MyMemoryAccounting",
    (), {"paged": (4, 1, []), "contiguous": (8, "oracle", 8, [])}, ("paged", "contiguous"), NO_RULES, EXAMPLES,
    (
        MachineCheck("model", "random pool states: {n} programs on paged and contiguous pools (the project's KV "
                     "managers)", _lazy(pools=("paged", *RULES)), 4.0, "visible"),
        MachineCheck("rule", "shared blocks: {n} fork trees whose owners share a partly filled block and end at "
                     "different lengths", _lazy(pools=("paged",), forks=True), 3.0, "hidden"),
        MachineCheck("long", "long programs: {n} random programs of 60 steps on bigger pools",
                     _lazy(pools=("paged", *RULES), big=True), 2.0, "hidden", scale=2, steps=60),
    ),
    "05_memory_accounting", "memory_accounting",
)
