"""The docs in reading order: README.md (the site's home page), then the pages of mkdocs.yml's nav, in order."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def book() -> list[Path]:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:\n", 1)[1]
    names = re.findall(r"^\s+- [^\n]*?: (\S+\.md)\s*$", nav, re.M)
    return [ROOT / "README.md" if name == "index.md" else ROOT / "docs" / name for name in names]


def book_text() -> str:
    """Every page's text, in reading order."""
    return "\n".join(path.read_text(encoding="utf-8") for path in book())
