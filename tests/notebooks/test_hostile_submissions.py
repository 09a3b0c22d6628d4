"""Submissions that attack or break the grader, found by probing it from outside: every one gets a score and
readable feedback (or one `error:` line and a results.json), never a hang, a traceback or full marks it did not earn.

Each case is the lab 1 solution (first fit) with one change: a method that loops forever, an exception whose
__str__ has a typo in it, sys.exit() in a method or at the top level, hypothesis.reject() to hide the programs a
bug fails, values whose __eq__ always says True, a forged `__grader_notes__`, a notebook cell Python cannot parse,
a chain of computed constants; and --results paths that would overwrite the submission or cannot be written.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from sim.exercises import grade
from sim.exercises.source import find_class, load, notes

ROOT = Path(__file__).resolve().parents[2]
SOLUTION = (ROOT / "notebooks" / "solutions" / "first_fit.py").read_text()
CLASS = SOLUTION[SOLUTION.index("class MyFirstFitAllocator") :]
ALLOCATE = "    def allocate(self, size: int) -> int | None:\n"
assert ALLOCATE in CLASS


def _submission(tmp_path: Path, text: str, name: str = "student.py") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _grade(path: Path, **kwargs):
    namespace = load(path)
    cls = find_class(namespace, "MyFirstFitAllocator", ("allocate", "free"), path)
    return grade("first_fit", cls, max_examples=10, **kwargs), namespace


def _cli(path: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sim.exercises",
            "grade",
            str(path),
            "--exercise",
            "first_fit",
            "--max-examples",
            "10",
            *flags,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_an_endless_loop_fails_each_check_alone_after_its_time_limit(tmp_path):
    path = _submission(tmp_path, CLASS.replace(ALLOCATE, ALLOCATE + "        while True:\n            pass\n"))
    # the examples and the model machine: every kind of check the limit guards (the rule and long machines run
    # through the same guard; their endless loops cost a minute more and show nothing new)
    report, _ = _grade(path, check_timeout=1.0, machines=("model",))
    assert report.score == 0 and report.results
    # 1 s on the reference machine, scaled by this one's measured slowness (sim/exercises/limits.py)
    said = re.compile(
        r"made no progress for [\d.]+ s, past its time limit of [\d.]+ s without progress \(an endless loop\?\)"
    )
    assert all(said.search(r.detail) for r in report.results if r.detail), report.text()


def test_an_exception_whose_str_raises_is_feedback(tmp_path):
    broken = (
        "class OutOfSlots(Exception):\n    def __str__(self):\n        return f'no hole of {self.sise}'\n\n\n"
        + CLASS.replace(ALLOCATE, ALLOCATE + "        raise OutOfSlots()\n")
    )
    report, _ = _grade(_submission(tmp_path, broken))
    assert report.score < report.max_score
    assert any("<a OutOfSlots whose str() raised AttributeError>" in r.detail for r in report.results), report.text()


@pytest.mark.slow
def test_sys_exit_in_a_method_is_feedback_and_at_the_top_level_one_line(tmp_path):
    report, _ = _grade(
        _submission(tmp_path, "import sys\n" + CLASS.replace(ALLOCATE, ALLOCATE + "        sys.exit(0)\n"))
    )
    assert report.score < report.max_score and any("your code called sys.exit(0)" in r.detail for r in report.results)
    top = _submission(tmp_path, "import sys\nsys.exit(3)\n" + CLASS, "top.py")
    done = _cli(top, "--results", str(tmp_path / "r.json"))
    assert done.returncode == 2 and done.stderr.strip().endswith("running it raised SystemExit: it called sys.exit(3)")
    assert json.loads((tmp_path / "r.json").read_text())["score"] == 0


def test_hypothesis_reject_cannot_hide_a_bug(tmp_path):
    hiding = (
        "        import hypothesis\n        if self.num_slots > 16 and hypothesis.currently_in_test_context():\n"
        "            hypothesis.reject()\n        if self.num_slots > 16:\n            return None\n"
    )
    report, _ = _grade(_submission(tmp_path, CLASS.replace(ALLOCATE, ALLOCATE + hiding)))
    assert report.score < report.max_score
    assert any("only the grader may steer hypothesis" in r.detail for r in report.results), report.text()


def test_values_that_always_compare_equal_pass_nothing(tmp_path):
    cheat = (
        "class Any_(int):\n    def __eq__(self, o):\n        return True\n    def __ne__(self, o):\n"
        "        return False\n    __hash__ = int.__hash__\n\n\nclass MyFirstFitAllocator:\n"
        "    def __init__(self, num_slots):\n        self.num_slots = num_slots\n    @property\n"
        "    def num_free_slots(self):\n        return Any_(0)\n    def free_runs(self):\n        return []\n"
        "    def allocate(self, size):\n        return Any_(0)\n    def free(self, start):\n        pass\n"
    )
    report, _ = _grade(_submission(tmp_path, cheat))
    assert report.score == 0, report.text()


def test_a_forged_grader_note_is_not_shown(tmp_path):
    path = _submission(tmp_path, "__grader_notes__ = ['All 7 checks passed. Score: 13/13']\n" + CLASS)
    assert notes(load(path)) == []


def test_results_that_would_overwrite_the_submission_or_cannot_be_written_are_refused_first(tmp_path):
    path = _submission(tmp_path, CLASS)
    done = _cli(path, "--results", str(path))
    assert done.returncode == 2 and "is the submission itself" in done.stderr and path.read_text() == CLASS
    done = _cli(path, "--results", str(tmp_path / "no" / "r.json"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "no folder" in done.stderr


def test_a_notebook_cell_python_cannot_parse_is_skipped_and_a_long_chain_of_constants_loads(tmp_path):
    nb = nbformat.v4.new_notebook()
    chain = "c0 = abs(1)\n" + "".join(f"c{i} = abs(c{i - 1})\n" for i in range(1, 3000))
    uses = CLASS.replace("        self.num_slots = num_slots\n", "        self.num_slots = num_slots + 0 * c2999\n", 1)
    nb.cells = [
        nbformat.v4.new_code_cell("x = " + "-" * 200_000 + "1"),
        nbformat.v4.new_code_cell(chain),
        nbformat.v4.new_code_cell(uses),
    ]
    path = tmp_path / "student.ipynb"
    nbformat.write(nb, path)
    code = (
        "import sys; from pathlib import Path; from sim.exercises.source import load, notes; "
        "print(notes(load(Path(sys.argv[1]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )  # (it ran for minutes at 2,000 links: a pass per link, each over all)
    assert done.returncode == 0, done.stderr
    assert "skipped code cell 1" in done.stdout and "c2999" not in done.stdout, done.stdout
