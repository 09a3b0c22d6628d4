"""The property checks of the memory-accounting lab: random pool states built by the project's KV managers.

Each hypothesis example picks a pool (paged, or contiguous under one reservation rule), then runs a random program
of admissions, growth, forks (paged) and frees on the project's manager. After EVERY step the pool's state is handed
to the student's class and its five counts must equal the manager's own `breakdown()`, asked with `waiting` drawn
both ways. `note()` narrates the program, so a shrunk failure reads as the steps that built the state.

Imported only when a check runs (it needs hypothesis, a dev dependency); the module's name starts with "_", so the
lab loader does not take it for a lab.
"""
from __future__ import annotations

import unittest
from typing import Any, Callable

from hypothesis import given, note, settings
from hypothesis import strategies as st

from ...testing.blocks import machine_settings
from ..referee import NO_RULES, Referee, format_call
from ._memory_accounting_oracle import ContiguousPool, PagedPool, compare, expected


def _paged_pool(data: st.DataObject, big: bool) -> PagedPool:
    block_size = data.draw(st.integers(1, 8 if big else 4), label="block_size")
    num_blocks = data.draw(st.integers(2, 24 if big else 8), label="num_blocks")
    note(f"paged pool: {num_blocks} blocks of {block_size} slots")
    return PagedPool(num_blocks, block_size)


def _contiguous_pool(data: st.DataObject, rule: str, big: bool) -> ContiguousPool:
    # NOTE: powers of two and not (6, 12, 48, ...): a buddy run rounds a reservation of 48 up to 64 under every rule
    lengths = (8, 16, 24, 32, 48, 64) if big else (4, 6, 8, 12, 16)
    max_seq_len = data.draw(st.sampled_from(lengths), label="max_seq_len")
    num_slots = data.draw(st.integers(max_seq_len, 4 * max_seq_len + 3), label="num_slots")
    note(f"contiguous pool, rule {rule!r}: {num_slots} slots (buddy allocator), max_seq_len {max_seq_len}")
    return ContiguousPool(num_slots, rule, max_seq_len)


# One step of a program: (op, a, b, waiting). a and b pick the step's numbers (taken modulo what is allowed in the
# state the step meets), so a program is a plain list that hypothesis shrinks by dropping steps and lowering numbers.
OPS = ("admit", "grow", "fork", "free")
Op = tuple[str, int, int, bool]


def _ops(forks: bool) -> st.SearchStrategy:
    weights = ("admit", "admit", "grow", "grow", "free") + ("fork",) * (3 if forks else 2)
    return st.tuples(st.sampled_from(weights), st.integers(0, 63), st.integers(0, 63), st.booleans())


def _step(op: Op, pool: PagedPool | ContiguousPool, live: dict[int, int], forks: bool) -> None:
    """Apply one step; `live` maps each live sequence to its final length (kept up to date)."""
    kind, a, b, _ = op
    paged = isinstance(pool, PagedPool)
    limit = min(pool.kv.num_slots if paged else pool.kv.max_seq_len, 24)
    if kind == "admit" or not live or (kind == "fork" and not paged):
        final_len = 1 + a % limit
        prompt_len = 1 + b % final_len
        seq = pool.admit(prompt_len, final_len)
        note(f"admit a sequence: prompt {prompt_len} tokens, final length {final_len} -> "
             + ("refused (pool full)" if seq is None else f"seq {seq}"))
        if seq is not None:
            live[seq] = final_len
        return
    seq = sorted(live)[a % len(live)]
    n = pool.kv.num_tokens(seq)
    if kind == "free":
        pool.free(seq)
        del live[seq]
        note(f"free seq {seq}")
    elif kind == "grow" and live[seq] > n:
        k = 1 + b % (live[seq] - n)
        ok = pool.grow(seq, k)
        note(f"seq {seq} grows by {k} token(s)" + (f" (now {pool.kv.num_tokens(seq)})" if ok else ": refused"))
    elif kind == "fork":
        bs = pool.kv.block_size
        # NOTE: final lengths often end inside the shared last block (always with `forks`), where owners differ in reach
        span = (-(-n // bs) * bs + 1 - n) if forks or b % 2 else 12
        final_len = n + b % (span + 1)
        child = pool.fork(seq, final_len)
        live[child] = final_len
        note(f"fork seq {seq} ({n} tokens) -> seq {child}, final length {final_len}: it shares every block")


def _check(student: Any, pool: PagedPool | ContiguousPool, waiting: bool) -> None:
    method = "paged" if isinstance(pool, PagedPool) else "contiguous"
    args = pool.args(waiting)
    problem = compare(format_call(method, args), getattr(student, method)(*args), expected(pool, waiting))
    if problem is not None:
        raise AssertionError(problem)


def pool_program_test(make: Callable[..., Any], max_examples: int, steps: int, pools: tuple[str, ...],
                      forks: bool = False, big: bool = False) -> type:
    """A TestCase whose runTest checks the student's answer after every step of random programs on `pools`."""

    class PoolPrograms(unittest.TestCase):
        @settings(machine_settings(max_examples), report_multiple_bugs=False)
        @given(data=st.data())
        def runTest(self, data: st.DataObject) -> None:
            kind = data.draw(st.sampled_from(pools[:1] + pools), label="pool")  # paged (the first) twice as often
            pool = _paged_pool(data, big) if kind == "paged" else _contiguous_pool(data, kind, big)
            student = Referee(make(), NO_RULES)
            live: dict[int, int] = {}
            # NOTE: a list drawn freely averages ~6 steps and shrinks fast into a short story; the long check asks for
            # at least half its steps (it shrinks slower, and only the autograder runs it)
            shortest = steps // 2 if big else 1
            program = data.draw(st.lists(_ops(forks), min_size=shortest, max_size=steps), label="program")
            for op in program:
                _step(op, pool, live, forks)
                _check(student, pool, op[3])

    return PoolPrograms
