"""The CPU offload tier on the engine, measured: multi-turn conversations on a GPU pool too small to keep them.

    python -m reference offload-bench [--sessions 6] [--turns 4] [--max-tokens 24] [--gpu-blocks 24] [--quick] [--out CSV]

SmolLM2-135M-Instruct (greedy, float32, the engine's CPU backend) serves `--sessions` chat sessions of `--turns` turns.
Each turn's prompt is the session's whole history (its system text, every earlier question and answer) and a new
question, as a chat server sends it. The turns are served one at a time, session after session (turn 1 of every
session, then turn 2 of every session, ...), so that by the time a session comes back, the other sessions' requests
have taken its blocks: a pool of `--gpu-blocks` blocks of 16 tokens, with prefix caching, holds about one session.
The same conversation runs twice, on two engines over the same loaded model: without the tier (an evicted prefix is
computed again) and with a CPU tier of `--offload-blocks` blocks (default: enough for every session's history), whose
reloads bring the evicted prefix back (reference/engine/kv_cache.py's tier pool, decided by sim/kv/offload.py). The greedy
tokens must be IDENTICAL (checked; the command fails otherwise).

Per system the CSV has the prompt tokens served, the share found in the prefix cache on the GPU and in the tier, the
blocks offloaded and reloaded, and the time to first token of the turns after the first (mean and p90; each turn is
alone in the engine, so its TTFT is the prefill of what the caches did not hold, plus the reloads). The CSV (default
figures/offload_engine.csv; figures/quick/ with --quick) starts with `# key: value` lines naming the machine,
versions and command. NOTE: on a CPU-only machine the "GPU" pool and the tier are both host memory (pinning needs
CUDA), so a reload is a memory copy, not a PCIe transfer: the TTFT gain here is an upper bound of what a GPU sees,
where the reload crosses PCIe (the simulator's figure cpu_offload prices it so).
"""
from __future__ import annotations

import argparse
import shlex

import numpy as np

DEFAULT_OUT = "figures/offload_engine.csv"
QUICK_OUT = "figures/quick/offload_engine.csv"
QUICK = {"sessions": 3, "turns": 2, "max_tokens": 8}
BLOCK_SIZE = 16
COLUMNS = ("system", "sessions", "turns", "gpu_blocks", "offload_blocks", "prompt_tokens", "gpu_hit_share",
           "cpu_hit_share", "hit_share", "offloaded_blocks", "reloaded_blocks", "mean_ttft_later_turns_s",
           "p90_ttft_later_turns_s", "identical")
TOPICS = ("the water cycle and why rain falls", "how a bicycle gear works", "the history of the printing press",
          "why the sky is blue in the day and red at dusk", "how bread rises when yeast is added",
          "how a compass finds north", "why leaves change colour in autumn", "how a refrigerator keeps food cold")
