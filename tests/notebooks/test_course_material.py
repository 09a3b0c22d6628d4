"""The course material around the walkthroughs: each notebook's "You will learn" objectives and "Predict, then
run" questions, and notebooks/INSTRUCTORS.md, whose answers quote the numbers the notebooks print.

An answer in INSTRUCTORS.md is a list item `- **Answer, cell-NN:** ...`; every code span in it that holds a digit
(`saves 58%`, `r2:prefill(17)`) is a piece of what cell cell-NN prints, quoted verbatim, and is checked here
without a Jupyter kernel:

- notebooks 1-5, 7 and 8: their code cells run in this process, in order, in one namespace per notebook, as the kernel
  would run them (in the notebooks' folder, `%` magics dropped, matplotlib drawing off-screen), and each quoted
  span must appear in its cell's printed output. A cell that answers with a plot and prints nothing (notebook 5's
  sweep) is given a printed form of the points it plots (`PLOTTED`). About 26 s in all on 2 cores (notebook 7's
  simulations about 8 s of it, notebook 8's about 6 s with its tiny engine).
- notebook 6 loads a real model, too slow for this file (tests/notebooks/test_walkthroughs.py runs it). Its
  answers quote only shapes, block ids and free-block counts, which follow from the model's spec and the
  simulator's KV manager: `replay_engine_blocks` makes the engine's allocations on a `PagedKVManager` and prints
  the same lines.
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from functools import lru_cache
from pathlib import Path

import matplotlib
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
WALKTHROUGHS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
INSTRUCTORS = NOTEBOOKS / "INSTRUCTORS.md"
LEARN, PREDICT = "**You will learn**", "**Predict, then run.**"
# NOTE: three questions per walkthrough is the norm; 05 asks a fourth, on the paper's other Fig. 12 setups (what tensor
# parallelism costs), because those panels belong with its Fig. 12 and no other walkthrough reproduces the paper; 07
# asks five, one per KV memory mechanism that came after the paper (a radix tree, a CPU offload tier for the prefix
# cache, vAttention's pages, a hybrid model's groups, an 8-bit KV cache): each is a mechanism of its own, and the
# tier's question needs cell-06's conversations, so it cannot move to another walkthrough. (Serving policies after
# the paper, priority and disaggregation, are walkthrough 09's.)
MORE_PREDICTIONS = {"05_reproducing_the_paper": 4, "07_after_the_paper": 5}
ENGINE = "06_real_engine.ipynb"


def markdown(cell) -> str:
    return cell.source if cell.cell_type == "markdown" else ""


def bullets(text: str) -> list[str]:
    """The items of a markdown list ("- " lines, continued by indented lines), whitespace normalised."""
    items: list[str] = []
    for line in text.splitlines():
        if line.startswith("- "):
            items.append(line[2:].strip())
        elif line.startswith("  ") and items:
            items[-1] += " " + line.strip()
    return [" ".join(item.split()) for item in items]


def predict_targets(nb) -> list[str]:
    """The ids of the code cells that answer the notebook's "Predict, then run" questions."""
    return [nb.cells[i + 1].id for i, cell in enumerate(nb.cells[:-1]) if PREDICT in markdown(cell)]


