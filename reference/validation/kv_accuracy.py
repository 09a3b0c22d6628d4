"""What an 8-bit KV cache costs in accuracy: int8 K/V (reference/attention/quant.py) against the float32 cache.

    python -m reference kv-accuracy [--models smollm2,gemma3] [--max-tokens 32] [--quick] [--out CSV]

On the greedy prompts of `make peer` (reference.bench.bench.peer_prompt_ids: 8 raw texts and 8 chat-templated questions;
a model without a chat template, as the Gemma 3 270M base model, takes the questions as raw text), `--max-tokens`
new tokens each, ignore EOS, float32 weights, the engine's CPU backend:

- greedy agreement: the engine generates with kv_dtype="auto" (float32 K/V, the bit-exact oracle) and with "int8";
  a prompt agrees when the token ids are identical, else the first position where they differ is recorded;
- logit error: the float32 run's whole sequence (prompt + its greedy tokens) is run through the model once with each
  cache (teacher forcing, so both predict the same positions), and the logits that predict each generated token are
  compared: max and mean |int8 - float32| over the vocabulary and positions, the KL divergence KL(float32 || int8)
  of the next-token distributions (mean and max over positions), and how often the argmax agrees. NOTE: a prompt's
  own K/V is quantized before its attention reads it in both the engine's decode steps and this single pass (store
  precedes attention), so the teacher-forced logits are those the int8 engine computes at each position;
- memory: K/V bytes per token of each cache and the blocks of 16 tokens a 1 GiB budget holds
  (reference.engine.kv_cache.kv_bytes_per_block).

NOTE (the numbers depend on the backend, beyond float rounding): rounding to int8 is discontinuous, so a float32
difference of 1e-6 between two backends' attention sums can move an element of a later layer's K or V across a
rounding boundary, one step (absmax / 127) apart, and the steps cascade. Measured on Gemma 3 270M, make peer's 14th
prompt plus 32 tokens, torch against torch_batched with int8 caches: layers 0-2 identical, 6 of 12,288 key elements
one step apart in layer 3, 1,992 (up to 6 steps) in layer 17, logits up to 1.1 apart; with float32 caches the two
differ by 8e-5. The CSV names the backend that ran it (the engine's CPU default).

The CSV (default figures/kv_accuracy.csv; figures/quick/ with --quick) has one row per model and prompt and one
"all" row per model, after `# key: value` lines naming the machine, versions and command.
"""
from __future__ import annotations

import argparse
import shlex
import statistics
import time

DEFAULT_OUT = "figures/kv_accuracy.csv"
QUICK_OUT = "figures/quick/kv_accuracy.csv"
MODELS = ("smollm2", "gemma3")
QUICK = {"prompts": 2, "max_tokens": 8}  # --quick: the first raw and the first chat prompt, 8 tokens, smollm2
BLOCK_SIZE = 16
BUDGET_BYTES = 1 << 30  # the memory column: blocks in 1 GiB of K/V
COLUMNS = ("model", "prompt", "kind", "prompt_tokens", "new_tokens", "identical", "first_difference",
           "max_abs_logit_error", "mean_abs_logit_error", "mean_kl", "max_kl", "argmax_agreement",
           "kv_bytes_per_token_float32", "kv_bytes_per_token_int8", "blocks_per_gib_float32", "blocks_per_gib_int8")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated, of {', '.join(MODELS)} (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=32, help="greedy tokens per prompt, 1..256 (default: 32, "
                   "make peer's)")
    p.add_argument("--quick", action="store_true", help=f"smollm2 on {QUICK['prompts']} prompts, "
                   f"{QUICK['max_tokens']} tokens (a smoke run; written under figures/quick/)")
    p.add_argument("--out", help=f"CSV to write (default: {DEFAULT_OUT}; {QUICK_OUT} with --quick)")


