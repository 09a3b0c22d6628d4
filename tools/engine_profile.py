"""Where the CPU engine's time goes, step by step, and the most a change outside the matrix products could give.

    python tools/engine_profile.py [--workload bench|long] [--threads N] [--num-requests N] [--out CSV]

The engine serves `python -m reference bench`'s workload (SmolLM2-135M, float32, greedy, every request at t=0, the
same engine settings as the bench's throughput row) once untimed to warm up, then once timed, each step split into:

    gemm_ms        the projections and the LM head (the model's `linear`: oneDNN's prepacked kernel, or F.linear
                   for a prefill of many rows; reference/models/matmul.py)
    attention_ms   the paged attention calls (prefill and decode)
    other_ms       the rest of the forward pass (embedding, norms, RoPE and the K/V store, SwiGLU's activation,
                   the Python between them)
    outside_ms     the rest of the step: the scheduler, the batch's tensors, sampling, the outputs

and GEMM_GFLOPS counts each product's 2 x rows x in x out. The last rows are the totals, this core's float32 GEMM
peak (`torch.mm` of two 2048 x 2048 matrices at the same thread count, best of 3) and the bound.

Why: the engine runs at vLLM's speed on these CPUs (`make peer`, figures/peer_vllm.csv), and both multiply with the
same library (vLLM's CPU build prepacks every linear weight for oneDNN, as reference.models.matmul does). A margin over
vLLM can come only from what is not a matrix product, or from a GEMM faster than oneDNN's. `bound` = wall / gemm is
the most the engine could be sped up if everything else took no time at all; `needed_cut` is the share of the
non-GEMM time that a 1.25x speed-up (issue 28's target over vLLM, taking vLLM at the engine's speed) would have to
remove. NOTE: the timers add about a microsecond per call (~150 calls a step); the split is of wall time, one run.
Writes figures/engine_profile_cpu.csv (or --out) with `# key: value` lines naming the machine, versions and command.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_OUT = "figures/engine_profile_cpu.csv"
COLUMNS = (
    "section",
    "step",
    "prefill_tokens",
    "decodes",
    "wall_ms",
    "gemm_ms",
    "attention_ms",
    "other_ms",
    "outside_ms",
    "gemm_gflops",
    "weights_gbps",
    "decode_kv_gbps",
    "value",
    "note",
)
TARGET = 1.25  # issue 28's float32 target over vLLM at 1 thread


class _Timer:
    """Wraps a callable; adds its wall time to `totals[name]`, and what it read: for a linear (kind "linear") its FLOPs
    and weight bytes, for a decode attention (kind "decode") the K/V bytes of its sequences."""

    def __init__(self, fn, totals: dict, name: str, kind: str | None = None) -> None:
        self.fn, self.totals, self.name, self.kind = fn, totals, name, kind

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        out = self.fn(*args, **kwargs)
        elapsed = time.perf_counter() - start
        self.totals[self.name] += elapsed
        if self.kind == "linear":  # linear(x, weight, ...): x [..., in], weight [out, in]
            x, weight = args[0], args[1]
            self.totals["flop"] += 2 * (x.numel() // x.shape[-1]) * weight.shape[0] * weight.shape[1]
            self.totals["weight_bytes"] += weight.numel() * weight.element_size()
        elif self.kind == "decode":  # (query, key_cache, value_cache, block_tables, seq_lens, ...): no window here
            key_cache, seq_lens = args[1], args[4]
            row = key_cache.shape[2] * key_cache.shape[3] * key_cache.element_size()  # one token's K (or V)
            self.totals["kv_bytes"] += 2 * row * int(seq_lens.sum())
            self.totals["decode_attention"] += elapsed
        return out


def read_gbps(num_bytes: int = 1 << 29, repeats: int = 3) -> float:
    """This core's memory read bandwidth: the sum of a float32 tensor of `num_bytes` (no cache holds it), best of 3."""
    import torch

    x = torch.ones(num_bytes // 4)
    x.sum()
    return num_bytes / min(_timed(x.sum) for _ in range(repeats)) / 1e9


def gemm_peak_gflops(size: int = 2048, repeats: int = 3) -> float:
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * size**3 / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def profile(requests, threads: int, loaded: tuple | None = None) -> list[dict]:
    """One row per step of serving `requests` (after a warm-up run of two), on `loaded` (model, tokenizer; default:
    SmolLM2 in float32, loaded here). The model is left as it was."""
    import torch

    from reference import LLM, SamplingParams
    from reference.bench.bench import whole_workload_blocks
    from reference.models import llama, load_model

    torch.set_num_threads(threads)
    model, tokenizer = loaded if loaded is not None else load_model("smollm2", dtype=torch.float32)[:2]
    blocks = whole_workload_blocks(requests)  # as reference.bench.bench.engine_throughput sizes it

    def serve(reqs, rows: list | None) -> None:
        llm = LLM.from_loaded(model, tokenizer, block_size=16, num_gpu_blocks=blocks)
        torch.set_num_threads(threads)
        for r in reqs:
            llm.add_request(
                r.prompt_token_ids, SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True)
            )
        step = 0
        while llm.has_unfinished_requests():
            for name in totals:
                totals[name] = 0
            start = time.perf_counter()
            llm.step()
            wall = time.perf_counter() - start
            if rows is not None:
                rows.append(_step_row(step, wall, dict(totals)))
            step += 1

    totals = {
        "gemm": 0.0,
        "attention": 0.0,
        "decode_attention": 0.0,
        "forward": 0.0,
        "flop": 0,
        "weight_bytes": 0,
        "kv_bytes": 0,
        "prefill_tokens": 0,
        "decodes": 0,
    }
    saved = (model.linear, model.forward, llama.paged_prefill_attention, llama.paged_decode_attention)
    try:  # timers around the model's product, its attention calls and its forward pass (the executor's call)
        model.linear = _Timer(model.linear, totals, "gemm", "linear")
        llama.paged_prefill_attention = _Timer(llama.paged_prefill_attention, totals, "attention")
        llama.paged_decode_attention = _Timer(llama.paged_decode_attention, totals, "attention", "decode")
        forward = _Timer(saved[1], totals, "forward")

        def counted_forward(input_ids, positions, batch, *args, **kwargs):
            totals["prefill_tokens"] += batch.num_prefill_tokens
            totals["decodes"] += batch.num_tokens - batch.num_prefill_tokens
            return forward(input_ids, positions, batch, *args, **kwargs)

        model.forward = counted_forward
        serve(requests[:2], None)  # warm-up: numba's kernels loaded, oneDNN's primitives created
        rows: list[dict] = []
        serve(requests, rows)
    finally:
        model.linear, llama.paged_prefill_attention, llama.paged_decode_attention = saved[0], saved[2], saved[3]
        del model.forward  # the class's again
    return rows


