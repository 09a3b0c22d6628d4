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

NOTE: both systems run with torch.set_num_threads(1) (--threads sets another count, for both), so that the two runs
are comparable on a 2-core machine shared with other processes (make peer measures this engine at 1 and 2 threads
against vLLM). A run at another count writes its own CSV (_2threads before .csv for 2).

``--dtype bfloat16`` (vLLM's CPU default where the CPU has bfloat16 instructions) runs the throughput comparison with
both systems in bfloat16, the engine in float32 beside them (the same run: the bfloat16 / float32 ratio), and
reports how far the two bfloat16 programs agree instead of the concurrency runs (which depend on lengths only):

3. Greedy agreement, engine vs HF in bfloat16: on the timed workload (every request's tokens from both timed runs)
   and on the 16 prompts of `make peer` (PEER_RAW, PEER_QUESTIONS; 32 new tokens, ignore EOS, HF at batch 1): how
   many token sequences are identical, and the mean share of each sequence's tokens before its first difference.
   In float32 the two agree token for token (tests/reference/test_engine.py); in bfloat16 each program rounds every
   product and sum to 8 bits of mantissa at its own places (HF's SDPA and RMSNorm, the engine's paged kernels), so
   a near-tie between two tokens can flip and the sequences part from there: the numbers are reported, not
   asserted. Both systems are asked to ignore EOS the same way: HF runs with no EOS token at all (neither a stop
   nor suppressed), the engine with ignore_eos.

It writes figures/bench_engine_cpu_bf16.csv (BF16_COLUMNS), with the same commented header.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from sim.base.outfiles import check_outputs, write_csv
from sim.base.request import Request
from sim.workloads.workload import generate_requests

DEFAULT_OUT = "figures/bench_engine_cpu.csv"
DTYPES = ("float32", "bfloat16")  # --dtype: the engine's and HF's
DEFAULT_OUTS = {"float32": DEFAULT_OUT, "bfloat16": "figures/bench_engine_cpu_bf16.csv"}
CONCURRENCY_POLICIES = ("paged", "max", "pow2", "oracle")
MAX_MODEL_LEN = 2048  # what the `max` baseline reserves in the concurrency run: OPT's context, as in the paper
CSV_COLUMNS = ("section", "system", "num_requests", "output_tokens", "wall_s", "tokens_per_s",
               "max_concurrent_requests", "num_preemptions", "note")
FIRST_TOKEN_ID = 100  # synthetic prompts avoid SmolLM2's special tokens (ids < 17)
BF16_COLUMNS = ("section", "system", "dtype", "num_requests", "output_tokens", "wall_s", "tokens_per_s",
                "max_concurrent_requests", "num_preemptions", "identical_sequences", "matched_prefix_share",
                "note")
# The greedy prompts of `make peer` (tools/peer_vllm.py): raw texts, and questions in SmolLM2's chat template.
PEER_RAW = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away,",
            "The three primary colours are", "import numpy as np\n", "Water boils at", "The paged attention algorithm",
            "In 1969, the first"]
PEER_QUESTIONS = ["What is 2+2?", "Name a planet.", "Write a haiku about rain.", "What is a KV cache?",
                  "Translate 'hello' to French.", "Give one tip for sleep.", "What is Python?", "Count to five."]
PEER_NEW_TOKENS = 32
# --workload: "bench" (ShareGPT-shaped, short: bench_workload) or "long" (long prompts: long_workload), and the long
# one's inclusive length ranges and default request count (one run of it took ~50 s for the engine at 1 thread).
WORKLOADS = ("bench", "long")
LONG_PROMPT, LONG_OUTPUT = (512, 2048), (64, 256)
LONG_REQUESTS = 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default="bench", help="bench (default: ShareGPT-shaped, prompts 8-128 tokens) or "
                   f"long (prompts {LONG_PROMPT[0]:,}-{LONG_PROMPT[1]:,}, outputs {LONG_OUTPUT[0]}-{LONG_OUTPUT[1]} "
                   "tokens; throughput only, no concurrency runs; its CSV ends in _long)")
    p.add_argument("--quick", action="store_true", help="16 short requests (a smoke run, ~1 min), not 64")
    p.add_argument("--num-requests", type=int, help=f"requests in the workload (default: 64; 16 with --quick; "
                   f"{LONG_REQUESTS} with --workload long)")
    p.add_argument("--out", help=f"CSV to write (default: {DEFAULT_OUT}; {DEFAULT_OUTS['bfloat16']} with --dtype "
                   "bfloat16; with --workload long, _long after _cpu)")
    p.add_argument("--dtype", default="float32", help="the engine's and HF's dtype: float32 (default) or bfloat16 "
                   "(also their greedy agreement; no concurrency runs)")
    p.add_argument("--hf-batch-size", type=int, default=16,
                   help="static batch size of the HF transformers baseline (default: 16)")
    p.add_argument("--kv-blocks", type=int,
                   help="KV pool (blocks of 16 tokens) of the concurrency comparison (default: 256; 128 with --quick)")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload and prompt ids (default: 0)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of both systems (default: 1; the CSV of "
                   "another count ends in _Nthreads)")


