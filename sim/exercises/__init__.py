"""Graders for the classroom exercises (notebooks/exercises/): `check(name, YourClass)`.

Each exercise asks a student to write one piece of the memory manager the vLLM paper builds on
(Kwon et al., SOSP 2023): a first-fit and a buddy slot allocator (the contiguous baselines, section 3
and 6.1), a block allocator with reference counts and copy-on-write (sections 4.2 and 4.4), and the
LRU prefix cache of vLLM's automatic prefix caching. `check` grades the student's class with

1. the narrated examples of the exercise (small stories, `slot_stories.py` / `block_stories.py`), and
2. once they all pass, the SAME hypothesis state machine the project grades its own allocators with
   (`sim.testing`),

and prints readable feedback: which example failed, its steps and what was expected; or the shortest
failing program hypothesis found and the invariant it broke; the call that raised, when the student's code
raised; every method still "not implemented yet". Those are the VISIBLE checks. `grade` runs them and the
HIDDEN ones (registry.py: the placement rules against an oracle, refused calls that must change nothing,
longer programs), each with a score; `python -m sim.exercises grade SOURCE --exercise NAME` grades a module
or notebook into Gradescope's results.json (gradescope.py).

    from sim.exercises import check
    check("block_allocator", MyBlockAllocator)

Importing this package needs only `sim`; running a check needs `hypothesis` (a dev dependency).
"""
from __future__ import annotations

from typing import Any, Callable, Collection

from .limits import CHECK_TIMEOUT_S
from .referee import refereed
from .registry import EXERCISES, Exercise, MachineCheck
from .report import CheckReport, CheckResult, run_example, run_machine
from .unfinished import unfinished

__all__ = ["EXERCISES", "CheckReport", "CheckResult", "Exercise", "MachineCheck", "check", "grade"]


def check(
    name: str, cls_or_factory: Callable[..., Any], *, max_examples: int = 200, quiet: bool = False,
    exercises: dict[str, Exercise] = EXERCISES,
) -> CheckReport:
    """Grade a student's class (or a factory taking the same arguments) for exercise `name` on the VISIBLE checks;
    print and return the report.

    Examples run first, then the state machine (`max_examples` random programs of up to 30 steps; derandomized,
    so the same class always gets the same verdict). The machine runs only once every example passes.
    `quiet=True` returns the report without printing it. Raises ValueError only for an unknown exercise name.
    `exercises`: where `name` is looked up (reference.exercises passes these plus its tensor labs).
    """
    return _run(exercises, name, cls_or_factory, max_examples, quiet, hidden=False)


def grade(
    name: str, cls_or_factory: Callable[..., Any], *, max_examples: int = 200, quiet: bool = True,
    machines: Collection[str] = ("model", "rule", "long"), exercises: dict[str, Exercise] = EXERCISES,
    check_timeout: float | None = CHECK_TIMEOUT_S,
) -> CheckReport:
    """Every check of exercise `name`, visible and hidden, each run on its own and scored by its weight.

    What the autograder command runs (`python -m sim.exercises grade`). `quiet=False` also prints the report.
    `machines` picks the state machines to run by kind (registry.py); the examples always run. `check_timeout`:
    a check's time limit in seconds on the reference machine, scaled to this machine's speed (limits.py; None: no
    limit); a check that makes no progress for its limit fails alone, "an endless loop?".
    """
    return _run(exercises, name, cls_or_factory, max_examples, quiet, hidden=True, machines=machines,
                timeout=check_timeout)


def _run(exercises: dict[str, Exercise], name: str, cls_or_factory: Callable[..., Any], max_examples: int,
         quiet: bool, hidden: bool, machines: Collection[str] = ("model", "rule", "long"),
         timeout: float | None = CHECK_TIMEOUT_S) -> CheckReport:
    if name not in exercises:
        raise ValueError(f"unknown exercise {name!r} (allowed: {', '.join(exercises)})")
    if max_examples < 1:
        raise ValueError(f"max_examples must be >= 1, got {max_examples}")
    exercise = exercises[name]
    report = CheckReport(name, getattr(cls_or_factory, "__name__", repr(cls_or_factory)))
    report.not_implemented, report.missing = unfinished(
        cls_or_factory, exercise.probe_with, exercise.probes, exercise.surface
    )
    make = refereed(cls_or_factory, exercise.rules)
    if exercise.warm_up is not None:
        try:
            exercise.warm_up()
        except Exception:  # noqa: BLE001 - the checks that need what failed say so, each in its own words
            pass
    for example in exercise.examples:
        run_example(example.__doc__.strip(), example, make, report, timeout=timeout)
    unknown = set(machines) - {"model", "rule", "long"}
    if unknown:
        raise ValueError(f"unknown machine kinds {sorted(unknown)} (allowed: model, rule, long)")
    for machine in exercise.machines:
        if machine.kind not in machines:
            continue
        if machine.visibility == "hidden" and not hidden:
            report.num_hidden += 1
            continue
        n = machine.scale * max_examples
        build = (lambda m=machine, n=n: m.build(cls_or_factory, n, m.steps))
        run_machine(machine.title.format(n=n), build, report, machine.weight, machine.visibility,
                    after_examples=not hidden, timeout=timeout)
    if not quiet:
        print(report.text(exercise.title))
    return report
