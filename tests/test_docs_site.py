"""The docs site (`make docs`, mkdocs.yml, tools/docs_hooks.py) builds with `--strict`: no broken link, no missing
anchor, no link out of docs/ to a file the repository lacks, every page in the nav; and a broken link or anchor does
fail it. Also: README.md stays a front door (at most 250 lines) and every page of docs/ is in the nav."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_book import ROOT, book

pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]'; `make install` has it)")


def build(root: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"), "-d", str(out)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_the_site_builds_with_every_link_and_anchor_found(tmp_path):
    out = build(ROOT, tmp_path / "site")
    assert out.returncode == 0, out.stderr
    assert "WARNING" not in out.stderr, out.stderr
    pages = {p.name for p in (tmp_path / "site").glob("*.html")}
    assert {"index.html", "figures.html", "engine.html", "ARCHITECTURE.html"} <= pages
    assert 'src="../figures/memory_managers.png"' in (tmp_path / "site" / "index.html").read_text()


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(ROOT / name, copy)
    shutil.copytree(ROOT / "docs", copy / "docs")
    (copy / "tools").mkdir()
    shutil.copy(ROOT / "tools" / "docs_hooks.py", copy / "tools")
    for entry in ROOT.iterdir():  # the rest of the checkout, which links out of docs/ point at
        if not (copy / entry.name).exists() and entry.name not in ("site", ".git"):
            (copy / entry.name).symlink_to(entry)
    assert build(copy, tmp_path / "site").returncode == 0  # the copy builds as the checkout does
    for broken, message in [
        ("[a](paper.md#no-such-anchor)", "does not contain an anchor '#no-such-anchor'"),
        ("[a](no-such-page.md)", "'no-such-page.md', but the target is not found"),
        ("[a](../figures/no_such_figure.png)", "which is no file of the repository"),
    ]:
        page = copy / "docs" / "gpu.md"
        page.write_text((ROOT / "docs" / "gpu.md").read_text() + f"\n{broken}\n")
        out = build(copy, tmp_path / "site")
        assert out.returncode != 0 and message in out.stderr, (broken, out.stderr)


def test_the_readme_is_a_front_door_and_every_page_is_in_the_nav():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
    assert sorted(book()[1:]) == sorted((ROOT / "docs").glob("*.md"))
    assert book()[0] == ROOT / "README.md"
