"""Detection gaps the grader used to miss: each planted bug below passed every visible check (or, for beam_cow, was
reported as a long program that did not shrink).

- memory_accounting: max_seq_len only ever a power of two, so forgetting the buddy rounding under `max` passed;
- first_fit: the "lowest-addressed hole" example had two equal holes, so best fit and worst fit passed it;
- block_table_attention: the store was only checked on caches contiguous in memory, so a store through reshape()
  (which copies a non-contiguous view, and loses the write) passed;
- beam_cow: the long check drew at least 30 steps, so its failures kept ~28 beams opened before the step that broke.
"""

from __future__ import annotations

import importlib

import pytest

from reference.exercises import check, grade

from .test_exercises import solution


def planted(name: str, bug: str):
    module = importlib.import_module(f"tests.notebooks.planted.{name}")
    return next(break_it for bug_id, break_it, _, _ in module.PLANTED if bug_id == bug)


def test_max_without_buddy_rounding_fails_a_visible_example_naming_the_rounding():
    bug = planted("memory_accounting", "max-forgets-the-buddy-rounding")(solution("memory_accounting"))
    report = check("memory_accounting", bug, quiet=True)
    text = report.text()
    assert not report.passed, text
    assert "max_seq_len 48" in text and "external_fragmentation: expected 16, found 0" in text, text
    assert "the buddy allocator rounds the reserved run of max_seq_len slots up to a power of two: 48 -> 64" in text


def test_random_pool_states_draw_lengths_that_are_no_power_of_two():
    bug = planted("memory_accounting", "max-forgets-the-buddy-rounding")(solution("memory_accounting"))
    machine = grade("memory_accounting", bug, max_examples=100, machines=("model",)).results[-1]
    assert machine.name.startswith("random pool states") and not machine.passed, machine.detail
    assert "rule 'max'" in machine.detail and "external_fragmentation: expected" in machine.detail, machine.detail


@pytest.mark.parametrize("bug, found", [("best-fit", 6), ("worst-fit", 10)])
def test_best_and_worst_fit_fail_the_lowest_hole_example(bug, found):
    report = check("first_fit", planted("first_fit", bug)(solution("first_fit")), quiet=True)
    first = report.results[0]
    assert first.name == "allocations go to the lowest-addressed hole that is long enough" and not first.passed
    assert f"expected 0, found {found}" in first.detail, first.detail


def test_store_through_a_reshape_fails_on_caches_not_contiguous_in_memory():
    bug = planted("block_table_attention", "stores-through-a-reshape")(solution("block_table_attention"))
    report = check("block_table_attention", bug, max_examples=25, quiet=True)
    store = report.results[1]
    assert store.name.startswith("store_kv writes") and not store.passed, report.text()
    assert "found [[nan, nan]]" in store.detail and "views of ONE array" in store.detail, store.detail
    machine = grade("block_table_attention", bug, max_examples=25, machines=("model",)).results[-1]
    assert not machine.passed and "a write into the copy is lost" in machine.detail, machine.detail


@pytest.mark.parametrize("bug", [b for b, *_ in importlib.import_module("tests.notebooks.planted.beam_cow").PLANTED])
def test_long_beam_programs_shrink_to_a_short_story(bug):
    report = grade("beam_cow", planted("beam_cow", bug)(solution("beam_cow")), max_examples=25, machines=("long",))
    machine = report.results[-1]
    assert machine.name.startswith("long programs") and not machine.passed, report.text()
    lines = machine.detail.splitlines()
    program = [line for line in lines[1:] if not line.startswith("broken") and "a pool of" not in line]
    assert len(program) <= 6, machine.detail  # was 38 to 58 lines, 21 to 29 of them new beams, before
    assert sum("new_beam(" in line for line in program) <= 2, machine.detail
