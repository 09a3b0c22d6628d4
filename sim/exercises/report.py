"""How an exercise is graded and how the verdict reads: narrated examples, then a hypothesis state machine.

A grade is a list of checks. Each narrated example is a small function that drives the student's class
through a story, recording every call on a `Story`; when an expectation fails, the feedback is the story
so far plus the expectation ("ref_count(0) after one owner frees: expected 1, found 2"). The state machine
is one of the project's own (`sim.testing`); when it fails, hypothesis has already shrunk the failing
program, and its `note()` lines (attached to the exception as `__notes__`) are printed as the steps.

Whatever the student's code raises is feedback, never a crash of the grader: the CALL that raised (named by
the `Referee` the student's class is wrapped in) and the line inside it. A `NotImplementedError` becomes
"method X is not implemented yet", X read from the frame that raised it; `unfinished.py` lists every such
method up front. Each check carries a weight (its score when it passes) and a visibility: "visible" checks
are what `check` runs in the notebook, "hidden" ones run only in the autograder (`python -m sim.exercises grade`).
"""
from __future__ import annotations

import math
import numbers
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from .limits import CHECK_TIMEOUT_S, CheckTimeout, time_limit
from .referee import RuleBroken, exercise_call, student_text
from .source import explain_name_error

INDENT = "      "
ROUNDING = 1e-9  # relative: a rate computed another way (1 - misses / total, a running mean) differs in its last bits


def same(found: Any, expected: Any) -> bool:
    """`found == expected`, except that floats (also inside lists, tuples and dicts) agree to within rounding.

    The spec fixes a value, not the arithmetic that reaches it: `hits / total` and `1 - misses / total` are the
    same hit rate, 0.2 and 0.19999999999999996. Containers must still be of the same kind and shape.
    """
    # NOTE: the student's value is read through the built-in types' own methods (int.__int__, list.copy, ...), never
    # its own __eq__ / __ne__: an int or list subclass whose __eq__ always says True passed three stories
    if expected is None:
        return found is None
    if isinstance(expected, bool):  # True, numpy's True, or 1 (a predicate answering 0 / 1 is still right)
        if type(found).__name__ in ("bool", "bool_"):
            return bool(found) is expected
        return isinstance(found, int) and int.__int__(found) == expected
    if _fractional(found) or _fractional(expected):
        return (isinstance(found, numbers.Real) and isinstance(expected, numbers.Real)
                and math.isclose(_float(found), float(expected), rel_tol=ROUNDING, abs_tol=1e-12))
    if isinstance(expected, numbers.Integral):
        return (isinstance(found, numbers.Integral) and not isinstance(found, bool)
                and (int.__int__(found) if isinstance(found, int) else int(found)) == expected)
    if isinstance(expected, str):
        return isinstance(found, str) and str.__str__(found) == expected
    if isinstance(expected, list) and isinstance(found, list) and type(expected) is list:
        found = list.copy(found)
    elif isinstance(expected, tuple) and isinstance(found, tuple) and type(expected) is tuple:
        found = tuple.__getitem__(found, slice(None))
    if isinstance(expected, (list, tuple)) and type(found) is type(expected):
        return len(found) == len(expected) and all(same(f, e) for f, e in zip(found, expected))
    if isinstance(expected, dict) and isinstance(found, dict):
        keys = dict.keys(found)
        return keys == expected.keys() and all(same(dict.__getitem__(found, k), expected[k]) for k in expected)
    return not found != expected


def _float(value: Any) -> float:
    return float.__float__(value) if isinstance(value, float) else float(value)


def _fractional(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)


@dataclass(slots=True)
class CheckResult:
    name: str  # the example's title, or "state machine (...)"
    passed: bool
    detail: str = ""  # why it failed: the steps taken and what broke (empty when passed or skipped)
    skipped: bool = False
    weight: float = 1.0  # the points it is worth
    visibility: str = "visible"  # "visible" (the notebook's check) or "hidden" (only the autograder runs it)

    @property
    def score(self) -> float:
        return self.weight if self.passed else 0.0


