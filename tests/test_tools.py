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
    kept = probe.run_case(probe.Case("sim", ["run", "--num-requests", "3", "--requests-csv", "A.csv", "--steps-csv",
                                             "nodir/x.csv"], "output path", protect), timeout=60)  # fmt: skip
    assert kept["outcome"] == "clean" and kept["files_lost"] == "", kept
    overwritten = probe.run_case(probe.Case("sim", ["run", "--num-requests", "3", "--requests-csv", "A.csv"], "valid",
                                            protect), timeout=60)  # fmt: skip
    assert overwritten["files_lost"] == "A.csv"  # a file that existed before and changed is counted as lost
