"""Benchmark of the paged decode kernel: how close does it get to the memory bandwidth, and what does paging cost?

Decode attention is memory bound: each step reads every cached K/V byte of every sequence once. So the
honest yardstick is not FLOP/s but bandwidth, compared with the best the same GPU does in the same run:
a device-to-device copy (``dst.copy_(src)``). Two experiments (vLLM's paper makes the same point with
its kernel microbenchmark, Kwon et al., SOSP 2023, Section 7.1 / Figure 18):

1. ``decode``: batch 1..256 x context 128..32k, block size 16, shuffled block tables drawn from a KV pool
   much larger than the L2 cache. Reports ``fraction_of_copy`` = decode bandwidth / copy bandwidth, where
   decode bandwidth = bytes the kernel must read (K, V, queries) and write (outputs) / time, and copy
   bandwidth = (bytes read + bytes written) / time for a copy of the same number of K/V bytes.
2. ``paging``: one batch, block sizes 1..256, the same kernel with an identity block table (each sequence's
   blocks adjacent and in order, as in a contiguous cache) and with a shuffled one: the price of paging.

``python -m reference.attention.bench`` needs a CUDA GPU; it prints a table and writes
``figures/bench_attention_gpu.csv``. Without one it says so and exits 0. ``--cpu-smoke`` runs a tiny
configuration through the Triton interpreter, only to prove the script works (timings meaningless).

NOTE (measurement): each timed repeat starts with the L2 cache flushed (a 256 MiB buffer is overwritten),
is timed with CUDA events, and the median of the repeats is reported, after warmup runs.
"""

from __future__ import annotations

import csv
import statistics
import sys
import time
from pathlib import Path

import torch

from reference.attention import paged_decode_attention
from reference.attention.triton_decode import choose_num_splits
from sim.outfiles import OutputPathError, atomic_write, check_outputs

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "figures" / "bench_attention_gpu.csv"
FIELDS = ["experiment", "batch", "context", "block_size", "block_table", "num_splits", "time_us",
          "bytes_moved", "gbps", "copy_gbps", "fraction_of_copy"]
GPU_CONFIG = dict(batches=[1, 4, 16, 64, 256], contexts=[128, 512, 2048, 8192, 32768], block_size=16,
                  paging_batch=32, paging_context=4096, block_sizes=[1, 2, 4, 8, 16, 32, 64, 128, 256],
                  num_heads=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16,  # Llama-3-8B shape
                  pool_gib=4.0, max_kv_gib=20.0, warmup=3)
SMOKE_CONFIG = dict(batches=[1, 2], contexts=[16, 40], block_size=4, paging_batch=2, paging_context=24,
                    block_sizes=[1, 8], num_heads=4, num_kv_heads=2, head_dim=16, dtype=torch.float32,
                    pool_gib=1e-4, max_kv_gib=1.0, warmup=0)


