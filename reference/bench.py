"""CPU benchmark of the reference engine: continuous batching over a paged KV cache vs static batching.

Two measurements, side by side in ONE run (these machines are noisy: numbers taken in different runs do not
compare), printed as a table and saved as CSV with the machine and the exact command line:

1. Throughput (the paper's Fig. 12 question, at toy scale): useful output tokens/s of this engine (iteration-level
   scheduling, Orca/vLLM) vs HF transformers `generate` with static padded batches (request-level scheduling,
   the FasterTransformer baseline), same SmolLM2 weights, same requests, greedy, ignore EOS. A static batch is
   left-padded to its longest prompt and runs until its longest request is done
   (min_new_tokens = max_new_tokens = the batch's longest output); only each request's own output counts.
2. Concurrency (the paper's Fig. 2 / 13 question): how many requests run at once in a fixed KV budget with
   paged blocks vs the Orca baselines' contiguous reservations (max, pow2, oracle), from
   `LLM.stats.max_concurrent_requests` on the same workload, all requests arriving at once.

NOTE: both systems run with torch.set_num_threads(1), so that the two runs are comparable on a 2-core machine
shared with other processes (make peer measures this engine at 1 and 2 threads against vLLM).
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import time
from pathlib import Path

import numpy as np

from sim.outfiles import check_outputs, write_csv
from sim.request import Request
from sim.workload import generate_requests

DEFAULT_OUT = "figures/bench_engine_cpu.csv"
CONCURRENCY_POLICIES = ("paged", "max", "pow2", "oracle")
MAX_MODEL_LEN = 2048  # what the `max` baseline reserves in the concurrency run: OPT's context, as in the paper
CSV_COLUMNS = ("section", "system", "num_requests", "output_tokens", "wall_s", "tokens_per_s",
               "max_concurrent_requests", "num_preemptions", "note")  # fmt: skip
FIRST_TOKEN_ID = 100  # synthetic prompts avoid SmolLM2's special tokens (ids < 17)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="16 short requests (a smoke run, ~1 min), not 64")
    p.add_argument("--num-requests", type=int, help="requests in the workload (default: 64; 16 with --quick)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"CSV to write (default: {DEFAULT_OUT})")
    p.add_argument("--hf-batch-size", type=int, default=16,
                   help="static batch size of the HF transformers baseline (default: 16)")
    p.add_argument("--kv-blocks", type=int,
                   help="KV pool (blocks of 16 tokens) of the concurrency comparison (default: 256; 128 with --quick)")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload and prompt ids (default: 0)")


def bench_workload(num_requests: int, *, quick: bool, seed: int, vocab_size: int) -> list[Request]:
    """ShareGPT-shaped requests (sim.workload's log-normal fit), scaled down to fit a CPU.

    Modelling approximation: each ShareGPT length is divided (prompt by 4, output by 8; twice that with --quick)
    and clipped to [8, 128] prompt and [4, 64] output tokens ([8, 32] and [4, 16] with --quick): the heavy tail
    and the spread survive, the absolute lengths do not. Prompt ids are uniform random (seeded) over the vocabulary.
    """
    scale, (p_hi, o_hi) = (2, (32, 16)) if quick else (1, (128, 64))
    rng = np.random.default_rng([seed, 0x5EED])
    out = []
    for r in generate_requests("sharegpt", num_requests, arrival="offline", seed=seed):
        prompt = int(np.clip(round(r.prompt_len / (4 * scale)), 8, p_hi))
        output = int(np.clip(round(r.output_len / (8 * scale)), 4, o_hi))
        ids = rng.integers(FIRST_TOKEN_ID, vocab_size, size=prompt).tolist()
        out.append(Request(r.request_id, 0.0, prompt, output, prompt_token_ids=ids))
    return out


def _sync() -> None:
    """Wait for queued GPU work (nothing to wait for on the CPU), so that a wall clock measures it."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_engine(llm, requests: list[Request]) -> tuple[float, object]:
    """Serve every request (all at once, greedy, exact output lengths); wall seconds and the engine's stats."""
    from reference import SamplingParams

    _sync()
    started = time.perf_counter()
    for r in requests:
        llm.add_request(r.prompt_token_ids, SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True))
    while llm.has_unfinished_requests():
        llm.step()
    _sync()
    return time.perf_counter() - started, llm.stats


