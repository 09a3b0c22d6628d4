"""`make peer` (tools/peer_vllm.py): its refusals, the README's vLLM numbers recomputed from its committed CSV, and
the README's API table ("Moves to vLLM by changing the import") checked to be what tools/peer/api_table.py makes of
figures/peer_api.csv. The run itself needs vLLM's CPU build and minutes, so it is not part of the tests."""

import csv
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import peer_vllm  # noqa: E402

from sim.figures.readme_numbers import Files, make_block  # noqa: E402

api_checks, api_table = peer_vllm.api_checks, peer_vllm.api_table  # tools/peer/, as make peer imports them


def rows() -> list[dict]:
    with open(ROOT / "figures" / "peer_vllm.csv") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def test_without_vllm_it_says_where_it_looked(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        peer_vllm.main(["--vllm-python", str(tmp_path / "none"), "--out", str(tmp_path / "x.csv")])
    assert info.value.code == 2 and "make peer` builds .venv-vllm" in capsys.readouterr().err


def test_the_committed_run_covers_every_check():
    sections = {r["section"] for r in rows()}
    assert sections == {
        "greedy_equality",
        "beam_search_equality",
        "throughput",
        "cold_start",
        "throughput_ratio",
        "throughput_one_core",
        "cold_start_one_core",
        "throughput_ratio_one_core",
        "block_pool",
    }
    text = (ROOT / "figures" / "peer_vllm.csv").read_text()
    assert "# command: python tools/peer_vllm.py" in text and "vllm 0.32" in text


def test_the_committed_bfloat16_run_reports_speed_and_agreement():
    """`tools/peer_vllm.py --dtype bfloat16` (figures/peer_vllm_bf16.csv, when committed): the speed part in
    bfloat16, and the greedy comparison as agreement rows (counts, never a pass or fail)."""
    path = ROOT / "figures" / peer_vllm.BF16_OUT.removeprefix("figures/")
    if not path.exists():
        pytest.skip("no bfloat16 run committed")
    with open(path) as f:
        table = list(csv.DictReader(line for line in f if not line.startswith("#")))
    assert {r["section"] for r in table} == {
        "greedy_agreement_bf16",
        "throughput_bf16",
        "cold_start_bf16",
        "throughput_ratio_bf16",
        "throughput_one_core_bf16",
        "cold_start_one_core_bf16",
        "throughput_ratio_one_core_bf16",
    }
    agreement = [r for r in table if r["section"] == "greedy_agreement_bf16"]
    assert [r["system"] for r in agreement] == [
        "engine vs vLLM",
        "engine vs HF transformers",
        "vLLM vs HF transformers",
    ]
    assert all(0 <= int(r["value"]) <= 16 and "bfloat16" in r["unit"] for r in agreement)
    assert all(r["note"].endswith("; bfloat16") for r in table if r["section"].startswith("throughput"))
    assert "--dtype bfloat16" in path.read_text()


def test_an_unknown_dtype_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        peer_vllm.main(["--dtype", "float8", "--out", str(tmp_path / "x.csv")])
    assert info.value.code == 2 and "--dtype float8 (allowed: float32, bfloat16, both)" in capsys.readouterr().err


def test_readme_numbers_are_the_committed_peer_run():
    """The README's two tables of this run (sim/figures/readme_numbers.py; the README holds exactly those blocks:
    tests/sim/test_readme_numbers.py) have the CSV's numbers."""
    files = Files(ROOT / "figures")
    speed, checks = make_block("peer", files), make_block("peer-checks", files)
    columns = ("threads", "this engine (output tokens/s)", "vLLM 0.32 CPU", "engine / vLLM")
    table = {(r["section"], r["system"], r["threads"]): r for r in rows()}
    for threads in ("1", "2"):
        ours = float(table["throughput", "engine", threads]["value"])
        theirs = float(table["throughput", "vllm", threads]["value"])
        ratio = float(table["throughput_ratio", "engine / vLLM", threads]["value"])
        row = speed.row(f"throughput.{threads}")
        assert tuple(row[c] for c in columns) == (threads, f"{ours:.1f}", f"{theirs:.1f}", f"{ratio:.2f}")
    ours, theirs = (float(table["throughput_one_core", s, "1"]["value"]) for s in ("engine", "vllm"))
    ratio = float(table["throughput_ratio_one_core", "engine / vLLM", "1"]["value"])
    row = speed.row("throughput_one_core.1")
    assert tuple(row[c] for c in columns) == ("1, both on one core", f"{ours:.1f}", f"{theirs:.1f}", f"{ratio:.2f}")
    equal = table["greedy_equality", "engine vs vLLM", "1"]
    assert checks.row("greedy")["result"].startswith(f"{equal['value']} of 16 prompts")
    beams = table["beam_search_equality", "engine vs vLLM", "1"]
    assert checks.row("beams")["result"].startswith(f"{beams['value']} of 8 cases")
    pool = table["block_pool", "sim.BlockAllocator vs vLLM BlockPool", ""]
    assert checks.row("block_pool")["result"].startswith(f"{pool['value']} of {pool['rounds']} runs")
    cold = {s: float(table["cold_start", s, "1"]["value"]) for s in ("engine", "vllm")}
    assert checks.row("cold_start")["result"] == f"{cold['engine']:.1f} s against {cold['vllm']:.1f} s"


def test_reusing_vllms_api_results_needs_api_only(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        peer_vllm.main(["--reuse-vllm-api", "--api-out", str(tmp_path / "api.csv"), "--out", str(tmp_path / "x.csv")])
    assert info.value.code == 2 and "--reuse-vllm-api goes with --api-only" in capsys.readouterr().err


def test_readme_api_table_is_generated_from_the_committed_csv():
    text = (ROOT / "docs" / "vllm.md").read_text()  # "Measured against vLLM itself": its page
    assert api_table.readme_block(text) == api_table.render(*api_table.read_csv(api_table.CSV))
    assert api_table.main(["--check"]) == 0


def test_the_committed_api_run_covers_every_check_in_order():
    table, comments = api_table.read_csv(api_table.CSV)
    assert [(r["check"], r["what"]) for r in table] == [(name, what) for name, what, _ in api_checks.CHECKS]
    verdicts = {api_table.SAME, api_table.DIFFERS, api_table.FAILS_HERE, api_table.FAILS_VLLM, api_table.FAILS_BOTH}
    assert {r["verdict"] for r in table} <= verdicts
    assert comments["command"].startswith("python tools/peer_vllm.py") and comments["vllm_version"].startswith("vllm ")
    for r in table:  # each verdict is what the recorded results give
        assert api_table.verdict(json.loads(r["vllm"]), json.loads(r["engine"])) == (r["verdict"], r["note"])


@pytest.mark.parametrize(
    "vllm, engine, expected",
    [
        ({"value": {"ids": [1, 2, 3]}}, {"value": {"ids": [1, 2, 3]}}, (api_table.SAME, "")),
        ({"value": {"lp": -1.23456}}, {"value": {"lp": -1.23461}}, (api_table.SAME, "")),  # two float32 programs
        (
            {"value": {"ids": [1, 2, 3]}},
            {"value": {"ids": [1, 5, 3]}},
            (api_table.DIFFERS, "ids[1]: vLLM `2`, here `5`"),
        ),
        (
            {"value": {"type": "str"}},
            {"value": {"type": "int"}},
            (api_table.DIFFERS, 'type: vLLM `"str"`, here `"int"`'),
        ),
        ({"value": {"ids": [1, 2]}}, {"value": {"ids": [1, 2, 3]}}, (api_table.DIFFERS, "ids: vLLM 2 items, here 3")),
        ({"value": {"a": 1}}, {"value": {"a": 1, "b": 2}}, (api_table.DIFFERS, "b: only here has it")),
        ({"value": {"x": True}}, {"value": {"x": 1}}, (api_table.DIFFERS, "x: vLLM `true`, here `1`")),
        ({"value": {}}, {"error": "TypeError: no"}, (api_table.FAILS_HERE, "TypeError: no")),
        ({"error": "KeyError: k"}, {"value": {}}, (api_table.FAILS_VLLM, "KeyError: k")),
    ],
)
def test_verdicts(vllm, engine, expected):
    assert api_table.verdict(vllm, engine) == expected


def test_the_table_escapes_pipes_and_keeps_the_markers(tmp_path):
    row = {"check": "c", "what": "`a | b`", "vllm": "", "engine": "", "verdict": api_table.SAME, "note": "x|y"}
    block = api_table.render([row], {"versions": "v", "date": "2026-01-01T00:00:00"})
    assert "| `a \\| b` | same | x\\|y |" in block and block.startswith("1 of 1 checks give the same result")
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{api_table.BEGIN}\nold\n{api_table.END}\nafter\n")
    csv_path = tmp_path / "api.csv"
    csv_path.write_text(
        "# date: 2026-01-01T00:00:00\n# versions: v\ncheck,what,vllm,engine,verdict,note\nc,`a | b`,,,same,x|y\n"
    )
    assert api_table.update_readme(readme, csv_path) and not api_table.update_readme(readme, csv_path)
    assert readme.read_text() == f"before\n{api_table.BEGIN}\n{block}\n{api_table.END}\nafter\n"
    with pytest.raises(ValueError, match="no <!-- peer-api-table:begin -->"):
        api_table.replace_block("no markers", block)


def test_the_cpu_is_named_with_the_flags_that_pick_kernels():
    text = (
        "processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu sse avx2 fma avx512f avx512_bf16\n"
        "processor\t: 1\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu\n"
    )
    assert peer_vllm.cpu_description(text) == "AMD EPYC 9R14; avx2 fma avx512f avx512_bf16"
    assert peer_vllm.cpu_description("model name\t: Old\nflags\t: sse\n").startswith("Old; none of avx2 fma")


@pytest.mark.parametrize(
    "engine, vllm, flagged",
    [
        ([127.9, 128.5], [129.8, 120.0], True),  # 0.99x at the median with vLLM's rounds 8% apart: noise
        ([205.2, 204.0], [182.4, 183.0], False),  # 1.12x, each side within 0.6%: a difference
        ([100.0, 100.0, 100.0], [100.0, 100.0, 100.0], True),  # equal, no spread: margin 0 is not a difference
    ],
)
def test_a_margin_inside_the_rounds_spread_is_flagged(engine, vllm, flagged):
    row = peer_vllm.ratio_row(engine, vllm)
    assert row["rounds"] == len(engine) and len(row["per_round"].split()) == len(engine)
    assert ("not a measured difference" in row["note"]) == flagged
    import statistics

    assert row["value"] == round(statistics.median(engine) / statistics.median(vllm), 2)
