"""tools/core_report.py, the counter of the core a student reads: its numbers, and the door of the fast plane.

The core path (the files one simulated request goes through) is counted in code lines, not docstrings, comments or
blank lines; the fast plane (sim/fast/) must reach the core through public names only (docs/ARCHITECTURE.md, "The
fast plane"), and no class of the project may borrow another's private state (a mixin).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("core_report", ROOT / "tools" / "core_report.py")
core_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(core_report)

# The core path's code lines at most (tools/core_report.py's count): a ratchet, lowered as the core is simplified.
CORE_BUDGET = 1775
CORE_FILES = 10


@pytest.fixture(scope="module")
def report() -> dict:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "core_report.py"), "--json"], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def test_code_lines_are_lines_of_code_only():
    source = (
        '"""A docstring\nof two lines."""\n# a comment\n\nx = 1  # a comment after code\n\n\ndef f():\n'
        '    """Its docstring."""\n    return (x +\n            1)\n'
    )
    assert core_report.code_lines(source) == 4  # x = 1, def f, and the two lines of the return


def test_the_core_path_stays_within_its_budget(report):
    files = report["core_files"]
    assert {path for path, _, _ in files} >= {"sim/scheduling/scheduler.py", "sim/clock/loop.py", "sim/kv/paged.py"}
    assert len(files) <= CORE_FILES, files
    total = sum(code for _, _, code in files)
    assert total <= CORE_BUDGET, f"the core path has {total} code lines, over its budget of {CORE_BUDGET}"
    assert not any(path.startswith("sim/fast/") for path, _, _ in files), "the fast plane is not the core"


def test_the_reading_guide_gives_the_counters_numbers(report):
    """docs/ARCHITECTURE.md, "Follow one request", lists every file of the core path with its code lines as counted
    here, and their total."""
    section = (ROOT / "docs" / "ARCHITECTURE.md").read_text().split("## Follow one request\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    listed = {path: int(n.replace(",", "")) for path, n in re.findall(r"^\| `([^`]+)` \| ([\d,]+) \|", section, re.M)}
    counted = {path: code for path, _, code in report["core_files"]}
    assert listed == counted
    assert f"In all: {sum(counted.values()):,} code lines in {len(counted)} files." in section


def test_walkthrough_02_points_to_the_reading_guide():
    cells = json.loads((ROOT / "notebooks" / "02_paging.ipynb").read_text())["cells"]
    assert any("Follow one request" in "".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def test_no_mixins_no_circles_no_private_imports(report):
    assert report["mixins"] == []
    assert report["circles"] == []
    assert report["private_imports"] == []


def test_the_fast_plane_reaches_the_core_through_public_names_only(report):
    assert report["fast_plane_private"] == []


def test_the_fast_plane_check_sees_a_private_import_and_a_private_read(tmp_path):
    """The check is not vacuous: a fast-plane module that imports a private name of the core, or reads one on a core
    object, is named; its own private attributes (self._x) are its business."""
    module = tmp_path / "probe.py"
    module.write_text(
        "from sim.scheduling.scheduler import _queue_key\n\n\nclass Probe:\n    def f(self, scheduler):\n"
        "        self._mine = 1\n        return scheduler._running, self._mine\n"
    )
    mods = {"sim.fast.probe": module, "sim.scheduling.scheduler": ROOT / "sim" / "scheduling" / "scheduler.py"}
    found = core_report.fast_plane_private(mods, core_report.imports(mods))
    assert found == [
        "sim.fast.probe: from sim.scheduling.scheduler import _queue_key",
        "sim.fast.probe:7: scheduler._running",
    ]
