"""Graders for the classroom exercises (notebooks/exercises/): `check(name, YourClass)`.

Each exercise asks a student to write one piece of the memory manager the vLLM paper builds on
(Kwon et al., SOSP 2023): a first-fit and a buddy slot allocator (the contiguous baselines, section 3
and 6.1), a block allocator with reference counts and copy-on-write (sections 4.2 and 4.4), and the
LRU prefix cache of vLLM's automatic prefix caching. `check` grades the student's class with

1. the narrated examples of the exercise (small stories, `slot_stories.py` / `block_stories.py`), and
2. once they all pass, the SAME hypothesis state machine the project grades its own allocators with
   (`sim.testing`),

and prints readable feedback: which example failed, its steps and what was expected; or the shortest
failing program hypothesis found and the invariant it broke; or "method X is not implemented yet".

    from sim.exercises import check
    check("block_allocator", MyBlockAllocator)

Importing this package needs only `sim`; running a check needs `hypothesis` (a dev dependency).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .block_stories import BLOCK_ALLOCATOR_EXAMPLES, PREFIX_CACHE_EXAMPLES
from .report import CheckReport, CheckResult, run_example, run_machine
from .slot_stories import BUDDY_EXAMPLES, FIRST_FIT_EXAMPLES

__all__ = ["EXERCISES", "CheckReport", "CheckResult", "Exercise", "check"]

# The pools the state machines use: small, so memory runs out often (as in tests/sim).
MACHINE_NUM_BLOCKS, MACHINE_BLOCK_SIZE = 6, 4
PREFIX_MACHINE_NUM_BLOCKS = 8


@dataclass(frozen=True, slots=True)
class Exercise:
    title: str  # what the student builds, and where the paper describes it
    constructor: str  # how `check` builds the student's class (the arguments a factory receives)
    examples: tuple  # narrated example functions (make, story) -> None; their docstrings are their titles
    machine: Callable[[Callable[..., Any], int], type]  # (make, max_examples) -> a unittest.TestCase class


def _slot_machine(power_of_two: bool) -> Callable[[Callable[..., Any], int], type]:
    def build(make: Callable[..., Any], max_examples: int) -> type:
        from hypothesis import settings

        from ..testing.slots import make_slot_allocator_test

        # NOTE: the buddy exercise handles powers of two only (no top-level regions, unlike sim.slots), so its
        # machine gets the largest power of two <= the drawn size (8, 16 or 32 slots).
        factory = (lambda n: make(1 << (n.bit_length() - 1))) if power_of_two else make
        test = make_slot_allocator_test(factory, max_examples=max_examples)
        test.settings = settings(test.settings, report_multiple_bugs=False)
        return test

    return build


def _block_machine(num_blocks: int) -> Callable[[Callable[..., Any], int], type]:
    def build(make: Callable[..., Any], max_examples: int) -> type:
        from hypothesis import settings

        from ..testing.blocks import make_block_allocator_test

        test = make_block_allocator_test(lambda: make(num_blocks, MACHINE_BLOCK_SIZE), max_examples=max_examples)
        test.settings = settings(test.settings, report_multiple_bugs=False)  # one bug, told clearly
        return test

    return build


EXERCISES: dict[str, Exercise] = {
    "first_fit": Exercise(
        "a first-fit slot allocator (contiguous KV memory, paper section 3)",
        "YourClass(num_slots)", FIRST_FIT_EXAMPLES, _slot_machine(power_of_two=False),
    ),
    "buddy": Exercise(
        "a binary buddy allocator (the Orca baselines' allocator, paper section 6.1)",
        "YourClass(num_slots), num_slots a power of two", BUDDY_EXAMPLES, _slot_machine(power_of_two=True),
    ),
    "block_allocator": Exercise(
        "a block allocator with reference counts and copy-on-write (paper sections 4.2 and 4.4)",
        "YourClass(num_blocks, block_size)", BLOCK_ALLOCATOR_EXAMPLES, _block_machine(MACHINE_NUM_BLOCKS),
    ),
    "prefix_cache": Exercise(
        "an LRU prefix cache over a block allocator (vLLM's automatic prefix caching)",
        "YourClass(num_blocks, block_size), with enable_prefix_caching True",
        PREFIX_CACHE_EXAMPLES, _block_machine(PREFIX_MACHINE_NUM_BLOCKS),
    ),
}  # fmt: skip


def check(
    name: str, cls_or_factory: Callable[..., Any], *, max_examples: int = 200, quiet: bool = False
) -> CheckReport:
    """Grade a student's class (or a factory taking the same arguments) for exercise `name`; print and return it.

    Examples run first, then the state machine (`max_examples` random programs of up to 30 steps; derandomized,
    so the same class always gets the same verdict). The machine runs only once every example passes.
    `quiet=True` returns the report without printing it. Raises ValueError only for an unknown exercise name.
    """
    if name not in EXERCISES:
        raise ValueError(f"unknown exercise {name!r} (allowed: {', '.join(EXERCISES)})")
    if max_examples < 1:
        raise ValueError(f"max_examples must be >= 1, got {max_examples}")
    exercise = EXERCISES[name]
    report = CheckReport(name, getattr(cls_or_factory, "__name__", repr(cls_or_factory)))
    for example in exercise.examples:
        run_example(example.__doc__.strip(), example, cls_or_factory, report)
    title = f"state machine: {max_examples} random programs (hypothesis, sim.testing)"
    run_machine(title, exercise.machine(cls_or_factory, max_examples), report)
    if not quiet:
        print(report.text(exercise.title))
    return report
