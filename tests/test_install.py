"""Install anywhere (README.md, "Which install?"): the light install runs the simulator half without torch.

- every module of `sim` imports, in a fresh interpreter, without bringing torch, triton or transformers into
  sys.modules (the light install has none of them: a module that imported one would break it);
- the nine sim labs' solutions get full marks from the autograder's command line (`python -m sim.exercises grade`),
  as a student on the light install runs it;
- pyproject.toml: the light extra (`course`) names no engine package, even through the extras it includes, and
  triton sits behind a marker that keeps it to the platforms with wheels;
- the Dockerfile (the full install in a container) cannot silently rot: what it copies and runs exists, and its
  torch pin is the Makefile's;
- the instructors' install guide (notebooks/INSTRUCTORS.md, "Before the first lab: installing") quotes the sizes and
  times of figures/install.csv exactly as tools/install_report.py writes them, so no number there is typed by hand.

`make test-light` runs this file in .venv-light (the light install); `make test` runs it in .venv too.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "triton", "transformers")
FEW = 20  # random programs per state machine for the CLI grading (the in-process grader tests run more)

# Imports every sim module in order; a meta-path finder notes which sim module asked for a heavy package (the
# innermost sim frame on the stack at that moment), so the failure names the import, not just the package.
_PROBE = r"""
import importlib, json, pkgutil, sys, traceback
HEAVY = {heavy!r}
culprits = {{}}

class Watch:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in HEAVY and top not in culprits:
            frame, chain = sys._getframe(1), []
            while frame is not None:
                mod = frame.f_globals.get("__name__", "")
                if mod == "sim" or mod.startswith("sim."):
                    chain.append(f"{{mod}}:{{frame.f_lineno}}")
                frame = frame.f_back
            culprits[top] = chain
        return None

sys.meta_path.insert(0, Watch())
import sim
modules, failed, pulled = ["sim"], {{}}, {{}}
for info in pkgutil.walk_packages(sim.__path__, "sim.", onerror=lambda name: failed.setdefault(name, "walk")):
    if not info.name.endswith(".__main__"):  # running a __main__ runs its command (sim.drivers.cli is imported anyway)
        modules.append(info.name)
for name in modules:
    before = {{m for m in HEAVY if m in sys.modules}}
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed[name] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    for m in HEAVY:
        if m in sys.modules and m not in before:
            pulled[m] = name
