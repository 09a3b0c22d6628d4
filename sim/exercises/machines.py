"""The state machines a grade runs: the project's own (`sim.testing`) and two stricter ones only a grader needs.

Every machine drives the student's allocator through a `Referee` (referee.py), so any call that raises must
change nothing, and a call that raises is named in the feedback. On top of the project's machines:

- `StrictBlockAllocatorMachine` adds refused calls that touch an owned block BEFORE the bad argument:
  `free([b, b])` on a block with one owner, `free([b, c])` with `c` free, `share([b, c])` with `c` free. An
  allocator that changes block `b` and only then notices the bad argument passes the project's machine (it
  never makes such calls: the project's own allocators check first) but fails here.
- `PlacementSlotMachine` is the project's slot machine, with more small allocations, and an oracle beside the
  student's allocator (placement.py): every `allocate` answer and the free runs after every call must match
  the exercise's rule.

Each builder takes (make, max_examples, steps) and returns a unittest.TestCase class; the examples stay small
(6 or 8 blocks, 8..32 slots) so memory runs out often, as in tests/sim.
"""
from __future__ import annotations

from typing import Any, Callable

from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from ..testing.blocks import BlockAllocatorMachine, machine_settings, make_block_allocator_test
from ..testing.slots import SlotAllocatorMachine, make_slot_allocator_test
from .placement import Placement, PlacementRule
from .referee import BLOCK_RULES, SLOT_RULES, Referee, RuleBroken

MACHINE_BLOCK_SIZE = 4


class StrictBlockAllocatorMachine(BlockAllocatorMachine):
    """`BlockAllocatorMachine` plus refused calls whose bad argument comes after a good one (all-or-nothing)."""

    @precondition(lambda self: any(self.refs))
    @rule(data=st.data())
    def refused_free_changes_nothing(self, data: st.DataObject) -> None:
        b = data.draw(st.sampled_from(self.owned()), label="owned block")
        free = [c for c, r in enumerate(self.refs) if r == 0]
        if free and data.draw(st.booleans(), label="with a free block"):
            blocks = [b, data.draw(st.sampled_from(free), label="free block")]
            why = f"block {blocks[1]} is free"
        else:
            blocks = [b] * (self.refs[b] + 1)
            why = f"block {b} has {self.refs[b]} owner(s)"
        self._refused("free", blocks, why, RuntimeError)

    @precondition(lambda self: any(self.refs) and 0 in self.refs)
    @rule(data=st.data())
    def refused_share_changes_nothing(self, data: st.DataObject) -> None:
        b = data.draw(st.sampled_from(self.owned()), label="owned block")
        c = data.draw(st.sampled_from([c for c, r in enumerate(self.refs) if r == 0]), label="free block")
        self._refused("share", [b, c], f"block {c} is free", Exception)

    def _refused(self, method: str, blocks: list[int], why: str, error: type[BaseException]) -> None:
        note(f"{method}({blocks}) must raise ({why}) and change nothing")
        before = self.snapshot()
        try:
            getattr(self.alloc, method)(blocks)
        except (RuleBroken, NotImplementedError):
            raise
        except Exception as exc:  # noqa: BLE001
            if not isinstance(exc, error):
                raise AssertionError(f"{method}({blocks}) ({why}): expected {error.__name__}, "
                                     f"found {type(exc).__name__}: {exc}") from exc
        else:
            raise AssertionError(f"{method}({blocks}) ({why}): expected {error.__name__}, nothing was raised")
        self.expect_unchanged(before, f"the refused {method}({blocks})")


class PlacementSlotMachine(SlotAllocatorMachine):
    """`SlotAllocatorMachine` plus many small allocations: holes and free buddies of one size, side by side, are
    where a placement rule shows (which of two fitting holes? merge with which neighbour?)."""

    @rule(size=st.integers(1, 4))
    def allocate_small(self, size: int) -> None:
        self.allocate(size)

    @rule(size=st.integers(1, 4))
    def checkerboard(self, size: int) -> None:
        """Allocate `size` until refused, then free every second of those: many free runs of one size side by side
        (for buddy: free blocks whose buddies are used), so the next allocation must pick the right one."""
        note(f"checkerboard: allocate({size}) until refused, then free every second one")
        taken: list[int] = []
        for _ in range(self.alloc.num_slots):
            before = set(self.live)
            self.allocate(size)
            new = set(self.live) - before
            if not new:
                break
            taken += new
        for start in taken[::2]:
            note(f"free({start})")
            self.alloc.free(start)
            del self.live[start]


def _quiet(test: type) -> type:
    test.settings = settings(test.settings, report_multiple_bugs=False)  # one bug, told clearly
    return test


def block_machine(num_blocks: int, strict: bool = False) -> Callable[[Callable[..., Any], int, int], type]:
    def build(make: Callable[..., Any], max_examples: int, steps: int) -> type:
        def factory() -> Referee:
            return Referee(make(num_blocks, MACHINE_BLOCK_SIZE), BLOCK_RULES)

        if not strict:
            return _quiet(make_block_allocator_test(factory, max_examples=max_examples, stateful_step_count=steps))
        machine = type("StrictBlockAllocatorMachine", (StrictBlockAllocatorMachine,),
                       {"factory": staticmethod(factory)})
        machine.TestCase.settings = machine_settings(max_examples, steps)
        return _quiet(machine.TestCase)

    return build


def slot_machine(power_of_two: bool, placement: PlacementRule | None = None
                 ) -> Callable[[Callable[..., Any], int, int], type]:
    def build(make: Callable[..., Any], max_examples: int, steps: int) -> type:
        def factory(n: int) -> Referee:
            # NOTE: the buddy exercise handles powers of two only (no top-level regions, unlike sim.kv.slots), so
            # its machine gets the largest power of two <= the drawn size (8, 16 or 32 slots).
            n = (1 << (n.bit_length() - 1)) if power_of_two else n
            return Referee(make(n), SLOT_RULES, Placement(placement, n) if placement else None)

        if placement is None:
            return _quiet(make_slot_allocator_test(factory, max_examples=max_examples, stateful_step_count=steps))
        machine = type("PlacementSlotMachine", (PlacementSlotMachine,), {"factory": staticmethod(factory)})
        machine.TestCase.settings = machine_settings(max_examples, steps)
        return _quiet(machine.TestCase)

    return build