def sections() -> dict[str, str]:
    """INSTRUCTORS.md's walkthrough sections, by notebook file name (headings "## `0N_name.ipynb`: ...")."""
    parts = re.split(r"^## `(\d\d_\w+\.ipynb)`.*$", INSTRUCTORS.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def answers(section: str) -> dict[str, str]:
    """cell id -> the text of its answer (the list item, continuation lines joined)."""
    found = re.findall(r"^- \*\*Answer, (cell-\w+):?\*\*:?(.*(?:\n  .*)*)", section, flags=re.M)
    return {cell_id: " ".join(text.split()) for cell_id, text in found}


def quoted_numbers(answer: str) -> list[str]:
    """The answer's code spans that hold a number (a digit not inside a name: `pow2` holds none)."""
    return [span for span in re.findall(r"`([^`]+)`", answer) if re.search(r"(?<![A-Za-z_])\d", span)]


def unmatched(answer: str, printed: str) -> list[str]:
    """The answer's quoted spans with a digit that the cell did not print."""
    return [span for span in quoted_numbers(answer) if span not in printed]


def render_sweep(ns: dict) -> str:
    # notebook 5, cell-01 plots sweep()'s points and prints nothing: one line per plotted point
    return "\n".join(
        f"{policy} at {rate} req/s: {latency:.2f} s/token, mean batch {batch:.1f}"
        for policy, out in ns["sharegpt"].items()
        for rate, latency, batch in zip(ns["RATES"], out["latency"], out["batch"])
    )


PLOTTED = {("05_reproducing_the_paper.ipynb", "cell-01"): render_sweep}


@lru_cache(maxsize=None)
def printed_outputs(name: str) -> dict[str, str]:
    """Run the notebook's code cells here, in order, and return what each printed, by cell id."""
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    namespace: dict = {"__name__": "__main__"}
    printed = {}
    with contextlib.chdir(NOTEBOOKS), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Agg's "cannot show the figure"
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith("%"))
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(source, f"{name}:{cell.id}", "exec"), namespace)
            plt.close("all")
            render = PLOTTED.get((name, cell.id))
            printed[cell.id] = out.getvalue() + ("\n" + render(namespace) if render else "")
    return printed


def replay_engine_blocks() -> dict[str, str]:
    """Notebook 6's block moves on the simulator's own KV manager, printed as the notebook prints them.

    The pool is the notebook's (48 blocks of 8 slots). The token counts are the notebook's, as its output shows:
    the first `generate` call's sequence held 2 blocks (so `a`, admitted next, gets `[1, 0]`); then `a` = seq 1
    with a 9-token prompt, `b` = seqs 2 and 3, two samples of a 4-token prompt; every step adds one token to each
    running sequence; `a` finishes after 9 steps, and `c` = seq 4 holds 5 blocks two steps after it arrives.
    """
    from sim.base.specs import get_model
    from sim.kv import NewSequence, make_kv_manager

    smollm2 = get_model("smollm2-135m")
    lines = {"cell-01": f"K cache of layer 0: {(48, 8, smollm2.num_kv_heads, smollm2.head_dim)}"}
    kv = make_kv_manager("paged", 48 * 8, block_size=8)
    kv.allocate_slots([0], [16], [NewSequence(16, 16)])
    kv.free(0)
    kv.allocate_slots([1, 2], [9, 4], [NewSequence(9, 19), NewSequence(4, 20)])
    kv.fork(2, 3, final_len=20)
    log = [
        f"step 0: free blocks {kv.num_free_blocks}, copy-on-write []",
        f"blocks {kv.block_table(2)}, owners {[kv.allocator.ref_count(b) for b in kv.block_table(2)]}",
    ]
    for step in range(1, 10):
        running = [1, 2, 3] if step < 9 else [2, 3]  # a samples its 10th and last token at step 8
        copies = kv.allocate_slots(running, [1] * len(running)).copies
        if step == 9:
            kv.free(1)
        log.append(f"step {step}: free blocks {kv.num_free_blocks}, copy-on-write {copies}")
    lines["cell-04"] = "\n".join(log)
    queue = kv.allocator.free_queue()
    kv.allocate_slots([4], [5 * 8], [NewSequence(5 * 8, 60)])
    lines["cell-06"] = (
        f"free queue before c arrives, front first: {queue[:10]} ...\nrequest 3 seq 4: blocks {kv.block_table(4)}"
    )
    return lines


# --- the notebooks ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", WALKTHROUGHS, ids=lambda p: p.stem)
def test_walkthrough_opens_with_three_to_five_objectives(path):
    cells = nbformat.read(path, as_version=4).cells
    learn = [i for i, cell in enumerate(cells) if LEARN in markdown(cell)]
    assert learn and learn[0] in (0, 1), f"{path.name}: no '{LEARN}' cell among the first two cells"
    objectives = bullets(markdown(cells[learn[0]]))
    assert 3 <= len(objectives) <= 5, objectives


