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

``--sweep`` times a grid of the kernel's launch knobs (``triton_decode.DecodeTuning``: tile, warps, pipeline
stages, split target) on the long-context shapes instead, all variants alternating in one run, and saves
``figures/bench_attention_sweep_gpu.csv``; ``DEFAULT_TUNING`` is chosen from it. ``--plot CSV`` draws
``figures/kernel_bandwidth.png`` from a saved table (no GPU needed; reference.attention.bench_plot).

``python -m reference.attention.bench`` (also ``python -m reference bench-kernels``) needs a CUDA GPU; it
prints a table and writes ``figures/bench_attention_gpu.csv`` and the figure. Without one it says so and exits
0. ``--cpu-smoke`` runs a tiny configuration through the Triton interpreter, only to prove the script works.

NOTE (measurement): the systems compared at one point (decode and copy; identity and shuffled table; the sweep's
variants) are timed alternately, repeat by repeat, so a clock or temperature drift hits them alike. Each timed
repeat starts with the L2 cache flushed (a 256 MiB buffer is overwritten) and replays a CUDA graph of the call
between two CUDA events (see time_alternating: eager Triton launches cost more host time than the flush hides);
the median of the repeats is reported, after warmup runs. ``eager_us`` keeps the eager call's time as well.
"""

from __future__ import annotations

import datetime
import itertools
import math
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from reference.attention import paged_decode_attention
from reference.attention.triton_decode import DEFAULT_TUNING, DecodeTuning, choose_num_splits
from reference.cli_parser import Parser  # one-line usage errors, as in every command line here
from sim.base.outfiles import OutputPathError, check_outputs, write_csv

FIGURES = Path(__file__).resolve().parents[2] / "figures"
DEFAULT_OUT = FIGURES / "bench_attention_gpu.csv"
DEFAULT_SWEEP_OUT = FIGURES / "bench_attention_sweep_gpu.csv"
FIELDS = ["experiment", "batch", "context", "block_size", "block_table", "num_splits", "time_us",
          "bytes_moved", "gbps", "copy_gbps", "fraction_of_copy", "eager_us"]
SWEEP_FIELDS = ["tile", "num_warps", "num_stages", "target_programs", "batch", "context", "num_splits",
                "time_us", "gbps", "copy_gbps", "fraction_of_copy"]
GPU_CONFIG = dict(batches=[1, 4, 16, 64, 256], contexts=[128, 512, 2048, 8192, 32768], block_size=16,
                  paging_batch=32, paging_context=4096, block_sizes=[1, 2, 4, 8, 16, 32, 64, 128, 256],
                  num_heads=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16,  # Llama-3-8B shape
                  pool_gib=4.0, max_kv_gib=20.0, warmup=3,
                  sweep_shapes=[(64, 2048), (256, 2048), (16, 8192), (4, 32768), (256, 8192), (8, 1024)],
                  sweep_grid=dict(tile=[32, 64, 128], num_warps=[4, 8], num_stages=[2, 3],
                                  target_programs=[512, 1024]))
SMOKE_CONFIG = dict(batches=[1, 2], contexts=[16, 40], block_size=4, paging_batch=2, paging_context=24,
                    block_sizes=[1, 8], num_heads=4, num_kv_heads=2, head_dim=16, dtype=torch.float32,
                    pool_gib=1e-4, max_kv_gib=1.0, warmup=0,
                    sweep_shapes=[(2, 40)], sweep_grid=dict(tile=[16, 32], num_warps=[4], num_stages=[2],
                                                            target_programs=[4]))


def time_alternating(fns: list, repeats: int, warmup: int, flush, graphs: bool = True) -> list[float]:
    """Median wall time in seconds of each of ``fns``, timed in turn within every repeat, each call after an L2
    flush: CUDA events around a CUDA-graph replay of the call on a GPU (``graphs``; eager calls otherwise),
    perf_counter on the CPU.

    NOTE: a graph replays the kernels without Python: a Triton launch costs ~90 us of host time (Triton 3.6,
    measured on the H100 with cProfile), more than the L2 flush in front of it takes on the GPU, so eager timings
    add launch gaps to the kernel's time. The CSV keeps both (``time_us`` from graphs, ``eager_us`` eager)."""
    cuda = torch.cuda.is_available()
    for fn in fns:
        for _ in range(warmup):
            fn()
    if cuda and graphs:
        torch.cuda.synchronize()
        captured = []
        for fn in fns:
            if getattr(fn, "eager", False):  # see copy_call
                captured.append(fn)
                continue
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            captured.append(graph.replay)
        fns = captured
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            flush()
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                out.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