def time_median(fn, repeats: int, warmup: int, flush) -> float:
    """Median wall time of ``fn()`` in seconds (CUDA events on a GPU, perf_counter on the CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        flush()
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


class Bench:
    """One KV pool (a flat buffer viewed with any block size) and the two experiments over it."""

    def __init__(self, cfg: dict, repeats: int, device: str, seed: int = 0):
        self.cfg, self.repeats, self.device = cfg, repeats, device
        self.gen = torch.Generator().manual_seed(seed)
        c, elem = cfg, torch.tensor([], dtype=cfg["dtype"]).element_size()
        self.token_bytes = c["num_kv_heads"] * c["head_dim"] * elem  # one token's K (or V) in one layer
        largest = max([b * n for b in c["batches"] for n in c["contexts"] if self.fits(b, n)]
                      + [c["paging_batch"] * c["paging_context"]])
        pool_tokens = max(int(c["pool_gib"] * 2**30 / self.token_bytes), 2 * largest + 256)
        pool_tokens = -(-pool_tokens // 256) * 256  # divisible by every block size we try
        shape = (pool_tokens, c["num_kv_heads"], c["head_dim"])
        self.key_pool = torch.randn(shape, dtype=c["dtype"], device=device)  # values never matter
        self.value_pool = torch.randn(shape, dtype=c["dtype"], device=device)
        self.copy_dst = torch.empty(2 * largest * self.token_bytes // elem, dtype=c["dtype"], device=device)
        self.scratch = torch.empty(2**26 if device == "cuda" else 1, dtype=torch.float32, device=device)

    def fits(self, batch: int, context: int) -> bool:
        return 2 * batch * context * self.token_bytes <= self.cfg["max_kv_gib"] * 2**30

    def flush(self) -> None:
        self.scratch.zero_()  # 256 MiB on a GPU: evicts K/V left in L2 by the previous repeat

    def time_decode(self, batch: int, context: int, block_size: int, shuffled: bool) -> dict:
        c = self.cfg
        key_cache = self.key_pool.view(-1, block_size, c["num_kv_heads"], c["head_dim"])
        value_cache = self.value_pool.view(-1, block_size, c["num_kv_heads"], c["head_dim"])
        width = -(-context // block_size)
        if shuffled:  # distinct physical blocks scattered over the whole pool
            ids = torch.randperm(key_cache.shape[0], generator=self.gen)[: batch * width]
        else:  # identity: sequence i owns blocks i*width .. (i+1)*width - 1, in order
            ids = torch.arange(batch * width)
        block_tables = ids.reshape(batch, width).to(torch.int32).to(self.device)
        seq_lens = torch.full((batch,), context, dtype=torch.int32, device=self.device)
        query = torch.randn(batch, c["num_heads"], c["head_dim"], generator=self.gen).to(c["dtype"]).to(self.device)
        scale = c["head_dim"] ** -0.5
        seconds = time_median(
            lambda: paged_decode_attention(query, key_cache, value_cache, block_tables, seq_lens, scale),
            self.repeats, c["warmup"], self.flush)
        kv_bytes = 2 * batch * context * self.token_bytes
        moved = kv_bytes + 2 * query.numel() * query.element_size()  # K, V read; queries read, outputs written
        return dict(batch=batch, context=context, block_size=block_size,
                    block_table="shuffled" if shuffled else "identity",
                    num_splits=choose_num_splits(batch, c["num_kv_heads"], width * block_size),
                    time_us=seconds * 1e6, bytes_moved=moved, gbps=moved / seconds / 1e9, kv_bytes=kv_bytes)

    def copy_gbps(self, num_bytes: int) -> float:
        """Bandwidth of a device-to-device copy of ``num_bytes``: (read + written) bytes / time."""
        n = num_bytes // self.key_pool.element_size() // 2  # half from the K pool, half from the V pool
        src_k, src_v = self.key_pool.view(-1)[:n], self.value_pool.view(-1)[:n]
        dst_k, dst_v = self.copy_dst[:n], self.copy_dst[n : 2 * n]

        def copy():
            dst_k.copy_(src_k)
            dst_v.copy_(src_v)

        seconds = time_median(copy, self.repeats, self.cfg["warmup"], self.flush)
        return 2 * 2 * n * self.key_pool.element_size() / seconds / 1e9

    def run(self) -> list[dict]:
        c, rows = self.cfg, []
        for batch in c["batches"]:
            for context in c["contexts"]:
                if not self.fits(batch, context):
                    print(f"skip decode batch={batch} context={context}: K/V over {c['max_kv_gib']} GiB")
                    continue
                rows.append(self.with_copy("decode", self.time_decode(batch, context, c["block_size"], True)))
        for block_size in c["block_sizes"]:
            for shuffled in (False, True):
                row = self.time_decode(c["paging_batch"], c["paging_context"], block_size, shuffled)
                rows.append(self.with_copy("paging", row))
        return rows

    def with_copy(self, experiment: str, row: dict) -> dict:
        copy = self.copy_gbps(row.pop("kv_bytes"))
        row.update(experiment=experiment, copy_gbps=copy, fraction_of_copy=row["gbps"] / copy)
        print("  ".join(f"{k}={row[k]:.3g}" if isinstance(row[k], float) else f"{k}={row[k]}" for k in FIELDS),
              flush=True)
        return row


def write_csv(rows: list[dict], path: Path) -> None:
    """The rows as CSV, written whole or not at all (sim.outfiles); missing folders are created."""
    with atomic_write(path, newline="", make_parents=True) as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for row in rows:  # 4 significant digits: more would be noise
            writer.writerow({k: f"{v:.4g}" if isinstance(v, float) else v for k, v in row.items()})
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    from reference.cli import _Parser  # one-line usage errors, as in every command line here

    parser = _Parser(prog="python -m reference.attention.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny run through the Triton interpreter")
    parser.add_argument("--repeats", type=int, default=20, help="timed repeats per point (median reported)")
    parser.add_argument("--out", type=Path, default=None, help=f"CSV path (GPU default: {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats} (allowed: 1, 2, ...)")
    default = DEFAULT_OUT if torch.cuda.is_available() else None  # the CSV written when --out is not given
    try:  # before any timing: a folder is created only for the default path
        check_outputs({"--out": args.out or default}, make_parents=args.out is None)
    except OutputPathError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if torch.cuda.is_available():
        cfg, device, out = GPU_CONFIG, "cuda", args.out or DEFAULT_OUT
        print(f"device: {torch.cuda.get_device_name()}")
    elif args.cpu_smoke:
        cfg, device, out = SMOKE_CONFIG, "cpu", args.out  # timings meaningless: no CSV unless asked
        args.repeats = min(args.repeats, 1)
    else:
        print("bench_attention: this benchmark needs a CUDA GPU (none found); "
              "--cpu-smoke checks the script through the Triton interpreter")
        return 0
    rows = Bench(cfg, args.repeats, device).run()
    if out is not None:
        write_csv(rows, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
