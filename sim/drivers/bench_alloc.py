"""Allocator speed: operations per second of the block allocator and of every KV manager policy.

    python -m sim bench-alloc [--ops N] [--seed S] [--csv PATH]

Benchmarks (each runs N operations of a workload drawn from a seeded numpy Generator, so the same seed
times the same calls):

    blocks          BlockAllocator(4096 blocks of 16): allocate 1-8 blocks or free a held allocation
    paged           PagedKVManager over 4096 blocks of 16 (65,536 token slots): continuous batching,
                    i.e. admit a request when it fits, else grow a running sequence by one token, and
                    free a sequence at its final length (or when it cannot grow)
    <policy>        the same batching workload on the contiguous baselines (max, pow2, oracle) over the
                    same 65,536 slots, with the buddy and the first_fit slot allocators

An "operation" is one call: allocate / free, or allocate_slots (admitting a prompt, or one more token) / free
(the can_allocate_slots check before an admission is timed but not counted). The mix of calls differs by policy: under `max` only 32
sequences fit, so most admission checks fail; read ops/s as the speed of the whole workload, not of
one call. Benchmark only: tests never assert on these numbers. Writes a CSV (default figures/bench_alloc.csv) with a machine description.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from ..base.outfiles import OutputPathError, check_outputs
from ..base.outfiles import write_csv as write_csv_file
from ..kv import NewSequence, make_kv_manager
from ..kv.blocks import BlockAllocator

NUM_BLOCKS = 4096
BLOCK_SIZE = 16
MAX_SEQ_LEN = 2048  # OPT's context length, what the `max` policy reserves
MAX_RUNNING = 64  # sequences running at once in the batching workload
DEFAULT_CSV = "figures/bench_alloc.csv"
COLUMNS = ("benchmark", "policy", "allocator", "ops", "seconds", "ops_per_s", "machine")


def machine() -> str:
    return f"{platform.platform()}; Python {platform.python_version()}; {os.cpu_count()} CPUs"


def bench_blocks(num_ops: int, rng: np.random.Generator) -> tuple[int, float]:
    """Allocate 1-8 blocks (60%) or free a random held allocation (40%; always when the pool is short)."""
    sizes = rng.integers(1, 9, num_ops).tolist()
    coins = rng.random(num_ops).tolist()
    picks = rng.random(num_ops).tolist()
    alloc, held = BlockAllocator(NUM_BLOCKS, BLOCK_SIZE), []
    start = time.perf_counter()
    for size, coin, pick in zip(sizes, coins, picks):
        blocks = alloc.allocate(size) if coin < 0.6 or not held else None
        if blocks is not None:
            held.append(blocks)
            continue
        i = int(pick * len(held))
        held[i], held[-1] = held[-1], held[i]  # swap-remove: O(1)
        alloc.free(held.pop())
    return num_ops, time.perf_counter() - start


def bench_manager(make: Callable, num_ops: int, rng: np.random.Generator) -> tuple[int, float]:
    """Continuous batching: admit when the next request fits, else one token for a running sequence."""
    # Requests shaped roughly like ShareGPT's (prompts and outputs of tens to hundreds of tokens).
    prompts = rng.integers(16, 512, num_ops).tolist()
    outputs = rng.integers(16, 512, num_ops).tolist()
    picks = rng.random(num_ops).tolist()
    kv, running, next_req = make(), [], 0
    start = time.perf_counter()
    for pick in picks:
        prompt_len, final_len = prompts[next_req], prompts[next_req] + outputs[next_req]
        new = [NewSequence(prompt_len, final_len)] if len(running) < MAX_RUNNING else None
        if new is not None and kv.can_allocate_slots([next_req], [prompt_len], new):
            kv.allocate_slots([next_req], [prompt_len], new)
            running.append((next_req, final_len))
            next_req += 1
            continue
        i = int(pick * len(running))
        seq_id, final_len = running[i]
        if kv.num_tokens(seq_id) < final_len and kv.allocate_slots([seq_id], [1]) is not None:
            continue
        running[i] = running[-1]  # finished (or cannot grow: preempted by recompute) -> free it
        running.pop()
        kv.free(seq_id)
    return num_ops, time.perf_counter() - start


def bench(num_ops: int, seed: int) -> list[dict]:
    rows = []

    def record(benchmark: str, policy: str, allocator: str, result: tuple[int, float]) -> None:
        ops, seconds = result
        row = {"benchmark": benchmark, "policy": policy, "allocator": allocator, "ops": ops}
        rows.append({**row, "seconds": round(seconds, 4), "ops_per_s": round(ops / seconds), "machine": machine()})

    num_slots = NUM_BLOCKS * BLOCK_SIZE
    record("blocks", "", "block", bench_blocks(num_ops, np.random.default_rng(seed)))
    paged = lambda: make_kv_manager("paged", num_slots, block_size=BLOCK_SIZE)  # noqa: E731
    record("kv_cycle", "paged", "block", bench_manager(paged, num_ops, np.random.default_rng(seed)))
    try:
        import sim.kv.contiguous  # noqa: F401  (the baselines may be absent from a trimmed checkout)
    except ImportError:
        print("note: sim.kv.contiguous not found; skipping the contiguous policies")
        return rows
    for policy in ("max", "pow2", "oracle"):
        for allocator in ("buddy", "first_fit"):
            make = lambda p=policy, a=allocator: make_kv_manager(  # noqa: E731
                p, num_slots, block_size=1, allocator=a, max_seq_len=MAX_SEQ_LEN
            )
            record("kv_cycle", policy, allocator, bench_manager(make, num_ops, np.random.default_rng(seed)))
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    """The rows as CSV, written whole or not at all; missing folders are created."""
    write_csv_file(path, COLUMNS, rows, make_parents=True)


def format_table(rows: list[dict]) -> str:
    shown = ("benchmark", "policy", "allocator", "ops", "seconds", "ops_per_s")
    widths = [max(len(name), *(len(str(r[name])) for r in rows)) for name in shown]
    lines = ["  ".join(name.ljust(w) for name, w in zip(shown, widths))]
    lines += ["  ".join(str(r[name]).ljust(w) for name, w in zip(shown, widths)) for r in rows]
    lines.append(f"machine: {rows[0]['machine']}")
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    """Bad flags: one line on stderr and exit 2, no usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m sim bench-alloc", description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200_000, help="operations per benchmark (default: 200000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the workload generator (default: 0)")
    parser.add_argument("--csv", default=DEFAULT_CSV, metavar="PATH",
                        help=f"where to write the results (default: {DEFAULT_CSV})")
    args = parser.parse_args(argv)
    from ..base.limits import MAX_COUNT, MAX_SEED

    if not 1 <= args.ops <= MAX_COUNT:
        print(f"error: --ops must be >= 1, got {args.ops} (allowed: an integer from 1 to {MAX_COUNT:,})",
              file=sys.stderr)
        return 2
    if not 0 <= args.seed <= MAX_SEED:
        print(f"error: --seed: got {args.seed} (allowed: an integer from 0 to {MAX_SEED:,})", file=sys.stderr)
        return 2
    try:  # before the benchmark: a folder is created only for the default path
        check_outputs({"--csv": args.csv}, make_parents=args.csv == DEFAULT_CSV)
    except OutputPathError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = bench(args.ops, args.seed)
    print(format_table(rows))  # first: a disk that fails the write below does not lose the numbers
    try:
        write_csv(rows, Path(args.csv))
    except OSError as exc:  # the disk filled up during the run: any earlier file is unchanged
        print(f"error: --csv {args.csv}: {exc.strerror} (allowed: a writable file path)", file=sys.stderr)
        return 2
    print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