@dataclass(slots=True)
class CheckReport:
    """What `sim.exercises.check` found. `passed` is True only if every check ran and passed."""

    exercise: str
    implementation: str  # the graded class's name
    results: list[CheckResult] = field(default_factory=list)
    not_implemented: list[str] = field(default_factory=list)  # method names that raised NotImplementedError
    missing: list[str] = field(default_factory=list)  # methods the grader calls that the class does not define
    num_hidden: int = 0  # checks left for the autograder (not run here)
    notes: list[str] = field(default_factory=list)  # what reading the submission skipped, one line each (source.py)

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def num_failed(self) -> int:
        return sum(not r.passed and not r.skipped for r in self.results)

    @property
    def score(self) -> float:
        return sum(r.score for r in self.results)

    @property
    def max_score(self) -> float:
        return sum(r.weight for r in self.results)

    def text(self, title: str = "") -> str:
        lines = [f"Checking {self.implementation} for the exercise {self.exercise!r}{': ' + title if title else ''}"]
        lines += [f"Note: {note}" for note in self.notes]
        for r in self.results:
            mark = "-" if r.skipped else ("✓" if r.passed else "✗")
            hidden = ", hidden" if r.visibility == "hidden" else ""
            lines.append(f"  {mark} {r.name}   [{_points(r.score)}/{_points(r.weight)}{hidden}]")
            if r.detail:
                lines += [INDENT + line for line in r.detail.splitlines()]
        if self.missing:
            names = ", ".join(f"{name}" for name in self.missing)
            lines.append(f"Missing: your class does not define {names} (the grader calls it).")
        if self.not_implemented:
            names = ", ".join(f"{name}()" for name in self.not_implemented)
            verb = "is" if len(self.not_implemented) == 1 else "are"
            lines.append(f"Not finished yet: {names} {verb} not implemented yet (raising NotImplementedError).")
        elif self.missing:
            pass
        elif self.passed:
            lines.append(f"All {len(self.results)} checks passed.")
        else:
            lines.append(f"{self.num_failed} of {len(self.results)} checks failed: start with the first one above.")
        lines.append(f"Score: {_points(self.score)}/{_points(self.max_score)}")
        if self.num_hidden:
            lines.append(f"(The autograder runs {self.num_hidden} more check(s), hidden here.)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        verdict = "passed" if self.passed else f"{self.num_failed} of {len(self.results)} checks failed"
        return f"<CheckReport {self.exercise} for {self.implementation}: {verdict}>"


class ExpectationFailed(AssertionError):
    """An example's expectation did not hold; the message says what was expected and what was found."""


class Story:
    """Records the calls an example makes, so a failure can be told as the steps that led to it."""

    def __init__(self) -> None:
        self.steps: list[str] = []

    def do(self, obj: Any, method: str, *args: Any) -> Any:
        """Call obj.method(*args) and record it as `method(args) -> result`."""
        call = f"{method}({', '.join(repr(a) for a in args)})"
        self.steps.append(call)  # recorded first, so a call that raises is the story's last step
        result = getattr(obj, method)(*args)
        quiet = result is None and method in ("free", "share", "cache_block")  # methods that answer nothing
        self.steps[-1] = call if quiet else f"{call} -> {student_text(result, use_repr=True)}"
        return result

    def blocks(self, obj: Any, num_blocks: int) -> list[int]:
        """obj.allocate(num_blocks), which the story expects to succeed with `num_blocks` distinct block ids."""
        table = self.do(obj, "allocate", num_blocks)
        ok = isinstance(table, (list, tuple)) and len(set(table)) == num_blocks == len(table)  # as the machines take it
        self.ensure(ok, f"allocate({num_blocks}): expected a list of {num_blocks} distinct block ids, found {table!r}")
        return list(table)

    def say(self, text: str) -> None:
        """A line of narration in the steps ("# fork: both sequences now own block 0")."""
        self.steps.append(f"# {text}")

    def expect(self, what: str, found: Any, expected: Any) -> None:
        if not same(found, expected):
            raise ExpectationFailed(f"{what}: expected {expected!r}, found {found!r}")

    def ensure(self, ok: bool, message: str) -> None:
        if not ok:
            raise ExpectationFailed(message)

    def raises(self, error: type[BaseException], obj: Any, method: str, *args: Any) -> BaseException:
        """Call obj.method(*args) expecting `error`; record it and return the exception."""
        call = f"{method}({', '.join(repr(a) for a in args)})"
        try:
            getattr(obj, method)(*args)
        except (NotImplementedError, RuleBroken):
            raise
        except NameError as exc:  # a missing name is a bug to report (describe_error says which), not a refusal
            if error is not NameError:
                self.steps.append(f"{call} raised NameError")
                raise
            self.steps.append(f"{call} raised {type(exc).__name__}: {student_text(exc)}")
            return exc
        except error as exc:
            self.steps.append(f"{call} raised {type(exc).__name__}: {student_text(exc)}")
            return exc
        except Exception as exc:  # noqa: BLE001  (a wrong exception type is feedback, not a crash)
            self.steps.append(f"{call} raised {type(exc).__name__}: {student_text(exc)}")
            raise ExpectationFailed(f"{call}: expected {error.__name__}, found {type(exc).__name__}") from exc
        self.steps.append(call)
        raise ExpectationFailed(f"{call}: expected {error.__name__}, but nothing was raised")


def raising_method(exc: BaseException) -> str:
    """The name of the function in which `exc` was raised (the innermost frame of its traceback)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return frames[-1].name if frames else "?"


def _points(x: float) -> str:
    return f"{x:g}"


def describe_error(exc: BaseException) -> str:
    """One line: an expectation's own message, or what the student's code raised, during which call, and where."""
    if isinstance(exc, AssertionError) and student_text(exc):
        cause = exc.__cause__
        if isinstance(exc, RuleBroken) and isinstance(cause, NameError):  # never a bare NameError
            return f"broken: {exc} ({explain_name_error(cause)})"
        return f"broken: {student_text(exc)}"
    call = exercise_call(exc)
    during = f" during the call {call}" if call else ""
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    if frame is not None and "/sim/exercises/" in frame.filename.replace("\\", "/"):
        # raised by the grader's own call (wrong arguments, an unexpected return value), not inside your code
        return (f"{type(exc).__name__}: {student_text(exc)}{during} (calling your class; check the method's "
                f"signature and what it returns)")
    where = f" in {frame.name} (line {frame.lineno})" if frame else ""
    if isinstance(exc, NameError):  # never a bare NameError: which name, and where it went
        why = explain_name_error(exc).removeprefix("NameError: ")
        return f"your code raised NameError{during}{where}: {why}"
    if isinstance(exc, CheckTimeout):
        return f"{student_text(exc)}{during}{where}"
    if isinstance(exc, SystemExit):
        return f"your code called sys.exit({student_text(exc.code, use_repr=True)}){during}{where}"
    return f"your code raised {type(exc).__name__}: {student_text(exc)}{during}{where}"


def run_example(title: str, example: Callable[[Callable[..., Any], Story], None], make: Callable[..., Any],
                report: CheckReport, weight: float = 1.0, visibility: str = "visible",
                timeout: float | None = CHECK_TIMEOUT_S) -> None:
    story = Story()
    try:
        with time_limit(timeout):
            example(make, story)
    except NotImplementedError as exc:
        _not_implemented(report, exc)
        detail = f"{raising_method(exc)}() is not implemented yet"
        report.results.append(CheckResult(title, False, detail, weight=weight, visibility=visibility))
        return
    except BaseException as exc:  # anything the student's code raises is feedback (sys.exit() too), but Ctrl-C
        if isinstance(exc, KeyboardInterrupt):
            raise
        steps = "\n".join(["steps:"] + ["  " + s for s in story.steps]) + "\n" if story.steps else ""
        report.results.append(CheckResult(title, False, steps + describe_error(exc), weight=weight,
                                          visibility=visibility))
        return
    report.results.append(CheckResult(title, True, weight=weight, visibility=visibility))


def run_machine(title: str, build: Callable[[], type], report: CheckReport, weight: float = 1.0,
                visibility: str = "visible", after_examples: bool = True,
                timeout: float | None = CHECK_TIMEOUT_S) -> None:
    """Run a state machine (a TestCase class from `build()`); on failure, print hypothesis' shrunk program and
    the broken rule. `after_examples`: skip it while an example fails (the notebook's one-thing-at-a-time)."""
    # NOTE: in the notebook the machine runs only once every example passes: a failing example is the clearer
    # story, and shrinking a failing random program takes seconds. The autograder runs every check on its own
    # (after_examples=False), so each check's score depends on that check alone.
    def skipped(why: str) -> None:
        report.results.append(CheckResult(f"{title}: skipped until {why}", False, skipped=True, weight=weight,
                                          visibility=visibility))

    if report.not_implemented or report.missing:
        return skipped("every method is implemented")
    if after_examples and not all(r.passed for r in report.results):
        return skipped("the examples above pass")
    try:
        with time_limit(timeout):
            build()("runTest").runTest()
    except NotImplementedError as exc:
        _not_implemented(report, exc)
        detail = f"{raising_method(exc)}() is not implemented yet"
        report.results.append(CheckResult(title, False, detail, weight=weight, visibility=visibility))
        return
    except BaseException as exc:  # as in run_example
        if isinstance(exc, KeyboardInterrupt):
            raise
        report.results.append(CheckResult(title, False, _machine_story(exc), weight=weight, visibility=visibility))
        return
    report.results.append(CheckResult(title, True, weight=weight, visibility=visibility))


# Lines hypothesis adds around the program; the note() lines between them tell the story.
_HYPOTHESIS_LINES = ("Failing test case", "Falsifying", "state = ", "state.", "Draw ", "You can")


def _machine_story(exc: BaseException) -> str:
    notes = getattr(exc, "__notes__", [])
    notes = [student_text(n) for n in (notes if isinstance(notes, list) else [])]
    if any(n.startswith("Explanation") for n in notes):  # hypothesis' coverage explanation: not for students
        notes = notes[: next(i for i, n in enumerate(notes) if n.startswith("Explanation"))]
    steps = [n for n in notes if n.strip() and not n.startswith(_HYPOTHESIS_LINES)]
    if not steps:  # no narration: show hypothesis' own rendering of the program
        steps = [n for n in notes if n.startswith("state.")]
    lines = ["the shortest failing program hypothesis found:"] + ["  " + s for s in _collapse(steps)]
    call = exercise_call(exc)
    if call and not isinstance(exc, AssertionError):
        lines.append(f"  then {call} raised {type(exc).__name__}")
    frames = traceback.extract_tb(exc.__traceback__)
    machines = ("/sim/testing/", "/sim/exercises/machines.py")
    checking = [f.name for f in frames if any(m in f.filename.replace("\\", "/") for m in machines)]
    if checking:
        lines.append(f"  (it failed in the machine's `{checking[-1]}`)")
    lines.append(describe_error(exc))
    return "\n".join(lines)


def _collapse(steps: list[str]) -> list[str]:
    """Runs of the same step (hypothesis does not always shrink away no-ops like allocate(0)) as one line."""
    out: list[str] = []
    count = 0
    for i, step in enumerate(steps):
        count += 1
        if i + 1 == len(steps) or steps[i + 1] != step:
            out.append(step if count == 1 else f"{step}   (x{count})")
            count = 0
    return out


def _not_implemented(report: CheckReport, exc: BaseException) -> None:
    name = raising_method(exc)
    if name not in report.not_implemented:
        report.not_implemented.append(name)
