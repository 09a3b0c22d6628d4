"""`--quick` (tests/conftest.py, `make check`): which tests the edit-test loop keeps, and that it reaches every module."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from .conftest import quick_selection

ROOT = Path(__file__).resolve().parents[1]


class Item(NamedTuple):  # what the rule reads of a collected test
    module: str
    function: str
    case: str = ""
    slow: bool = False


def select(items: list[Item]) -> tuple[list[Item], list[str]]:
    return quick_selection(items, module=lambda i: i.module, function=lambda i: i.function, slow=lambda i: i.slow)


def test_slow_tests_and_later_cases_are_left_out_in_order():
    items = [
        Item("a.py", "test_x", "1"),
        Item("a.py", "test_x", "2"),
        Item("a.py", "test_slow", slow=True),
        Item("a.py", "test_y"),
        Item("b.py", "test_x", "1"),
        Item("b.py", "test_x", "2"),
    ]
    kept, rescued = select(items)
    # test_x's first case in each module (the same name in two modules is two tests), test_y; no slow test
    assert kept == [items[0], items[3], items[4]] and rescued == []


def test_a_module_whose_tests_are_all_slow_keeps_its_first():
    items = [
        Item("a.py", "test_x"),
        Item("nb.py", "test_run", "01", slow=True),
        Item("nb.py", "test_run", "02", slow=True),
        Item("nb.py", "test_other", slow=True),
    ]
    kept, rescued = select(items)
    assert kept == [items[0], items[1]] and rescued == ["nb.py"]


def test_a_slow_first_case_gives_way_to_the_next_one():
    items = [Item("a.py", "test_x", "big", slow=True), Item("a.py", "test_x", "small"), Item("a.py", "test_x", "more")]
    assert select(items) == ([items[1]], [])


@pytest.mark.slow
def test_make_check_collects_every_test_module_of_the_suite():
    """The whole suite collected under --quick (no test runs): a test of every tests/**/test_*.py, far fewer tests."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    kept = [line for line in done.stdout.splitlines() if "::" in line]
    modules = {str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")}
    assert {line.split("::")[0] for line in kept} == modules and len(modules) > 100
    total = int(re.search(r"(\d+)/(\d+) tests collected", done.stdout).group(2))
    assert 0 < len(kept) < total / 2, (len(kept), total)