def bench_workload(num_requests: int, *, quick: bool, seed: int, vocab_size: int) -> list[Request]:
    """ShareGPT-shaped requests (sim.workloads.workload's log-normal fit), scaled down to fit a CPU.

    Modelling approximation: each ShareGPT length is divided (prompt by 4, output by 8; twice that with --quick)
    and clipped to [8, 128] prompt and [4, 64] output tokens ([8, 32] and [4, 16] with --quick): the heavy tail
    and the spread survive, the absolute lengths do not. Prompt ids are uniform random (seeded) over the vocabulary.
    """
    scale, (p_hi, o_hi) = (2, (32, 16)) if quick else (1, (128, 64))
    lengths = [(int(np.clip(round(r.prompt_len / (4 * scale)), 8, p_hi)),
                int(np.clip(round(r.output_len / (8 * scale)), 4, o_hi)))
               for r in generate_requests("sharegpt", num_requests, arrival="offline", seed=seed)]
    return _with_prompt_ids(lengths, seed=seed, vocab_size=vocab_size)


def long_workload(num_requests: int, *, seed: int, vocab_size: int) -> list[Request]:
    """Long prompts, the workload where attention over the context and the prefill dominate (--workload long):
    prompt lengths uniform in LONG_PROMPT and output lengths uniform in LONG_OUTPUT (inclusive, seeded), prompt ids
    drawn as bench_workload draws them."""
    rng = np.random.default_rng([seed, 0x1046])
    prompts = rng.integers(LONG_PROMPT[0], LONG_PROMPT[1] + 1, size=num_requests)
    outputs = rng.integers(LONG_OUTPUT[0], LONG_OUTPUT[1] + 1, size=num_requests)
    return _with_prompt_ids([(int(p), int(o)) for p, o in zip(prompts, outputs)], seed=seed, vocab_size=vocab_size)


def workload(name: str, num_requests: int | None = None, *, quick: bool = False, seed: int = 0,
             vocab_size: int) -> list[Request]:
    """The named workload (WORKLOADS) with its default request count unless `num_requests` is given."""
    if name not in WORKLOADS:
        raise ValueError(f"--workload {name} (allowed: {', '.join(WORKLOADS)})")
    if name == "long":
        return long_workload(num_requests or LONG_REQUESTS, seed=seed, vocab_size=vocab_size)
    return bench_workload(num_requests or (16 if quick else 64), quick=quick, seed=seed, vocab_size=vocab_size)


def _with_prompt_ids(lengths: list[tuple[int, int]], *, seed: int, vocab_size: int) -> list[Request]:
    """Requests 0, 1, ... of these (prompt, output) lengths, all at t=0, each prompt's ids uniform random over
    [FIRST_TOKEN_ID, vocab_size), drawn in request order from one generator seeded by `seed`."""
    rng = np.random.default_rng([seed, 0x5EED])
    return [Request(i, 0.0, prompt, output, prompt_token_ids=rng.integers(FIRST_TOKEN_ID, vocab_size,
                                                                          size=prompt).tolist())
            for i, (prompt, output) in enumerate(lengths)]