def engine_throughput(requests: list[Request]) -> dict:
    from reference import LLM
    from reference.models import load_model

    # A pool that holds every request at once (no preemption): the throughput comparison is about batching.
    blocks = sum(-(-r.total_len // 16) for r in requests) + 16
    loaded = load_model("smollm2")
    time_engine(LLM.from_loaded(*loaded, block_size=16, num_gpu_blocks=blocks), requests[:2])  # warm-up, untimed
    wall, stats = time_engine(LLM.from_loaded(*loaded, block_size=16, num_gpu_blocks=blocks), requests)
    return result_row("throughput", "engine (continuous batching, paged KV)", requests, wall,
                      stats.max_concurrent_requests, stats.num_preemptions, f"{blocks} blocks of 16 tokens")  # fmt: skip


def hf_throughput(requests: list[Request], batch_size: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from reference.models import smollm2_checkpoint_dir

    os.environ["HF_HUB_OFFLINE"] = "1"
    model = AutoModelForCausalLM.from_pretrained(smollm2_checkpoint_dir(), dtype=torch.float32,
                                                 local_files_only=True).eval()  # fmt: skip
    pad = model.generation_config.pad_token_id
    wall = time_hf_batches(model, requests, batch_size, pad if pad is not None else 0, warmup=2)
    return result_row("throughput", f"HF transformers generate (static batches of {batch_size})", requests, wall,
                      min(batch_size, len(requests)), 0, "left padding; a batch runs to its longest output")  # fmt: skip


def time_hf_batches(model, requests: list[Request], batch_size: int, pad: int, warmup: int) -> float:
    """Wall seconds of HF `generate` over the requests in static batches, in arrival order (FCFS), after an untimed
    warm-up batch of the first `warmup` requests. A batch is left-padded (every prompt ends at the last column)
    and runs until its longest output (min_new_tokens = max_new_tokens)."""
    import torch

    def run_batch(batch: list[Request]) -> None:
        width, steps = max(r.prompt_len for r in batch), max(r.output_len for r in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):
            ids[i, width - r.prompt_len:] = torch.tensor(r.prompt_token_ids)
            mask[i, width - r.prompt_len:] = 1
        with torch.inference_mode():
            model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device), do_sample=False,
                           max_new_tokens=steps, min_new_tokens=steps, pad_token_id=pad)  # fmt: skip

    run_batch(requests[:warmup])
    _sync()
    started = time.perf_counter()
    for i in range(0, len(requests), batch_size):
        run_batch(requests[i:i + batch_size])
    _sync()
    return time.perf_counter() - started


def concurrency(requests: list[Request], num_blocks: int) -> list[dict]:
    """Max concurrent requests per policy in one KV pool of `num_blocks` blocks of 16 tokens.

    The steps run on a tiny random Llama (reference.models.TINY_CONFIG) with a 2048-token context, OPT's, as
    the paper's `max` baseline reserves: which requests run together depends only on the lengths and the
    scheduler (ignore_eos, max_tokens = the true output length), not on the weights, and the tiny model runs
    the many batch-1 steps of the contiguous policies in seconds. Prompt ids are folded into its vocabulary.
    """
    from reference import LLM
    from reference.models import random_model

    model = random_model(max_position_embeddings=MAX_MODEL_LEN)
    vocab = model.config.vocab_size
    folded = [Request(r.request_id, 0.0, r.prompt_len, r.output_len, prompt_token_ids=[t % vocab for t in
              r.prompt_token_ids]) for r in requests]  # fmt: skip
    rows = []
    for policy in CONCURRENCY_POLICIES:
        llm = LLM.from_loaded(model, policy=policy, block_size=16, num_gpu_blocks=num_blocks,
                              max_model_len=MAX_MODEL_LEN)  # fmt: skip
        wall, stats = time_engine(llm, folded)
        note = f"{num_blocks} blocks x 16 tokens; tiny random Llama, max_model_len {MAX_MODEL_LEN}"
        rows.append(result_row("concurrency", policy, requests, wall, stats.max_concurrent_requests,
                               stats.num_preemptions, note))  # fmt: skip
        print(f"  concurrency {policy}: {stats.max_concurrent_requests} requests at most", flush=True)
    return rows


def result_row(section, system, requests, wall, concurrent, preemptions, note) -> dict:
    """One row of the results table (CSV_COLUMNS): `requests` served in `wall` seconds by `system`."""
    tokens = sum(r.output_len for r in requests)
    return {"section": section, "system": system, "num_requests": len(requests), "output_tokens": tokens,
            "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2), "max_concurrent_requests": concurrent,
            "num_preemptions": preemptions, "note": note}  # fmt: skip


def machine_description() -> str:
    import torch
    import transformers

    cpu = platform.processor() or "unknown cpu"
    if Path("/proc/cpuinfo").is_file():
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]  # fmt: skip
        cpu = names[0] if names else cpu
    return (f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
            f"python {platform.python_version()}, torch {torch.__version__} ({torch.get_num_threads()} thread), "
            f"transformers {transformers.__version__}")