print(json.dumps({{"modules": modules, "failed": failed, "pulled": pulled, "culprits": culprits}}))
"""


def test_every_sim_module_imports_without_torch_triton_or_transformers():
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(report["modules"]) > 30 and "sim.exercises.labs" in report["modules"], report["modules"]
    assert not report["failed"], f"sim modules that do not import here: {report['failed']}"
    pulled = {
        pkg: f"imported by {mod} (asked at {' <- '.join(report['culprits'].get(pkg, [])) or '?'})"
        for pkg, mod in report["pulled"].items()
    }
    assert not pulled, f"sim must not import {', '.join(pulled)}: {pulled}"


def _imports_in(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every import statement in the file, at any depth (a function's body too)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.partition(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.partition(".")[0]))
    return found


def test_no_sim_source_imports_an_engine_package_even_inside_a_function():
    """The probe above imports every module; an import inside a function runs only when that function does. This reads
    every import statement of sim/ instead, so a path no test reaches is covered too (and the light tier need not
    re-run every sim test without torch to find one: Makefile, test-light)."""
    forbidden = {*HEAVY, "numba", "reference"}  # the engine's packages, and the engine itself (imports go one way)
    files = sorted((ROOT / "sim").rglob("*.py"))
    assert len(files) > 30 and ROOT / "sim" / "drivers" / "sweep.py" in files
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {top}"
        for path in files
        for line, top in _imports_in(path)
        if top in forbidden
    ]
    assert not bad, "sim must not import the engine's packages:\n" + "\n".join(bad)
    # the scan sees an import inside a function: sweep.py imports the optional ray only in _run_ray
    assert "ray" in {top for _, top in _imports_in(ROOT / "sim" / "drivers" / "sweep.py")}


def test_every_package_sim_imports_is_one_the_light_install_has():
    """Beyond the engine's packages: an import of anything the light extras do not install (say one the full install
    brings in only as a dependency of torch or transformers) would break the light install on the path that runs it."""
    data = _pyproject()
    project, extras = data["project"]["name"], data["project"]["optional-dependencies"]
    light = {_requirement_name(r) for r in data["project"]["dependencies"] + _expand(extras, "course", project)}
    # pillow is matplotlib's own dependency; ray is its own extra, imported only by `--backend ray`, which says how to
    # install it where it is missing (tests/sim/test_sweep.py)
    allowed = light | {"PIL", "ray", "sim"} | set(sys.stdlib_module_names)
    files = sorted((ROOT / "sim").rglob("*.py"))
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {top}"
        for path in files
        for line, top in _imports_in(path)
        if top not in allowed
    ]
    assert not bad, "sim imports packages the light install (pyproject.toml: course) lacks:\n" + "\n".join(bad)


def _sim_labs() -> dict:
    from sim.exercises import EXERCISES  # sim's own labs; reference.exercises adds the three tensor labs

    return EXERCISES


def test_there_are_nine_sim_labs_each_with_a_solution():
    labs = _sim_labs()
    assert len(labs) == 9, sorted(labs)
    for name, lab in labs.items():
        assert (ROOT / "notebooks" / "solutions" / f"{lab.solution}.py").is_file(), name
        assert (ROOT / "notebooks" / "exercises" / f"{lab.notebook}.ipynb").is_file(), name


@pytest.mark.parametrize("name", sorted(_sim_labs()))
def test_sim_lab_solution_gets_full_marks_from_the_grader_command(name, tmp_path):
    out = tmp_path / "results.json"
    solution = Path("notebooks") / "solutions" / f"{_sim_labs()[name].solution}.py"
    command = [
        sys.executable,
        "-m",
        "sim.exercises",
        "grade",
        str(solution),
        "--exercise",
        name,
        "--results",
        str(out),
        "--max-examples",
        str(FEW),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    failed = [t["name"] for t in data["tests"] if t["status"] != "passed"]
    assert data["score"] == data["max_score"] > 0 and not failed, (failed, done.stdout[-3000:])


# --- pyproject.toml: the extras ---------------------------------------------------------------------------------


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirement_name(req: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", req.strip()).group(0).lower().replace("_", "-")


def _expand(extras: dict, name: str, project: str, seen: set | None = None) -> list[str]:
    """The requirements of extra `name`, the project's own extras it names (project[a,b]) expanded."""
    seen = set() if seen is None else seen
    if name in seen:
        return []
    seen.add(name)
    found = []
    for req in extras[name]:
        own = re.fullmatch(rf"{re.escape(project)}\[([^\]]+)\]", req.strip())
        if own:
            for sub in own.group(1).split(","):
                found += _expand(extras, sub.strip(), project, seen)
        else:
            found.append(req)
    return found


def test_the_light_extras_name_no_engine_package():
    data = _pyproject()
    project, extras = data["project"]["name"], data["project"]["optional-dependencies"]
    for light in ("course", "test"):
        names = {_requirement_name(r) for r in data["project"]["dependencies"] + _expand(extras, light, project)}
        assert not names & {*HEAVY, "ray", "numba", "accelerate"}, (light, sorted(names))
    assert {"hypothesis", "jupyterlab", "ipykernel"} <= {
        _requirement_name(r) for r in _expand(extras, "course", project)
    }
    engine = {_requirement_name(r) for r in _expand(extras, "engine", project)}
    assert {"torch", "triton", "transformers"} <= engine
    dev = {_requirement_name(r) for r in _expand(extras, "dev", project)}
    assert engine | {"ray", "pytest", "pytest-xdist", "hypothesis", "nbclient", "jupyterlab"} <= dev