def describe_workload(name: str, requests: list[Request]) -> str:
    """The CSV header's `workload:` line: what the requests are, with their length ranges and means."""
    prompts, outputs = [r.prompt_len for r in requests], [r.output_len for r in requests]
    shape = ("ShareGPT-shaped requests at t=0 (scaled down, see reference/bench/bench.py)" if name == "bench" else
             f"long-prompt requests at t=0 (--workload long: prompt and output lengths uniform in {LONG_PROMPT[0]:,}-"
             f"{LONG_PROMPT[1]:,} and {LONG_OUTPUT[0]}-{LONG_OUTPUT[1]})")
    return (f"{len(requests)} {shape}: prompt {min(prompts)}-{max(prompts)} (mean {np.mean(prompts):.1f}), "
            f"output {min(outputs)}-{max(outputs)} (mean {np.mean(outputs):.1f}) tokens, greedy, ignore EOS")


def _sync() -> None:
    """Wait for queued GPU work (nothing to wait for on the CPU), so that a wall clock measures it."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_engine(llm, requests: list[Request], outputs: dict[str, list[int]] | None = None) -> tuple[float, object]:
    """Serve every request (all at once, greedy, exact output lengths); wall seconds and the engine's stats.
    `outputs`, when given, receives each request's output token ids by its request_id (the workload's own ids)."""
    from reference import SamplingParams

    _sync()
    started = time.perf_counter()
    for r in requests:
        llm.add_request(r.prompt_token_ids, SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True),
                        request_id=None if outputs is None else str(r.request_id))
    while llm.has_unfinished_requests():
        finished = [o for o in llm.step() if o.finished]
        if outputs is not None:
            outputs.update((o.request_id, list(o.outputs[0].token_ids)) for o in finished)
    _sync()
    return time.perf_counter() - started, llm.stats


def whole_workload_blocks(requests: list[Request], block_size: int = 16) -> int:
    """A KV pool (blocks of `block_size` tokens) that holds every request at once, with 16 blocks to spare: no
    preemption, so a throughput comparison is about batching."""
    return sum(-(-r.total_len // block_size) for r in requests) + 16


def engine_throughput(requests: list[Request], dtype: str = "float32",
                      outputs: dict[str, list[int]] | None = None) -> dict:
    """The engine's row, SmolLM2 in `dtype` (see time_engine for `outputs`); a 16-bit run's note also names the
    attention backend and the projection path the engine picked."""
    import torch

    from reference import LLM
    from reference.models import load_model

    blocks = whole_workload_blocks(requests)
    threads = torch.get_num_threads()  # the run's (--threads): an LLM takes one thread unless OMP_NUM_THREADS says

    def engine():
        llm = LLM.from_loaded(*loaded, block_size=16, num_gpu_blocks=blocks)
        torch.set_num_threads(threads)
        return llm

    loaded = load_model("smollm2", dtype=_torch_dtype(dtype))
    time_engine(engine(), requests[:2])  # warm-up, untimed
    llm = engine()
    wall, stats = time_engine(llm, requests, outputs)
    note = f"{blocks} blocks of 16 tokens" + (f"; backend {llm.backend}, matmul {llm.model.matmul}" if dtype !=
                                              "float32" else "")
    return result_row("throughput", "engine (continuous batching, paged KV)", requests, wall,
                      stats.max_concurrent_requests, stats.num_preemptions, note)


def _torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def load_hf(dtype: str = "float32"):
    """HF transformers' own model of the embedded SmolLM2 checkpoint (the folder the engine loads), in `dtype`."""
    from transformers import AutoModelForCausalLM

    from reference.models import smollm2_checkpoint_dir

    os.environ["HF_HUB_OFFLINE"] = "1"
    return AutoModelForCausalLM.from_pretrained(smollm2_checkpoint_dir(), dtype=_torch_dtype(dtype),
                                                local_files_only=True).eval()


def hf_throughput(requests: list[Request], batch_size: int, dtype: str = "float32",
                  outputs: dict[str, list[int]] | None = None) -> dict:
    """HF's row. With `outputs` (the bfloat16 run), each request's output token ids by request_id, and HF runs
    without EOS (as the engine's ignore_eos) instead of with min_new_tokens (which suppresses EOS)."""
    model = load_hf(dtype)
    pad = model.generation_config.pad_token_id
    wall = time_hf_batches(model, requests, batch_size, pad if pad is not None else 0, warmup=2, outputs=outputs)
    return result_row("throughput", f"HF transformers generate (static batches of {batch_size})", requests, wall,
                      min(batch_size, len(requests)), 0, "left padding; a batch runs to its longest output")


