"""The optional compiled build (`make fast`, sim/compiled.py): its stale-build guard, and (when build/fast/ holds a
current build) that the compiled modules give the results of the .py files, run for run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim import compiled

ROOT = Path(__file__).resolve().parents[2]

# (sim.run keywords): the compiled KV managers, both schedulers, the fast plane and the plain loop, a beam search and
# parallel samples, the offload tier.
WORKLOADS = [
    dict(policy="paged", scheduler="v0", rate=2.0, duration=300.0),
    dict(policy="paged", scheduler="v1", rate=2.0, duration=300.0),
    dict(policy="paged", scheduler="v0", rate=2.0, duration=120.0, jump=False),
    dict(policy="max", scheduler="v0", rate=2.0, duration=200.0),
    dict(policy="pow2", scheduler="v1", rate=2.0, duration=200.0),
    dict(policy="oracle", scheduler="v1", rate=2.0, duration=200.0),
    dict(policy="vattention", scheduler="v1", rate=2.0, duration=200.0),
    dict(policy="radix", scheduler="v1", rate=2.0, duration=200.0, prefix_len=64),
    dict(policy="hybrid", model="gemma3-270m", scheduler="v1", rate=2.0, duration=100.0),
    dict(policy="paged", scheduler="v1", rate=1.0, duration=100.0, beam_width=3),
    dict(policy="paged", scheduler="v0", rate=1.0, duration=100.0, n=3, swap_space_gib=4.0),
    dict(policy="paged", scheduler="v1", rate=2.0, duration=100.0, prefix_len=256, cpu_offload_gib=1.0),
]
CODE = """
import json, sys
import sim, sim.compiled
out = []
for kwargs in json.load(sys.stdin):
    r = sim.run(**kwargs)
    summary = {k: v for k, v in r.summary.items() if "wall" not in k}
    tables = [t for t in (r.requests, r.steps) if t is not None]
    out.append([summary, [{name: col.tolist() for name, col in t.columns.items()} for t in tables]])
print(json.dumps({"active": sim.compiled.active(), "runs": out}, default=repr))
"""


def _run(mode: str, kwargs: dict) -> dict:
    env = {**os.environ, compiled.ENV: mode, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", CODE],
        input=json.dumps([kwargs]),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(compiled.check_build()[0] is None, reason="no current compiled build (make fast)")
@pytest.mark.parametrize("kwargs", WORKLOADS)
def test_compiled_build_gives_the_results_of_the_py_files(kwargs):
    fast, plain = _run("require", kwargs), _run("0", kwargs)
    assert fast["active"] and not plain["active"]
    assert json.dumps(fast["runs"]) == json.dumps(plain["runs"])  # summaries and tables, as text (NaN is NaN there)


def _fake_build(tmp_path, monkeypatch, sources: dict[str, str]) -> None:
    build = tmp_path / "fast"
    build.mkdir()
    (build / "lib.so").write_bytes(b"")
    manifest = {"sources": sources, "files": {"sim_fast__mypyc": "lib.so"}, "cache_tag": sys.implementation.cache_tag}
    (build / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(compiled, "BUILD_DIR", build)
    monkeypatch.setattr(compiled, "MANIFEST", build / "manifest.json")
    monkeypatch.setattr(compiled, "_active", False)


def test_a_build_of_other_sources_is_refused(tmp_path, monkeypatch, capsys):
    hashes = compiled.source_hashes(compiled.MODULES)
    _fake_build(tmp_path, monkeypatch, {**hashes, "sim.kv.blocks": "0" * 64})  # sim/kv/blocks.py edited since the build
    manifest, why = compiled.check_build()
    assert manifest is None and why == "sim/kv/blocks.py changed since the compiled build (run `make fast` again)"
    meta_path = list(sys.meta_path)
    assert compiled.enable("1") is False and not compiled.active() and sys.meta_path == meta_path
    assert capsys.readouterr().err == f"LAB_FAST: running the .py files: {why}\n"  # one line, then the .py files
    with pytest.raises(ImportError, match="LAB_FAST=require: sim/kv/blocks.py changed since"):
        compiled.enable("require")


def test_a_current_build_is_accepted_and_nothing_happens_by_default(tmp_path, monkeypatch):
    _fake_build(tmp_path, monkeypatch, compiled.source_hashes(compiled.MODULES))
    assert compiled.check_build() == (json.loads(compiled.MANIFEST.read_text()), "")
    assert compiled.enable("") is False and compiled.enable("0") is False and not compiled.active()


def test_a_build_of_modules_since_moved_is_refused(tmp_path, monkeypatch):
    """A build made before a module moved (sim.blocks, now sim.kv.blocks) names a source that is gone: refused, with
    one line, not a crash on the missing file."""
    hashes = compiled.source_hashes(compiled.MODULES)
    hashes["sim.blocks"] = hashes.pop("sim.kv.blocks")
    _fake_build(tmp_path, monkeypatch, hashes)
    assert compiled.check_build() == (
        None,
        "the compiled build is of other modules than sim.compiled.MODULES (run `make fast` again)",
    )


def test_a_missing_build_or_another_python_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(compiled, "MANIFEST", tmp_path / "nothing.json")
    assert "no compiled build" in compiled.check_build()[1]
    _fake_build(tmp_path, monkeypatch, {})
    manifest = json.loads(compiled.MANIFEST.read_text()) | {"cache_tag": "cpython-299"}
    compiled.MANIFEST.write_text(json.dumps(manifest))
    assert "the compiled build is for cpython-299" in compiled.check_build()[1]


def test_no_compiled_module_lies_beside_the_sources():
    assert not [p for p in (ROOT / "sim").rglob("*") if p.suffix in (".so", ".pyd")]


def _build_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_fast", ROOT / "tools" / "build_fast.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_copy_mypyc_compiles_keeps_every_line_and_marks_each_class():
    """tools/build_fast.py's rewrite, on a made-up module: the same line count (tracebacks agree), plain classes open
    to interpreted subclasses, a frozen dataclass left a Python class (copyable, picklable), Protocols untouched."""
    source = "\n".join(
        [
            "from __future__ import annotations",
            "from dataclasses import dataclass",
            "from typing import Protocol",
            "",
            "",
            "class Pool:",
            "    pass",
            "",
            "",
            "@dataclass(frozen=True, slots=True)",
            "class Fact:",
            "    x: int",
            "",
            "",
            "@dataclass(slots=True)",
            "class State:",
            "    y: int",
            "",
            "",
            "class Door(Protocol):",
            "    def f(self): ...",
        ]
    )
    copy = _build_script().mypyc_copy(source, "sim.made_up").split("\n")
    assert len(copy) == len(source.split("\n"))
    assert copy[0].endswith("; from mypy_extensions import mypyc_attr, trait")
    assert copy[4] == "@mypyc_attr(allow_interpreted_subclasses=True)" and copy[5] == "class Pool:"
    assert copy[8] == "@mypyc_attr(native_class=False)" and copy[9].startswith("@dataclass(frozen=True")
    assert copy[13] == "@mypyc_attr(allow_interpreted_subclasses=True)" and copy[14] == "@dataclass(slots=True)"
    assert copy[18] == "" and copy[19] == "class Door(Protocol):"


def test_a_class_with_no_room_for_a_decorator_stops_the_build():
    with pytest.raises(SystemExit, match="class Packed: no blank line above it"):
        _build_script().mypyc_copy("from __future__ import annotations\nX = 1\nclass Packed:\n    pass\n", "sim.m")
