"""The autograder (sim.exercises.grade and `python -m sim.exercises grade`): scores, hidden checks, planted bugs.

A grader a course can use must refuse each planted bug (tests/notebooks/planted/: every exercise's solution
with one rule broken) with feedback that names the operation and the rule; give the solutions full marks;
list every unwritten method of a skeleton at once; and write Gradescope's results.json for a module or a
notebook. The slow part is a state machine shrinking a failing program, so each planted bug runs only the
machines that must catch it, with few programs.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import nbformat
import pytest

from reference.exercises import EXERCISES, check, grade

from .test_exercises import CASES, NOTEBOOKS, notebook, skeleton, solution

ROOT = NOTEBOOKS.parent
FEW = 25  # random programs per machine: enough for every planted bug below, quick to shrink

PLANTED = [
    pytest.param(name, break_it, machines, expected, id=f"{name}/{bug}")
    for name in CASES
    for bug, break_it, machines, expected in importlib.import_module(f"tests.notebooks.planted.{name}").PLANTED
]


def test_at_least_three_planted_bugs_per_exercise():
    for name in CASES:
        assert len(importlib.import_module(f"tests.notebooks.planted.{name}").PLANTED) >= 3, name


@pytest.mark.parametrize("name, break_it, machines, expected", PLANTED)
def test_planted_bug_is_caught_naming_the_operation_and_the_rule(name, break_it, machines, expected):
    report = grade(name, break_it(solution(name)), max_examples=FEW, machines=machines)
    text = report.text()
    assert report.score < report.max_score and not report.not_implemented, text
    for fragment in expected:
        assert fragment in text, text


def test_planted_bug_passes_the_project_machine_but_not_the_rule_machine():
    # the case: a refused share that already changed a block passed every check before
    bug = importlib.import_module("tests.notebooks.planted.block_allocator").share_not_all_or_nothing
    report = grade("block_allocator", bug(solution("block_allocator")), max_examples=FEW, machines=("model", "rule"))
    by_kind = {r.name.split(":")[0]: r for r in report.results}
    assert by_kind["state machine"].passed, report.text()
    rule = by_kind["all-or-nothing"]
    assert not rule.passed and rule.visibility == "hidden" and rule.score == 0
    assert "share([" in rule.detail and "must change nothing" in rule.detail, rule.detail


@pytest.mark.parametrize("name", sorted(CASES))
def test_solution_scores_full_marks_on_every_check(name):
    report = grade(name, solution(name), max_examples=FEW)
    assert report.passed and report.score == report.max_score > 0, report.text()
    kinds = {r.visibility for r in report.results}
    assert kinds == {"visible", "hidden"}
    assert sum(r.weight for r in report.results if r.visibility == "hidden") == 5.0


def test_check_runs_only_the_visible_checks():
    report = check("buddy", solution("buddy"), max_examples=FEW, quiet=True)
    assert {r.visibility for r in report.results} == {"visible"} and report.num_hidden == 2
    assert "The autograder runs 2 more check(s), hidden here." in report.text()
    assert not any("placement" in r.name for r in report.results)


@pytest.mark.parametrize("name", sorted(CASES))
def test_skeleton_lists_every_unwritten_method_at_once(name):
    report = grade(name, skeleton(name), max_examples=FEW)
    assert sorted(report.not_implemented) == sorted(CASES[name][3]) and not report.missing
    assert report.score == 0
    names = ", ".join(f"{m}()" for m in EXERCISES[name].probes)
    assert f"Not finished yet: {names} are not implemented yet" in report.text()


def test_missing_method_is_listed():
    source = (NOTEBOOKS / "solutions" / "block_allocator.py").read_text().replace("def share(", "def shared(")
    namespace: dict = {}
    exec(compile(source, "<block allocator without share>", "exec"), namespace)
    report = grade("block_allocator", namespace["MyBlockAllocator"], max_examples=FEW)
    assert report.missing == ["share"] and "Missing: your class does not define share" in report.text()
    assert report.score < report.max_score and all(r.skipped for r in report.results if "machine" in r.name)


def test_the_call_that_raised_is_named():
    class KeyErrorOnFree(solution("block_allocator")):
        def free(self, block_ids):
            return {}[block_ids[0]]  # a bug inside the student's code, not an expectation

    report = check("block_allocator", KeyErrorOnFree, max_examples=FEW, quiet=True)
    text = report.text()
    assert "your code raised KeyError: 0 during the call free([0, 1]) in free (line" in text, text


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "sim.exercises", "grade", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_cli_writes_gradescope_results(tmp_path):
    out = tmp_path / "results.json"
    done = _run_cli(
        "notebooks/solutions/buddy.py", "--exercise", "buddy", "--results", str(out), "--max-examples", str(FEW)
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert set(data) == {"score", "max_score", "output", "visibility", "stdout_visibility", "tests"}
    assert data["score"] == data["max_score"] == sum(t["max_score"] for t in data["tests"]) == 16.0
    for test in data["tests"]:
        assert set(test) == {"name", "score", "max_score", "status", "output", "visibility"}
        assert test["visibility"] in ("visible", "after_published") and test["status"] == "passed"
    assert [t["visibility"] for t in data["tests"]].count("after_published") == 2
    assert "placement" not in data["output"]  # the always-visible summary names no hidden check


def test_cli_grades_a_notebook_without_running_unrelated_cells(tmp_path):
    nb = notebook("prefix_cache")
    source = (NOTEBOOKS / "solutions" / "prefix_cache.py").read_text()
    nb.cells = [
        nbformat.v4.new_code_cell("%matplotlib inline\nimport math"),
        nbformat.v4.new_code_cell(source),
        nbformat.v4.new_code_cell("raise SystemExit('the grader must not run this cell')"),
        *[c for c in nb.cells if "skeleton" not in c.metadata.get("tags", [])],
    ]
    path = tmp_path / "student.ipynb"
    nbformat.write(nb, path)
    out = tmp_path / "results.json"
    done = _run_cli(str(path), "--exercise", "prefix_cache", "--results", str(out), "--max-examples", "10")
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["score"] == data["max_score"] > 0, data


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.py", "--exercise", "buddy"], "no such file: missing.py"),
        (["notebooks/solutions/buddy.py", "--exercise", "lru"], "unknown exercise 'lru' (allowed: first_fit, buddy"),
        (
            ["notebooks/solutions/first_fit.py", "--exercise", "prefix_cache"],
            "no class MyPrefixCachingAllocator found (nor any other class defining allocate, cache_block, lookup",
        ),
        (["notebooks/README.md", "--exercise", "buddy"], "expected a .py module or an .ipynb notebook, found .md"),
    ],
    ids=["no-file", "unknown-exercise", "no-class", "not-python"],
)
def test_cli_bad_input_is_one_line_and_status_2(args, message, tmp_path):
    out = tmp_path / "results.json"
    done = _run_cli(*args, "--results", str(out))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert json.loads(out.read_text())["score"] == 0  # Gradescope still shows the student why
