"""The README's generated numbers of `make calibrate` (reference/validation/readme_numbers.py): the blocks follow the files they
are made from, and `python -m reference readme-numbers` checks a stale block (exit 1), rewrites a copy, and says in
one line what is wrong with a README without markers, as `python -m sim readme-numbers` does
(tests/sim/test_readme_numbers.py). That the committed README's blocks are what the committed files give, and are the
commands' own text: tests/reference/test_calibrate.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reference.cli import main
from reference.validation.readme_numbers import BLOCKS, Files, make_block, readme_blocks
from sim.figures import readme_numbers as sim_numbers
from sim.figures.readme_numbers import current_block, markers
from tests.docs_book import book_text

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "figures"
OK = "the README's calibration numbers are the files'"


def reference(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reference", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def empty_blocks(names=tuple(BLOCKS), inside: str = "") -> str:
    return "\n\n".join(f"{markers(n)[0]}\n{inside}{markers(n)[1]}" for n in names)


def test_the_blocks_are_in_reading_order_beside_sims():
    book = book_text()  # README.md, then mkdocs.yml's nav
    assert list(BLOCKS) == sorted(BLOCKS, key=lambda name: book.index(markers(name)[0]))
    assert not set(BLOCKS) & set(sim_numbers.BLOCKS)  # one command per block: sim's never touches these


def test_check_passes_on_the_committed_readme():
    out = reference("readme-numbers", "--check")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"README.md and docs/*.md: {OK}"


def test_the_blocks_follow_the_files(tmp_path, capsys):
    # a validation run in which one trace misses a target: the table and the sentence say so, nothing else moves
    figures = tmp_path / "figures"
    figures.mkdir()
    for name in ("cost_model_cpu.json", "validate_online.csv", "validate_online_requests.csv"):
        shutil.copy(FIGURES / name, figures)
    lines = (FIGURES / "validate_sim.csv").read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if not line.startswith("#")) + 1  # the first trace's row
    column = lines[first - 1].rstrip("\n").split(",").index("median_e2e_latency_error")
    cells = lines[first].split(",")
    cells[column] = "0.5"
    lines[first] = ",".join(cells)
    (figures / "validate_sim.csv").write_text("".join(lines))
    committed, changed = readme_blocks(), readme_blocks(Files(figures))
    assert changed["calibration"] == committed["calibration"] and changed["serving"] == committed["serving"]
    assert f"| {cells[0]} | {cells[1]} | 50.0% / " in changed["validation"]
    total = len(lines) - first
    met = int(re.search(rf"(\d+) of {total} traces meet the targets", committed["validation"]).group(1))
    assert f"{cells[0]} misses" not in committed["validation"]  # the committed run's first trace met them
    assert f"{met - 1} of {total} traces meet the targets" in changed["validation"]
    assert f"{cells[0]} misses median E2E" in changed["validation"]

    # --check of the committed pages (in one file) against those files names the stale block, and only it; --write rewrites a copy
    readme = tmp_path / "README.md"
    readme.write_text(book_text())  # every page in one file: --readme checks that one file
    assert main(["readme-numbers", "--check", "--readme", str(readme), "--figures", str(figures)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"{readme}: its blocks validation are not what the files give (run: python -m reference readme-numbers --write)"
    ]
    assert main(["readme-numbers", "--write", "--readme", str(readme), "--figures", str(figures)]) == 0
    assert capsys.readouterr().out.strip() == f"rewrote {readme}"
    assert current_block(readme.read_text(encoding="utf-8"), "validation") == changed["validation"]
    # the pages around the block, sim's blocks among them, are as they were
    before, after = book_text(), readme.read_text(encoding="utf-8")
    begin, end = markers("validation")
    assert before[: before.index(begin)] == after[: after.index(begin)]
    assert before[before.index(end) :] == after[after.index(end) :]


def test_a_stale_block_is_found_and_write_rewrites_a_copy(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("before\n\n" + empty_blocks(inside="stale\n") + "\n\nafter\n")
    assert main(["readme-numbers", "--check", "--readme", str(readme)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "serving, calibration, validation" in err[0] and "reference readme-numbers --write" in err[0]
    ), err
    assert main(["readme-numbers", "--write", "--readme", str(readme)]) == 0
    assert capsys.readouterr().out.strip() == f"rewrote {readme}"
    assert main(["readme-numbers", "--check", "--readme", str(readme)]) == 0
    assert capsys.readouterr().out.strip() == f"{readme}: {OK}"
    text = readme.read_text()
    assert text.startswith(f"before\n\n{markers('serving')[0]}\nFrom `figures/validate_online.csv`")
    assert f"{markers('calibration')[0]}\nFrom `figures/cost_model_cpu.json`" in text
    assert text.endswith("\n\nafter\n") and "stale" not in text
    assert main(["readme-numbers", "--write", "--readme", str(readme)]) == 0
    assert capsys.readouterr().out.strip() == f"unchanged: {readme}"

    # one number edited by hand: --check names its block, and only it
    readme.write_text(text.replace(" of 11 traces", " of 12 traces"))
    assert main(["readme-numbers", "--check", "--readme", str(readme)]) == 1
    assert "its blocks validation are not" in capsys.readouterr().err


def test_a_readme_without_markers_is_one_line(tmp_path, capsys):
    plain = tmp_path / "plain.md"
    plain.write_text("no markers here\n")
    assert main(["readme-numbers", "--check", "--readme", str(plain)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{plain}: no {markers('serving')[0]}"), err
    assert "(nor calibration, validation)" in err[0]
    # --write has nowhere to write: bad input, one `error:` line, exit 2, nothing written
    assert main(["readme-numbers", "--write", "--readme", str(plain)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "readme-numbers:serving:begin" in err[0], err
    assert plain.read_text() == "no markers here\n"
    # one block missing, or its markers in the wrong order: that block is named
    some = tmp_path / "some.md"
    begin, end = markers("validation")
    some.write_text(empty_blocks(["serving", "calibration"], inside="stale\n") + f"\n{end}\n{begin}\n")
    assert main(["readme-numbers", "--check", "--readme", str(some)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"no {begin} ... {end} block" in err[0], err
    assert main(["readme-numbers", "--write", "--readme", str(some)]) == 2
    assert "error: " in capsys.readouterr().err and "stale" in some.read_text()  # nothing replaced


def test_print_gives_every_block_between_its_markers(capsys):
    assert main(["readme-numbers"]) == 0
    out = capsys.readouterr().out
    readme = book_text()
    for name in BLOCKS:
        begin, end = markers(name)
        assert f"{begin}\n{current_block(readme, name)}\n{end}" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["readme-numbers", "--figures", "nowhere"], "no such file"),
        (["readme-numbers", "--write", "--check"], "not allowed with argument"),
        (["readme-numbers", "--check", "--readme", "absent.md"], "absent.md"),
    ],
)
def test_bad_input_is_one_error_line(args, message, tmp_path):
    out = reference(*args, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("error: ") and message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_missing_or_foreign_file_names_itself(tmp_path):
    with pytest.raises(FileNotFoundError, match="cost_model_cpu.json: no such file"):
        make_block("calibration", Files(tmp_path))
    (tmp_path / "cost_model_cpu.json").write_text('{"model": "smollm2-135m"}')
    with pytest.raises(ValueError, match="cost_model_cpu.json: no 'machine'"):
        make_block("calibration", Files(tmp_path))
    (tmp_path / "validate_sim.csv").write_text("trace,num_requests\n")
    with pytest.raises(ValueError, match="validate_sim.csv: expected the summary rows"):
        make_block("validation", Files(tmp_path))
