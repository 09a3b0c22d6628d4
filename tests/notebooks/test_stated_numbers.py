"""The checker of the walkthroughs' stated numbers (stated_numbers.py), without a kernel.

test_walkthroughs.py executes each walkthrough and asserts that `check_stated_numbers` finds nothing; that proves
little unless the checker can fail. Here it is fed notebooks built in memory (nbformat.v4) whose text or output
disagrees, and must say so in one line naming the walkthrough, the phrase, the stated and the printed number. And
every claim must point at the committed notebooks as they are: its phrase in their markdown, its snippet in
exactly one code cell, so an edit of the text fails in a second instead of after executing the notebook.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from .stated_numbers import check_claim, check_stated_numbers, missing_phrases
from .walkthrough_claims import CLAIMS, Claim

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
WALKTHROUGHS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))

# notebook 2's first claim: the text says seq 0 has 12 tokens in blocks [0, 1, 4] after the decode loop
PHRASE = "Seq 0 now has 12 tokens and the block table `[0, 1, 4]`"
SOURCE = "for step in range(1, 7):\n    kv.allocate_slots([0, 1], [1, 1])"
PRINTED = (
    "decode step 6 (new block: seq [1])   seq 0: {} tokens -> {}  seq 1:  9 tokens -> [2, 3, 5]   free blocks: 2\n"
)


def walkthrough(markdown: str, printed: str | None) -> nbformat.NotebookNode:
    """A two-cell notebook as nbclient leaves it: the text, then a code cell that printed `printed`."""
    code = new_code_cell(SOURCE)
    if printed is not None:
        code.outputs = [new_output("stream", name="stdout", text=printed)]
    return new_notebook(cells=[new_markdown_cell(markdown), code])


def first_claim() -> Claim:
    claim = CLAIMS["02_paging"][0]
    assert claim.phrase == PHRASE and claim.cell in SOURCE  # this file's notebooks are built for that claim
    return claim


def test_a_notebook_that_prints_what_the_text_says_passes():
    nb = walkthrough(f"Predict. {PHRASE}. In which slot?", PRINTED.format(12, "[0, 1, 4]"))
    assert check_claim("02_paging", first_claim(), nb) is None


def test_a_wrong_number_is_reported_with_the_phrase_the_stated_and_the_printed_number():
    nb = walkthrough(PHRASE, PRINTED.format(13, "[0, 1, 4]"))
    message = check_claim("02_paging", first_claim(), nb)
    assert message == (
        f"02_paging: the text says '{PHRASE}' (12, 0, 1, 4) but cell 'for step in range(1, 7):' printed (13, 0, 1, 4)"
    )
    assert "\n" not in message


def test_a_rewrapped_phrase_still_matches_but_an_edited_one_does_not():
    rewrapped = walkthrough(PHRASE.replace(" the block", "\nthe block"), PRINTED.format(12, "[0, 1, 4]"))
    assert check_claim("02_paging", first_claim(), rewrapped) is None
    edited = walkthrough(PHRASE.replace("12 tokens", "11 tokens"), PRINTED.format(12, "[0, 1, 4]"))
    assert check_claim("02_paging", first_claim(), edited) == f"02_paging: the text no longer says '{PHRASE}'"


def test_a_missing_output_or_cell_is_a_mismatch():
    silent = check_claim("02_paging", first_claim(), walkthrough(PHRASE, None))
    assert silent.startswith(f"02_paging: the text says '{PHRASE}'") and "printed nothing matching" in silent
    nb = walkthrough(PHRASE, PRINTED.format(12, "[0, 1, 4]"))
    nb.cells[1].source = "print(kv.block_table(0))"
    assert "0 code cells contain 'for step in range(1, 7):'" in check_claim("02_paging", first_claim(), nb)


def test_a_range_claim_fails_outside_its_range():
    claim = Claim(
        "waste under 4%",
        "busy[policy]",
        r"^paged +token states +([\d.]+)%",
        read=lambda ms: 100 - ms[0][0],
        within=(0, 4),
    )
    nb = new_notebook(cells=[new_markdown_cell("vLLM: waste under 4%."), new_code_cell("busy[policy] = 1")])
    nb.cells[1].outputs = [new_output("stream", name="stdout", text="paged   token states  98.4%\n")]
    assert check_claim("01_x", claim, nb) is None
    nb.cells[1].outputs[0].text = "paged   token states  95.1%\n"
    assert check_claim("01_x", claim, nb) == (
        "01_x: the text says 'waste under 4%' (0 to 4) but cell 'busy[policy]' printed ((95.1)) -> 4.9"
    )


def test_check_stated_numbers_lists_every_mismatch_of_an_unexecuted_walkthrough():
    nb = nbformat.read(NOTEBOOKS / "02_paging.ipynb", as_version=4)  # committed: the text is there, no outputs
    mismatches = check_stated_numbers("02_paging", nb)
    assert len(mismatches) == len(CLAIMS["02_paging"])
    assert all(m.startswith("02_paging: the text says '") and "printed nothing matching" in m for m in mismatches)


def test_there_are_claims_for_every_walkthrough_and_nothing_else():
    assert sorted(CLAIMS) == [path.stem for path in WALKTHROUGHS]


@pytest.mark.parametrize("path", WALKTHROUGHS, ids=lambda p: p.stem)
def test_every_claim_points_at_the_committed_notebook(path):
    nb = nbformat.read(path, as_version=4)
    assert missing_phrases(path.stem, nb) == []
    code = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    for claim in CLAIMS[path.stem]:
        assert sum(claim.cell in source for source in code) == 1, f"'{claim.cell}' must be in exactly one code cell"
