"""A grade as Gradescope's results.json (https://gradescope-autograders.readthedocs.io/en/latest/specs/).

One test per check, in the order they ran: its name, score, max_score, status, output (the same feedback the
notebook prints) and visibility. Visible checks are "visible"; hidden ones get `hidden_visibility`, by default
"after_published": a student sees them, with their feedback, once the grades are published, not while the
assignment is open (Gradescope's "hidden" never shows them). The top-level "output" names what is unfinished;
"stdout_visibility" is "hidden", since stdout holds the hidden checks' feedback too.
"""
from __future__ import annotations

from typing import Any

from .report import CheckReport

VISIBILITIES = ("hidden", "after_due_date", "after_published", "visible")  # Gradescope's test visibilities


def results(report: CheckReport, title: str = "", hidden_visibility: str = "after_published") -> dict[str, Any]:
    if hidden_visibility not in VISIBILITIES:
        raise ValueError(f"hidden_visibility must be one of {', '.join(VISIBILITIES)}, got {hidden_visibility!r}")
    tests = []
    for number, r in enumerate(report.results, 1):
        status = "passed" if r.passed else "failed"
        output = r.detail or ("passed" if r.passed else "skipped" if r.skipped else "failed")
        tests.append({
            "name": f"{number}. {r.name}",
            "score": r.score,
            "max_score": r.weight,
            "status": status,
            "output": output,
            "visibility": "visible" if r.visibility == "visible" else hidden_visibility,
        })
    # NOTE: the top-level output is always shown, so it names no hidden check: what is unfinished, and the title.
    summary = [f"{report.implementation} for the exercise {report.exercise!r}{': ' + title if title else ''}"]
    summary += [f"Note: {note}" for note in report.notes]  # skipped notebook cells: the student must see why
    if report.missing:
        summary.append(f"Missing: your class does not define {', '.join(report.missing)}.")
    if report.not_implemented:
        summary.append(f"Not implemented yet: {', '.join(n + '()' for n in report.not_implemented)}.")
    return {
        "score": report.score,
        "max_score": report.max_score,
        "output": "\n".join(summary),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
    }


def refusal(message: str) -> dict[str, Any]:
    """The results.json of a submission that could not be graded (no class, not valid Python ...): 0 points."""
    return {"score": 0.0, "output": message, "visibility": "visible", "stdout_visibility": "hidden", "tests": []}
