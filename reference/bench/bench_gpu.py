"""GPU benchmark of the reference engine: SmolLM2's shape with random weights, against HF transformers on the GPU.

The embedded SmolLM2 checkpoint (98 MB as GGUF, 538 MB converted) cannot travel to a lent GPU machine, so this
runs a model of the same configuration (``SMOLLM2_CONFIG``: 30 layers, 9 query heads over 3 KV heads, head_dim 64)
with seeded random weights, built as a HF ``LlamaForCausalLM`` and saved as a checkpoint folder that the engine
loads with its own loader. Weights: N(0, 1) embeddings (tied), N(0, 1/fan_in) projections, norms 1 + 0.1 N(0, 1),
so that logits spread (std ~20) and greedy decoding has no near-ties that mere summation order could flip.

Two measurements, side by side in ONE run, printed and saved as CSV with the device, versions and command:

1. Greedy equality: ``--equality-prompts`` prompts of 8..1000 random token ids, 32 new tokens each, the engine
   (Triton kernels, paged KV, chunked prefill) vs HF ``generate`` (batch 1, SDPA) on the same weights; in float32
   (the kernels' dots in IEEE float32, so the sequences must be equal) and in bfloat16 (reported: 16-bit
   rounding in two different programs may flip a late token; the count of equal sequences and the mean length of
   the common prefix are saved).
2. Throughput in bfloat16 on the bench workload of ``python -m reference bench`` (ShareGPT-shaped lengths, prompts
   8-128 and outputs 4-64 tokens, ignore EOS) scaled up to ``--num-requests`` (256): useful output tokens/s of the
   engine (all requests at t=0, continuous batching) vs HF ``generate`` in static left-padded batches of
   ``--hf-batch-size`` (16, as the CPU bench) and in one batch of every request (HF's best case: one padded batch,
   but every request runs to the longest output).

``python -m reference bench-gpu`` writes ``figures/bench_engine_gpu.csv``. Without CUDA it says so and exits 0;
``--cpu-smoke`` runs a two-layer model of the same shape on the CPU only to prove the script works.
"""
from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from reference.bench.bench import bench_workload, result_row, time_engine, time_hf_batches, whole_workload_blocks
from reference.cli_parser import Parser
from sim.base.outfiles import check_outputs, write_csv

DEFAULT_OUT = "figures/bench_engine_gpu.csv"
CSV_COLUMNS = ("section", "system", "dtype", "num_requests", "output_tokens", "wall_s", "tokens_per_s",
               "max_concurrent_requests", "num_preemptions", "note")
# SmolLM2-135M-Instruct's configuration (the converted checkpoint's config.json; a CPU test checks these values).
SMOLLM2_CONFIG = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1,
                      eos_token_id=2, pad_token_id=2)
EQUALITY_NEW_TOKENS = 32


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-requests", type=int, default=256, help="requests in the throughput workload (default 256)")
    p.add_argument("--hf-batch-size", type=int, default=16, help="static batch size of the HF baseline (default 16)")
    p.add_argument("--equality-prompts", type=int, default=16, help="prompts of the greedy comparison (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, prompts and workload (default 0)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"CSV to write (default: {DEFAULT_OUT})")
    p.add_argument("--cpu-smoke", action="store_true", help="a 2-layer model on the CPU, only to test the script")


def check_args(args: argparse.Namespace) -> None:
    """ValueError (one line, with the allowed range) before any work; --out checked as every output is."""
    from sim.base.limits import MAX_SEED

    for name, high in {"num_requests": 100_000, "hf_batch_size": 4096, "equality_prompts": 1000}.items():
        value = getattr(args, name)
        if not 1 <= value <= high:
            raise ValueError(f"--{name.replace('_', '-')} {value} (allowed: an integer from 1 to {high:,})")
    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"--seed {args.seed} (allowed: an integer from 0 to {MAX_SEED:,})")
    check_outputs({"--out": args.out}, make_parents=args.out == DEFAULT_OUT)


def save_random_checkpoint(folder: Path, seed: int, num_layers: int) -> None:
    """A HF LlamaForCausalLM of SmolLM2's configuration with spread random weights (module docstring), saved."""
    import torch
    import transformers

    config = transformers.LlamaConfig(**{**SMOLLM2_CONFIG, "num_hidden_layers": num_layers})
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 if "embed" in name else p.shape[1] ** -0.5)
            else:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))  # Llama has no biases: every 1-D weight is a norm
    model.save_pretrained(folder)


def load_hf(folder: Path, dtype, device: str):
    import transformers

    return transformers.LlamaForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True).to(device).eval()


def random_prompts(count: int, seed: int, vocab: int, longest: int = 1000) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng([seed, 0xE0])
    lengths = np.unique(np.geomspace(8, longest, count).round().astype(int)).tolist()
    lengths += rng.integers(8, longest, size=count - len(lengths)).tolist()
    return [rng.integers(100, vocab, size=n).tolist() for n in lengths]


def engine_greedy(llm, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from reference import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]


def hf_greedy(model, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    import torch

    out = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids], device=model.device)
            y = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                               max_new_tokens=max_tokens, min_new_tokens=max_tokens, pad_token_id=0)
            out.append(y[0, len(ids):].tolist())
    return out


