"""How an exercise is graded and how the verdict reads: narrated examples, then a hypothesis state machine.

A grade is a list of checks. Each narrated example is a small function that drives the student's class
through a story, recording every call on a `Story`; when an expectation fails, the feedback is the story
so far plus the expectation ("ref_count(0) after one owner frees: expected 1, found 2"). The state machine
is one of the project's own (`sim.testing`); when it fails, hypothesis has already shrunk the failing
program, and its `note()` lines (attached to the exception as `__notes__`) are printed as the steps.

Whatever the student's code raises is feedback, never a crash of the grader. A `NotImplementedError`
becomes "method X is not implemented yet", X read from the frame that raised it.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

INDENT = "      "


@dataclass(slots=True)
class CheckResult:
    name: str  # the example's title, or "state machine (...)"
    passed: bool
    detail: str = ""  # why it failed: the steps taken and what broke (empty when passed or skipped)
    skipped: bool = False


@dataclass(slots=True)
class CheckReport:
    """What `sim.exercises.check` found. `passed` is True only if every check ran and passed."""

    exercise: str
    implementation: str  # the graded class's name
    results: list[CheckResult] = field(default_factory=list)
    not_implemented: list[str] = field(default_factory=list)  # method names that raised NotImplementedError

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def num_failed(self) -> int:
        return sum(not r.passed and not r.skipped for r in self.results)

    def text(self, title: str = "") -> str:
        lines = [f"Checking {self.implementation} for the exercise {self.exercise!r}{': ' + title if title else ''}"]
        for r in self.results:
            mark = "-" if r.skipped else ("✓" if r.passed else "✗")
            lines.append(f"  {mark} {r.name}")
            if r.detail:
                lines += [INDENT + line for line in r.detail.splitlines()]
        if self.not_implemented:
            names = ", ".join(f"{name}()" for name in self.not_implemented)
            verb = "is" if len(self.not_implemented) == 1 else "are"
            lines.append(f"Not finished yet: {names} {verb} not implemented yet (raising NotImplementedError).")
        elif self.passed:
            lines.append(f"All {len(self.results)} checks passed.")
        else:
            lines.append(f"{self.num_failed} of {len(self.results)} checks failed: start with the first one above.")
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
        self.steps[-1] = call if quiet else f"{call} -> {result!r}"
        return result

    def blocks(self, obj: Any, num_blocks: int) -> list[int]:
        """obj.allocate(num_blocks), which the story expects to succeed with `num_blocks` distinct block ids."""
        table = self.do(obj, "allocate", num_blocks)
        ok = isinstance(table, list) and len(set(table)) == num_blocks == len(table)
        self.ensure(ok, f"allocate({num_blocks}): expected a list of {num_blocks} distinct block ids, found {table!r}")
        return table

    def say(self, text: str) -> None:
        """A line of narration in the steps ("# fork: both sequences now own block 0")."""
        self.steps.append(f"# {text}")

    def expect(self, what: str, found: Any, expected: Any) -> None:
        if found != expected:
            raise ExpectationFailed(f"{what}: expected {expected!r}, found {found!r}")

    def ensure(self, ok: bool, message: str) -> None:
        if not ok:
            raise ExpectationFailed(message)

    def raises(self, error: type[BaseException], obj: Any, method: str, *args: Any) -> BaseException:
        """Call obj.method(*args) expecting `error`; record it and return the exception."""
        call = f"{method}({', '.join(repr(a) for a in args)})"
        try:
            getattr(obj, method)(*args)
        except NotImplementedError:
            raise
        except error as exc:
            self.steps.append(f"{call} raised {type(exc).__name__}: {exc}")
            return exc
        except Exception as exc:  # noqa: BLE001  (a wrong exception type is feedback, not a crash)
            self.steps.append(f"{call} raised {type(exc).__name__}: {exc}")
            raise ExpectationFailed(f"{call}: expected {error.__name__}, found {type(exc).__name__}") from exc
        self.steps.append(call)
        raise ExpectationFailed(f"{call}: expected {error.__name__}, but nothing was raised")


def raising_method(exc: BaseException) -> str:
    """The name of the function in which `exc` was raised (the innermost frame of its traceback)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return frames[-1].name if frames else "?"


def describe_error(exc: BaseException) -> str:
    """One line: an expectation's own message, or what the student's code raised and where."""
    if isinstance(exc, AssertionError) and str(exc):
        return f"broken: {exc}"
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    if frame is not None and "/sim/exercises/" in frame.filename.replace("\\", "/"):
        # raised by the grader's own call (wrong arguments, an unexpected return value), not inside your code
        return (f"{type(exc).__name__}: {exc} (calling your class; check the method's signature "
                f"and what it returns)")
    where = f" in {frame.name} (line {frame.lineno})" if frame else ""
    return f"your code raised {type(exc).__name__}: {exc}{where}"


def run_example(title: str, example: Callable[[Callable[..., Any], Story], None], make: Callable[..., Any],
                report: CheckReport) -> None:  # fmt: skip
    story = Story()
    try:
        example(make, story)
    except NotImplementedError as exc:
        _not_implemented(report, exc)
        report.results.append(CheckResult(title, False, f"{raising_method(exc)}() is not implemented yet"))
        return
    except Exception as exc:  # noqa: BLE001  (anything the student's code raises is feedback)
        steps = "\n".join(["steps:"] + ["  " + s for s in story.steps]) + "\n" if story.steps else ""
        report.results.append(CheckResult(title, False, steps + describe_error(exc)))
        return
    report.results.append(CheckResult(title, True))


def run_machine(title: str, test_case: type, report: CheckReport) -> None:
    """Run a `sim.testing` TestCase; on failure, print hypothesis' shrunk program and the broken invariant."""
    # NOTE: the machine runs only once every example passes: a failing example is the clearer story, and
    # shrinking a failing random program takes seconds. One thing to fix at a time.
    if report.not_implemented:
        report.results.append(CheckResult(title + ": skipped until every method is implemented", False, skipped=True))
        return
    if not all(r.passed for r in report.results):
        report.results.append(CheckResult(title + ": skipped until the examples above pass", False, skipped=True))
        return
    try:
        test_case("runTest").runTest()
    except NotImplementedError as exc:
        _not_implemented(report, exc)
        report.results.append(CheckResult(title, False, f"{raising_method(exc)}() is not implemented yet"))
        return
    except Exception as exc:  # noqa: BLE001
        report.results.append(CheckResult(title, False, _machine_story(exc)))
        return
    report.results.append(CheckResult(title, True))


# Lines hypothesis adds around the program; the note() lines between them tell the story.
_HYPOTHESIS_LINES = ("Failing test case", "Falsifying", "state = ", "state.", "Draw ", "You can")


def _machine_story(exc: BaseException) -> str:
    notes = [str(n) for n in getattr(exc, "__notes__", [])]
    if any(n.startswith("Explanation") for n in notes):  # hypothesis' coverage explanation: not for students
        notes = notes[: next(i for i, n in enumerate(notes) if n.startswith("Explanation"))]
    steps = [n for n in notes if n.strip() and not n.startswith(_HYPOTHESIS_LINES)]
    if not steps:  # no narration: show hypothesis' own rendering of the program
        steps = [n for n in notes if n.startswith("state.")]
    lines = ["the shortest failing program hypothesis found:"] + ["  " + s for s in _collapse(steps)]
    frames = traceback.extract_tb(exc.__traceback__)
    checking = [f.name for f in frames if "/sim/testing/" in f.filename.replace("\\", "/")]
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
