"""The table "Moves to vLLM by changing the import": tools/peer/api_checks.py's results from both systems, compared
check by check, saved as figures/peer_api.csv (by tools/peer_vllm.py) and written into docs/vllm.md between two
marker comments. The page's table is generated, never typed: tests/test_peer.py checks that it equals what
`render` makes of the committed CSV.

    python tools/peer/api_table.py            # rewrite docs/vllm.md's table from figures/peer_api.csv
    python tools/peer/api_table.py --check    # exit 1 if docs/vllm.md's table is not the CSV's

Verdicts: "same" (equal results; floats within 1e-3 relative: two float32 programs), "runs, differs" (both run;
the note names the first difference), "fails here" / "fails in vLLM" / "fails in both" (the note has the error).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "figures" / "peer_api.csv"
README = ROOT / "docs" / "vllm.md"  # the page of "Measured against vLLM itself"
COLUMNS = ("check", "what", "vllm", "engine", "verdict", "note")
BEGIN, END = "<!-- peer-api-table:begin -->", "<!-- peer-api-table:end -->"
SAME, DIFFERS = "same", "runs, differs"
FAILS_HERE, FAILS_VLLM, FAILS_BOTH = "fails here", "fails in vLLM", "fails in both"
NOT_IN_VLLM = "not run in vLLM"  # a check newer than the vLLM results reused from an earlier run
TOLERANCE = 1e-3


def close(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if not all(isinstance(x, (int, float)) for x in (a, b)):
        return a == b
    return abs(a - b) <= TOLERANCE * max(1.0, abs(a), abs(b))


def shown(value, width: int = 48) -> str:
    text = json.dumps(round(value, 4) if isinstance(value, float) else value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 3] + "..."


def first_difference(a, b, path: str = "") -> str | None:
    """Where two results first differ, e.g. 'token_ids[3]: vLLM `12`, here `7`'; None if they are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            where = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                return f"{where}: only {'vLLM' if key in a else 'here'} has it"
            found = first_difference(a[key], b[key], where)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        if len(a) != len(b):
            return f"{path or 'result'}: vLLM {len(a)} items, here {len(b)}"
        return None
    if close(a, b):
        return None
    return f"{path or 'result'}: vLLM `{shown(a)}`, here `{shown(b)}`"


def verdict(vllm: dict | None, engine: dict) -> tuple[str, str]:
    """(verdict, note) of one check from both sides' results ({"value": ...} or {"error": "Type: message"})."""
    if vllm is None:
        return NOT_IN_VLLM, ""
    if "error" in vllm and "error" in engine:
        return FAILS_BOTH, f"vLLM: {vllm['error']}; here: {engine['error']}"
    if "error" in engine:
        return FAILS_HERE, engine["error"]
    if "error" in vllm:
        return FAILS_VLLM, vllm["error"]
    found = first_difference(vllm["value"], engine["value"])
    return (SAME, "") if found is None else (DIFFERS, found)


def rows(checks: list[tuple[str, str]], vllm: dict[str, dict], engine: dict[str, dict]) -> list[dict]:
    """One CSV row per check, in the order of `checks` ((name, what) pairs)."""
    missing = {"error": "not run"}
    out = []
    for name, what in checks:
        ours = engine.get(name, missing)
        v, note = verdict(vllm.get(name), ours)
        out.append(
            {
                "check": name,
                "what": what,
                "vllm": cell(vllm.get(name)),
                "engine": cell(ours),
                "verdict": v,
                "note": note,
            }
        )
    return out


def cell(result: dict | None) -> str:
    return "" if result is None else json.dumps(result, ensure_ascii=False, separators=(",", ":"))


def read_csv(path: Path = CSV) -> tuple[list[dict], dict[str, str]]:
    """The rows and the `# key: value` comments of figures/peer_api.csv."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    comments = dict(line[2:].split(": ", 1) for line in lines if line.startswith("# ") and ": " in line)
    return list(csv.DictReader(io.StringIO("\n".join(line for line in lines if not line.startswith("#"))))), comments


def vllm_results(path: Path = CSV) -> dict[str, dict]:
    """vLLM's side of an earlier run, from its CSV: {check: result}."""
    return {r["check"]: json.loads(r["vllm"]) for r in read_csv(path)[0] if r["vllm"]}


def escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(table_rows: list[dict], comments: dict[str, str]) -> str:
    """The README's block between the markers: a count, then one line per check."""
    counts = {
        v: sum(r["verdict"] == v for r in table_rows)
        for v in (SAME, DIFFERS, FAILS_HERE, FAILS_VLLM, FAILS_BOTH, NOT_IN_VLLM)
    }
    words = {
        DIFFERS: ("run but differ", "runs but differs"),
        FAILS_HERE: ("fail here", "fails here"),
        FAILS_VLLM: ("fail in vLLM", "fails in vLLM"),
        FAILS_BOTH: ("fail in both", "fails in both"),
        NOT_IN_VLLM: ("were not run in vLLM", "was not run in vLLM"),
    }
    tally = "".join(
        f", {counts[v]} {w[counts[v] == 1]}" for v, w in words.items() if counts[v] or v in (DIFFERS, FAILS_HERE)
    )
    lines = [
        f"{counts[SAME]} of {len(table_rows)} checks give the same result in both{tally} "
        f"({comments.get('versions', '')}; `figures/peer_api.csv`, {comments.get('date', '')[:10]}):",
        "",
        "| vLLM's code, as its documentation writes it | with `reference` | note |",
        "|---|---|---|",
    ]
    lines += [f"| {escape(r['what'])} | {r['verdict']} | {escape(r['note'])} |" for r in table_rows]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """`text` with what stands between BEGIN and END replaced by `block`. ValueError without both markers."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{README.relative_to(ROOT)} has no {BEGIN} ... {END} block")
    return f"{text[: start + len(BEGIN)]}\n{block}\n{text[end:]}"


def readme_block(text: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{README.relative_to(ROOT)} has no {BEGIN} ... {END} block")
    return text[start + len(BEGIN) : end].strip("\n")


def update_readme(readme: Path = README, path: Path = CSV) -> bool:
    """Rewrite README's table from the CSV; True if it changed."""
    from sim.base.outfiles import write_text

    text = readme.read_text(encoding="utf-8")
    new = replace_block(text, render(*read_csv(path)))
    if new != text:
        write_text(readme, new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--csv", type=Path, default=CSV)
    p.add_argument("--readme", type=Path, default=README)
    p.add_argument("--check", action="store_true", help="only compare: exit 1 if the README's table is not the CSV's")
    args = p.parse_args(argv)
    if args.check:
        same = readme_block(args.readme.read_text(encoding="utf-8")) == render(*read_csv(args.csv))
        print("README table is the CSV's" if same else f"README table differs from {args.csv}: run without --check")
        return 0 if same else 1
    print(f"{'rewrote' if update_readme(args.readme, args.csv) else 'unchanged:'} {args.readme}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