def no_eos_config(model, **settings):
    """A copy of the model's generation config with `settings` and without EOS: `generate` neither stops at EOS nor
    suppresses it, as the engine's ignore_eos (min_new_tokens would instead forbid EOS until then: another greedy
    choice). NOTE: an empty list, not None: transformers takes None as "not set" and falls back to the model's EOS."""
    import copy

    config = copy.deepcopy(model.generation_config)
    config.update(eos_token_id=[], **settings)
    return config


def time_hf_batches(model, requests: list[Request], batch_size: int, pad: int, warmup: int,
                    outputs: dict[str, list[int]] | None = None) -> float:
    """Wall seconds of HF `generate` over the requests in static batches, in arrival order (FCFS), after an untimed
    warm-up batch of the first `warmup` requests. A batch is left-padded (every prompt ends at the last column)
    and runs until its longest output (min_new_tokens = max_new_tokens). With `outputs`: each request's first
    output_len new tokens by request_id, and no EOS instead of min_new_tokens (no_eos_config)."""
    import torch

    def run_batch(batch: list[Request], keep: dict | None = None) -> None:
        width, steps = max(r.prompt_len for r in batch), max(r.output_len for r in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):
            ids[i, width - r.prompt_len:] = torch.tensor(r.prompt_token_ids)
            mask[i, width - r.prompt_len:] = 1
        settings = dict(do_sample=False, max_new_tokens=steps, pad_token_id=pad)
        until = dict(min_new_tokens=steps, **settings) if outputs is None else dict(
            generation_config=no_eos_config(model, **settings))
        with torch.inference_mode():
            out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device), **until)
        if keep is not None:
            keep.update((str(r.request_id), out[i, width:width + r.output_len].tolist()) for i, r in enumerate(batch))

    run_batch(requests[:warmup])
    _sync()
    started = time.perf_counter()
    for i in range(0, len(requests), batch_size):
        run_batch(requests[i:i + batch_size], outputs)
    _sync()
    return time.perf_counter() - started


class Agreement(NamedTuple):
    """How far two systems' greedy token sequences for the same prompts agree."""

    identical: int  # sequences equal token for token
    total: int
    mean_prefix_share: float  # mean over sequences of (tokens before the first difference) / length; 1.0 if equal
    first_difference: list[int | None]  # per sequence: the first differing position, None where equal

    def describe(self) -> str:
        return (f"{self.identical} of {self.total} sequences identical; mean share of tokens before the first "
                f"difference {self.mean_prefix_share:.3f}")


def greedy_agreement(ours: list[list[int]], theirs: list[list[int]]) -> Agreement:
    """Compare two systems' outputs for the same prompts, sequence by sequence. A sequence that is a prefix of the
    other (one stopped early) differs at the shorter one's end."""
    if len(ours) != len(theirs) or not ours:
        raise ValueError(f"expected the same number (>= 1) of sequences from both, got {len(ours)} and {len(theirs)}")
    first = []
    for a, b in zip(ours, theirs):
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        first.append(None if a == b else same)
    shares = [1.0 if f is None else f / max(len(a), len(b)) for f, a, b in zip(first, ours, theirs)]
    return Agreement(first.count(None), len(first), statistics.fmean(shares), first)


def peer_prompt_ids(tokenizer) -> list[list[int]]:
    """The 16 greedy prompts of `make peer` as token ids: PEER_RAW tokenized, PEER_QUESTIONS in the chat template."""
    ids = [list(tokenizer(text).input_ids) for text in PEER_RAW]
    return ids + [list(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                     tokenize=True, return_dict=True)["input_ids"])
                  for q in PEER_QUESTIONS]


def hf_greedy(model, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """HF `generate`, one prompt at a time (no padding), greedy, exactly `max_tokens` new tokens with EOS ignored
    (no_eos_config): the output token ids."""
    import torch

    config, out = no_eos_config(model, do_sample=False, max_new_tokens=max_tokens, pad_token_id=0), []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids], device=model.device)
            y = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=config)
            out.append(y[0, len(ids):].tolist())
    return out


def engine_greedy(llm, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """The engine's greedy output token ids for each prompt (ignore_eos, exactly `max_tokens` new tokens)."""
    from reference import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]