QUESTIONS = ("Explain it to a ten-year-old.", "Give one surprising fact about it.", "How would you test that at home?",
             "Summarise what you said in one sentence.", "What is a common mistake people make about it?",
             "Name one thing that is still unknown about it.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sessions", type=int, default=6, help="chat sessions, 2..8 (default: %(default)s)")
    p.add_argument("--turns", type=int, default=4, help="turns per session, 2..6 (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=24, help="greedy tokens per answer, 1..128 (default: 24)")
    p.add_argument("--gpu-blocks", type=int, default=24, help="the GPU pool in blocks of 16 tokens, 8..4096: small "
                   "enough that the sessions evict each other (default: %(default)s)")
    p.add_argument("--offload-blocks", type=int, help="the CPU tier in blocks, 1..65536 (default: 64 per session)")
    p.add_argument("--quick", action="store_true", help=f"{QUICK['sessions']} sessions of {QUICK['turns']} turns, "
                   f"{QUICK['max_tokens']} tokens per answer (a smoke run; written under figures/quick/)")
    p.add_argument("--out", help=f"CSV to write (default: {DEFAULT_OUT}; {QUICK_OUT} with --quick)")


def check_args(args: argparse.Namespace) -> None:
    """ValueError (one line) for a bad flag or an output that could not be written, before the model loads."""
    from sim.base.outfiles import check_outputs

    if args.quick:
        if (args.sessions, args.turns, args.max_tokens) != (6, 4, 24):
            raise ValueError("--quick sets the sessions, turns and tokens itself (allowed: --quick alone, or "
                             "--sessions, --turns and --max-tokens without it)")
        args.sessions, args.turns, args.max_tokens = QUICK["sessions"], QUICK["turns"], QUICK["max_tokens"]
    if args.offload_blocks is None:
        args.offload_blocks = 64 * args.sessions
    for flag, value, low, high in (("--sessions", args.sessions, 2, len(TOPICS)), ("--turns", args.turns, 2, 6),
                                   ("--max-tokens", args.max_tokens, 1, 128), ("--gpu-blocks", args.gpu_blocks, 8, 4096),
                                   ("--offload-blocks", args.offload_blocks, 1, 65536)):
        if not low <= value <= high:
            raise ValueError(f"{flag} {value} (allowed: an integer from {low} to {high})")
    if args.out is None:
        args.out = QUICK_OUT if args.quick else DEFAULT_OUT
    check_outputs({"--out": args.out}, {})


def serve_sessions(llm, openings: list[list[int]], questions: list[list[int]], turns: int,
                   max_tokens: int) -> tuple[list[list[int]], list[float], int]:
    """Serve the conversation on `llm`, one turn at a time, turn-major: session s's turn t is its opening, then for
    each earlier turn its question and answer, then question t (token ids). Returns every turn's greedy answer (in
    serving order), the TTFT of every turn after the first, and the prompt tokens served."""
    from reference import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    history = [list(ids) for ids in openings]
    answers, later_ttft, prompt_tokens = [], [], 0
    for t in range(turns):
        for s, past in enumerate(history):
            prompt = past + questions[t % len(questions)]
            out = llm.generate([prompt], params)[0]
            answer = list(out.outputs[0].token_ids)
            answers.append(answer)
            prompt_tokens += len(prompt)
            if t:
                later_ttft.append(out.metrics.ttft)
            history[s] = prompt + answer
    return answers, later_ttft, prompt_tokens


def measure(model, tokenizer, openings, questions, turns: int, max_tokens: int, gpu_blocks: int,
            offload_blocks: int) -> tuple[list[dict], bool]:
    """Both systems on the same loaded model: (their CSV rows, whether their tokens are identical)."""
    from reference import LLM

    rows, answers = [], {}
    max_len = max(len(o) for o in openings) + turns * (max(len(q) for q in questions) + max_tokens) + 1
    for system, tier in (("gpu only", 0), ("gpu + cpu tier", offload_blocks)):
        llm = LLM.from_loaded(model, tokenizer, block_size=BLOCK_SIZE, num_gpu_blocks=gpu_blocks, max_model_len=max_len,
                              enable_prefix_caching=True, num_offload_blocks=tier)
        serve_sessions(llm, openings[:1], questions, 1, 2)  # warm-up: allocations, the kernels' first compilation
        before = llm.kv_manager.prefix_cache_stats()
        answers[system], ttft, prompt_tokens = serve_sessions(llm, openings, questions, turns, max_tokens)
        stats = llm.kv_manager.prefix_cache_stats()
        queried = stats.queried_tokens - before.queried_tokens
        hits, cpu_hits = stats.hit_tokens - before.hit_tokens, stats.cpu_hit_tokens - before.cpu_hit_tokens
        rows.append({"system": system, "sessions": len(openings), "turns": turns, "gpu_blocks": gpu_blocks,
                     "offload_blocks": tier, "prompt_tokens": prompt_tokens,
                     "gpu_hit_share": round((hits - cpu_hits) / queried, 4), "cpu_hit_share": round(cpu_hits / queried, 4),
                     "hit_share": round(hits / queried, 4),
                     "offloaded_blocks": stats.offloaded_blocks - before.offloaded_blocks,
                     "reloaded_blocks": stats.reloaded_blocks - before.reloaded_blocks,
                     "mean_ttft_later_turns_s": round(float(np.mean(ttft)), 4),
                     "p90_ttft_later_turns_s": round(float(np.percentile(ttft, 90)), 4), "identical": ""})
    identical = answers["gpu only"] == answers["gpu + cpu tier"]
    rows[1]["identical"] = identical
    return rows, identical


def run(args: argparse.Namespace, argv: list[str]) -> int:
    import torch

    from reference.bench.bench import machine_description
    from reference.engine.executor import use_one_cpu_thread
    from reference.models import load_model
    from sim.base.outfiles import write_csv

    use_one_cpu_thread(torch.device("cpu"))
    model, tokenizer, _ = load_model("smollm2", dtype=torch.float32, device="cpu")
    openings = [tokenizer(f"System: you are a patient teacher. Today's topic is {topic}. Answer in plain words, "
                          f"and keep every answer short.\n").input_ids for topic in TOPICS[:args.sessions]]
    questions = [tokenizer(f"User: {q}\nAssistant:").input_ids for q in QUESTIONS]
    rows, identical = measure(model, tokenizer, openings, questions, args.turns, args.max_tokens, args.gpu_blocks,
                              args.offload_blocks)
    if not identical:
        raise RuntimeError("the CPU tier changed the greedy tokens: expected them identical to the run without it")
    comments = [f"machine: {machine_description()}", f"command: {shlex.join(argv)}",
                f"setup: SmolLM2-135M-Instruct, float32 weights, greedy, {args.max_tokens} tokens per answer (EOS "
                f"ignored), {args.sessions} sessions x {args.turns} turns served one at a time, turn-major; prefix "
                f"caching, blocks of {BLOCK_SIZE} tokens, the engine's CPU backend; the 'GPU' pool and the tier are "
                f"both host memory on this machine (a reload is a memory copy, not a PCIe transfer)"]
    write_csv(args.out, COLUMNS, rows, comments=comments, make_parents=args.quick)
    plain, tier = rows
    print(f"prompt tokens found: {plain['hit_share']:.1%} without the tier, {tier['hit_share']:.1%} with it "
          f"({tier['cpu_hit_share']:.1%} from the CPU); mean TTFT of later turns {plain['mean_ttft_later_turns_s']} s "
          f"-> {tier['mean_ttft_later_turns_s']} s; greedy tokens identical; wrote {args.out}")
    return 0
