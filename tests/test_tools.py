"""tools/bad_inputs.py, the bad-input probe (`make bad-inputs`): its catalogue builds from the command lines'
own parsers, and its verdicts are right on cases whose outcome is known."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bad_inputs", ROOT / "tools" / "bad_inputs.py")
probe = importlib.util.module_from_spec(spec)
sys.modules["bad_inputs"] = probe  # dataclasses look their module up there
spec.loader.exec_module(probe)


def test_the_catalogue_covers_every_command_and_every_numeric_flag():
    cases = probe.sim_cases() + probe.reference_cases()
    assert len(cases) >= 300
    subcommands = {(c.command, c.argv[0]) for c in cases}
    assert {("sim", s) for s in ("run", "sweep", "figures", "bench", "bench-alloc")} <= subcommands
    assert {("reference", s) for s in ("generate", "bench", "bench-kernels")} <= subcommands
    assert any(c.argv[:3] == ["run", "--seed", "-1"] for c in cases)
    assert any("--trace" in c.argv and c.files and "deep.jsonl" in c.files for c in cases)


def test_verdicts_on_known_outcomes():
    refused = probe.run_case(probe.Case("sim", ["run", "--rate", "abc"], "flag value"), timeout=60)
    assert refused["outcome"] == "clean" and refused["exit"] == 2, refused
    accepted = probe.run_case(probe.Case("sim", ["run", "--num-requests", "3", "--json"], "valid"), timeout=60)
    assert accepted["outcome"] == "wrong_exit" and accepted["exit"] == 0, accepted  # a valid input is not refused
    protect = {"A.csv": probe.SENTINEL}
    kept = probe.run_case(
        probe.Case(
            "sim",
            ["run", "--num-requests", "3", "--requests-csv", "A.csv", "--steps-csv", "nodir/x.csv"],
            "output path",
            protect,
        ),
        timeout=60,
    )
    assert kept["outcome"] == "clean" and kept["files_lost"] == "", kept
    overwritten = probe.run_case(
        probe.Case("sim", ["run", "--num-requests", "3", "--requests-csv", "A.csv"], "valid", protect), timeout=60
    )
    assert overwritten["files_lost"] == "A.csv"  # a file that existed before and changed is counted as lost


def test_core_report_sees_a_planted_mixin_private_import_and_circle(tmp_path):
    """tools/core_report.py (the counts issue 26 reports): each detector fires on a small planted case and stays
    quiet where state is the class's own or inherited."""
    spec = importlib.util.spec_from_file_location("core_report", ROOT / "tools" / "core_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    (tmp_path / "a.py").write_text(
        "from sim.b import _helper\n\nclass Host:\n    def __init__(self):\n"
        "        self._state = 1\n\nclass Child(Host):\n    def f(self):\n"
        "        return self._state\n\nclass Mixin:\n    def g(self):\n"
        "        return self._state\n"
    )
    (tmp_path / "b.py").write_text("def _helper():\n    from sim.a import Host\n    return Host\n")
    mods = {"sim.a": tmp_path / "a.py", "sim.b": tmp_path / "b.py"}
    edges = report.imports(mods)
    assert report.mixins(mods) == ["sim.a.Mixin reads _state"]
    assert report.private_imports(mods, edges) == ["sim.a: from sim.b import _helper"]
    assert report.circles(mods, edges) == [["sim.a", "sim.b"]]
    assert report.code_lines('"""doc\nmore"""\n# comment\n\nx = 1\n') == 1


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_install_report_installs_what_the_makefile_installs():
    """tools/install_report.py times the Makefile's own pip lines: its pins are read from the Makefile, and the light
    install names no engine package (tests/test_install.py checks the extras themselves)."""
    report = _tool("install_report")
    makefile = (ROOT / "Makefile").read_text()
    full = [" ".join(step) for step in report.steps("full")]
    for name in ("TORCH_SPEC", "MODEL_SPEC", "GEMMA3_SPEC"):
        pin = report.makefile_value(name)
        assert pin in makefile and any(pin in step for step in full), name
    assert any(step.endswith("[dev]") for step in full)
    light = " ".join(" ".join(step) for step in report.steps("light"))
    assert "[course,test]" in light and "torch" not in light and "GEMMA3" not in light
    import csv

    rows = list(csv.DictReader((ROOT / "figures" / "install.csv").open()))
    assert [r["install"] for r in rows] == ["light", "full"] and list(rows[0]) == report.COLUMNS
    assert [r["has_torch"] for r in rows] == ["False", "True"]  # what the light install promises, measured


def _run_tool(*argv: str):
    import subprocess

    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_busy_runs_the_command_beside_busy_processes_and_keeps_its_status():
    sys.path.insert(0, str(ROOT))
    from tools.busy import hogs

    with hogs(2) as procs:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)  # spinning while the block runs
    assert all(p.returncode is not None for p in procs)  # stopped and reaped after it
    done = _run_tool("tools/busy.py", "--hogs", "1", "--", sys.executable, "-c", "raise SystemExit(3)")
    assert done.returncode == 3 and "exited 3 after" in done.stderr and "1 busy process beside it" in done.stderr
    for argv, words in (
        (["--hogs", "1"], "no command given"),
        (["--hogs", "-1", "--", "true"], "--hogs must be"),
        (["--", "no-such-command-here"], "no such command"),
    ):
        bad = _run_tool("tools/busy.py", *argv)
        assert bad.returncode == 2 and words in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_grade_under_load_refuses_bad_flags_before_grading(tmp_path):
    for argv, words in (
        (["--lab", "nope"], "unknown --lab 'nope' (allowed: first_fit,"),
        (["--hogs", "-2"], "--hogs takes counts from 0 to 64"),
        (["--out", str(tmp_path), "--lab", "buddy"], "is a folder"),
    ):
        bad = _run_tool("tools/grade_under_load.py", *argv)
        assert bad.returncode == 2 and words in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
        assert bad.stdout == ""  # nothing graded