def peer_prompts_agreement(dtype: str = "bfloat16") -> Agreement:
    """Engine vs HF transformers, both in `dtype`, on the 16 prompts of `make peer` (PEER_NEW_TOKENS new tokens,
    ignore EOS, HF at batch 1, the engine all at once with its defaults)."""
    from reference import LLM

    llm = LLM("smollm2", dtype=dtype, max_model_len=2048, seed=0)
    prompts = peer_prompt_ids(llm.tokenizer)
    ours = engine_greedy(llm, prompts, PEER_NEW_TOKENS)
    del llm
    return greedy_agreement(ours, hf_greedy(load_hf(dtype), prompts, PEER_NEW_TOKENS))


def agreement_row(section: str, system: str, dtype: str, agreement: Agreement, output_tokens: int, note: str
                  ) -> dict:
    """A row of the bfloat16 table (BF16_COLUMNS) for a greedy comparison."""
    return {"section": section, "system": system, "dtype": dtype, "num_requests": agreement.total,
            "output_tokens": output_tokens, "wall_s": "", "tokens_per_s": "", "max_concurrent_requests": "",
            "num_preemptions": "", "identical_sequences": agreement.identical,
            "matched_prefix_share": round(agreement.mean_prefix_share, 4),
            "note": f"{agreement.describe()}; {note}; first difference per sequence: {agreement.first_difference}"}


def dtype_run(requests: list[Request], args: argparse.Namespace) -> list[dict]:
    """The rows of a --dtype run other than float32 (module docstring): throughput of the engine in float32 and in
    `args.dtype` and of HF in `args.dtype`, then the two greedy agreements."""
    dtype = args.dtype
    rows = [{**engine_throughput(requests), "dtype": "float32"}]
    print(f"  engine, float32: {rows[-1]['tokens_per_s']:.1f} output tokens/s", flush=True)
    ours: dict[str, list[int]] = {}
    rows.append({**engine_throughput(requests, dtype, outputs=ours), "dtype": dtype})
    print(f"  engine, {dtype}: {rows[-1]['tokens_per_s']:.1f} output tokens/s", flush=True)
    theirs: dict[str, list[int]] = {}
    rows.append({**hf_throughput(requests, args.hf_batch_size, dtype, outputs=theirs), "dtype": dtype})
    print(f"  HF static batches, {dtype}: {rows[-1]['tokens_per_s']:.1f} output tokens/s", flush=True)
    names = [str(r.request_id) for r in requests]
    timed = greedy_agreement([ours[n] for n in names], [theirs[n] for n in names])
    print(f"  greedy, the timed workload: {timed.describe()}", flush=True)
    rows.append(agreement_row("greedy_agreement", f"engine vs HF generate (static batches of {args.hf_batch_size})",
                              dtype, timed, sum(r.output_len for r in requests),
                              "the timed runs' outputs; HF without EOS, the engine with ignore_eos"))
    peer = peer_prompts_agreement(dtype)
    print(f"  greedy, the 16 prompts of make peer: {peer.describe()}", flush=True)
    rows.append(agreement_row("greedy_agreement_peer_prompts", "engine vs HF generate (batch 1)", dtype, peer,
                              peer.total * PEER_NEW_TOKENS, f"tools/peer_vllm.py's 8 raw and 8 chat prompts, "
                              f"{PEER_NEW_TOKENS} new tokens, ignore EOS"))
    return rows


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
              r.prompt_token_ids]) for r in requests]
    rows = []
    for policy in CONCURRENCY_POLICIES:
        llm = LLM.from_loaded(model, policy=policy, block_size=16, num_gpu_blocks=num_blocks,
                              max_model_len=MAX_MODEL_LEN)
        wall, stats = time_engine(llm, folded)
        note = f"{num_blocks} blocks x 16 tokens; tiny random Llama, max_model_len {MAX_MODEL_LEN}"
        rows.append(result_row("concurrency", policy, requests, wall, stats.max_concurrent_requests,
                               stats.num_preemptions, note))
        print(f"  concurrency {policy}: {stats.max_concurrent_requests} requests at most", flush=True)
    return rows


def result_row(section, system, requests, wall, concurrent, preemptions, note) -> dict:
    """One row of the results table (CSV_COLUMNS): `requests` served in `wall` seconds by `system`."""
    tokens = sum(r.output_len for r in requests)
    return {"section": section, "system": system, "num_requests": len(requests), "output_tokens": tokens,
            "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2), "max_concurrent_requests": concurrent,
            "num_preemptions": preemptions, "note": note}


