"""Where an allocation must go: the placement rules of the contiguous exercises, checked against an oracle.

First fit (exercise 1) and the buddy system (exercise 2) are deterministic: the exercise's text fixes where
every allocation goes and what the free space looks like after every `free`. So the project's own allocators,
which follow the same text, predict each answer exactly:

- first fit: `allocate(size)` takes the LOWEST-addressed free run of at least `size` slots and hands out exactly
  `size` (the rest of the run stays free); `free` merges the run with the free runs touching it.
- buddy (`sim.kv.slots.BuddyAllocator` on a power-of-two space, the exercise's case): `allocate(size)` rounds `size`
  up to 2**k, takes the lowest-addressed free block of the smallest order >= k that has one and splits it in
  halves, keeping the LOWER half; so a block of 2**k slots always starts at a multiple of 2**k. `free` merges a
  block with its buddy (`start ^ 2**k`) while the buddy is free, and never with a neighbour that is not its buddy.

The `Referee` feeds the oracle the same calls as the student's allocator and raises `RuleBroken` naming the call
and the rule at the first answer (or free-run list) that differs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..kv.slots import BuddyAllocator, FirstFitAllocator
from .referee import RuleBroken, format_call


@dataclass(frozen=True, slots=True)
class PlacementRule:
    oracle: Callable[[int], Any]  # num_slots -> an allocator that follows the rule
    allocate: Callable[[int], str]  # size -> the rule `allocate(size)` follows, in words
    after_allocate: str  # what the free space looks like after an allocation
    free: str  # the rule `free` follows, in words
    aligned: bool  # blocks of 2**k slots at multiples of 2**k (buddy)


def _round_up(size: int) -> int:
    return 1 << max(size - 1, 0).bit_length()


FIRST_FIT = PlacementRule(
    FirstFitAllocator,
    lambda size: f"first fit takes the lowest-addressed free run of at least {size} slot(s)",
    "first fit hands out exactly the size asked; the rest of the run stays free",
    "a freed run merges with the free runs touching it on either side",
    aligned=False,
)
BUDDY = PlacementRule(
    BuddyAllocator,
    lambda size: (f"the buddy rule rounds {size} up to {_round_up(size)} slot(s) and takes the lowest-addressed free "
                  f"block of the smallest order that has one, splitting it in halves and keeping the lower half"),
    "splitting keeps the lower half and leaves each upper half as a free block",
    "a freed block merges with its buddy (start ^ its size) while the buddy is free, and only with its buddy",
    aligned=True,
)


class Placement:
    """The oracle beside one student allocator, and the rule it checks (used by `Referee`)."""

    methods = ("allocate", "free")

    def __init__(self, rule: PlacementRule, num_slots: int) -> None:
        self.rule = rule
        self.oracle = rule.oracle(num_slots)

    def ask(self, name: str, args: tuple) -> tuple[Any, BaseException | None, list]:
        """The oracle's answer to the same call (or what it raised), and its free runs before the call."""
        runs = self.oracle.free_runs()
        try:
            return getattr(self.oracle, name)(*args), None, runs
        except Exception as exc:  # noqa: BLE001  (the oracle refusing is an answer the student must match)
            return None, exc, runs

    def check(self, target: Any, name: str, args: tuple, result: Any, answer: tuple) -> None:
        want, error, runs_before = answer
        call = format_call(name, args)
        if error is not None:
            raise RuleBroken(f"{call} -> {result!r}: expected {type(error).__name__} ({error})")
        if name == "allocate":
            self._check_allocate(target, args[0], result, want, runs_before)
            why = self.rule.after_allocate
        else:
            why = self.rule.free
        found, expected = target.free_runs(), self.oracle.free_runs()
        if found != expected:
            raise RuleBroken(f"after {call}: free_runs() expected {expected}, found {found}: {why} "
                             f"(free runs before the call: {runs_before})")

    def _check_allocate(self, target: Any, size: int, result: Any, want: Any, runs_before: list) -> None:
        rule = self.rule.allocate(size)
        where = f"(free runs before the call: {runs_before})"
        if result is None or want is None:
            if result != want:
                raise RuleBroken(f"allocate({size}) -> {result!r}: expected {want!r}: {rule} {where}")
            return
        if self.rule.aligned:
            got_size, want_size = target.allocated_size(result), self.oracle.allocated_size(want)
            if got_size != want_size:
                raise RuleBroken(f"allocate({size}) -> {result} holding {got_size} slots: expected {want_size}, "
                                 f"{size} rounded up to a power of two")
            if result % got_size:
                raise RuleBroken(f"allocate({size}) -> {result}: a block of {got_size} slots must start at a multiple "
                                 f"of {got_size} (the buddy rule's alignment)")
        if result != want:
            raise RuleBroken(f"allocate({size}) -> {result}: expected {want}: {rule} {where}")