def _step_row(step: int, wall: float, t: dict) -> dict:
    other = t["forward"] - t["gemm"] - t["attention"]
    return {
        "section": "step",
        "step": step,
        "prefill_tokens": t["prefill_tokens"],
        "decodes": t["decodes"],
        "wall_ms": round(wall * 1e3, 3),
        "gemm_ms": round(t["gemm"] * 1e3, 3),
        "attention_ms": round(t["attention"] * 1e3, 3),
        "other_ms": round(other * 1e3, 3),
        "outside_ms": round((wall - t["forward"]) * 1e3, 3),
        "gemm_gflops": round(t["flop"] / t["gemm"] / 1e9, 1) if t["gemm"] else "",
        "weights_gbps": round(t["weight_bytes"] / t["gemm"] / 1e9, 2) if t["gemm"] else "",
        "decode_kv_gbps": round(t["kv_bytes"] / t["decode_attention"] / 1e9, 2) if t["decode_attention"] else "",
        **{"_" + k: t[k] for k in ("flop", "weight_bytes", "kv_bytes", "decode_attention")},
    }


def _totals(section: str, rows: list[dict], note: str) -> dict:
    """The sums of `rows` (steps) as one row, with their GEMM rate and the bandwidths of what they read."""
    sums = {
        k: sum(r[k] for r in rows)
        for k in (
            "wall_ms",
            "gemm_ms",
            "attention_ms",
            "other_ms",
            "outside_ms",
            "prefill_tokens",
            "decodes",
            "_flop",
            "_weight_bytes",
            "_kv_bytes",
            "_decode_attention",
        )
    }
    gemm_s, attention_s = sums["gemm_ms"] / 1e3, sums["_decode_attention"]
    return {
        "section": section,
        "step": len(rows),
        **{k: round(v, 3) for k, v in sums.items() if k[0] != "_"},
        "gemm_gflops": round(sums["_flop"] / gemm_s / 1e9, 1) if gemm_s else "",
        "weights_gbps": round(sums["_weight_bytes"] / gemm_s / 1e9, 2) if gemm_s else "",
        "decode_kv_gbps": round(sums["_kv_bytes"] / attention_s / 1e9, 2) if attention_s else "",
        "note": note,
    }