def machine_description() -> str:
    import torch
    import transformers

    from reference.cpu_paths import cpu_paths

    cpu, threads = platform.processor() or "unknown cpu", torch.get_num_threads()
    if Path("/proc/cpuinfo").is_file():
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    return (f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
            f"python {platform.python_version()}, torch {torch.__version__} ({threads} thread{'s' * (threads != 1)}), "
            f"transformers {transformers.__version__}; {cpu_paths().describe()}")


def _print_table(rows: list[dict], dtype: bool = False) -> None:
    """The rows as a table; with `dtype`, a dtype column after the system."""
    kind = f" {'dtype':<9}" if dtype else ""
    print(f"{'section':<12} {'system':<48}{kind} {'reqs':>5} {'out tok':>8} {'wall s':>8} {'tok/s':>8} "
          f"{'max conc':>8} {'preempt':>8}")
    for r in rows:
        kind = f" {r['dtype']:<9}" if dtype else ""
        print(f"{r['section']:<12} {r['system']:<48}{kind} {r['num_requests']:>5} {r['output_tokens']:>8} "
              f"{r['wall_s']:>8.2f} {r['tokens_per_s']:>8.1f} {r['max_concurrent_requests']:>8} "
              f"{r['num_preemptions']:>8}")


def out_path(args: argparse.Namespace) -> str:
    """--out, or the default CSV of --dtype, --workload and --threads: figures/bench_engine_cpu[_long][_bf16]
    [_Nthreads].csv."""
    default = DEFAULT_OUTS.get(args.dtype, DEFAULT_OUT)
    stem = DEFAULT_OUT.removesuffix(".csv")
    if args.workload != "bench":
        default = default.replace(stem, f"{stem}_{args.workload}")
    return args.out or (default if args.threads == 1 else default.removesuffix(".csv") + f"_{args.threads}threads.csv")


def check_args(args: argparse.Namespace) -> None:
    """ValueError (one line, with the allowed range) for a bad flag or an --out that could not be written, before
    any work starts (sim.base.outfiles.check_outputs; a missing folder is created only for the default path)."""
    from sim.base.limits import MAX_POOL_BLOCKS, MAX_SEED

    if args.dtype not in DTYPES:
        raise ValueError(f"--dtype {args.dtype} (allowed: {', '.join(DTYPES)})")
    if args.workload not in WORKLOADS:
        raise ValueError(f"--workload {args.workload} (allowed: {', '.join(WORKLOADS)})")
    if args.workload != "bench" and (args.quick or args.kv_blocks is not None):
        raise ValueError(f"--{'quick' if args.quick else 'kv-blocks'} goes with --workload bench (--workload "
                         f"{args.workload} has its own lengths and no concurrency runs)")

    # A benchmark's workload must fit in memory and in a run someone waits for: 100,000 requests is already hours
    # on a CPU; a batch or a pool past these sizes would not fit in this machine's memory as float32 K/V anyway.
    limits = {"num_requests": 100_000, "hf_batch_size": 4096, "kv_blocks": MAX_POOL_BLOCKS}
    for name, high in limits.items():
        value = getattr(args, name)
        if value is not None and not 1 <= value <= high:
            raise ValueError(f"--{name.replace('_', '-')} {value} (allowed: an integer from 1 to {high:,})")
    if not 1 <= args.threads <= (os.cpu_count() or 1):
        raise ValueError(f"--threads {args.threads} (allowed: an integer from 1 to {os.cpu_count() or 1}, the cores)")
    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"--seed {args.seed} (allowed: an integer from 0 to {MAX_SEED:,})")
    check_outputs({"--out": out_path(args)}, make_parents=args.out is None)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """The `python -m reference bench` command (flags checked by check_args first)."""
    import torch

    started, load_before = time.perf_counter(), os.getloadavg()[0]
    torch.set_num_threads(args.threads)  # see the module docstring
    from reference.models.loader import read_config, smollm2_checkpoint_dir

    vocab = read_config(smollm2_checkpoint_dir()).vocab_size
    requests = workload(args.workload, args.num_requests, quick=args.quick, seed=args.seed, vocab_size=vocab)
    if args.dtype == "float32":
        engine = engine_throughput(requests)
        print(f"  engine: {engine['tokens_per_s']:.1f} output tokens/s", flush=True)
        hf = hf_throughput(requests, args.hf_batch_size)
        print(f"  HF static batches: {hf['tokens_per_s']:.1f} output tokens/s", flush=True)
        rows = [engine, hf]
        if args.workload == "bench":  # the long prompts pass the `max` baseline's MAX_MODEL_LEN
            rows += concurrency(requests, args.kv_blocks or (128 if args.quick else 256))
    else:
        rows = dtype_run(requests, args)
    torch.set_num_threads(args.threads)  # the concurrency runs' LLMs took one thread: the header names the run's
    header = {
        "machine": machine_description(),
        **({} if args.dtype == "float32" else {"cpu": cpu_description()}),
        "command": shlex.join(argv),
        "threads": f"torch.set_num_threads({args.threads}) for both systems",
        "workload": describe_workload(args.workload, requests),
        "load_average": f"{load_before:.2f} at start, {os.getloadavg()[0]:.2f} at end (1 min; other processes "
                        "share these cores)",
        "total_s": f"{time.perf_counter() - started:.1f}",
    }
    if args.dtype == "float32":
        _report(rows, header, Path(out_path(args)))
    else:
        report_dtype(rows, header, Path(out_path(args)))
    return 0


