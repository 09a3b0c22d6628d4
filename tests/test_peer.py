"""`make peer` (tools/peer_vllm.py): its refusals, and the README's vLLM numbers checked against its committed CSV.
The run itself needs vLLM's CPU build and minutes, so it is not part of the tests."""
import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import peer_vllm  # noqa: E402

README = " ".join((ROOT / "README.md").read_text().split())


def rows() -> list[dict]:
    with open(ROOT / "figures" / "peer_vllm.csv") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def test_without_vllm_it_says_where_it_looked(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        peer_vllm.main(["--vllm-python", str(tmp_path / "none"), "--out", str(tmp_path / "x.csv")])
    assert info.value.code == 2 and "make peer` builds .venv-vllm" in capsys.readouterr().err


def test_the_committed_run_covers_every_check():
    sections = {r["section"] for r in rows()}
    assert sections == {"greedy_equality", "beam_search_equality", "throughput", "cold_start", "throughput_ratio",
                        "block_pool"}
    text = (ROOT / "figures" / "peer_vllm.csv").read_text()
    assert "# command: python tools/peer_vllm.py" in text and "vllm 0.32" in text


def test_readme_quotes_the_committed_peer_run():
    table = {(r["section"], r["system"], r["threads"]): r for r in rows()}
    for threads in ("1", "2"):
        ours = float(table["throughput", "engine", threads]["value"])
        theirs = float(table["throughput", "vllm", threads]["value"])
        ratio = float(table["throughput_ratio", "engine / vLLM", threads]["value"])
        assert f"| {threads} | {ours:.1f} | {theirs:.1f} | {ratio:.2f} |" in README
    equal = table["greedy_equality", "engine vs vLLM", "1"]
    assert f"{equal['value']} of 16 prompts" in README
    beams = table["beam_search_equality", "engine vs vLLM", "1"]
    assert f"**Beam search**: {beams['value']} of 8 cases" in README
    pool = table["block_pool", "sim.BlockAllocator vs vLLM BlockPool", ""]
    assert f"{pool['value']} of {pool['rounds']} runs" in README
    cold = {s: float(table["cold_start", s, "1"]["value"]) for s in ("engine", "vllm")}
    assert f"{cold['engine']:.1f} s against {cold['vllm']:.1f} s" in README