def summary(rows: list[dict], peak: float, bandwidth: float) -> list[dict]:
    """The totals over the steps (all, those with prompt tokens, decode-only), this core's GEMM peak and read
    bandwidth, and the bound (module docstring)."""
    total = _totals("total", rows, "sums over the steps")
    out = [total]
    prefill = [r for r in rows if r["prefill_tokens"]]
    decode = [r for r in rows if not r["prefill_tokens"]]
    for section, part, note in (
        ("prefill_steps", prefill, "steps that feed prompt tokens"),
        ("decode_steps", decode, "steps that feed one token a sequence"),
    ):
        if part:
            out.append(_totals(section, part, note))
    wall, gemm = total["wall_ms"], total["gemm_ms"]
    rest = wall - gemm
    needed = (wall - wall / TARGET) / rest if rest > 0 else float("inf")
    out.append(
        {
            "section": "gemm_peak",
            "value": round(peak, 1),
            "note": "GFLOPS: torch.mm 2048 x 2048 float32, best of 3, at the same threads",
        }
    )
    out.append(
        {
            "section": "read_bandwidth",
            "value": round(bandwidth, 2),
            "note": "GB/s: the sum of a 512 MiB float32 "
            "tensor, best of 3, at the same threads (weights_gbps and decode_kv_gbps near it: memory-bound)",
        }
    )
    out.append(
        {
            "section": "bound",
            "value": round(wall / gemm, 3) if gemm else "",
            "note": "wall / gemm: the most "
            "any change outside the matrix products could speed the engine up (all else taking no time)",
        }
    )
    out.append(
        {
            "section": "needed_cut",
            "value": round(needed, 3),
            "note": f"share of the non-GEMM time a {TARGET}x "
            "speed-up would have to remove (more than 1: impossible without a faster GEMM)",
        }
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/engine_profile.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workload",
        default="bench",
        choices=("bench", "long"),
        help="reference/bench/bench.py's workload (default: bench)",
    )
    parser.add_argument("--num-requests", type=int, help="requests (default: the workload's own, 64 or 8)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, 1..64 (default: 1)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"CSV to write (default: {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    if not 1 <= args.threads <= 64:
        parser.error(f"--threads {args.threads}: allowed 1..64")
    if args.num_requests is not None and not 1 <= args.num_requests <= 256:
        parser.error(f"--num-requests {args.num_requests}: allowed 1..256")
    from sim.base.outfiles import check_outputs, write_csv

    try:
        check_outputs({"--out": args.out}, make_parents=args.out == DEFAULT_OUT)
    except ValueError as exc:
        parser.error(str(exc))
    import torch

    from reference.bench.bench import describe_workload, machine_description, workload

    requests = workload(args.workload, args.num_requests, vocab_size=49152)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    rows = profile(requests, args.threads)
    rows += summary(rows, gemm_peak_gflops(), read_gbps())
    for row in rows:
        for key in [k for k in row if k[0] == "_"]:
            del row[key]
    by = {r["section"]: r for r in rows if r["section"] != "step"}
    t = by["total"]
    print(
        f"{t['step']} steps, {t['wall_ms'] / 1e3:.2f} s: GEMMs {t['gemm_ms'] / t['wall_ms']:.1%} "
        f"({t['gemm_gflops']} GFLOPS; peak {by['gemm_peak']['value']}), attention "
        f"{t['attention_ms'] / t['wall_ms']:.1%}, rest of the forward {t['other_ms'] / t['wall_ms']:.1%}, outside "
        f"the forward {t['outside_ms'] / t['wall_ms']:.1%}"
    )
    for name in ("prefill_steps", "decode_steps"):
        if name in by:
            p = by[name]
            print(
                f"{name}: {p['step']} steps, {p['wall_ms'] / 1e3:.2f} s, GEMMs {p['gemm_ms'] / p['wall_ms']:.1%} at "
                f"{p['gemm_gflops']} GFLOPS ({p['weights_gbps']} GB/s of weights), attention "
                f"{p['attention_ms'] / p['wall_ms']:.1%} (decode K/V read at {p['decode_kv_gbps'] or '-'} GB/s)"
            )
    print(f"this core: GEMM peak {by['gemm_peak']['value']} GFLOPS, memory read {by['read_bandwidth']['value']} GB/s")
    print(
        f"bound (wall / gemm): {by['bound']['value']}x; a {TARGET}x speed-up must remove "
        f"{by['needed_cut']['value']:.0%} of the non-GEMM time"
    )
    comments = [
        f"machine: {machine_description()}",
        f"command: {shlex.join(['python', 'tools/engine_profile.py', *(argv if argv is not None else sys.argv[1:])])}",
        f"workload: {describe_workload(args.workload, requests)}; SmolLM2-135M float32",
        f"date: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}",
        f"total_s: {time.perf_counter() - started:.0f}",
    ]
    try:
        write_csv(args.out, COLUMNS, rows, comments=comments, make_parents=args.out == DEFAULT_OUT)
    except OSError as exc:  # an output that passed its checks and still cannot be written (a full disk, /proc)
        print(
            f"python tools/engine_profile.py: error: cannot write {args.out}: {exc.strerror or exc} (nothing was "
            "replaced; the numbers are printed above)",
            file=sys.stderr,
        )
        return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