def test_triton_is_required_only_where_pypi_has_wheels():
    markers = pytest.importorskip("packaging.requirements")
    data = _pyproject()
    engine = _expand(data["project"]["optional-dependencies"], "engine", data["project"]["name"])
    (triton,) = [markers.Requirement(r) for r in engine if _requirement_name(r) == "triton"]
    assert triton.marker is not None
    platforms = {
        ("linux", "x86_64"): True,
        ("linux", "aarch64"): True,
        ("darwin", "arm64"): False,
        ("darwin", "x86_64"): False,
        ("win32", "AMD64"): False,
    }
    for (system, machine), wanted in platforms.items():
        assert triton.marker.evaluate({"sys_platform": system, "platform_machine": machine}) is wanted, system


# --- the Dockerfile ----------------------------------------------------------------------------------------------


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.M)}


def _makefile_var(name: str) -> str:
    m = re.search(rf"^{name}\s*\??:?=\s*(.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert m, name
    return m.group(1).strip()


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) per instruction, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def test_dockerfile_installs_what_the_makefile_installs():
    steps = _dockerfile()
    assert steps[0] == ("FROM", "python:3.11-slim"), steps[0]
    args = dict(a.split("=", 1) for i, a in steps if i == "ARG" and "=" in a)
    assert args["TORCH_SPEC"].strip('"') == _makefile_var("TORCH_SPEC"), "the Dockerfile's torch pin is not make's"
    runs = " && ".join(a for i, a in steps if i == "RUN")
    targets = _makefile_targets()
    made = re.findall(r"\bmake\s+([A-Za-z][\w.-]*)", runs)
    assert "install" in made and set(made) <= targets, (made, sorted(targets))
    assert 'TORCH_SPEC="$TORCH_SPEC"' in runs or "TORCH_SPEC=$TORCH_SPEC" in runs  # make uses the same pin
    # every pip line installs the pinned torch or a project extra that exists
    extras = set(_pyproject()["project"]["optional-dependencies"])
    for line in re.findall(r"pip install ([^&;]+)", runs):
        words = [w for w in shlex.split(line) if not w.startswith("-")]
        for word in words:
            if word in ("$TORCH_SPEC", "$TORCH_INDEX"):  # the pin checked above; the index it comes from
                continue
            m = re.fullmatch(r"(?:-e\s*)?\.\[([\w,-]+)\]", word)
            assert m and set(m.group(1).split(",")) <= extras, f"pip installs {word!r}, not the project's pins"
    cmd = next(a for i, a in steps if i == "CMD")
    assert set(re.findall(r"\bmake\b\W+(\w[\w.-]*)", cmd)) <= targets and "test" in cmd, cmd


def test_dockerfile_copies_files_that_exist_and_dockerignore_keeps_the_sources():
    steps = _dockerfile()
    for instr, arg in steps:
        if instr == "COPY":
            sources = [w for w in shlex.split(arg) if not w.startswith("--")][:-1]
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: no such file"
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ".venv" in ignored and ".venv-light" in ignored
    needed = [
        "Makefile",
        "pyproject.toml",
        "README.md",
        "sim",
        "reference",
        "notebooks",
        "tests",
        "figures",
        "tools",
        "docs",
    ]
    for path in needed:
        assert (ROOT / path).exists() and path not in ignored and f"{path}/" not in ignored, path


# --- the instructors' install guide ------------------------------------------------------------------------------


def test_the_instructors_install_numbers_are_the_csv_s():
    spec = importlib.util.spec_from_file_location("install_report", ROOT / "tools" / "install_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    rows = report.read_rows(ROOT / "figures" / "install.csv")
    assert [r["install"] for r in rows] == ["light", "full"]
    block = report.guide_block(rows)
    for r in rows:  # the block quotes each measured number
        assert f"| {r['install']} | {int(r['venv_mib']):,} MiB | {int(r['seconds']):,} s |" in block, block
    guide = (ROOT / "notebooks" / "INSTRUCTORS.md").read_text()
    wanted = f"{report.GUIDE_BEGIN}\n{block}\n{report.GUIDE_END}"
    assert wanted in guide, "INSTRUCTORS.md's install block is not the CSV's: python tools/install_report.py --guide"
    assert "## Before the first lab: installing" in guide.split(report.GUIDE_BEGIN)[0]
