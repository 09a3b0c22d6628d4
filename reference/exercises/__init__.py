"""The labs whose checks run tensors, and the grader over every exercise: `check(name, YourClass)`.

`sim.exercises` grades the allocator exercises and the labs that need only `sim` (sim never imports torch or
reference). The labs here check against the engine's own code: the torch attention oracle
(reference/attention/torch_ref.py), the batch's slot mapping, and Triton's interpreter. `EXERCISES` is all of them
in course order; `check` and `grade` are sim.exercises' over it, and `python -m reference.exercises grade` is its
autograder command.

    from reference.exercises import check
    check("triton_decode", MyPagedDecode)
"""
from __future__ import annotations

from typing import Any, Callable, Collection

from sim import exercises as _sim
from sim.exercises import CheckReport, Exercise
from sim.exercises.labs import load_labs

from . import labs

EXERCISES: dict[str, Exercise] = dict(sorted({**_sim.EXERCISES, **load_labs(labs.__name__, labs.__path__)}.items(),
                                             key=lambda item: item[1].notebook))

__all__ = ["EXERCISES", "check", "grade"]


def check(name: str, cls_or_factory: Callable[..., Any], *, max_examples: int = 200, quiet: bool = False
          ) -> CheckReport:
    """sim.exercises.check over every exercise, these labs included."""
    return _sim.check(name, cls_or_factory, max_examples=max_examples, quiet=quiet, exercises=EXERCISES)


def grade(name: str, cls_or_factory: Callable[..., Any], *, max_examples: int = 200, quiet: bool = True,
          machines: Collection[str] = ("model", "rule", "long"),
          check_timeout: float | None = _sim.CHECK_TIMEOUT_S) -> CheckReport:
    """sim.exercises.grade over every exercise, these labs included."""
    return _sim.grade(name, cls_or_factory, max_examples=max_examples, quiet=quiet, machines=machines,
                      exercises=EXERCISES, check_timeout=check_timeout)