def check_args(args: argparse.Namespace) -> None:
    """ValueError (one line) for a bad flag or an output that could not be written, before any model loads."""
    from sim.base.outfiles import check_outputs

    models = [m for m in args.models.split(",") if m]
    if not models or any(m not in MODELS for m in models) or len(set(models)) != len(models):
        raise ValueError(f"--models {args.models!r} (allowed: a comma-separated list of {', '.join(MODELS)}, each "
                         "once)")
    if not 1 <= args.max_tokens <= 256:
        raise ValueError(f"--max-tokens {args.max_tokens} (allowed: an integer from 1 to 256)")
    if args.quick and (args.models != ",".join(MODELS) or args.max_tokens != 32):
        raise ValueError("--quick sets the models and tokens itself (allowed: --quick alone, or --models and "
                         "--max-tokens without it)")
    if args.out is None:
        args.out = QUICK_OUT if args.quick else DEFAULT_OUT
    check_outputs({"--out": args.out}, make_parents=args.quick)


def prompts_for(tokenizer) -> tuple[list[list[int]], list[str]]:
    """make peer's greedy prompts as token ids, and each one's kind ("raw", "chat", or "question as raw text")."""
    from reference.bench.bench import PEER_QUESTIONS, PEER_RAW, peer_prompt_ids

    if getattr(tokenizer, "chat_template", None):
        return peer_prompt_ids(tokenizer), ["raw"] * len(PEER_RAW) + ["chat"] * len(PEER_QUESTIONS)
    texts = PEER_RAW + PEER_QUESTIONS
    return [list(tokenizer(t).input_ids) for t in texts], ["raw"] * len(PEER_RAW) + ["question as raw text"] * len(
        PEER_QUESTIONS)


