"""The README's "The paper, side by side": its block is exactly what sim/figures/paper.py makes of the committed CSVs,
the lab's numbers there are the CSVs' own (recomputed here by hand), every difference beyond 10% has a note, the
sensitivity CSV is the sweep the code defines (and one of its runs reproduces), and bad command lines end in one
`error:` line with exit status 2."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from sim.drivers.sweep import run_task
from sim.figures import paper
from sim.figures.paper import PAPER, ROWS, Data, PaperNumber, Value, difference, readme_block
from sim.figures.paper_sensitivity import COLUMNS, PARAMS, points, read_sensitivity, row

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "figures"


@pytest.fixture(scope="module")
def data() -> Data:
    return Data(FIGURES)


def rows(name: str) -> list[dict]:
    with open(FIGURES / f"{name}.csv") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def lab(data: Data, key: str) -> Value:
    return next(r for r in ROWS if r.key == key).lab(data)


def sustained_by_hand(curve: list[tuple[float, float]]) -> float:
    """The highest rate whose latency, and every lower rate's, is under 1 s/token: walked here, not via knee()."""
    best = None
    for rate, latency in sorted(curve):
        if latency > 1.0:
            break
        best = rate
    return best


def test_readme_block_is_generated_from_the_committed_csvs(data):
    page = (ROOT / "docs" / "paper.md").read_text(encoding="utf-8")  # "The paper, side by side": its page
    assert paper.current_block(page) == readme_block(data)


def test_the_table_quotes_the_csvs_numbers(data):
    block = readme_block(data)
    # Fig. 2: token states among the memory in use, straight from memory_waste.csv
    pow2 = next(r for r in rows("memory_waste") if r["policy"] == "pow2" and r["view"] == "memory in use")
    share = 100 * float(pow2["token_states"])
    assert lab(data, "fig2.pow2").x == pytest.approx(share)
    assert f"| {share:.1f}% | {share / 26.8 - 1:+.1%} (note" in block
    # Fig. 13: the batch of Pow2 on ShareGPT, and vLLM's over Oracle's
    batch = {(r["workload"], r["system"]): float(r["mean_batch_size"]) for r in rows("batch_size")}
    assert lab(data, "fig13.sharegpt.pow2").x == batch["sharegpt", "pow2"]
    expected = batch["sharegpt", "paged"] / batch["sharegpt", "oracle"]
    assert lab(data, "fig13.sharegpt.paged/oracle").x == pytest.approx(expected)
    assert f"| 9.81 | Fig. 13a bar label | {batch['sharegpt', 'pow2']:.2f} |" in block


def curves(table: list[dict], key: str, rate: str = "rate") -> dict[str, list[tuple[float, float]]]:
    """{row[key]: [(rate, normalized latency), ...]} of CSV rows."""
    found: dict[str, list] = {}
    for r in table:
        found.setdefault(r[key], []).append((float(r[rate]), float(r["normalized_latency_s_per_token"])))
    return found


def test_sustained_rates_are_read_off_the_curves_by_hand(data):
    sharegpt = curves([r for r in rows("latency_vs_rate") if r["workload"] == "sharegpt"], "system")
    ratio = sustained_by_hand(sharegpt["paged"]) / sustained_by_hand(sharegpt["oracle"])
    assert lab(data, "fig12.sharegpt.oracle") == Value(pytest.approx(ratio))
    # Alpaca: vLLM's curve never crossed 1 s/token in the figure; the sweep's extra rates (same setup) complete it
    alpaca = curves([r for r in rows("latency_vs_rate") if r["workload"] == "alpaca"], "system")
    sweep = read_sensitivity(FIGURES / "paper_sensitivity.csv")
    extra = curves([r for r in sweep if (r["study"], r["curve"]) == ("rates", "fig12:alpaca:paged")], "curve")
    assert sustained_by_hand(alpaca["paged"]) == max(r for r, _ in alpaca["paged"])  # only a lower bound
    ratio = sustained_by_hand(alpaca["paged"] + extra["fig12:alpaca:paged"]) / sustained_by_hand(alpaca["oracle"])
    assert lab(data, "fig12.alpaca.oracle").x == pytest.approx(ratio)
    chat = curves(rows("chatbot"), "system", rate="request_rate")
    column = {r["system"]: float(r["sustained_rate"]) for r in rows("chatbot")}  # what the figure itself says
    assert {s: sustained_by_hand(chat[s]) for s in column} == column
    assert lab(data, "fig17.oracle").x == pytest.approx(column["paged"] / column["oracle"])


def test_best_block_sizes_and_preemption_modes_by_hand(data):
    alpaca = {
        int(r["block_size"]): float(r["normalized_latency_s_per_token"])
        for r in rows("block_size")
        if r["workload"] == "alpaca"
    }
    good = [b for b, v in alpaca.items() if v <= 1.1 * min(alpaca.values())]
    assert lab(data, "fig18b.alpaca").x == (min(good), max(good))
    latency = {
        (r["preemption"], int(r["block_size"])): float(r["normalized_latency_s_per_token"])
        for r in rows("recompute_vs_swap")
    }
    small = min(latency["swap", b] / latency["recompute", b] for b in (1, 2, 4, 8))
    assert lab(data, "fig19.small").x.startswith(f"swap / recompute {small:.2f}")


