"""Correct-but-different solutions must get full marks; the stories must not depend on choices the spec leaves open.

The grader was wrong both ways: a correct notebook scored 0 because a module-level `MIN_SIZES = list(range(1, 2))`
was dropped (a bare NameError), a broken scratch cell made a notebook ungradeable, and a correct block allocator
handing out blocks last-in-first-out failed the "refused free" story, which assumed lowest-id-first. So:

1. property check per story: every narrated example of an exercise passes on reference implementations that differ
   from the solution ONLY in a choice the spec leaves open (which free block `allocate` hands out; the order of
   never-used blocks in the prefix cache's queue);
2. every file of tests/notebooks/different/ gets full marks as a module, and inside the exercise's notebook next to
   a scratch cell that does not parse (skipped with one line naming it) and an experiment cell;
3. a name the student's code misses is told as which name and where it went, never as a bare NameError.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import nbformat
import pytest

from reference.exercises import EXERCISES, grade
from sim.exercises.referee import refereed
from sim.exercises.report import CheckReport, run_example
from sim.exercises.source import find_class, load, notes

from .test_exercises import NOTEBOOKS, notebook, solution

ROOT = NOTEBOOKS.parent
DIFFERENT = Path(__file__).parent / "different"
FEW = 25


# --- 1. stories independent of the spec's open choices --------------------------------------------------------
def _allocation_order(name: str, pick):
    """The block allocator solution, except that `allocate` hands out the free blocks `pick(free, n)` chooses."""
    base = solution("block_allocator")

    class Variant(base):
        def allocate(self, num_blocks):
            if not self.can_allocate(num_blocks):
                return None
            chosen = pick(list(self.free_blocks), num_blocks)
            for b in chosen:
                self.free_blocks.remove(b)
                self.ref_counts[b] = 1
            return chosen

    Variant.__name__ = name
    return Variant


def _lifo(free, n):  # the reported case: a stack, the last block pushed (freed) handed out first
    return [free[-1 - i] for i in range(n)]


def _scattered(free, n):  # neither end first: a fixed shuffle of the ids (deterministic, as hypothesis needs)
    return sorted(free, key=lambda b: ((b * 7919) % 13, b))[:n]


def _never_used_order(name: str, order):
    """The prefix cache solution, except that its never-used blocks sit in the queue in `order(range(n))`."""
    base = solution("prefix_cache")

    class Variant(base):
        def __init__(self, num_blocks, block_size):
            super().__init__(num_blocks, block_size)
            self.free_queue = OrderedDict.fromkeys(order(range(num_blocks)))

    Variant.__name__ = name
    return Variant


def _answers(name: str, cls_name: str, method: str, convert) -> type:
    """The solution of exercise `name`, except that `method` answers convert(the solution's answer): the same answer
    in another form the spec leaves open (a tuple for a list, float64 for float32, rounding in the last bits)."""
    base = solution(name)
    original = getattr(base, method)
    if isinstance(original, property):
        replaced = property(lambda self: convert(original.fget(self)))
    else:

        def replaced(self, *args):
            answer = original(self, *args)
            return None if answer is None else convert(answer)

    return type(cls_name, (base,), {method: replaced})


OPEN_CHOICES = [
    ("block_allocator", _answers("block_allocator", "AllocateAnswersATuple", "allocate", tuple)),
    # 1 - misses / total: the hit rate's other rounding (0.19999999999999996 for 0.2); it scored 6/15
    (
        "prefix_economics",
        _answers(
            "prefix_economics", "HitRateAsOneMinusMissRate", "hit_rate", lambda rate: 1 - (1 - rate) if rate else rate
        ),
    ),
    ("chunked_prefill", _answers("chunked_prefill", "AttentionInFloat64", "attend_chunk", lambda t: t.double())),
    ("triton_decode", _answers("triton_decode", "OnlineStepAnswersAList", "online_softmax_step", list)),
    ("block_allocator", _allocation_order("LIFO", _lifo)),
    ("block_allocator", _allocation_order("HighestIdFirst", lambda free, n: sorted(free, reverse=True)[:n])),
    ("block_allocator", _allocation_order("LowestIdFirst", lambda free, n: sorted(free)[:n])),
    ("block_allocator", _allocation_order("ScatteredFreeBlock", _scattered)),
    ("prefix_cache", _never_used_order("NeverUsedHighestFirst", lambda ids: reversed(ids))),
    ("prefix_cache", _never_used_order("NeverUsedShuffled", lambda ids: random.Random(3).sample(list(ids), len(ids)))),
]


@pytest.mark.parametrize("name, variant", OPEN_CHOICES, ids=[f"{n}/{v.__name__}" for n, v in OPEN_CHOICES])
def test_every_story_passes_whatever_the_open_choice(name, variant):
    exercise = EXERCISES[name]
    for example in exercise.examples:
        report = CheckReport(name, variant.__name__)
        run_example(example.__doc__.strip(), example, refereed(variant, exercise.rules), report)
        assert report.passed, report.text()


@pytest.mark.parametrize("name, variant", OPEN_CHOICES, ids=[f"{n}/{v.__name__}" for n, v in OPEN_CHOICES])
def test_open_choice_gets_full_marks(name, variant):
    report = grade(name, variant, max_examples=FEW)
    assert report.score == report.max_score > 0, report.text()


def test_the_refused_free_story_uses_the_blocks_handed_out():
    # the case: LIFO hands out [3, 2] on a fresh pool of 4... here of 3: [2, 1]; block 0 is the free one
    report = grade("block_allocator", _allocation_order("LIFO", _lifo), max_examples=FEW, machines=())
    story = next(r for r in report.results if r.name.startswith("a refused free"))
    assert story.passed, report.text()


# --- 2. correct-but-different solutions: full marks, as a module and in a notebook ----------------------------
def _exercise_of(path: Path) -> str:
    return max((n for n in EXERCISES if path.stem.startswith(n + "_")), key=len)


FILES = sorted(p for p in DIFFERENT.glob("*_*.py") if not p.name.startswith("_"))


def _grade_file(path: Path):
    namespace = load(path)
    name = _exercise_of(path)
    exercise = EXERCISES[name]
    cls = find_class(namespace, exercise.class_name, tuple(exercise.probes), path)
    return grade(name, cls, max_examples=FEW), notes(namespace)


def test_every_sim_lab_has_a_different_solution():
    covered = {_exercise_of(p) for p in FILES}
    assert {"first_fit", "buddy", "block_allocator", "token_budget", "victim_policy", "prefix_economics"} <= covered


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_different_module_gets_full_marks(path):
    report, skipped = _grade_file(path)
    assert report.score == report.max_score > 0 and not skipped, report.text()


def _student_notebook(name: str, cells: list[str]) -> nbformat.NotebookNode:
    """The exercise's notebook with the skeleton cell replaced by `cells` (the student's code cells)."""
    nb = notebook(name)
    out = []
    for cell in nb.cells:
        if "skeleton" in cell.metadata.get("tags", []):
            out += [nbformat.v4.new_code_cell(source) for source in cells]
        else:
            out.append(cell)
    nb.cells = out
    return nb


SCRATCH = "for x in range(3)\n    print(x)"  # a scratch cell that does not parse
EXPERIMENT = "a = {cls}(*{args})\nprint(a)\nraise RuntimeError('an experiment the grader must not run')"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_different_notebook_with_a_broken_scratch_cell_gets_full_marks(path, tmp_path):
    name = _exercise_of(path)
    exercise = EXERCISES[name]
    experiment = EXPERIMENT.format(cls=exercise.class_name, args=tuple(exercise.probe_with))
    nb = _student_notebook(name, [path.read_text(), SCRATCH, experiment])
    student = tmp_path / f"{path.stem}.ipynb"  # so _exercise_of finds the exercise from the name
    nbformat.write(nb, student)
    report, skipped = _grade_file(student)
    assert report.score == report.max_score > 0, report.text()
    assert len(skipped) == 1 and "skipped code cell" in skipped[0] and "for x in range(3)" in skipped[0], skipped
    assert "SyntaxError" in skipped[0]


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_the_notebooks_own_cells_cost_no_note(name, tmp_path):
    """The solution in place of the skeleton: the notebook's own experiment cells are never noted as skipped (lab 7's
    `chunks = [... engines["chunked"] ...]` read an experiment the grader does not run, in every student's report)."""
    module = EXERCISES[name].solution
    student = tmp_path / f"{name}_student.ipynb"
    nbformat.write(_student_notebook(name, [(NOTEBOOKS / "solutions" / f"{module}.py").read_text()]), student)
    assert notes(load(student)) == []