class Bench:
    """One KV pool (a flat buffer viewed with any block size) and the experiments over it."""

    def __init__(self, cfg: dict, repeats: int, device: str, tuning: DecodeTuning = DEFAULT_TUNING, seed: int = 0):
        self.cfg, self.repeats, self.device, self.tuning = cfg, repeats, device, tuning
        self.gen = torch.Generator().manual_seed(seed)
        c, elem = cfg, torch.tensor([], dtype=cfg["dtype"]).element_size()
        self.token_bytes = c["num_kv_heads"] * c["head_dim"] * elem  # one token's K (or V) in one layer
        largest = max([b * n for b in c["batches"] for n in c["contexts"] if self.fits(b, n)]
                      + [b * n for b, n in c["sweep_shapes"]] + [c["paging_batch"] * c["paging_context"]])
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

    def decode_call(self, batch: int, context: int, block_size: int, shuffled: bool, tuning: DecodeTuning):
        """A zero-argument function that runs one decode step of ``batch`` sequences of ``context`` tokens."""
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
        return lambda: paged_decode_attention(query, key_cache, value_cache, block_tables, seq_lens, scale,
                                              tuning=tuning)

    def copy_call(self, num_bytes: int):
        """A device-to-device copy of ``num_bytes`` (half from the K pool, half from the V pool)."""
        n = num_bytes // self.key_pool.element_size() // 2
        src_k, src_v = self.key_pool.view(-1)[:n], self.value_pool.view(-1)[:n]
        dst_k, dst_v = self.copy_dst[:n], self.copy_dst[n : 2 * n]

        def copy():
            dst_k.copy_(src_k)
            dst_v.copy_(src_v)

        # NOTE: timed eagerly (two launches; the flush hides them). Captured in a CUDA graph, a copy of 1 GiB and
        # more ran at ~2.4 TB/s instead of ~3.0 on the H100 (a graph's memcpy node takes another path), which
        # would flatter the kernel; the eager copy is the faster yardstick.
        copy.eager = True
        return copy

    def row(self, batch: int, context: int, block_size: int, seconds: float, copy_seconds: float,
            tuning: DecodeTuning) -> dict:
        c = self.cfg
        kv_bytes = 2 * batch * context * self.token_bytes
        q_bytes = batch * c["num_heads"] * c["head_dim"] * self.key_pool.element_size()
        moved = kv_bytes + 2 * q_bytes  # K, V read; queries read, outputs written
        gbps, copy_gbps = moved / seconds / 1e9, 2 * kv_bytes / copy_seconds / 1e9  # a copy reads and writes
        width = -(-context // block_size)
        return dict(batch=batch, context=context, block_size=block_size,
                    num_splits=choose_num_splits(batch, c["num_kv_heads"], width * block_size, tuning),
                    time_us=seconds * 1e6, bytes_moved=moved, gbps=gbps, copy_gbps=copy_gbps,
                    fraction_of_copy=gbps / copy_gbps)

    def run(self) -> list[dict]:
        c, rows, t = self.cfg, [], self.tuning
        for batch, context in itertools.product(c["batches"], c["contexts"]):
            if not self.fits(batch, context):
                print(f"skip decode batch={batch} context={context}: K/V over {c['max_kv_gib']} GiB")
                continue
            decode = self.decode_call(batch, context, c["block_size"], True, t)
            seconds, copy_seconds = time_alternating(
                [decode, self.copy_call(2 * batch * context * self.token_bytes)], self.repeats, c["warmup"],
                self.flush)
            eager = time_alternating([decode], self.repeats, 0, self.flush, graphs=False)[0]
            rows.append(self.show(dict(experiment="decode", block_table="shuffled", eager_us=eager * 1e6,
                                       **self.row(batch, context, c["block_size"], seconds, copy_seconds, t))))
        batch, context = c["paging_batch"], c["paging_context"]
        for block_size in c["block_sizes"]:
            fns = [self.decode_call(batch, context, block_size, shuffled, t) for shuffled in (False, True)]
            fns.append(self.copy_call(2 * batch * context * self.token_bytes))
            identity, shuffled, copy_seconds = time_alternating(fns, self.repeats, c["warmup"], self.flush)
            for table, seconds in (("identity", identity), ("shuffled", shuffled)):
                rows.append(self.show(dict(experiment="paging", block_table=table,
                                           **self.row(batch, context, block_size, seconds, copy_seconds, t))))
        return rows

    def sweep(self) -> list[dict]:
        """Every DecodeTuning of the grid on every sweep shape (shuffled tables, the default block size)."""
        c, rows = self.cfg, []
        grid = c["sweep_grid"]
        tunings = [DecodeTuning(tile=tile, num_warps=w, num_stages=s, target_programs=p)
                   for tile, w, s, p in itertools.product(grid["tile"], grid["num_warps"], grid["num_stages"],
                                                          grid["target_programs"])]
        for batch, context in c["sweep_shapes"]:
            fns = [self.copy_call(2 * batch * context * self.token_bytes)]
            fns += [self.decode_call(batch, context, c["block_size"], True, t) for t in tunings]
            copy_seconds, *seconds = time_alternating(fns, self.repeats, c["warmup"], self.flush)
            for t, s in zip(tunings, seconds):
                row = self.row(batch, context, c["block_size"], s, copy_seconds, t)
                rows.append({k: v for k, v in {**vars(t), **row}.items() if k in SWEEP_FIELDS})
            best = max(rows[-len(tunings):], key=lambda r: r["fraction_of_copy"])
            print(f"sweep batch={batch} context={context}: best {best['fraction_of_copy']:.3f} of copy with "
                  + ", ".join(f"{k}={best[k]}" for k in SWEEP_FIELDS[:4]), flush=True)
        return rows

    def show(self, row: dict) -> dict:
        print("  ".join(f"{k}={row[k]:.3g}" if isinstance(row[k], float) else f"{k}={row[k]}" for k in FIELDS
                        if k in row), flush=True)
        return row


def best_tunings(rows: list[dict]) -> list[tuple[float, float, dict]]:
    """The sweep's variants ranked by the geometric mean of their fraction of copy over the shapes (then by the
    worst shape): ``(geomean, worst, knobs)``, best first."""
    by_knobs: dict[tuple, list[float]] = {}
    for r in rows:
        by_knobs.setdefault(tuple(r[k] for k in SWEEP_FIELDS[:4]), []).append(float(r["fraction_of_copy"]))
    ranked = [(math.exp(statistics.fmean(math.log(f) for f in fracs)), min(fracs), dict(zip(SWEEP_FIELDS[:4], k)))
              for k, fracs in by_knobs.items()]
    return sorted(ranked, key=lambda x: (x[0], x[1]), reverse=True)


def describe_machine(argv: list[str], repeats: int, tuning: DecodeTuning | None) -> list[str]:
    """Comment lines of the CSV: device, clocks, versions, the command."""
    import triton

    lines = [f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
             f"command: {shlex.join(argv)}"]
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        lines.append(f"device: {p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB")
        lines.append(f"clocks: {gpu_clocks()}")
    lines.append(f"versions: torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, "
                 f"python {sys.version.split()[0]}")
    lines.append(f"timing: median of {repeats} repeats, L2 flushed before each; time_us: CUDA events around a "
                 "CUDA-graph replay (kernel time, no Python launch overhead); eager_us: the same call launched from "
                 "Python; systems compared at a point alternate repeat by repeat")
    if tuning is not None:
        lines.append(f"decode tuning: {tuning}")
    return lines


def gpu_clocks() -> str:
    """SM and memory clocks now and at most, from nvidia-smi (measured as found: this script never sets them)."""
    query = "clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"not readable ({type(exc).__name__})"
    return f"SM, memory now / max (MHz): {out}"


def save(rows: list[dict], fields: list[str], path: Path, comments: list[str]) -> None:
    """The rows as CSV (4 significant digits: more would be noise), written whole or not at all."""
    rows = [{k: f"{r[k]:.4g}" if isinstance(r.get(k), float) else r.get(k, "") for k in fields} for r in rows]
    write_csv(path, fields, rows, comments=comments, make_parents=True)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    from reference.attention import bench_plot

    parser = Parser(prog="python -m reference.attention.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny run through the Triton interpreter")
    parser.add_argument("--sweep", action="store_true", help="time a grid of the kernel's launch knobs instead")
    parser.add_argument("--plot", type=Path, metavar="CSV", help="only draw the figure from a saved table")
    parser.add_argument("--repeats", type=int, default=20, help="timed repeats per point (median reported)")
    parser.add_argument("--out", type=Path, default=None, help=f"CSV path (GPU default: {DEFAULT_OUT}, "
                        f"{DEFAULT_SWEEP_OUT} with --sweep)")
    parser.add_argument("--figure", type=Path, default=None, help=f"PNG path (default: {bench_plot.DEFAULT_PNG})")
    args = parser.parse_args(argv)
    argv = ["python", "-m", "reference.attention.bench", *(sys.argv[1:] if argv is None else argv)]
    if not 1 <= args.repeats <= 10_000:
        parser.error(f"--repeats must be from 1 to 10,000, got {args.repeats}")
    if args.plot is not None:
        return bench_plot.main_plot(args.plot, args.figure)
    cuda = torch.cuda.is_available()
    default_out = (DEFAULT_SWEEP_OUT if args.sweep else DEFAULT_OUT) if cuda else None
    out = args.out or default_out
    figure = None if args.sweep or not cuda else args.figure or bench_plot.DEFAULT_PNG
    try:  # before any timing: a folder is created only for the default paths
        check_outputs({"--out": out}, make_parents=args.out is None)
        check_outputs({"--figure": figure}, make_parents=args.figure is None)
    except OutputPathError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if cuda:
        cfg, device = GPU_CONFIG, "cuda"
        print(f"device: {torch.cuda.get_device_name()}")
    elif args.cpu_smoke:
        cfg, device = SMOKE_CONFIG, "cpu"  # timings meaningless: no CSV unless asked
        args.repeats = min(args.repeats, 1)
    else:  # asked for what cannot run here: a refusal, exit 2
        print("error: bench-kernels needs a CUDA GPU (none found; --cpu-smoke checks the script through the Triton "
              "interpreter)", file=sys.stderr)
        return 2
    bench = Bench(cfg, args.repeats, device)
    if args.sweep:
        rows = bench.sweep()
        ranked = best_tunings(rows)
        for geomean, worst, knobs in ranked[:5]:
            print(f"geomean {geomean:.3f}, worst {worst:.3f}: {knobs}")
        if out is not None:
            save(rows, SWEEP_FIELDS, out, describe_machine(argv, args.repeats, None))
        return 0
    rows = bench.run()
    if out is not None:
        save(rows, FIELDS, out, describe_machine(argv, args.repeats, bench.tuning))
        if figure is not None:
            bench_plot.main_plot(out, figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
