"""The autograder command: grade a student's module or notebook, print the feedback, write results.json.

    python -m sim.exercises grade SOURCE --exercise NAME [--results results.json]
        [--max-examples N] [--hidden-visibility after_published]

SOURCE is a .py module or an .ipynb notebook (source.py says what runs). Every check runs, visible and hidden
(registry.py lists them with their weights). Exit status 0 when the grade was written, whatever the score;
2 with one line on stderr when it cannot be (no such file, no class, unknown exercise, a bad flag). With
--results, a submission that cannot be graded still gets a results.json: 0 points and the same line, so the
student sees why on Gradescope.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import EXERCISES, grade
from .gradescope import VISIBILITIES, refusal, results
from .limits import CHECK_TIMEOUT_S, SLOW_CAP, STALL_S, CheckTimeout, time_limit
from .source import SubmissionError, find_class, load, notes


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and exit status 2, as for every bad input here
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser(exercises: dict, prog: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="Grade a classroom exercise (notebooks/exercises).")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    g = commands.add_parser("grade", help="grade a .py module or .ipynb notebook into Gradescope's results.json")
    g.add_argument("source", type=Path, help="the student's .py module or .ipynb notebook")
    g.add_argument("--exercise", required=True, help=f"one of: {', '.join(exercises)}")
    g.add_argument("--results", type=Path, help="where to write Gradescope's results.json")
    g.add_argument("--max-examples", type=int, default=200, help="random programs per state machine (default 200)")
    g.add_argument("--hidden-visibility", default="after_published", choices=VISIBILITIES,
                   help="Gradescope visibility of the hidden checks (default after_published)")
    g.add_argument("--check-timeout", type=float, default=CHECK_TIMEOUT_S, metavar="SECONDS",
                   help=f"a check's time limit on the reference machine, scaled by this machine's speed measured at "
                   f"the start: a check with no progress for min({STALL_S:g}, SECONDS) scaled seconds fails alone as an "
                   f"endless loop; one still progressing past SECONDS scaled may run {SLOW_CAP:g}x longer (default "
                   f"{CHECK_TIMEOUT_S:g}; 0: no limit)")
    return parser


def _check_results_path(results: Path, source: Path) -> None:
    """Before grading: --results must be a file this command can write, and not the submission itself."""
    if results.exists() and source.exists() and results.resolve() == source.resolve():
        raise SubmissionError(f"--results {results}: is the submission itself (allowed: another file)")
    if results.is_dir():
        raise SubmissionError(f"--results {results}: is a folder (allowed: a file path)")
    folder = results.parent if str(results.parent) else Path(".")
    if not folder.is_dir():
        raise SubmissionError(f"--results {results}: no folder {folder} (allowed: a file in an existing folder)")


def _write_results(path: Path, data: dict) -> int:
    try:
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        print(f"error: cannot write --results {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None, exercises: dict = EXERCISES, prog: str = "python -m sim.exercises") -> int:
    """The command over `exercises` (reference.exercises runs it over these plus its tensor labs)."""
    args = _parser(exercises, prog).parse_args(argv)
    try:
        if args.exercise not in exercises:
            raise SubmissionError(f"unknown exercise {args.exercise!r} (allowed: {', '.join(exercises)})")
        if args.max_examples < 1:
            raise SubmissionError(f"--max-examples must be >= 1, got {args.max_examples}")
        if not args.check_timeout >= 0:
            raise SubmissionError(f"--check-timeout must be >= 0 seconds (0: no limit), got {args.check_timeout}")
        if args.results is not None:
            _check_results_path(args.results, args.source)
        exercise = exercises[args.exercise]
        timeout = args.check_timeout or None
        try:
            with time_limit(timeout, what="its top-level code"):  # the file's top-level code runs here
                namespace = load(args.source)
        except CheckTimeout as exc:
            raise SubmissionError(f"{args.source}: {exc}") from None
        cls = find_class(namespace, exercise.class_name, tuple(exercise.probes), args.source)
    except SubmissionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if args.results is not None and "--results" not in str(exc):
            _write_results(args.results, refusal(str(exc)))
        return 2
    report = grade(args.exercise, cls, max_examples=args.max_examples, exercises=exercises, check_timeout=timeout)
    report.notes[:0] = notes(namespace)  # the notebook's skipped cells, each one line, before the checks
    print(report.text(exercise.title))
    if args.results is not None:
        return _write_results(args.results, results(report, exercise.title, args.hidden_visibility))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