# --- the reported case, exactly --------------------------------------------------------------------------------
FIRST_FIT = (NOTEBOOKS / "solutions" / "first_fit.py").read_text()
WITH_MIN_SIZES = FIRST_FIT.replace(
    "class MyFirstFitAllocator:", "MIN_SIZES = list(range(1, 2))\n\n\nclass MyFirstFitAllocator:"
).replace("if size < 1:", "if size < MIN_SIZES[0]:")


def _grade_notebook(tmp_path: Path, cells: list[str], name: str = "first_fit"):
    path = tmp_path / f"{name}_student.ipynb"
    nbformat.write(_student_notebook(name, cells), path)
    return _grade_file(path)


def test_reported_case_min_sizes_computed_at_module_level_gets_full_marks(tmp_path):
    assert "MIN_SIZES[0]" in WITH_MIN_SIZES
    report, skipped = _grade_notebook(tmp_path, [WITH_MIN_SIZES])
    assert report.score == report.max_score == 13, report.text()
    assert not skipped


def test_constant_computed_in_a_cell_of_its_own_is_kept(tmp_path):
    cls = WITH_MIN_SIZES.replace("MIN_SIZES = list(range(1, 2))", "")
    report, skipped = _grade_notebook(tmp_path, ["LOWEST = 1\nMIN_SIZES = list(range(LOWEST, 2))", cls])
    assert report.score == report.max_score == 13, (report.text(), skipped)


