"""Speculative decoding on the engine, measured: tokens/s with and without the n-gram draft on a repetitive workload.

    python -m reference spec-bench [--num-speculative-tokens 4] [--max-tokens 128] [--rounds 2] [--quick] [--out CSV]

The workload asks SmolLM2-135M-Instruct (chat template, greedy, float32 weights, the engine's CPU backend) to repeat,
edit or continue texts it is given, as code editing and summarising do: its answers copy long stretches of the
prompt, which is where a prompt-lookup draft (reference/engine/speculative.py) finds its guesses. Each round generates the
whole workload once without speculation and once with it (in alternating order, after one warm-up of each), as one
batch of requests; the greedy tokens must be IDENTICAL (checked; the command fails otherwise). Per system the CSV
has the tokens generated, the best round's seconds and tokens/s, the engine's steps, and with speculation the draft
tokens verified, accepted, and the acceptance rate; a last row per workload gives the speed-up.

The CSV (default figures/speculative_engine.csv; figures/quick/ with --quick) starts with `# key: value` lines naming
the machine, versions and command. NOTE: on a CPU a verify step's k extra positions cost real compute (the model's
weights are not the only cost, as on a memory-bound GPU), so the speed-up comes from fewer steps, paid for by
longer ones; the rejected drafts' compute is lost.
"""
from __future__ import annotations

import argparse
import shlex
import time

DEFAULT_OUT = "figures/speculative_engine.csv"
QUICK_OUT = "figures/quick/speculative_engine.csv"
QUICK = {"prompts": 2, "max_tokens": 16, "rounds": 1}
COLUMNS = ("system", "num_speculative_tokens", "prompts", "generated_tokens", "best_seconds", "tokens_per_s",
           "steps", "draft_tokens", "accepted_tokens", "acceptance_rate", "speedup", "identical")
CODE = '''def total_price(items, tax_rate):
    total = 0
    for item in items:
        total = total + item.price * item.quantity
    total = total * (1 + tax_rate)
    return round(total, 2)'''
TEXT = ("The committee met on Tuesday to review the budget. After a long discussion, the members agreed to fund the "
        "new library, to repair the old bridge, and to delay the stadium until next year.")
