"""Checking what each walkthrough's text says about its own output (walkthrough_claims.py) against its executed
notebook.

A walkthrough's markdown tells the reader what the cell above printed. Nothing ties those sentences to the code: a
change in the simulator moves the output and the text goes on stating the old number. For each `Claim`, the code
cell whose source contains its snippet (exactly one) is found, its printed output (stdout streams and the text/plain
of its results, in order) searched with the claim's pattern, the matches' groups read as numbers where they are
numbers (`15,805`, `2.98e-07`), True/False as booleans, anything else as text, and the value compared.

`check_stated_numbers(stem, nb)` returns one line per mismatch, a missing phrase, cell or output included;
tests/notebooks/test_walkthroughs.py calls it on every executed walkthrough, and test_stated_numbers.py proves
that it fails when it should and that every phrase is in the committed notebooks.
"""

from __future__ import annotations

import importlib.util
import re

from .walkthrough_claims import CLAIMS, Claim, show

# ---------------------------------------------------------------------------------------------- reading helpers


def _value(text: str | None):
    if text is None:
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text.replace(",", ""))
    except ValueError:
        pass
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def _shorten(text: str, width: int = 160) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _all_groups(matches: list[tuple]):
    values = tuple(v for match in matches for v in match if v is not None)
    return values[0] if len(values) == 1 else values


def _close(actual, expected, tolerance: float) -> bool:
    if isinstance(expected, (tuple, list)):
        return (
            isinstance(actual, (tuple, list))
            and len(actual) == len(expected)
            and all(_close(a, e, tolerance) for a, e in zip(actual, expected))
        )
    if isinstance(expected, (bool, str)) or isinstance(actual, (bool, str)):
        return actual == expected and type(actual) is type(expected)
    return isinstance(actual, (int, float)) and abs(actual - expected) <= tolerance + 1e-12


def _inside(actual, low: float, high: float) -> bool:
    if isinstance(actual, (tuple, list)):
        return len(actual) > 0 and all(_inside(a, low, high) for a in actual)
    return isinstance(actual, (int, float)) and not isinstance(actual, bool) and low <= actual <= high


# ---------------------------------------------------------------------------------------------------- checking


def _words(text: str) -> str:
    return " ".join(text.split())


def markdown_text(nb) -> str:
    """All markdown cells of a notebook, whitespace runs as one space."""
    return _words(" ".join(cell.source for cell in nb.cells if cell.cell_type == "markdown"))


def printed(cell) -> str:
    """What a code cell printed: its stdout streams and the text/plain of its results, in order."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream" and output.name == "stdout":
            parts.append(output.text)
        elif "text/plain" in output.get("data", {}):
            parts.append(output.data["text/plain"] + "\n")
    return "".join(parts)


def missing_phrases(stem: str, nb) -> list[str]:
    """The claims' phrases that no markdown cell of the notebook contains, as mismatch lines."""
    text = markdown_text(nb)
    return [
        f"{stem}: the text no longer says '{_words(c.phrase)}'" for c in CLAIMS[stem] if _words(c.phrase) not in text
    ]


def check_claim(stem: str, claim: Claim, nb) -> str | None:
    """None if the executed notebook bears the claim out, else one line saying what differs."""
    said = f"{stem}: the text says '{_words(claim.phrase)}' ({claim.expectation()})"
    if _words(claim.phrase) not in markdown_text(nb):
        return f"{stem}: the text no longer says '{_words(claim.phrase)}'"
    cells = [cell for cell in nb.cells if cell.cell_type == "code" and claim.cell in cell.source]
    if len(cells) != 1:
        return f"{said} but {len(cells)} code cells contain '{claim.cell}' (exactly one must)"
    if claim.engine and importlib.util.find_spec("torch") is None:
        return None  # the light install: the cell printed that the engine needs the full install
    matches = [tuple(_value(g) for g in m.groups()) for m in re.finditer(claim.pattern, printed(cells[0]), re.M)]
    if not matches:
        return f"{said} but cell '{claim.cell}' printed nothing matching {claim.pattern!r}"
    try:
        actual = (claim.read or _all_groups)(matches)
    except Exception as error:  # a read that does not fit what was printed is a mismatch, not a crash
        return f"{said} but cell '{claim.cell}' printed {_shorten(show(matches))}, unreadable: {error!r}"
    if claim.within is not None:
        ok = _inside(actual, *claim.within)
    else:
        ok = _close(actual, claim.stated, claim.tolerance)
    if ok:
        return None
    shown = show(actual) if claim.read is None else f"{_shorten(show(matches))} -> {show(actual)}"
    return f"{said} but cell '{claim.cell}' printed {shown}"


def check_stated_numbers(stem: str, nb) -> list[str]:
    """One line per claim of the walkthrough `stem` that its executed notebook `nb` does not bear out."""
    return [line for claim in CLAIMS[stem] if (line := check_claim(stem, claim, nb)) is not None]
