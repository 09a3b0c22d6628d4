"""mkdocs hooks for the docs site (mkdocs.yml, `make docs`).

- The home page is README.md, the repository's front door, which lives outside docs/: it is added as index.md, its
  links rewritten from the repository root's view to docs/'s (docs/engine.md -> engine.md, figures/x.png ->
  ../figures/x.png), so mkdocs checks them like any page's.
- Links that leave docs/ (../figures/x.png, ../sim/kv/paged.py, ../notebooks/README.md) point at files of the checkout,
  not at pages of the site; mkdocs would call each "not found among documentation files". Each is checked here
  instead: a target that exists in the repository is fine (mkdocs' own warning about it is dropped), one that does
  not is a warning, which `--strict` turns into a failed build. With `use_directory_urls: false` and the site built
  into site/ inside the checkout, such a link reads from site/NAME.html exactly as from docs/NAME.md. A link to
  ../README.md goes to the home page (index.md).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")
log = logging.getLogger("mkdocs.hooks.docs")


def _outside(url: str) -> bool:
    return url.startswith("../")


def _exists(url: str) -> bool:
    target = Path(os.path.normpath(ROOT / "docs" / url.split("#", 1)[0]))
    return target.is_relative_to(ROOT) and target.exists()


class _OutsideLinks(logging.Filter):
    """Drops mkdocs' warning about a link out of docs/ whose target exists in the repository (checked by the hook)."""

    QUOTED = re.compile(r"contains (?:a|an unrecognized relative) link '([^']+)'")

    def filter(self, record: logging.LogRecord) -> bool:
        found = self.QUOTED.search(record.getMessage())
        return not (found and _outside(found.group(1)) and _exists(found.group(1)))


def on_startup(**_) -> None:
    logging.getLogger("mkdocs.structure.pages").addFilter(_OutsideLinks())


def _from_root(url: str) -> str:
    """A README link (relative to the repository root) as seen from docs/."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", url) or url.startswith(("#", "/")):
        return url
    return url[len("docs/") :] if url.startswith("docs/") else "../" + url


def on_files(files, config):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    text = LINK.sub(lambda m: m.group(1) + _from_root(m.group(2)) + m.group(3), text)
    files.append(File.generated(config, "index.md", content=text))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    def check(m: re.Match) -> str:
        url = m.group(2)
        if url.split("#", 1)[0] == "../README.md":
            return m.group(1) + "index.md" + url[len("../README.md") :] + m.group(3)
        if _outside(url) and not _exists(url):
            log.warning(f"Doc file '{page.file.src_uri}' links to '{url}', which is no file of the repository")
        return m.group(0)

    return LINK.sub(check, markdown)
