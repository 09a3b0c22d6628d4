"""A reusable Hypothesis state machine for slot allocators (`sim.kv.slots`).

One machine runs against every allocator with the `sim.kv.slots.SlotAllocator` surface (the pattern of
Hypothesis's stateful testing docs): it allocates random sizes (often too big: the spaces are small,
8..40 slots, so memory runs out often), frees random live allocations and unknown offsets, and keeps
a model of what is live. After every step it checks:

- the allocator's own `check_invariants()`;
- no two live allocations overlap (each spans `allocated_size(start)` slots) and all lie in the space;
- num_free_slots == num_slots - sum of allocated sizes; largest_free_run == the longest free run;
- out of memory (None) only when the size exceeds largest_free_run, and then nothing changed;
- freeing everything gives back the initial free layout (one run for first-fit, the power-of-two
  regions for buddy) with every slot free.

    TestFirstFit = make_slot_allocator_test(FirstFitAllocator)
"""
from __future__ import annotations

from typing import Callable

from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ..kv.slots import SlotAllocator
from .blocks import machine_settings

AllocatorFactory = Callable[[int], SlotAllocator]  # num_slots -> a fresh allocator

MIN_SLOTS, MAX_SLOTS = 8, 40


def _snapshot(alloc: SlotAllocator) -> tuple:
    return (alloc.free_runs(), alloc.num_free_slots, alloc.largest_free_run)


class SlotAllocatorMachine(RuleBasedStateMachine):
    """Drives the allocator built by `factory(num_slots)` against a model of live allocations."""

    factory: AllocatorFactory  # set by make_slot_allocator_test, as KVManagerMachine's is

    def __init__(self) -> None:
        super().__init__()
        self.alloc: SlotAllocator | None = None
        self.live: dict[int, int] = {}  # model: start -> size requested

    @initialize(num_slots=st.integers(MIN_SLOTS, MAX_SLOTS))
    def build(self, num_slots: int) -> None:
        self.alloc = type(self).factory(num_slots)
        self.initial_runs = self.alloc.free_runs()
        note(f"new allocator over {num_slots} slots, free runs {self.initial_runs}")

    @rule(size=st.integers(1, MAX_SLOTS + 8))
    def allocate(self, size: int) -> None:
        before = _snapshot(self.alloc)
        start = self.alloc.allocate(size)
        note(f"allocate({size}) -> {start}")
        if start is None:
            assert size > before[2], f"allocate({size}) refused though largest_free_run is {before[2]}"
            assert _snapshot(self.alloc) == before, "allocate returned None but changed the allocator"
            return
        assert start not in self.live, f"allocate returned {start}, already live"
        got = self.alloc.allocated_size(start)
        assert got >= size, f"allocate({size}) at {start}: expected >= {size} slots, found {got}"
        self.live[start] = size

    @rule(size=st.integers(-2, 0))
    def allocate_bad_size(self, size: int) -> None:
        note(f"allocate({size}) must raise ValueError")
        try:
            self.alloc.allocate(size)
        except ValueError:
            return
        raise AssertionError(f"allocate({size}) did not raise ValueError")

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        start = data.draw(st.sampled_from(sorted(self.live)), label="start")
        note(f"free({start}) (size {self.live[start]})")
        self.alloc.free(start)
        del self.live[start]

    @rule(start=st.integers(0, MAX_SLOTS))
    def free_unknown(self, start: int) -> None:
        if start in self.live:
            return
        before = _snapshot(self.alloc)
        note(f"free({start}) of no allocation must raise RuntimeError")
        try:
            self.alloc.free(start)
        except RuntimeError as err:
            assert str(start) in str(err), f"error should name offset {start}: {err}"
            assert _snapshot(self.alloc) == before, "a refused free changed the allocator"
            return
        raise AssertionError(f"free({start}) of no allocation did not raise")

    @precondition(lambda self: self.live)
    @rule()
    def free_all(self) -> None:
        note(f"free everything: {sorted(self.live)}")
        for start in list(self.live):
            self.alloc.free(start)
        self.live.clear()
        assert self.alloc.num_free_slots == self.alloc.num_slots
        runs = self.alloc.free_runs()
        assert runs == self.initial_runs, f"after freeing all: expected free runs {self.initial_runs}, found {runs}"

    @invariant()
    def consistent(self) -> None:
        if self.alloc is None:
            return
        self.alloc.check_invariants()
        spans = sorted((s, self.alloc.allocated_size(s)) for s in self.live)
        for (a, la), (b, _) in zip(spans, spans[1:]):
            assert a + la <= b, f"allocations at {a} (+{la}) and {b} overlap"
        if spans:
            end = spans[-1][0] + spans[-1][1]
            assert spans[0][0] >= 0 and end <= self.alloc.num_slots, f"allocation outside [0, {self.alloc.num_slots})"
        used = sum(size for _, size in spans)
        assert self.alloc.num_free_slots == self.alloc.num_slots - used, (
            f"num_free_slots: expected {self.alloc.num_slots - used}, found {self.alloc.num_free_slots}"
        )
        longest = max((length for _, length in self.alloc.free_runs()), default=0)
        assert self.alloc.largest_free_run == longest, (
            f"largest_free_run: expected {longest}, found {self.alloc.largest_free_run}"
        )


def make_slot_allocator_test(factory: AllocatorFactory, max_examples: int = 500, **overrides) -> type:
    """A unittest.TestCase class running `SlotAllocatorMachine` on `factory`, under the settings every
    machine here shares (`machine_settings`); `overrides` replace any of them (e.g. phases, derandomize).
    Assign the result to a module-level name starting with `Test` so pytest collects it."""

    machine = type("SlotAllocatorMachine", (SlotAllocatorMachine,), {"factory": staticmethod(factory)})
    machine.TestCase.settings = settings(machine_settings(max_examples), **overrides)
    return machine.TestCase
