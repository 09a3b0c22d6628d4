"""The Jupyter walkthroughs (notebooks/NN_*.ipynb) and the exercise notebooks run top to bottom in a real
kernel, and every notebook of the lab is committed with its outputs cleared.

Each notebook runs in a fresh ipykernel started with THIS interpreter (the project's .venv): a kernelspec
written to a temporary JUPYTER_PATH, which Jupyter searches before any user or system kernelspec, so a
"python3" kernel from elsewhere on the machine can never be picked up (the last cell prints sys.executable
to prove it). The kernel's working directory is the notebook's folder, as when a reader opens it there.

Each executed walkthrough is also checked against its own text: the numbers its markdown states about its output
(tests/notebooks/walkthrough_claims.py, checked by stated_numbers.py) must be what it printed, so a change that
moves an output fails here until the text (and the claim) follows.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from .stated_numbers import check_stated_numbers

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
WALKTHROUGHS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
EXERCISES = sorted((NOTEBOOKS / "exercises").glob("*.ipynb"))
CELL_TIMEOUT_S = 180  # per cell: the engine notebook loads SmolLM2 (~10-20 s on 2 cores) in one cell
KERNEL_NAME = "paged-attention-lab-test"


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """A kernelspec whose argv is sys.executable, on a JUPYTER_PATH searched first; plus the kernel's env."""
    jupyter_path = tmp_path_factory.mktemp("jupyter")
    spec_dir = jupyter_path / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec_dir / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "lab", "language": "python"}))
    env = {
        "JUPYTER_PATH": os.pathsep.join([str(jupyter_path), os.environ.get("JUPYTER_PATH", "")]).rstrip(os.pathsep),
        # NOTE: the repo root first on the kernel's path, so `import sim` / `import reference` find the working
        # tree even where an editable install is stale (one made before a package had its __init__.py).
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel subprocess inherits this process's environment
    yield env
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_there_are_ten_walkthroughs():
    assert [p.name[:2] for p in WALKTHROUGHS] == ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10"], (
        WALKTHROUGHS
    )


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.rglob("*.ipynb")), ids=lambda p: str(p.relative_to(NOTEBOOKS)))
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"cell {i} of {path.name} has outputs"


def execute(path: Path) -> nbformat.NotebookNode:
    """Run the notebook in a fresh kernel, in its own folder; raises CellExecutionError (with the cell and its
    traceback) if any cell fails. A last cell reports which python ran it."""
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable)"))
    client = NotebookClient(
        nb, kernel_name=KERNEL_NAME, timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    return nb


@pytest.mark.slow
@pytest.mark.parametrize("path", WALKTHROUGHS, ids=lambda p: p.stem)
def test_walkthrough_runs_top_to_bottom(path, kernel_env):
    """It runs without an error and draws a picture, in this project's python; and every number its text states
    about its own output is what the output shows (walkthrough_claims.py's claims, checked on this one run)."""
    nb = execute(path)
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} draws no picture"
    assert nb.cells[-1].outputs[0]["text"].strip() == sys.executable
    mismatches = check_stated_numbers(path.stem, nb)
    assert not mismatches, "\n".join(mismatches)


@pytest.mark.slow
@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.stem)
def test_exercise_notebook_runs_and_reports_the_unfinished_skeleton(path, kernel_env):
    nb = execute(path)
    printed = "".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs)
    assert "not implemented yet" in printed and "Checking My" in printed, printed
    assert nb.cells[-1].outputs[0]["text"].strip() == sys.executable


@pytest.mark.slow
def test_the_readme_commands_for_opening_and_exporting_notebooks_work(tmp_path, kernel_env):  # env: os.environ
    """notebooks/README.md: `.venv/bin/jupyter lab notebooks/` and `jupyter nbconvert --execute`, both from the
    project's own environment (JupyterLab and nbconvert are installed with it)."""
    import subprocess

    jupyter = Path(sys.executable).with_name("jupyter")
    readme = (NOTEBOOKS / "README.md").read_text()
    assert ".venv/bin/jupyter lab notebooks/" in readme and ".venv/bin/jupyter nbconvert" in readme
    lab = subprocess.run([jupyter, "lab", "--version"], capture_output=True, text=True, timeout=120)
    assert lab.returncode == 0 and lab.stdout.strip()[0].isdigit(), lab.stderr
    done = subprocess.run(
        [
            jupyter,
            "nbconvert",
            "--to",
            "html",
            "--execute",
            "--output-dir",
            tmp_path,
            f"--ExecutePreprocessor.kernel_name={KERNEL_NAME}",
            NOTEBOOKS / "02_paging.ipynb",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=NOTEBOOKS,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    html = (tmp_path / "02_paging.html").read_text()
    assert "block_table" in html and "Traceback" not in html
