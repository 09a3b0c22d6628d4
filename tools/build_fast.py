"""`make fast`: compile the simulator's core and fast plane with mypyc into build/fast/ (optional; see sim/compiled.py).

    python tools/build_fast.py [--jobs N]

Compiles sim.compiled.MODULES (the .py files stay the source and the default: nothing beside them changes) into
build/fast/: one extension module per source plus mypyc's shared library, and build/fast/manifest.json with the
SHA-256 of every source compiled, the mypy version, the Python it is for and the build's wall time. A process uses
the build only with LAB_FAST=1 and only while every hash still matches (sim/compiled.py).

Type checking: mypyc compiles what mypy accepts. The project is not written for a strict type checker, so the
error codes below are switched off for the build; they name places where mypy cannot prove a type (an Optional the
code has already checked, an attribute of a duck-typed object), which mypyc handles with a run-time check or a
generic Python operation. Places where an annotation was wrong at run time (mypyc checks annotations when it
calls: a declared `int` that receives a float raises TypeError) were fixed in the sources.

Plug-in classes: mypyc forbids subclassing a compiled class in interpreted code unless the class allows it. The
project's exercises, tests and sim.disagg subclass core classes (KV managers, allocators, the run arithmetic, the
simulator), so the build allows interpreted subclasses of every compiled class (EXTENSIBLE) without a mypyc
decorator in the sources: this script gives mypyc that attribute for them. Frozen dataclasses (a memory
breakdown, a new sequence's facts, a cost model's constants) stay plain Python classes inside the compiled modules
(native_class=False): mypyc's frozen dataclasses can be neither copied nor pickled.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.compiled import BUILD_DIR, MANIFEST, MODULES, source_hashes, source_path  # noqa: E402

GROUP = "sim_fast"  # mypyc's shared library: build/fast/sim_fast__mypyc.*.so
MYPY_FLAGS = [
    "--follow-imports=silent",
    "--ignore-missing-imports",
    "--python-version",
    "3.10",
    "--disable-error-code",
    "union-attr",
    "--disable-error-code",
    "attr-defined",
    "--disable-error-code",
    "var-annotated",
    "--disable-error-code",
    "arg-type",
    "--disable-error-code",
    "assignment",
    "--disable-error-code",
    "operator",
    "--disable-error-code",
    "return-value",
    "--disable-error-code",
    "list-item",
    "--disable-error-code",
    "call-arg",
    "--disable-error-code",
    "misc",
    "--disable-error-code",
    "index",
    "--disable-error-code",
    "override",
    "--disable-error-code",
    "return",
]
MIXINS = {"sim.kv.no_sharing.NoSwapSpace", "sim.kv.no_sharing.NoPrefixCache"}


PLAIN_BASES = ("Protocol", "NamedTuple", "enum.Enum", "Enum")  # classes mypyc compiles its own way: left as they are
_CLASS = re.compile(r"^([ \t]*)class (\w+)(?:\(([^)]*)\))?:", re.M)


def mypyc_copy(text: str, module: str) -> str:
    """The source as mypyc compiles it: the same lines (so that line numbers in tracebacks agree), with
    @mypyc_attr(allow_interpreted_subclasses=True) (and @trait for MIXINS) written into the blank line(s) above
    each class, and their import appended to the `from __future__` line."""
    lines = text.split("\n")
    future = "from __future__ import annotations"
    if future not in lines:
        raise SystemExit(f"build_fast: {module} lacks `{future}`")
    lines[lines.index(future)] += "; from mypy_extensions import mypyc_attr, trait"
    for match in reversed(list(_CLASS.finditer(text))):
        indent, name, bases = match.group(1), match.group(2), match.group(3) or ""
        if any(b.strip() in PLAIN_BASES for b in bases.split(",")):
            continue
        row = text.count("\n", 0, match.start())
        own = row
        while row > 0 and lines[row - 1].lstrip().startswith("@"):  # above the class's own decorators
            row -= 1
        if any("frozen=True" in line for line in lines[row:own]):  # a compiled frozen dataclass cannot be copied
            decorators = [f"{indent}@mypyc_attr(native_class=False)"]  # or pickled: such classes stay Python's
        else:
            decorators = [f"{indent}@mypyc_attr(allow_interpreted_subclasses=True)"]
        if f"{module}.{name}" in MIXINS:
            decorators.append(f"{indent}@trait")
        for decorator in decorators:
            row -= 1
            if row < 0 or lines[row].strip():
                raise SystemExit(f"build_fast: {module}, class {name}: no blank line above it for a mypyc decorator")
            lines[row] = decorator
    return "\n".join(lines)


def copy_sources(dest: Path) -> None:
    """sim/ into dest/sim/ (the modules not compiled too: mypy reads their types), compiled modules rewritten."""
    shutil.copytree(ROOT / "sim", dest / "sim", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for module in MODULES:
        source = source_path(module)
        target = dest / source.relative_to(ROOT)
        target.write_text(mypyc_copy(source.read_text(), module))


def build(jobs: int) -> dict:
    import mypy.version
    from mypyc.build import mypycify
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext

    start = time.perf_counter()
    hashes = source_hashes(MODULES)  # before compiling: an edit during the build makes the build stale, not wrong
    if BUILD_DIR.exists():
        shutil.rmtree(BUILD_DIR)
    src, lib, temp = BUILD_DIR / "src", BUILD_DIR / "lib", BUILD_DIR / "tmp"
    copy_sources(src)
    cwd = os.getcwd()
    os.chdir(src)  # mypyc names modules by their paths relative to the working directory
    try:
        paths = [source_path(m).relative_to(ROOT).as_posix() for m in MODULES]
        extensions = mypycify(
            paths + MYPY_FLAGS, opt_level="3", group_name=GROUP, multi_file=True, target_dir=str(BUILD_DIR / "c")
        )
        checked = time.perf_counter()
        dist = Distribution({"name": "sim-fast", "ext_modules": extensions})
        cmd = build_ext(dist)
        cmd.build_lib, cmd.build_temp, cmd.parallel = str(lib), str(temp), jobs
        cmd.ensure_finalized()
        cmd.run()
    finally:
        os.chdir(cwd)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    files = {}
    for name in [*MODULES, f"{GROUP}__mypyc"]:
        built = lib.joinpath(*name.split(".")).with_name(name.split(".")[-1] + suffix)
        if not built.is_file():
            raise SystemExit(f"build_fast: mypyc did not produce {built}")
        files[name] = built.relative_to(BUILD_DIR).as_posix()
    shutil.rmtree(temp, ignore_errors=True)
    manifest = {
        "sources": hashes,
        "files": files,
        "cache_tag": sys.implementation.cache_tag,
        "python": sys.version.split()[0],
        "mypy": mypy.version.__version__,
        "build_wall_s": round(time.perf_counter() - start, 1),
        "mypyc_wall_s": round(checked - start, 1),
        "jobs": jobs,
    }
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tools/build_fast.py", description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="C compiler processes (default: all cores)")
    args = p.parse_args(argv)
    try:
        import mypyc  # noqa: F401
    except ImportError:
        print(
            "build_fast: mypyc is missing: pip install mypy (the Makefile's MYPY_SPEC), or run `make fast`",
            file=sys.stderr,
        )
        return 2
    manifest = build(args.jobs)
    print(
        f"compiled {len(MODULES)} modules into {BUILD_DIR.relative_to(ROOT)}/ in {manifest['build_wall_s']} s "
        f"(mypy {manifest['mypy']}, Python {manifest['python']}); use them with LAB_FAST=1"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
