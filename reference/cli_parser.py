"""The argument parser every command line of `reference` uses: argparse, but a usage error is one line.

`python -m reference` (reference/cli.py), its `bench-gpu` command (reference/bench/bench_gpu.py) and the kernel benchmark
(reference/attention/bench.py) all build their flags on it, so bad input ends the same way everywhere: one line
`error: ...` on stderr and exit status 2, never a usage dump or a traceback (docs/ARCHITECTURE.md, "Bad input").
"""
from __future__ import annotations

import argparse
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}\n")