WORKLOAD = (  # (instruction, the text it works on): the answers repeat the text, edited or not
    ("Repeat the following text exactly, word for word:", TEXT),
    ("Rename the variable `total` to `amount` in this Python function and output the whole function:", CODE),
    ("Rewrite this text, replacing Tuesday with Friday and keeping everything else the same:", TEXT),
    ("Add a docstring to this Python function and output the whole function:", CODE),
    ("Copy this list, one item per line, and number the items: apples, bananas, cherries, dates, figs, grapes, "
     "lemons, mangoes.", ""),
    ("Output this Python function unchanged:", CODE),
    ("Repeat the following text twice:", TEXT),
    ("Fix the indentation of this code if needed and output the whole code:", CODE),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-speculative-tokens", type=int, default=4, metavar="K",
                   help="draft tokens per step with speculation, 1..64 (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=128, help="greedy tokens per prompt, 1..512 (default: 128)")
    p.add_argument("--rounds", type=int, default=2, help="timed rounds per system, the best kept, 1..10 (default: 2)")
    p.add_argument("--quick", action="store_true", help=f"{QUICK['prompts']} prompts, {QUICK['max_tokens']} tokens, "
                   "one round (a smoke run; written under figures/quick/)")
    p.add_argument("--out", help=f"CSV to write (default: {DEFAULT_OUT}; {QUICK_OUT} with --quick)")


def check_args(args: argparse.Namespace) -> None:
    """ValueError (one line) for a bad flag or an output that could not be written, before the model loads."""
    from sim.base.outfiles import check_outputs

    for flag, value, low, high in (("--num-speculative-tokens", args.num_speculative_tokens, 1, 64),
                                   ("--max-tokens", args.max_tokens, 1, 512), ("--rounds", args.rounds, 1, 10)):
        if not low <= value <= high:
            raise ValueError(f"{flag} {value} (allowed: an integer from {low} to {high})")
    if args.quick and (args.max_tokens != 128 or args.rounds != 2):
        raise ValueError("--quick sets the tokens and rounds itself (allowed: --quick alone, or --max-tokens and "
                         "--rounds without it)")
    if args.out is None:
        args.out = QUICK_OUT if args.quick else DEFAULT_OUT
    check_outputs({"--out": args.out}, {})


def conversations(count: int | None = None) -> list[list[dict]]:
    return [[{"role": "user", "content": f"{ask}\n\n{text}" if text else ask}] for ask, text in WORKLOAD[:count]]


def measure(llm, prompts: list[str], max_tokens: int) -> tuple[list[list[int]], float, int]:
    """(each prompt's greedy tokens, seconds, engine steps) of one batch."""
    from reference import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    steps = llm.stats.num_steps
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    return [o.outputs[0].token_ids for o in outputs], time.perf_counter() - start, llm.stats.num_steps - steps


def run(args: argparse.Namespace, argv: list[str]) -> int:
    import torch

    from reference import LLM
    from reference.bench.bench import machine_description
    from reference.engine.executor import use_one_cpu_thread
    from reference.models import load_model
    from sim.base.outfiles import write_csv

    use_one_cpu_thread(torch.device("cpu"))
    count, max_tokens, rounds = (QUICK["prompts"], QUICK["max_tokens"], QUICK["rounds"]) if args.quick else (
        None, args.max_tokens, args.rounds)
    model, tokenizer, _ = load_model("smollm2", dtype=torch.float32, device="cpu")
    k = args.num_speculative_tokens
    engines = {0: LLM.from_loaded(model, tokenizer), k: LLM.from_loaded(model, tokenizer, num_speculative_tokens=k)}
    prompts = engines[0].render_chat(conversations(count))
    tokens, best, steps, drafted = {}, {}, {}, (0, 0)
    for llm in engines.values():  # warm-up: one short batch each (allocations, numba's compilation)
        measure(llm, prompts[:1], 4)
    for r in range(rounds):
        for system in (0, k) if r % 2 == 0 else (k, 0):
            engine = engines[system]
            before = (engine.stats.num_draft_tokens, engine.stats.num_accepted_tokens)
            out, seconds, n = measure(engine, prompts, max_tokens)
            tokens[system], steps[system] = out, n
            best[system] = min(best.get(system, seconds), seconds)
            if system:  # the drafts verified and accepted in this round (the CSV keeps the last round's)
                drafted = engine.stats.num_draft_tokens - before[0], engine.stats.num_accepted_tokens - before[1]
    if tokens[0] != tokens[k]:
        raise RuntimeError("speculative decoding changed the greedy tokens: expected them identical to plain decoding")
    generated = sum(len(t) for t in tokens[0])
    spec = engines[k].stats
    rows = [{"system": "plain", "num_speculative_tokens": 0, "prompts": len(prompts), "generated_tokens": generated,
             "best_seconds": round(best[0], 3), "tokens_per_s": round(generated / best[0], 2), "steps": steps[0],
             "draft_tokens": "", "accepted_tokens": "", "acceptance_rate": "", "speedup": "", "identical": ""},
            {"system": "ngram", "num_speculative_tokens": k, "prompts": len(prompts), "generated_tokens": generated,
             "best_seconds": round(best[k], 3), "tokens_per_s": round(generated / best[k], 2), "steps": steps[k],
             "draft_tokens": drafted[0], "accepted_tokens": drafted[1],
             "acceptance_rate": round(drafted[1] / drafted[0], 4) if drafted[0] else "",
             "speedup": round(best[0] / best[k], 3), "identical": True}]
    comments = [f"machine: {machine_description()}", f"command: {shlex.join(argv)}",
                f"setup: SmolLM2-135M-Instruct, float32 weights, chat template, greedy, {max_tokens} new tokens per "
                f"prompt at most (EOS ends earlier), {len(prompts)} prompts as one batch, the engine's CPU backend "
                f"{engines[0].backend}; n-gram draft: the last 3..1 tokens looked up in prompt + output "
                f"(reference/engine/speculative.py); best of {rounds} round(s), systems alternating",
                f"draft_counts: the last round's ({spec.num_draft_tokens} verified over all rounds and the warm-up)"]
    write_csv(args.out, COLUMNS, rows, comments=comments, make_parents=args.quick)
    print(f"plain {rows[0]['tokens_per_s']} tokens/s, n-gram k={k} {rows[1]['tokens_per_s']} tokens/s "
          f"({rows[1]['speedup']}x, {rows[0]['steps']} -> {rows[1]['steps']} steps, acceptance "
          f"{rows[1]['acceptance_rate']}); greedy tokens identical; wrote {args.out}")
    return 0
