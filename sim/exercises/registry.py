"""The exercises and labs: what the student writes, the checks that grade it, their weights and visibility.

A grade is a list of weighted checks, each "visible" (the notebook's `check` runs it: the student sees it while
working) or "hidden" (only the autograder, `python -m sim.exercises grade`, runs it):

| check                                        | weight | visibility | catches                                        |
|----------------------------------------------|--------|------------|------------------------------------------------|
| each narrated example (slot/block_stories)   | 1      | visible    | the exercise's rules, one small story each     |
| the state machine, `max_examples` programs   | 4      | visible    | any disagreement with the model (sim.testing)  |
| the rule machine                             | 3      | hidden     | buddy / first fit: placement against an oracle;|
|                                              |        |            | blocks: refused calls that change something    |
| the long machine, 2 x programs of 60 steps   | 2      | hidden     | bugs that need longer programs to show         |

Every check wraps the student's allocator in a `Referee` (all-or-nothing, and the call that raised).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .block_stories import BLOCK_ALLOCATOR_EXAMPLES, PREFIX_CACHE_EXAMPLES
from .placement import BUDDY, FIRST_FIT
from .referee import BLOCK_RULES, SLOT_RULES, Rules
from .slot_stories import BUDDY_EXAMPLES, FIRST_FIT_EXAMPLES

EXAMPLE_WEIGHT = 1.0
STEPS = 30  # steps per random program (the project's own machines use 30)

# The pools the block machines use: small, so memory runs out often (as in tests/sim).
MACHINE_NUM_BLOCKS, PREFIX_MACHINE_NUM_BLOCKS = 6, 8

Build = Callable[[Callable[..., Any], int, int], type]  # (make, max_examples, steps) -> a unittest.TestCase class


@dataclass(frozen=True, slots=True)
class MachineCheck:
    kind: str  # "model" (the project's machine), "rule" (placement / all-or-nothing) or "long"
    title: str  # "{n}" becomes the number of programs it runs
    build: Build
    weight: float
    visibility: str  # "visible" or "hidden"
    scale: int = 1  # runs scale x max_examples programs ...
    steps: int = STEPS  # ... of this many steps


@dataclass(frozen=True, slots=True)
class Exercise:
    title: str  # what the student builds, and where the paper describes it
    constructor: str  # how the grader builds the student's class (the arguments a factory receives)
    class_name: str  # the class the exercise notebook defines (what `grade` looks for in a submission)
    probe_with: tuple  # the constructor's arguments for the probes (unfinished.py)
    probes: dict[str, tuple | None]  # each method the student writes -> a harmless probe call's arguments
    surface: tuple[str, ...]  # everything the grader reads or calls on the class
    rules: Rules  # what the referee snapshots and logs
    examples: tuple  # narrated example functions (make, story) -> None; their docstrings are their titles
    machines: tuple[MachineCheck, ...]
    notebook: str  # the exercise notebook, notebooks/exercises/{notebook}.ipynb
    solution: str  # the solution module, notebooks/solutions/{solution}.py (kept apart from the notebook)
    model: str | None = None  # the real model its checks serve ("smollm2": the capstone), which the autograder installs
    # the grader's own setup, run once before the checks and outside their time limits (limits.py): the capstone
    # loads SmolLM2 and compiles the engine's kernels there, work that is not the student's
    warm_up: Callable[[], None] | None = None


def _lazy(builder: str, *args: Any) -> Build:
    """A machine builder imported only when a check runs (machines.py needs hypothesis, a dev dependency)."""

    def build(make: Callable[..., Any], max_examples: int, steps: int) -> type:
        from . import machines

        return getattr(machines, builder)(*args)(make, max_examples, steps)

    return build


def _machines(project: Build, rule_title: str, rule: Build, long: Build) -> tuple[MachineCheck, ...]:
    return (
        MachineCheck("model", "state machine: {n} random programs (hypothesis, sim.testing)", project, 4.0, "visible"),
        MachineCheck("rule", rule_title, rule, 3.0, "hidden"),
        MachineCheck("long", "long programs: {n} random programs of 60 steps", long, 2.0, "hidden", scale=2, steps=60),
    )


_SLOTS = ("num_slots", "num_free_slots", "largest_free_run", "free_runs", "allocated_size", "allocate", "free",
          "check_invariants")
_BLOCKS = ("num_blocks", "block_size", "num_free_blocks", "num_used_blocks", "can_allocate", "ref_count",
           "allocate", "share", "free", "copy_on_write", "check_invariants")
_PREFIX = _BLOCKS + ("enable_prefix_caching", "cache_block", "lookup", "is_cached", "num_prefix_hits",
                     "num_prefix_misses")


def _slot_machines(power_of_two: bool, rule_title: str, rule: Any) -> tuple[MachineCheck, ...]:
    plain = _lazy("slot_machine", power_of_two)
    return _machines(plain, rule_title, _lazy("slot_machine", power_of_two, rule), plain)


def _block_machines(num_blocks: int) -> tuple[MachineCheck, ...]:
    plain = _lazy("block_machine", num_blocks)
    title = "all-or-nothing: {n} programs with refused free/share calls that must change nothing"
    return _machines(plain, title, _lazy("block_machine", num_blocks, True), plain)


EXERCISES: dict[str, Exercise] = {
    "first_fit": Exercise(
        "a first-fit slot allocator (contiguous KV memory, paper section 3)",
        "YourClass(num_slots)", "MyFirstFitAllocator",
        (16,), {"largest_free_run": None, "allocate": (1,), "free": (0,)}, _SLOTS, SLOT_RULES, FIRST_FIT_EXAMPLES,
        _slot_machines(False, "placement: {n} programs, every answer as first fit places it", FIRST_FIT),
        "01_first_fit", "first_fit",
    ),
    "buddy": Exercise(
        "a binary buddy allocator (the Orca baselines' allocator, paper section 6.1)",
        "YourClass(num_slots), num_slots a power of two", "MyBuddyAllocator",
        (16,), {"allocate": (1,), "free": (0,)}, _SLOTS, SLOT_RULES, BUDDY_EXAMPLES,
        _slot_machines(True, "placement: {n} programs, every block where the buddy rule puts it", BUDDY),
        "02_buddy", "buddy",
    ),
    "block_allocator": Exercise(
        "a block allocator with reference counts and copy-on-write (paper sections 4.2 and 4.4)",
        "YourClass(num_blocks, block_size)", "MyBlockAllocator",
        (4, 16), {"allocate": (1,), "share": ([0],), "free": ([0],), "copy_on_write": (0,)}, _BLOCKS, BLOCK_RULES,
        BLOCK_ALLOCATOR_EXAMPLES, _block_machines(MACHINE_NUM_BLOCKS), "03_block_allocator", "block_allocator",
    ),
    "prefix_cache": Exercise(
        "an LRU prefix cache over a block allocator (vLLM's automatic prefix caching)",
        "YourClass(num_blocks, block_size), with enable_prefix_caching True", "MyPrefixCachingAllocator",
        (4, 16), {"allocate": (1,), "cache_block": (0, 1), "lookup": (1,), "is_cached": (0,)}, _PREFIX, BLOCK_RULES,
        PREFIX_CACHE_EXAMPLES, _block_machines(PREFIX_MACHINE_NUM_BLOCKS), "04_prefix_cache", "prefix_cache",
    ),
}

# The labs after the four allocator exercises, one module each (labs/__init__.py finds them, in notebook order).
# NOTE: imported last: a lab module imports Exercise and MachineCheck from this (by then defined) module.
from .labs import load_labs  # noqa: E402

EXERCISES.update(load_labs())
