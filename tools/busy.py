"""Run a command with every core kept busy beside it: a machine shared with other work, made on purpose.

    .venv/bin/python tools/busy.py [--hogs N] -- COMMAND [ARGS ...]

Starts N processes (default: one per core) that spin a busy loop, runs COMMAND, stops them, and exits with
COMMAND's status, printing how long it took. `make test-busy` runs the whole suite this way: no test may fail
because the machine is busy (time limits follow the machine; timing lives in the benchmarks).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from contextlib import contextmanager

HOG = "while True:\n    pass\n"


@contextmanager
def hogs(n: int):
    """n busy-loop processes for the duration of the block, stopped (and reaped) whatever happens in it."""
    procs = [subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.DEVNULL) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1, help="busy processes (default: one per core)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (usage: tools/busy.py [--hogs N] -- COMMAND ...)")
    if not 0 <= args.hogs <= 256:
        parser.error(f"--hogs must be from 0 to 256, got {args.hogs}")
    start = time.monotonic()
    with hogs(args.hogs):
        try:
            status = subprocess.run(command).returncode
        except FileNotFoundError:
            parser.error(f"no such command: {command[0]}")
        except KeyboardInterrupt:
            status = 130
    print(
        f"busy.py: {' '.join(command)} exited {status} after {time.monotonic() - start:.0f} s with {args.hogs} busy "
        f"process{'es' * (args.hogs != 1)} beside it",
        file=sys.stderr,
    )
    return status


if __name__ == "__main__":
    raise SystemExit(main())