def equality_row(dtype_name: str, ours: list[list[int]], theirs: list[list[int]]) -> dict:
    equal = sum(a == b for a, b in zip(ours, theirs))
    prefix = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(ours, theirs)]
    print(f"  greedy {dtype_name}: {equal} of {len(ours)} sequences equal to HF's "
          f"(mean common prefix {sum(prefix) / len(prefix):.1f} of {len(ours[0])} tokens)", flush=True)
    return {"section": "greedy_equality", "system": "engine vs HF generate (batch 1)", "dtype": dtype_name,
            "num_requests": len(ours), "output_tokens": sum(map(len, ours)), "wall_s": "", "tokens_per_s": "",
            "max_concurrent_requests": "", "num_preemptions": "",
            "note": f"{equal} of {len(ours)} sequences equal; mean common prefix "
                    f"{sum(prefix) / len(prefix):.1f} of {len(ours[0])}"}


def machine(device: str) -> str:
    import platform

    import torch
    import transformers
    import triton

    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or 'unknown'})"
    return (f"{name}; torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, "
            f"transformers {transformers.__version__}, python {platform.python_version()}")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """The `python -m reference bench-gpu` command (flags checked by check_args first)."""
    import torch

    from reference import LLM

    if not torch.cuda.is_available() and not args.cpu_smoke:  # asked for what cannot run here: a refusal, exit 2
        print("error: bench-gpu needs a CUDA GPU (none found; --cpu-smoke checks the script on the CPU)", file=sys.stderr)
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    smoke = args.cpu_smoke and device == "cpu"
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        folder = Path(tmp)
        save_random_checkpoint(folder, args.seed, num_layers=2 if smoke else SMOLLM2_CONFIG["num_hidden_layers"])
        vocab = SMOLLM2_CONFIG["vocab_size"]
        prompts = random_prompts(args.equality_prompts, args.seed, vocab, longest=64 if smoke else 1000)
        new_tokens = 4 if smoke else EQUALITY_NEW_TOKENS
        for dtype in (torch.float32, torch.bfloat16):
            name = str(dtype).removeprefix("torch.")
            llm = LLM(str(folder), device=device, dtype=dtype, num_gpu_blocks=4096, block_size=16)
            ours = engine_greedy(llm, prompts, new_tokens)
            del llm
            hf = load_hf(folder, dtype, device)
            rows.append(equality_row(name, ours, hf_greedy(hf, prompts, new_tokens)))
            del hf
        requests = bench_workload(args.num_requests, quick=smoke, seed=args.seed, vocab_size=vocab)
        blocks = whole_workload_blocks(requests)
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        name = str(dtype).removeprefix("torch.")
        llm_args = dict(device=device, dtype=dtype, num_gpu_blocks=blocks, block_size=16)
        # Warm-up: the whole workload once, untimed. Triton compiles a kernel again for each new specialization of
        # its integer arguments (a batch size divisible by 16, say): a shorter warm-up left compilations in the
        # timed run, which then measured the compiler, not the engine.
        time_engine(LLM(str(folder), **llm_args), requests)
        wall, stats = time_engine(LLM(str(folder), **llm_args), requests)
        rows.append({**result_row("throughput", "engine (continuous batching, paged KV, Triton)", requests, wall,
                                  stats.max_concurrent_requests, stats.num_preemptions, f"{blocks} blocks of 16"),
                     "dtype": name})
        engine_tps = rows[-1]["tokens_per_s"]
        print(f"  engine: {engine_tps:.1f} output tokens/s", flush=True)
        hf = load_hf(folder, dtype, device)
        for batch_size in sorted({args.hf_batch_size, len(requests)}):
            wall = time_hf_batches(hf, requests, batch_size, pad=0, warmup=batch_size)
            rows.append({**result_row("throughput", f"HF transformers generate (static batches of {batch_size})",
                                      requests, wall, min(batch_size, len(requests)), 0,
                                      "left padding; a batch runs to its longest output"), "dtype": name})
            print(f"  HF, batches of {batch_size}: {rows[-1]['tokens_per_s']:.1f} output tokens/s", flush=True)
    for r in rows:
        if r["system"].startswith("HF"):
            print(f"engine / {r['system']} = {engine_tps / r['tokens_per_s']:.2f}x")
    prompts_len, outputs = [r.prompt_len for r in requests], [r.output_len for r in requests]
    comments = [f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
                f"machine: {machine(device)}", f"command: {shlex.join(argv)}",
                f"model: SmolLM2-135M configuration, random weights (seed {args.seed}; see reference/bench/bench_gpu.py)",
                f"workload: {len(requests)} ShareGPT-shaped requests at t=0 (reference/bench/bench.py): prompt "
                f"{min(prompts_len)}-{max(prompts_len)}, output {min(outputs)}-{max(outputs)} tokens, greedy, "
                "ignore EOS",
                f"total_s: {time.perf_counter() - started:.1f}"]
    for line in comments:
        print(line)
    write_csv(args.out, CSV_COLUMNS, rows, comments=comments, make_parents=True)
    print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m reference bench-gpu", description=__doc__.split("\n")[0])
    add_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    try:
        check_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run(args, ["python", "-m", "reference", "bench-gpu", *argv])
