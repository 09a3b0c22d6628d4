"""The optional compiled build (`make fast`): the same .py files compiled with mypyc, used only when asked for.

The .py files are the simulator, on every platform and in every install; `make fast` (tools/build_fast.py) compiles
the core and the fast plane (MODULES below) with mypyc into build/fast/, never beside the sources, and records
there a SHA-256 of every source it compiled (build/fast/manifest.json). Nothing changes until a process asks:

    LAB_FAST=1 python -m sim bench ...        (or any program that imports sim with LAB_FAST=1 in its environment)

Then `import sim` (sim/__init__.py calls enable() first) checks the manifest against the sources as they are now
and, if every one is unchanged, installs an import hook that loads those modules from build/fast/. If any source
changed since the build (a student edited it), or the build is missing or for another Python, it prints one line
saying so to stderr and the process runs the .py files: an edit is never hidden behind a stale compiled module.
`LAB_FAST=require` turns that line into an error (the benchmark uses it, so that a "compiled" row is compiled).

active() says whether this process runs the compiled modules. The compiled modules behave as the .py files (the
test tests/sim/test_compiled_build.py compares runs); what they do not allow is listed in docs/benchmarks.md, "An optional
compiled build" (e.g. monkeypatching a function inside a compiled module does not reach its compiled callers).
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD_DIR = ROOT / "build" / "fast"
MANIFEST = BUILD_DIR / "manifest.json"
ENV = "LAB_FAST"

# What `make fast` compiles: the plain core and the fast plane (docs/ARCHITECTURE.md), as module names.
MODULES = (
    "sim.kv.blocks", "sim.kv.slots", "sim.scheduling.sequence", "sim.scheduling.plan", "sim.scheduling.preemption", "sim.scheduling.step_shape",
    "sim.scheduling.speculative", "sim.scheduling.beam", "sim.scheduling.failed_step", "sim.scheduling.scheduler", "sim.clock.loop", "sim.clock.metrics", "sim.clock.cost",
    "sim.kv.base", "sim.kv.checks", "sim.kv.no_sharing", "sim.kv.swap", "sim.kv.groups", "sim.kv.paged",
    "sim.kv.offload", "sim.kv.contiguous", "sim.kv.vattention", "sim.kv.hybrid", "sim.kv.radix", "sim.kv.radix_tree",
    "sim.fast.records", "sim.fast.runs", "sim.fast.paged", "sim.fast.epoch", "sim.fast.contiguous",
    "sim.fast.vattention", "sim.fast.hybrid",
)

_active = False


def source_path(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def source_hashes(modules) -> dict[str, str]:
    return {m: hashlib.sha256(source_path(m).read_bytes()).hexdigest() for m in modules}


def check_build() -> tuple[dict | None, str]:
    """(the manifest, "") when build/fast/ holds a build of the sources as they are now, else (None, why not)."""
    try:
        manifest = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return None, f"no compiled build in {BUILD_DIR} (run `make fast`)"
    if manifest.get("cache_tag") != sys.implementation.cache_tag:
        tag = sys.implementation.cache_tag
        return None, f"the compiled build is for {manifest.get('cache_tag')}, this Python is {tag}"
    if sorted(manifest.get("sources", ())) != sorted(MODULES):  # modules moved, added or dropped since the build
        return None, "the compiled build is of other modules than sim.compiled.MODULES (run `make fast` again)"
    changed = sorted(m for m, h in source_hashes(manifest["sources"]).items() if h != manifest["sources"][m])
    if changed:
        shown = ", ".join(source_path(m).relative_to(ROOT).as_posix() for m in changed[:4])
        more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
        return None, f"{shown}{more} changed since the compiled build (run `make fast` again)"
    missing = [name for name in manifest["files"].values() if not (BUILD_DIR / name).is_file()]
    if missing:
        return None, f"the compiled build lacks {missing[0]} (run `make fast` again)"
    return manifest, ""


class _Finder:
    """Finds the compiled modules (and mypyc's shared library) in build/fast/, before the .py files."""

    def __init__(self, files: dict[str, str]):
        self.files = files

    def find_spec(self, fullname, path=None, target=None):
        name = self.files.get(fullname)
        if name is None:
            return None
        location = str(BUILD_DIR / name)
        loader = importlib.machinery.ExtensionFileLoader(fullname, location)
        return importlib.util.spec_from_file_location(fullname, location, loader=loader)


def enable(mode: str) -> bool:
    """Use the compiled modules if build/fast/ holds a build of today's sources; `mode` is LAB_FAST's value."""
    global _active
    if mode in ("", "0"):
        return False
    manifest, why = check_build()
    if manifest is None:
        if mode == "require":
            raise ImportError(f"{ENV}=require: {why}")
        print(f"{ENV}: running the .py files: {why}", file=sys.stderr)
        return False
    already = [m for m in manifest["files"] if m in sys.modules]
    if already:  # too late: a module imported as .py would be mixed with compiled ones
        raise ImportError(f"{ENV}: {already[0]} was imported before sim; set {ENV} before the program starts")
    sys.meta_path.insert(0, _Finder(manifest["files"]))
    _active = True
    return True


def active() -> bool:
    """Whether this process runs the compiled modules (LAB_FAST set and the build current)."""
    return _active