def report_dtype(rows: list[dict], header: dict[str, str], out: Path) -> None:
    """Print and save a --dtype run's table (BF16_COLUMNS): throughput rows, then the agreement rows."""
    _print_table([r for r in rows if r["section"] == "throughput"], dtype=True)
    engine = {r["dtype"]: r["tokens_per_s"] for r in rows if r["system"].startswith("engine (")}
    hf = next(r for r in rows if r["system"].startswith("HF"))
    dtype = hf["dtype"]
    print(f"throughput: engine {dtype} / engine float32 = {engine[dtype] / engine['float32']:.2f}x, "
          f"engine {dtype} / HF static {dtype} = {engine[dtype] / hf['tokens_per_s']:.2f}x")
    for r in rows:
        if r["section"].startswith("greedy_agreement"):
            print(f"{r['section']} ({r['system']}, {r['dtype']}): {r['note'].split('; first difference')[0]}")
    write_csv_with_header(out, BF16_COLUMNS, rows, header)
    print(f"wrote {out} (the whole bench took {header['total_s']} s)")


def write_csv_with_header(out: Path, columns: tuple[str, ...], rows: list[dict], header: dict[str, str]) -> None:
    """Print the header lines and write the CSV under them as `# key: value` comments (whole or not at all)."""
    for key, value in header.items():
        print(f"{key}: {value}")
    write_csv(out, columns, rows, comments=[f"{key}: {value}" for key, value in header.items()], make_parents=True)


# The instruction-set extensions that decide which kernels torch's oneDNN picks (and vLLM's CPU build): AVX-512's
# BF16 instructions and AMX make bfloat16 matrix products several times faster than float32 ones.
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
             "amx_bf16", "amx_int8")


def cpu_description(cpuinfo: str | None = None) -> str:
    """The CPU's model name and which of CPU_FLAGS it has (from /proc/cpuinfo, or `cpuinfo`'s text)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return f"{platform.processor() or platform.machine()} (no /proc/cpuinfo: flags unknown)"
    fields = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    have = [f for f in CPU_FLAGS if f in flags]
    return f"{fields.get('model name', platform.machine())}; {' '.join(have) if have else 'none of ' + ' '.join(CPU_FLAGS)}"


def _report(rows: list[dict], header: dict[str, str], out: Path) -> None:
    _print_table(rows)
    tput = {r["system"]: r["tokens_per_s"] for r in rows if r["section"] == "throughput"}
    engine, hf = tput.values()
    conc = {r["system"]: r["max_concurrent_requests"] for r in rows if r["section"] == "concurrency"}
    print(f"throughput: engine / HF static = {engine / hf:.2f}x")
    if conc:  # none with --workload long
        print("concurrency: " + ", ".join(f"paged / {p} = {conc['paged'] / max(conc[p], 1):.2f}x"
                                          for p in CONCURRENCY_POLICIES[1:]))
    for key, value in header.items():
        print(f"{key}: {value}")
    # whole or not at all; the folder is there unless --out is the default (check_args)
    write_csv(out, CSV_COLUMNS, rows, comments=[f"{key}: {value}" for key, value in header.items()],
              make_parents=True)
    print(f"wrote {out} (the whole bench took {header['total_s']} s)")