def test_name_defined_only_in_a_broken_cell_is_explained(tmp_path):
    broken = "MIN_SIZES = list(range(1, 2))\nfor x in range(3)\n    print(x)"
    cls = WITH_MIN_SIZES.replace("MIN_SIZES = list(range(1, 2))", "")
    report, skipped = _grade_notebook(tmp_path, [broken, cls])
    text = report.text()
    assert report.score < report.max_score
    assert "name 'MIN_SIZES' is not defined when the grader runs your code: it is defined in code cell" in text, text
    assert "which the grader skipped (line 2: SyntaxError" in text, text
    assert len(skipped) == 1 and "'MIN_SIZES = list(range(1, 2))'" in skipped[0], skipped


def test_name_defined_nowhere_is_explained(tmp_path):
    cls = WITH_MIN_SIZES.replace("MIN_SIZES = list(range(1, 2))", "")
    report, _ = _grade_notebook(tmp_path, [cls])
    text = report.text()
    assert "name 'MIN_SIZES' is not defined: nothing in your submission defines or imports MIN_SIZES" in text, text
    assert "raised NameError: name 'MIN_SIZES' is not defined during" not in text  # never the bare error


def test_name_bound_in_a_loop_is_explained(tmp_path):
    cls = WITH_MIN_SIZES.replace("MIN_SIZES = list(range(1, 2))", "")
    report, _ = _grade_notebook(tmp_path, ["for _ in range(1):\n    MIN_SIZES = [1]", cls])
    assert "MIN_SIZES" in report.text() and "a top-level `for` block" in report.text(), report.text()


def test_statement_that_raises_is_skipped_with_one_line(tmp_path):
    report, skipped = _grade_notebook(tmp_path, [WITH_MIN_SIZES + "\nDATA = open('/no/such/file').read()\n"])
    assert report.score == report.max_score, report.text()
    assert len(skipped) == 1 and "it raised FileNotFoundError" in skipped[0], skipped
    assert skipped[0].startswith("skipped line ") and "of code cell" in skipped[0], skipped


def test_class_in_a_broken_cell_names_the_cell(tmp_path):
    path = tmp_path / "broken.ipynb"
    nbformat.write(_student_notebook("first_fit", [FIRST_FIT + "\n  oops"]), path)
    with pytest.raises(Exception, match=r"no class MyFirstFitAllocator found .*skipped code cell \d+"):
        find_class(load(path), "MyFirstFitAllocator", ("allocate",), path)


def test_cli_tells_the_skipped_cell_and_gives_full_marks(tmp_path):
    path = tmp_path / "student.ipynb"
    nbformat.write(_student_notebook("first_fit", [WITH_MIN_SIZES, SCRATCH]), path)
    out = tmp_path / "results.json"
    command = [
        sys.executable,
        "-m",
        "sim.exercises",
        "grade",
        str(path),
        "--exercise",
        "first_fit",
        "--results",
        str(out),
        "--max-examples",
        "10",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["score"] == data["max_score"] == 13, data
    assert "Note: skipped code cell" in data["output"] and "SyntaxError" in data["output"], data["output"]
    assert "Note: skipped code cell" in done.stdout
