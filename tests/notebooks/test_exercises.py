"""The classroom exercises (notebooks/exercises/) and their grader (sim.exercises.check).

A grader must pass a right answer, refuse an unfinished one with "not implemented yet", and refuse a
subtly wrong one with feedback that names what broke. The solutions are loaded from notebooks/solutions/
(student-style modules, independent of sim's own allocators); the skeletons are exec'd from the cell
tagged "skeleton" of each exercise notebook, exactly as a student first runs it.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

from reference.exercises import EXERCISES, check  # every exercise: sim's and the labs that run tensors
from sim import exercises as sim_exercises

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

# exercise name -> (notebook, solution module, class name, the methods the student writes): from the registry
CASES = {name: (e.notebook, e.solution, e.class_name, set(e.probes)) for name, e in EXERCISES.items()}


def solution(name: str) -> type:
    _, module, cls, _ = CASES[name]
    spec = importlib.util.spec_from_file_location(f"solution_{module}", NOTEBOOKS / "solutions" / f"{module}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, cls)


def notebook(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / "exercises" / f"{CASES[name][0]}.ipynb", as_version=4)


def skeleton(name: str) -> type:
    cells = [c for c in notebook(name).cells if "skeleton" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"expected one cell tagged 'skeleton', found {len(cells)}"
    namespace: dict = {}
    exec(compile(cells[0].source, f"<skeleton of {name}>", "exec"), namespace)
    return namespace[CASES[name][2]]


def test_every_exercise_has_a_notebook_and_a_solution():
    assert set(CASES) == set(EXERCISES)
    found = {p.stem for p in (NOTEBOOKS / "exercises").glob("*.ipynb")}
    assert found == {notebook for notebook, *_ in CASES.values()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_solution_passes(name):
    report = check(name, solution(name), quiet=True)
    assert report.passed, report.text()
    assert "All" in report.text() and "checks passed" in report.text()


@pytest.mark.parametrize("name", sorted(CASES))
def test_empty_skeleton_fails_as_not_implemented(name):
    report = check(name, skeleton(name), quiet=True)
    assert not report.passed
    text = report.text()
    assert "not implemented yet" in text, text
    assert set(report.not_implemented) <= CASES[name][3] and report.not_implemented, report.not_implemented
    assert "skipped until every method is implemented" in text  # no state machine on an unfinished class


@pytest.mark.parametrize("name", sorted(CASES))
def test_skeleton_is_the_solution_with_the_exercise_left_out(name):
    ours, theirs = solution(name), skeleton(name)
    assert set(vars(ours)) == set(vars(theirs)), "skeleton and solution must define the same methods"
    for method in CASES[name][3]:
        attr = vars(theirs)[method]
        func = attr.fget if isinstance(attr, property) else attr
        with pytest.raises(NotImplementedError):
            func(ours.__new__(ours), *([1] * (func.__code__.co_argcount - 1)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_check_cell_is_one_line(name):
    cls = CASES[name][2]
    sources = [c.source for c in notebook(name).cells if c.cell_type == "code"]
    grader = "sim" if name in sim_exercises.EXERCISES else "reference"  # sim's own labs need no torch
    assert any(re.fullmatch(rf'from {grader}\.exercises import check; check\("{name}", {cls}\);?', s) for s in sources)


# --- subtly broken solutions: the feedback must say what broke -----------------------------------------
def _free_forgets_shared(base):
    class FreeForgetsSharedBlocks(base):
        def free(self, block_ids):  # only blocks with one owner are released; shared ones keep every owner
            for b in block_ids:
                if self.ref_counts[b] == 0:
                    raise RuntimeError(f"block {b} is free")
                if self.ref_counts[b] == 1:
                    self.ref_counts[b] = 0
                    self.free_blocks.append(b)

    return FreeForgetsSharedBlocks


def _no_coalescing(base):
    class NoCoalescing(base):
        def free(self, start):  # puts the run back without merging it with its neighbours
            if start not in self.runs:
                raise RuntimeError(f"free of slot {start}, which starts no allocation")
            self.holes = sorted(self.holes + [(start, self.runs.pop(start))])

    return NoCoalescing


def _counts_references_as_used_blocks(base):
    class CountsReferences(base):
        @property
        def num_used_blocks(self):  # a block shared twice counted twice: only the state machine shares, then asks
            return sum(self.ref_counts)

    return CountsReferences


def _buddy_never_merges(base):
    class NeverMerges(base):
        def free(self, start):
            if start not in self.orders:
                raise RuntimeError(f"free of slot {start}, which starts no allocation")
            self.free_lists[self.orders.pop(start)].add(start)

    return NeverMerges


def _evicts_most_recently_freed(base):
    class EvictsMostRecentlyFreed(base):
        def free(self, block_ids):  # freed blocks go to the FRONT: the freshest cached prefix is evicted first
            super().free(block_ids)
            for b in block_ids:
                if self.ref_counts[b] == 0:
                    self.free_queue.move_to_end(b, last=False)

    return EvictsMostRecentlyFreed


@pytest.mark.parametrize(
    "name, break_it, expected",
    [
        (
            "block_allocator",
            _free_forgets_shared,
            "ref counts of [0, 1] after one owner frees: expected [1, 1], found [2, 2]",
        ),
        ("first_fit", _no_coalescing, "free_runs() after freeing the middle: one run again: expected [(0, 12)]"),
        ("block_allocator", _counts_references_as_used_blocks, "free + used: expected 6"),
        ("buddy", _buddy_never_merges, "0+4 merge into 8, which merges with 8 into 16: expected [(0, 16)]"),
        ("prefix_cache", _evicts_most_recently_freed, "allocate(1): expected [1], found [2]"),
    ],
    ids=["free-forgets-shared", "no-coalescing", "used-counts-references", "buddy-never-merges", "evicts-most-recent"],
)
def test_broken_solution_gets_feedback_naming_what_broke(name, break_it, expected):
    report = check(name, break_it(solution(name)), max_examples=100, quiet=True)
    text = report.text()
    assert not report.passed and not report.not_implemented
    assert expected in text, text
    assert "✗" in text and "checks failed" in text
    machine = report.results[-1]  # skipped after a failed example, else it must fail and say why
    assert machine.skipped or (not machine.passed and "broken:" in machine.detail), text


def test_state_machine_failure_prints_the_shrunk_program():
    broken = _counts_references_as_used_blocks(solution("block_allocator"))
    report = check("block_allocator", broken, max_examples=100, quiet=True)
    assert all(r.passed for r in report.results[:-1]), report.text()  # the examples never share and then count
    machine = report.results[-1]
    assert not machine.passed and machine.name.startswith("state machine")
    assert "the shortest failing program hypothesis found:" in machine.detail
    assert "share([" in machine.detail  # the note() steps of sim.testing.blocks
    assert "it failed in the machine's `agrees_with_model`" in machine.detail


def test_unknown_exercise_is_refused():
    with pytest.raises(ValueError, match="unknown exercise 'lru' \\(allowed: first_fit, buddy"):
        check("lru", object)
