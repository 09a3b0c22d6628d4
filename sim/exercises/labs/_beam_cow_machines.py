"""The property checks of the beam copy-on-write lab: random programs of forks, appends and frees on small pools.

Every step goes through `Beams` (_beam_cow_oracle.py), which keeps each beam's true token list beside the student's
class and checks after every call: each beam read back through its block table equals its true tokens, reference
counts equal the tables holding each block, a full block is never copied, an append takes exactly the block it
needs (or answers None and changes nothing), and no block leaks once every beam is freed (each program ends by
freeing them all). Programs are lists of plain integer tuples with no minimum length and no preamble, so hypothesis
shrinks a failure, long programs' too, into a short story (`note()`).

Imported only when a check runs (it needs hypothesis, a dev dependency); its name starts with "_", so the lab
loader does not take it for a lab.
"""
from __future__ import annotations

import unittest
from typing import Any, Callable

from hypothesis import given, note, settings
from hypothesis import strategies as st

from ...testing.blocks import machine_settings
from ..referee import NO_RULES, Referee
from ._beam_cow_oracle import Beams

# NOTE: "append" first: a step hypothesis cannot drop shrinks towards an append to the lowest live beam, not towards
# opening one more beam
_OP = st.tuples(st.sampled_from(("append", "append", "append", "new", "fork", "fork", "free")), st.integers(0, 63),
                st.integers(0, 63))


def _programs(steps: int, long: bool) -> st.SearchStrategy:
    """Lists of steps, every one of which hypothesis may drop while it shrinks (no minimum length but 1).

    A plain list averages ~6 steps. The long check wants more, without a floor (a floor of 30 steps left shrunk
    failures with 28 beams opened before the one fork that mattered): a list of runs of steps, flattened, averages
    ~28 steps (4 programs in 10 reach 30) and shrinks by dropping whole runs as well as single steps."""
    if not long:
        return st.lists(_OP, min_size=1, max_size=steps)
    runs = st.lists(st.lists(_OP, min_size=1, max_size=20), min_size=1, max_size=20)
    return runs.map(lambda rs: [op for run in rs for op in run][:steps])


class _Run:
    def __init__(self, beams: Beams) -> None:
        self.beams, self.next_id, self.next_token = beams, 0, 100

    def new(self, length: int) -> None:
        beam, self.next_id = self.next_id, self.next_id + 1
        tokens = list(range(self.next_token, self.next_token + length))
        self.next_token += length
        note(f"new_beam({beam}), then append its {length} prompt token(s) {tokens}")
        self.beams.new_beam(beam, [])
        for token in tokens:
            if self.beams.append(beam, token) is None:
                note(f"  append_slot({beam}, {token}) -> None: the pool is full")
                break

    def append(self, beam: int) -> None:
        token, self.next_token = self.next_token, self.next_token + 1
        slot = self.beams.append(beam, token)
        note(f"append_slot({beam}, {token}) -> {slot}" + ("  (out of memory)" if slot is None else ""))

    def fork(self, parent: int) -> int:
        child, self.next_id = self.next_id, self.next_id + 1
        note(f"fork({parent}, {child})")
        self.beams.fork(parent, child)
        return child

    def free(self, beam: int) -> None:
        note(f"free({beam})")
        self.beams.free(beam)

    def free_all(self) -> None:
        for beam in sorted(self.beams.truth):
            self.free(beam)


def _random_program(run: _Run, ops: list[tuple[str, int, int]]) -> None:
    for op, a, _b in ops:
        live = sorted(run.beams.truth)
        if op == "new" or not live:
            run.new(1 + a % 6)
        elif op == "append":
            run.append(live[a % len(live)])
        elif op == "fork":
            run.fork(live[a % len(live)])
        else:
            run.free(live[a % len(live)])


def _beam_search(run: _Run, width: int, choices: list[int]) -> None:
    """Width-k beam search: every beam appends a token; each choice keeps one candidate (a beam or a fork of it);
    beams no choice kept are pruned."""
    run.new(3)
    for step, choice in enumerate(choices):
        live = sorted(run.beams.truth)
        note(f"-- step {step}: beams {live}")
        for beam in live:
            run.append(beam)
        keep = [live[(choice >> (2 * i)) % len(live)] for i in range(width)]
        for beam in sorted(set(live) - set(keep)):
            run.free(beam)
        seen: set[int] = set()
        for beam in keep:
            if beam in seen:  # chosen twice: the second candidate is a fork of it
                run.fork(beam)
            seen.add(beam)


def beam_program_test(make: Callable[..., Any], max_examples: int, steps: int, beam_search: bool = False,
                      big: bool = False) -> type:
    """A TestCase whose runTest runs random programs (or beam searches) of up to `steps` steps, then frees every
    beam."""

    class BeamPrograms(unittest.TestCase):
        @settings(machine_settings(max_examples), report_multiple_bugs=False)
        @given(data=st.data())
        def runTest(self, data: st.DataObject) -> None:
            block_size = data.draw(st.integers(1, 4), label="block_size")
            num_blocks = data.draw(st.integers(2, 24 if big or beam_search else 8), label="num_blocks")
            note(f"a pool of {num_blocks} blocks of {block_size} slots")
            run = _Run(Beams(Referee(make(num_blocks, block_size), NO_RULES)))
            if beam_search:
                width = data.draw(st.integers(2, 4), label="width")
                choices = data.draw(st.lists(st.integers(0, 255), min_size=1, max_size=steps // 3), label="choices")
                note(f"beam search of width {width}")
                _beam_search(run, width, choices)
            else:
                _random_program(run, data.draw(_programs(steps, big), label="program"))
            run.free_all()

    return BeamPrograms