def teacher_forced_logits(model, sequence: list[int], kv_dtype: str, backend: str):
    """[len(sequence), vocab] float32 logits of one pass over `sequence` with a `kv_dtype` cache."""
    from reference.engine.batch import ForwardBatch
    from reference.engine.kv_cache import KVCache

    num_blocks = -(-len(sequence) // BLOCK_SIZE)
    cache = KVCache.for_model(model.config, num_blocks, BLOCK_SIZE, model.dtype, kv_dtype=kv_dtype)
    batch = ForwardBatch.build([(sequence, 0, list(range(num_blocks)))], BLOCK_SIZE)
    return model.forward(batch.input_ids, batch.positions, batch, cache, backend, all_logits=True).float()


def logit_errors(model, prompt: list[int], generated: list[int], backend: str) -> dict:
    """The logits predicting each generated token, float32 K/V against int8 (see the module docstring)."""
    import torch

    sequence = prompt + generated
    rows = slice(len(prompt) - 1, len(sequence) - 1)  # row p predicts token p + 1
    exact, int8 = (teacher_forced_logits(model, sequence, d, backend)[rows] for d in ("auto", "int8"))
    diff = (int8 - exact).abs()
    p_log, q_log = torch.log_softmax(exact, dim=-1), torch.log_softmax(int8, dim=-1)
    kl = (p_log.exp() * (p_log - q_log)).sum(dim=-1)  # [new_tokens], KL(float32 || int8) in nats
    return {"max_abs_logit_error": float(diff.max()), "mean_abs_logit_error": float(diff.mean()),
            "mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
            "argmax_agreement": float((exact.argmax(-1) == int8.argmax(-1)).float().mean())}


def measure(name: str, max_tokens: int, num_prompts: int | None) -> tuple[list[dict], str]:
    """The rows of one model (one per prompt, then "all") and the attention backend that ran them."""
    import torch

    from reference import LLM
    from reference.bench.bench import engine_greedy, greedy_agreement
    from reference.engine.kv_cache import kv_bytes_per_block
    from reference.models import load_model

    model, tokenizer, config = load_model(name)
    prompts, kinds = prompts_for(tokenizer)
    if num_prompts is not None:  # --quick: the first raw prompt and the first chat (or second-half) one
        half = len(prompts) // 2
        prompts, kinds = [prompts[0], prompts[half]], [kinds[0], kinds[half]]
    blocks = len(prompts) * -(-(max(map(len, prompts)) + max_tokens) // BLOCK_SIZE)  # all at once, no preemption
    outputs, backend = {}, None
    for kv_dtype in ("auto", "int8"):
        llm = LLM.from_loaded(model, tokenizer, num_gpu_blocks=blocks, block_size=BLOCK_SIZE, kv_dtype=kv_dtype)
        backend = llm.backend
        outputs[kv_dtype] = engine_greedy(llm, prompts, max_tokens)
        del llm
    agreement = greedy_agreement(outputs["int8"], outputs["auto"])
    per_token = {d: kv_bytes_per_block(config.num_layers, 1, config.num_kv_heads, config.head_dim, torch.float32, d)
                 for d in ("auto", "int8")}
    memory = {"kv_bytes_per_token_float32": per_token["auto"], "kv_bytes_per_token_int8": per_token["int8"],
              "blocks_per_gib_float32": BUDGET_BYTES // (BLOCK_SIZE * per_token["auto"]),
              "blocks_per_gib_int8": BUDGET_BYTES // (BLOCK_SIZE * per_token["int8"])}
    rows = []
    for i, (prompt, kind) in enumerate(zip(prompts, kinds)):
        errors = logit_errors(model, prompt, outputs["auto"][i], backend)
        first = agreement.first_difference[i]
        rows.append({"model": name, "prompt": i, "kind": kind, "prompt_tokens": len(prompt),
                     "new_tokens": max_tokens, "identical": first is None,
                     "first_difference": "" if first is None else first, **errors, **memory})
        print(f"  {name} prompt {i:2d} ({kind}): identical {first is None}"
              f"{'' if first is None else f' (first difference at token {first})'}, max |logit error| "
              f"{errors['max_abs_logit_error']:.4f}, mean KL {errors['mean_kl']:.2e}", flush=True)
    rows.append({"model": name, "prompt": "all", "kind": "", "prompt_tokens": sum(map(len, prompts)),
                 "new_tokens": max_tokens * len(prompts), "identical": f"{agreement.identical} of {agreement.total}",
                 "first_difference": " ".join("-" if f is None else str(f) for f in agreement.first_difference),
                 "max_abs_logit_error": max(r["max_abs_logit_error"] for r in rows),
                 "mean_abs_logit_error": statistics.fmean(r["mean_abs_logit_error"] for r in rows),
                 "mean_kl": statistics.fmean(r["mean_kl"] for r in rows), "max_kl": max(r["max_kl"] for r in rows),
                 "argmax_agreement": statistics.fmean(r["argmax_agreement"] for r in rows), **memory})
    return rows, backend


def run(args: argparse.Namespace, argv: list[str]) -> int:
    import torch

    from reference.bench.bench import machine_description
    from reference.engine.executor import use_one_cpu_thread
    from sim.base.outfiles import write_csv

    use_one_cpu_thread(torch.device("cpu"))
    started = time.perf_counter()
    models = ["smollm2"] if args.quick else [m for m in args.models.split(",") if m]
    max_tokens = QUICK["max_tokens"] if args.quick else args.max_tokens
    rows, backends = [], []
    for name in models:
        model_rows, backend = measure(name, max_tokens, QUICK["prompts"] if args.quick else None)
        rows += model_rows
        backends.append(f"{name}: {backend}")
    comments = [f"machine: {machine_description()}", f"command: {shlex.join(argv)}",
                f"setup: make peer's greedy prompts, {max_tokens} new tokens each, ignore EOS, float32 weights, "
                f"block size {BLOCK_SIZE}; int8 = 8-bit K/V with a float32 scale per token and KV head "
                "(reference/attention/quant.py) against the float32 cache", f"backend: {', '.join(backends)}",
                "logits: teacher-forced on the float32 run's tokens; KL(float32 || int8) in nats per position",
                f"total_s: {time.perf_counter() - started:.1f}"]
    cells = [{c: (f"{v:.6g}" if isinstance(v, float) else v) for c, v in r.items()} for r in rows]
    write_csv(args.out, COLUMNS, cells, comments=comments, make_parents=args.quick)
    for r in rows:
        if r["prompt"] == "all":
            print(f"{r['model']}: greedy identical {r['identical']}, max |logit error| {r['max_abs_logit_error']:.4f}, "
                  f"mean KL {r['mean_kl']:.2e}, argmax agreement {r['argmax_agreement']:.1%}; "
                  f"{r['blocks_per_gib_int8']:,} blocks per GiB int8 against {r['blocks_per_gib_float32']:,} float32")
    print(f"wrote {args.out}")
    return 0