@pytest.mark.parametrize(
    "number, value, expected",
    [
        (PaperNumber(2.0, ""), Value(1.5), -0.25),
        (PaperNumber((1.7, 2.7), ""), Value(2.0), 0.0),  # inside a range
        (PaperNumber((1.7, 2.7), ""), Value(1.36), 1.36 / 1.7 - 1),  # below it: from the low end
        (PaperNumber((1.7, 2.7), ""), Value(5.4), 1.0),  # above it: from the high end
        (PaperNumber("comparable", ""), Value("swap / recompute 0.9"), None),  # qualitative: no number
    ],
)
def test_difference_is_lab_over_paper_minus_one(number, value, expected):
    assert difference(number, value) == (None if expected is None else pytest.approx(expected))


def test_every_difference_beyond_ten_percent_has_a_note(data):
    block = readme_block(data)
    table = [line for line in block.splitlines() if line.startswith("| Fig.")]
    assert len(table) == len(ROWS)
    notes = [line for line in block.splitlines() if line[:1].isdigit() and ". **" in line]
    for paper_row, line in zip(ROWS, table):
        value = paper_row.lab(data)
        d = difference(PAPER[paper_row.key], value)
        flagged = (d is not None and abs(d) > 0.10) or value.verdict not in ("", "agrees")
        assert ("(note " in line) == flagged, line
    cited = {int(part.split(")")[0]) for line in table for part in line.split("(note ")[1:]}
    assert cited == set(range(1, len(notes) + 1))  # every note is cited, numbered from 1


def test_a_difference_without_a_note_is_refused(data, monkeypatch):
    bare = [r for r in ROWS if r.key == "fig13.sharegpt.pow2"][0]
    monkeypatch.setattr(paper, "ROWS", (paper.Row(bare.key, bare.figure, bare.quantity, bare.unit, bare.lab),))
    with pytest.raises(RuntimeError, match="no note explains it"):
        paper.table(data)


def test_the_sensitivity_csv_is_the_sweep_the_code_defines():
    text = (FIGURES / "paper_sensitivity.csv").read_text()
    assert text.startswith("# command: python -m sim paper-sensitivity\n")
    committed = read_sensitivity(FIGURES / "paper_sensitivity.csv")
    assert list(committed[0]) == list(COLUMNS)
    expected = []
    for point in points():
        params = {k: v for k, v in point.task.params.items() if k in PARAMS}
        params = {k: ("-".join(map(str, v)) if isinstance(v, tuple) else str(v)) for k, v in params.items()}
        expected.append((point.study, point.curve, params))
    found = [(r["study"], r["curve"], {k: r[k] for k in PARAMS if r[k] != ""}) for r in committed]
    assert found == expected


def test_one_sensitivity_run_reproduces_its_row():
    point = next(p for p in points() if (p.study, p.curve) == ("pool", "fig13:sharegpt:max"))
    committed = next(
        r
        for r in read_sensitivity(FIGURES / "paper_sensitivity.csv")
        if (r["study"], r["curve"]) == ("pool", "fig13:sharegpt:max")
    )
    again = row(point, run_task(point.task))
    for column in ("num_requests", "mean_batch_size", "token_states_of_used", "pow2_over_context"):
        assert str(again[column]) == committed[column], column


# --- the command line --------------------------------------------------------------------------------------------
def sim(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sim", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def test_check_passes_on_the_committed_readme_and_write_rewrites_a_copy(tmp_path):
    assert sim("paper-table", "--check").returncode == 0
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{paper.BEGIN}\nstale\n{paper.END}\nafter\n")
    stale = sim("paper-table", "--check", "--readme", str(readme))
    assert stale.returncode == 1 and "paper-table --write" in stale.stderr
    out = sim("paper-table", "--write", "--readme", str(readme))
    assert out.returncode == 0, out.stderr
    assert sim("paper-table", "--check", "--readme", str(readme)).returncode == 0
    assert readme.read_text().startswith(f"before\n{paper.BEGIN}\n| figure |")


@pytest.mark.parametrize(
    "args, message",
    [
        (["paper-table", "--figures", "nowhere"], "paper_sensitivity.csv: no such file"),
        (["paper-table", "--write", "--check"], "not allowed with argument"),
        (["paper-table", "--write", "--readme", "plain.md"], "has no <!-- paper-table:begin -->"),
        (["paper-sensitivity", "--out", "afolder"], "is a folder"),
        (["paper-sensitivity", "--out", "nodir/x.csv"], "does not exist"),
    ],
)
def test_bad_input_is_one_error_line(args, message, tmp_path):
    (tmp_path / "afolder").mkdir()
    (tmp_path / "plain.md").write_text("no markers here\n")
    (tmp_path / "figures").mkdir()
    out = sim(*args, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("error: ") and message in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert (tmp_path / "plain.md").read_text() == "no markers here\n"  # nothing written