@pytest.mark.parametrize("path", WALKTHROUGHS, ids=lambda p: p.stem)
def test_walkthrough_has_two_or_three_predictions_each_before_a_code_cell(path):
    nb = nbformat.read(path, as_version=4)
    questions = [i for i, cell in enumerate(nb.cells) if PREDICT in markdown(cell)]
    most = MORE_PREDICTIONS.get(path.stem, 3)
    assert 2 <= len(questions) <= most, f"{path.name}: {len(questions)} '{PREDICT}' cells"
    for i in questions:
        assert markdown(nb.cells[i]).startswith(PREDICT) and "?" in markdown(nb.cells[i]), nb.cells[i].source
        assert i + 1 < len(nb.cells) and nb.cells[i + 1].cell_type == "code", f"{path.name}: cell {i} answers nothing"


# --- INSTRUCTORS.md --------------------------------------------------------------------------------------------
def test_the_guide_has_a_section_per_walkthrough_and_names_every_notebook():
    assert list(sections()) == [p.name for p in WALKTHROUGHS]
    text = INSTRUCTORS.read_text()
    for path in WALKTHROUGHS:
        assert text.count(path.name) >= 2, f"{path.name} appears only in its heading"  # and in the lecture / lab
    assert "## A 90-minute lecture" in text and "## A 3-hour lab" in text


def test_the_figures_and_exercises_the_guide_names_exist():
    text = INSTRUCTORS.read_text()
    named = set(re.findall(r"figures/\w+\.png", text)) | {
        f"notebooks/{e}" for e in re.findall(r"exercises/\w+\.ipynb", text)
    }
    assert len(named) >= 10, named
    assert [name for name in sorted(named) if not (ROOT / name).is_file()] == []


@pytest.mark.parametrize("path", WALKTHROUGHS, ids=lambda p: p.stem)
def test_the_guide_repeats_the_objectives_and_answers_every_question(path):
    nb = nbformat.read(path, as_version=4)
    section = sections()[path.name]
    learn = next(markdown(cell) for cell in nb.cells[:2] if LEARN in markdown(cell))
    assert bullets(learn) == bullets(section.split("**Objectives.**")[1].split("**Predict")[0])
    assert sorted(answers(section)) == sorted(predict_targets(nb))


@pytest.mark.parametrize("name", [p.name for p in WALKTHROUGHS if p.name != ENGINE])
def test_the_answers_quote_what_the_notebook_prints(name):
    printed = printed_outputs(name)
    found = answers(sections()[name])
    assert sum(len(quoted_numbers(text)) for text in found.values()) >= len(found)  # each answer quotes numbers
    assert {cell_id: unmatched(text, printed[cell_id]) for cell_id, text in found.items()} == dict.fromkeys(found, [])


def test_the_engine_answers_follow_from_the_kv_manager():
    printed = replay_engine_blocks()
    found = answers(sections()[ENGINE])
    assert sum(len(quoted_numbers(text)) for text in found.values()) >= len(found)
    assert {cell_id: unmatched(text, printed[cell_id]) for cell_id, text in found.items()} == dict.fromkeys(found, [])


def test_a_wrong_number_in_an_answer_is_caught():
    printed = printed_outputs("02_paging.ipynb")["cell-10"]
    answer = answers(sections()["02_paging.ipynb"])["cell-10"]
    assert "`[4, 1, 0]`" in answer and unmatched(answer, printed) == []
    assert unmatched(answer.replace("`[4, 1, 0]`", "`[0, 1, 4]`"), printed) == ["[0, 1, 4]"]


def test_the_guide_lists_every_lab_in_course_order():
    from reference.exercises import EXERCISES

    table = INSTRUCTORS.read_text().split("## The thirteen labs")[1]
    rows = re.findall(r"^\| `(\d\d_\w+)` \|", table, flags=re.M)
    assert rows == [exercise.notebook for exercise in EXERCISES.values()] and len(rows) == 13


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks" / "exercises").glob("*.ipynb")), ids=lambda p: p.stem)
def test_every_lab_opens_with_its_objectives(path):
    """INSTRUCTORS.md: "Each lab is a notebook in `exercises/` with 'You will learn' objectives"."""
    first = markdown(nbformat.read(path, as_version=4).cells[0])
    assert first.startswith("# Exercise") and LEARN in first, f"{path.name}: no '{LEARN}' in its first cell"
    assert len(bullets(first.split(LEARN, 1)[1].split("**The idea.**", 1)[0])) >= 2