def _print_table(rows: list[dict]) -> None:
    print(f"{'section':<12} {'system':<48} {'reqs':>5} {'out tok':>8} {'wall s':>8} {'tok/s':>8} "
          f"{'max conc':>8} {'preempt':>8}")
    for r in rows:
        print(f"{r['section']:<12} {r['system']:<48} {r['num_requests']:>5} {r['output_tokens']:>8} "
              f"{r['wall_s']:>8.2f} {r['tokens_per_s']:>8.1f} {r['max_concurrent_requests']:>8} "
              f"{r['num_preemptions']:>8}")


def check_args(args: argparse.Namespace) -> None:
    """ValueError (one line, with the allowed range) for a bad flag or an --out that could not be written, before
    any work starts (sim.outfiles.check_outputs; a missing folder is created only for the default path)."""
    from sim.limits import MAX_POOL_BLOCKS, MAX_SEED

    # A benchmark's workload must fit in memory and in a run someone waits for: 100,000 requests is already hours
    # on a CPU; a batch or a pool past these sizes would not fit in this machine's memory as float32 K/V anyway.
    limits = {"num_requests": 100_000, "hf_batch_size": 4096, "kv_blocks": MAX_POOL_BLOCKS}
    for name, high in limits.items():
        value = getattr(args, name)
        if value is not None and not 1 <= value <= high:
            raise ValueError(f"--{name.replace('_', '-')} {value} (allowed: an integer from 1 to {high:,})")
    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"--seed {args.seed} (allowed: an integer from 0 to {MAX_SEED:,})")
    check_outputs({"--out": args.out}, make_parents=args.out == DEFAULT_OUT)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """The `python -m reference bench` command (flags checked by check_args first)."""
    import torch

    started, load_before = time.perf_counter(), os.getloadavg()[0]
    torch.set_num_threads(1)  # see the module docstring
    from reference.models.loader import read_config, smollm2_checkpoint_dir

    vocab = read_config(smollm2_checkpoint_dir()).vocab_size
    count = args.num_requests or (16 if args.quick else 64)
    requests = bench_workload(count, quick=args.quick, seed=args.seed, vocab_size=vocab)
    engine = engine_throughput(requests)
    print(f"  engine: {engine['tokens_per_s']:.1f} output tokens/s", flush=True)
    hf = hf_throughput(requests, args.hf_batch_size)
    print(f"  HF static batches: {hf['tokens_per_s']:.1f} output tokens/s", flush=True)
    rows = [engine, hf] + concurrency(requests, args.kv_blocks or (128 if args.quick else 256))
    prompts, outputs = [r.prompt_len for r in requests], [r.output_len for r in requests]
    header = {
        "machine": machine_description(),
        "command": shlex.join(argv),
        "threads": "torch.set_num_threads(1) for both systems",
        "workload": f"{len(requests)} ShareGPT-shaped requests at t=0 (scaled down, see reference/bench.py): "
                    f"prompt {min(prompts)}-{max(prompts)} (mean {np.mean(prompts):.1f}), "
                    f"output {min(outputs)}-{max(outputs)} (mean {np.mean(outputs):.1f}) tokens, greedy, ignore EOS",
        "load_average": f"{load_before:.2f} at start, {os.getloadavg()[0]:.2f} at end (1 min; other processes "
                        "share these cores)",
        "total_s": f"{time.perf_counter() - started:.1f}",
    }  # fmt: skip
    _report(rows, header, Path(args.out))
    return 0


def _report(rows: list[dict], header: dict[str, str], out: Path) -> None:
    _print_table(rows)
    tput = {r["system"]: r["tokens_per_s"] for r in rows if r["section"] == "throughput"}
    engine, hf = tput.values()
    conc = {r["system"]: r["max_concurrent_requests"] for r in rows if r["section"] == "concurrency"}
    print(f"throughput: engine / HF static = {engine / hf:.2f}x")
    print("concurrency: " + ", ".join(f"paged / {p} = {conc['paged'] / max(conc[p], 1):.2f}x"
                                      for p in CONCURRENCY_POLICIES[1:]))  # fmt: skip
    for key, value in header.items():
        print(f"{key}: {value}")
    # whole or not at all; the folder is there unless --out is the default (check_args)
    write_csv(out, CSV_COLUMNS, rows, comments=[f"{key}: {value}" for key, value in header.items()],
              make_parents=True)
    print(f"wrote {out} (the whole bench took {header['total_s']} s)")
