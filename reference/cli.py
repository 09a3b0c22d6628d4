"""`python -m reference`: the reference engine's command line (a thin user of `reference.LLM`).

    python -m reference generate "What is paged attention?" [--max-tokens 64] [--n 2 --temperature 0.8] [--json]
    python -m reference bench [--quick] [--out figures/bench_engine_cpu.csv]     engine vs HF, paged vs contiguous
    python -m reference bench --dtype bfloat16                                  both in bfloat16, + greedy agreement
    python -m reference bench-hybrid [--quick]                                  Gemma 3: hybrid vs paged KV, same bytes
    python -m reference calibrate [--quick] [--out figures/cost_model_cpu.json]  fit the simulator's cost model
    python -m reference validate-sim [--trace FILE ...] [--online]              the simulator's latency errors
    python -m reference readme-numbers [--write | --check]                      the README's numbers of those two
    python -m reference kv-accuracy [--quick] [--models smollm2,gemma3]         int8 KV against float32: greedy, logits
    python -m reference spec-bench [--quick] [--num-speculative-tokens 4]        n-gram speculative decoding: tokens/s
    python -m reference offload-bench [--quick] [--sessions 6] [--turns 4]       the CPU offload tier: hits, TTFT
    python -m reference serve [--port 8000] [--model smollm2] [...]             an OpenAI-compatible HTTP server
    python -m reference loadtest --trace FILE [--url URL] [--out CSV]           the server at a trace's arrivals
    python -m reference bench-kernels [...]                                     the GPU attention-kernel benchmark
    python -m reference bench-gpu [...]                                         the engine vs HF on a GPU

`generate` drives the engine the way vLLM's LLMEngine is driven: `add_request`, then `step()` until done,
printing each step's new text (one request, one sample) or each completion as it finishes (n > 1, beams).
Bad input ends with one line `error: ... (allowed: ...)` on stderr and exit status 2, never a traceback
(docs/ARCHITECTURE.md, "Bad input").
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from reference.cli_parser import Parser
from sim.config import MAX_SPECULATIVE_TOKENS, RUN_DEFAULTS  # sim.config and sim.kv import no torch: --help stays quick
from sim.kv import POLICIES


class UsageError(ValueError):
    """A flag value the command cannot serve; reported as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m reference",
                    description="The reference PagedAttention engine (vLLM's design, Kwon et al., SOSP 2023) on a "
                    "real model: generate text, or benchmark the engine.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    _add_generate_parser(sub)
    from reference.bench import bench  # light: heavy imports happen inside bench.run

    bench.add_arguments(sub.add_parser(
        "bench", help="CPU benchmark: engine vs HF transformers static batching; paged vs contiguous concurrency",
        description=bench.__doc__.split("\n\n")[0]))
    from reference.bench import bench_hybrid

    bench_hybrid.add_arguments(sub.add_parser(
        "bench-hybrid", help="CPU benchmark on the real Gemma 3 270M: the hybrid KV manager vs paged, same KV bytes",
        description=bench_hybrid.__doc__.split("\n\n")[0]))
    from reference.validation import calibrate, validate_sim

    calibrate.add_arguments(sub.add_parser(
        "calibrate", help="time the engine over designed batch shapes and fit the simulator's cost model (JSON)",
        description=calibrate.__doc__.split("\n\n")[0]))
    validate_sim.add_arguments(sub.add_parser(
        "validate-sim", help="replay traces through the engine (real time) and the calibrated simulator; latency errors",
        description=validate_sim.__doc__.split("\n\n")[0]))
    _add_readme_numbers_parser(sub)
    from reference.validation import kv_accuracy

    kv_accuracy.add_arguments(sub.add_parser(
        "kv-accuracy", help="the 8-bit KV cache's accuracy cost: greedy agreement and logit error of int8 K/V against "
        "float32 on make peer's prompts (CSV)", description=kv_accuracy.__doc__.split("\n\n")[0]))
    from reference.bench import bench_speculative

    bench_speculative.add_arguments(sub.add_parser(
        "spec-bench", help="speculative decoding with the n-gram draft on a repetitive workload: tokens/s with and "
        "without, acceptance (CSV)", description=bench_speculative.__doc__.split("\n\n")[0]))
    from reference.bench import bench_offload

    bench_offload.add_arguments(sub.add_parser(
        "offload-bench", help="the prefix cache's CPU offload tier on multi-turn conversations: prompt tokens found per "
        "tier and time to first token, with and without it (CSV)", description=bench_offload.__doc__.split("\n\n")[0]))
    _add_serve_parser(sub)
    from reference.bench import loadtest

    loadtest.add_arguments(sub.add_parser(
        "loadtest", help="drive the server with an HTTP client at a trace's arrival times; latencies at the client",
        description=loadtest.__doc__.split("\n\n")[0]))
    # listed for --help only: main() hands everything after "bench-kernels" to reference.attention.bench.main
    sub.add_parser("bench-kernels", add_help=False, help="GPU paged-attention kernel benchmark "
                   "(reference.attention.bench; `bench-kernels --help` lists its flags)")
    sub.add_parser("bench-gpu", add_help=False, help="GPU benchmark: the engine vs HF transformers on SmolLM2's "
                   "shape (reference.bench.bench_gpu; `bench-gpu --help` lists its flags)")
    return parser


def _add_readme_numbers_parser(sub) -> None:
    # the flags of reference/validation/readme_numbers.py, kept here: that module imports sim.figures (matplotlib), and
    # `python -m reference --help` stays quick
    p = sub.add_parser("readme-numbers", help="the README's numbers of calibrate and validate-sim, from the committed "
                       "files (README blocks)", description="Print the README's generated blocks of `make calibrate` "
                       "(reference.validation.readme_numbers): the committed cost model's fit (figures/cost_model_cpu.json) and "
                       "the simulator's errors against the engine (figures/validate_sim.csv). `python -m sim "
                       "readme-numbers` makes the README's other blocks.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the README's blocks between their markers")
    mode.add_argument("--check", action="store_true", help="exit 1 if a block of the README is not what the files give")
    p.add_argument("--figures", default="figures", metavar="DIR", help="folder of the results files (default: figures)")
    p.add_argument("--readme", default=None, metavar="PATH",
                   help="for --write/--check: this one file (default: README.md and docs/*.md, each block on its page)")


def _add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server on the engine (/v1/completions, "
                       "/v1/chat/completions, /v1/models, /health, /metrics)",
                       description="Serve the model over HTTP as vLLM's `vllm serve` does (reference.server): "
                       "OpenAI's completions and chat completions, streamed or not, batched continuously by the "
                       "engine's scheduler; Prometheus metrics at /metrics. Ctrl-C or SIGTERM stops it, aborting "
                       "open requests.")
    p.add_argument("--model", default="smollm2", help="'smollm2' (default), 'gemma3', or a local HF checkpoint folder")
    p.add_argument("--served-model-name", help="the name clients give as `model` (default: --model)")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="the port (default: 8000)")
    g = p.add_argument_group("the engine (LLM's keywords)")
    g.add_argument("--policy", default=RUN_DEFAULTS["policy"], type=_choice(POLICIES),
                   metavar="{" + ",".join(POLICIES) + "}", help="the KV manager (default: %(default)s)")
    g.add_argument("--block-size", type=int, default=RUN_DEFAULTS["block_size"], help="tokens per KV block")
    g.add_argument("--num-gpu-blocks", type=int, help="the KV pool in blocks (default: from the device's memory)")
    g.add_argument("--max-num-seqs", type=int, default=256, help="running sequences at most (default: 256)")
    g.add_argument("--max-num-batched-tokens", type=int, help="tokens per step at most (default: vLLM's rule)")
    g.add_argument("--max-model-len", type=int, help="the context (default: the model's)")
    g.add_argument("--enable-prefix-caching", action="store_true", help="cache full prompt blocks across requests")
    g.add_argument("--preemption", default="recompute", type=_choice(("recompute", "swap")),
                   metavar="{recompute,swap}", help="how a request is preempted (default: recompute)")
    g.add_argument("--swap-space", type=float, help="CPU swap space in GiB (with --preemption swap)")
    g.add_argument("--num-offload-blocks", type=int, default=0, metavar="N",
                   help="a CPU offload tier of N blocks for the prefix cache: evicted cached blocks are kept in host "
                   "memory and reloaded on a hit (with --enable-prefix-caching; default: 0, none)")
    g.add_argument("--kv-dtype", default="auto", metavar="{auto,int8}",
                   help="how the cache stores K/V: auto (the model's dtype) or int8 (default: %(default)s)")
    g.add_argument("--kv-cache-dtype", metavar="{auto,int8}", help="vLLM's name for --kv-dtype")
    g.add_argument("--seed", type=int, default=0, help="seeds the requests that bring none (default: 0)")


def run_serve(a: argparse.Namespace) -> int:
    """Load the model, build the LLM (every setting checked first: UsageError), serve until interrupted."""
    import importlib.util

    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
        raise UsageError("serve needs FastAPI and uvicorn (allowed: pip install -e '.[serve]', or make install)")
    _check_kv_dtype(a)  # (the flags first: before the address is tried, and the model loaded)
    if not 0 <= a.port <= 65535:
        raise UsageError(f"--port {a.port} (allowed: an integer from 0 to 65535)")
    _check_address(a.host, a.port)
    from reference import LLM
    from reference.server.run import run_server

    settings = dict(policy=a.policy, block_size=a.block_size, num_gpu_blocks=a.num_gpu_blocks,
                    max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens,
                    max_model_len=a.max_model_len, enable_prefix_caching=a.enable_prefix_caching,
                    preemption=a.preemption, swap_space=a.swap_space, seed=a.seed, kv_dtype=a.kv_dtype,
                    kv_cache_dtype=a.kv_cache_dtype, num_offload_blocks=a.num_offload_blocks)
    try:
        llm = LLM(a.model, **settings)
    except (TypeError, ValueError) as exc:
        raise UsageError(" ".join(str(exc).split())) from None
    return run_server(llm, a.served_model_name or a.model, a.host, a.port)  # 130 / 143 after Ctrl-C / SIGTERM


def _check_address(host: str, port: int) -> None:
    """UsageError unless this process can listen on (host, port): checked before the model loads, which takes
    seconds (uvicorn would only then say "address already in use", and exit 3)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"--host {host}: not an address of this machine ({exc}) (allowed: an IP address or host name "
                         f"of this machine, e.g. 127.0.0.1 or 0.0.0.0)") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as exc:
            raise UsageError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc}) (allowed: a "
                             f"free port of an address of this machine; --port 0 picks a free one)") from None


def _add_generate_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text for one prompt",
                       description="Generate a completion for PROMPT with the paged engine. One sample streams as "
                       "it is generated; n samples or beams print as each finishes.")
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--model", default="smollm2",
                   help="'smollm2' (embedded SmolLM2-135M-Instruct, default), 'gemma3' (Gemma 3 270M, whose sliding-"
                   "window layers the 'hybrid' policy serves), 'random' (a tiny random Llama without tokenizer: the "
                   "prompt is then space-separated token ids) or a local HF checkpoint folder")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                   help="wrap the prompt in the tokenizer's chat template (default: on; SmolLM2-Instruct is a chat "
                   "model and continues raw text poorly). --no-chat feeds the prompt as it is")
    g = p.add_argument_group("sampling (vLLM's SamplingParams)")
    g.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most (default: 64)")
    g.add_argument("--n", type=int, default=1, help="parallel samples sharing the prompt's KV blocks (default: 1)")
    g.add_argument("--beam-width", type=int, default=1, help="beam search width k; needs --temperature 0 (default: 1)")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (default); e.g. 0.8 with --n > 1, else all n samples are the same")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass, in (0, 1] (default: 1 = off)")
    g.add_argument("--top-k", type=int, default=-1, help="keep the k most likely tokens; -1 or 0 = off (default -1)")
    g.add_argument("--seed", type=int, default=0, help="seed of the sampling generator, >= 0 (default: 0)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating after the end-of-sequence token")
    g.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="stop when the text contains TEXT, which is left out (repeatable)")
    g.add_argument("--min-tokens", type=int, default=0, help="no stop before this many tokens (default: 0)")
    g.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min-p x the top probability, [0, 1]")
    g.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 0; 1 = off (default): > 1 discourages tokens of the prompt and the output")
    g.add_argument("--presence-penalty", type=float, default=0.0, help="[-2, 2], once per generated token (default 0)")
    g.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="[-2, 2], per occurrence of a generated token (default 0)")
    g.add_argument("--logprobs", type=int, help="with --json: the top LOGPROBS log-probabilities of every token, 0..20")
    g.add_argument("--prompt-logprobs", type=int, metavar="K",
                   help="with --json: each prompt token's log-probability and the top K there, 0..20 (vLLM's "
                   "prompt_logprobs)")
    g = p.add_argument_group("KV cache (the paper's memory manager)")
    g.add_argument("--policy", default=RUN_DEFAULTS["policy"], type=_choice(POLICIES), metavar="{" + ",".join(POLICIES) + "}",
                   help="paged (vLLM), or a contiguous Orca baseline reserving the max length / the prompt plus its "
                   "output rounded up to a power of two / exactly prompt + output (default: %(default)s)")
    g.add_argument("--block-size", type=int, default=RUN_DEFAULTS["block_size"],
                   help="tokens per KV block (default: %(default)s)")
    g.add_argument("--kv-blocks", type=int, help="KV pool size in blocks (default: just enough for this request)")
    g.add_argument("--kv-dtype", default="auto", metavar="{auto,int8}",
                   help="how the cache stores K/V: auto (the model's dtype) or int8 (8 bits and a float32 scale per "
                   "token and KV head: ~3.8x the tokens of float32 in the same bytes) (default: %(default)s)")
    g.add_argument("--kv-cache-dtype", metavar="{auto,int8}", help="vLLM's name for --kv-dtype")
    g.add_argument("--num-speculative-tokens", type=int, default=0, metavar="K",
                   help="speculative decoding: up to K draft tokens a step from an n-gram (prompt-lookup) draft, "
                   "verified by the model; greedy output unchanged (default: 0, off)")
    g.add_argument("--speculative-config", type=_json_object, metavar="JSON",
                   help="vLLM's spelling, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                   "\"prompt_lookup_max\": 3, \"prompt_lookup_min\": 1}': the n-gram draft's K and the longest and "
                   "shortest suffix it matches (without the last two, vLLM's 5 and 5); method ngram only")
    p.add_argument("--chrome-trace", metavar="PATH",
                   help="also write the engine's steps and the request's spans as a Chrome trace (JSON; open in "
                   "ui.perfetto.dev or chrome://tracing)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: prompt, outputs [{text, token_ids, cumulative_logprob, "
                   "finish_reason}], prompt_logprobs (with --prompt-logprobs), stats {num_steps, "
                   "max_concurrent_requests, num_preemptions, num_gpu_blocks, max_blocks_used_after_step}")


def _choice(allowed: tuple[str, ...]):
    def parse(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"{text!r} (allowed: {', '.join(allowed)})")
        return text

    return parse


def _json_object(text: str) -> dict:
    """A flag's JSON object (vLLM's --speculative-config): one key once, no NaN or Infinity."""
    from sim.base.trace_files import json_object, no_constant

    try:
        value = json.loads(text, object_pairs_hook=json_object, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON: {exc.msg} at character {exc.pos} (allowed: a JSON "
                                         f"object)") from None
    except ValueError as exc:  # the hooks: a key given twice, NaN or Infinity
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is a JSON {type(value).__name__} (allowed: a JSON object)")
    return value


def _check_kv_dtype(a: argparse.Namespace) -> None:
    """--kv-cache-dtype (vLLM's name) beside --kv-dtype: a value the engine has, and no disagreement."""
    from reference.engine.config import kv_dtype_of

    if a.kv_cache_dtype is not None:
        try:
            kv_dtype_of(a.kv_dtype, a.kv_cache_dtype, ("--kv-dtype", "--kv-cache-dtype"))
        except ValueError as exc:
            raise UsageError(str(exc)) from None


def _check_speculative_config(a: argparse.Namespace) -> None:
    """--speculative-config (vLLM's spelling) as the engine reads it, and beside --num-speculative-tokens."""
    from reference.engine.config import ngram_settings

    if a.speculative_config is None:
        return
    try:
        k = ngram_settings(a.speculative_config, "--speculative-config").num_speculative_tokens
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if a.num_speculative_tokens not in (0, k):
        raise UsageError(f"--num-speculative-tokens {a.num_speculative_tokens} with --speculative-config's "
                         f"num_speculative_tokens {k} (allowed: one of them, or both the same)")


def _check_generate_args(a: argparse.Namespace) -> None:
    """The flag rules, each with its allowed range (the engine checks again; this gives CLI wording)."""
    from reference.attention.quant import KV_DTYPES
    from reference.engine.prompts import check_text
    from reference.engine.sampling import (
        REPETITION_PENALTY_RANGE,  # (imports torch: not at the top, --help stays quick)
    )

    rules = [
        (a.prompt.strip() != "", "the prompt is empty", "a non-empty string"),
        (a.max_tokens >= 1, f"--max-tokens {a.max_tokens}", "an integer >= 1"),
        (a.n >= 1, f"--n {a.n}", "an integer >= 1"),
        (a.beam_width >= 1, f"--beam-width {a.beam_width}", "an integer >= 1"),
        (a.n == 1 or a.beam_width == 1, f"--n {a.n} with --beam-width {a.beam_width}", "at most one of them > 1"),
        (math.isfinite(a.temperature) and a.temperature >= 0, f"--temperature {a.temperature}", "a number >= 0"),
        (a.beam_width == 1 or a.temperature == 0, f"--beam-width {a.beam_width} with --temperature {a.temperature}",
         "--temperature 0: beam search is deterministic"),
        (0 < a.top_p <= 1, f"--top-p {a.top_p}", "a number in (0, 1]"),
        (a.top_k >= -1, f"--top-k {a.top_k}", "-1 or 0 (off) or an integer >= 1"),
        (a.seed >= 0, f"--seed {a.seed}", "an integer >= 0: the seed of the sampling generator"),
        (0 <= a.min_tokens <= a.max_tokens, f"--min-tokens {a.min_tokens}", "an integer from 0 to --max-tokens"),
        (0 <= a.min_p <= 1, f"--min-p {a.min_p}", "a number in [0, 1]"),
        (REPETITION_PENALTY_RANGE[0] <= a.repetition_penalty <= REPETITION_PENALTY_RANGE[1],
         f"--repetition-penalty {a.repetition_penalty}",
         f"a number in [{REPETITION_PENALTY_RANGE[0]:g}, {REPETITION_PENALTY_RANGE[1]:g}] (1 = off)"),
        (-2 <= a.presence_penalty <= 2, f"--presence-penalty {a.presence_penalty}", "a number in [-2, 2]"),
        (-2 <= a.frequency_penalty <= 2, f"--frequency-penalty {a.frequency_penalty}", "a number in [-2, 2]"),
        (a.logprobs is None or 0 <= a.logprobs <= 20, f"--logprobs {a.logprobs}", "an integer from 0 to 20"),
        (a.prompt_logprobs is None or 0 <= a.prompt_logprobs <= 20, f"--prompt-logprobs {a.prompt_logprobs}",
         "an integer from 0 to 20"),
        (all(a.stop or []), "--stop ''", "a non-empty text"),
        (a.beam_width == 1 or not (a.stop or a.min_tokens or a.logprobs is not None or a.min_p
                                   or a.prompt_logprobs is not None or a.repetition_penalty != 1
                                   or a.presence_penalty or a.frequency_penalty),
         f"--beam-width {a.beam_width} with sampling options", "beam search takes only --max-tokens, --ignore-eos"),
        (a.json or (a.logprobs is None and a.prompt_logprobs is None),
         "--logprobs / --prompt-logprobs without --json", "with --json only: the text output shows no log-probabilities"),
        (1 <= a.block_size <= 256, f"--block-size {a.block_size}", "an integer from 1 to 256"),
        (a.kv_blocks is None or a.kv_blocks >= 1, f"--kv-blocks {a.kv_blocks}", "an integer >= 1"),
        (a.kv_dtype in KV_DTYPES, f"--kv-dtype {a.kv_dtype!r}",
         "auto (the model's dtype) or int8 (8-bit K/V with a scale per token and KV head)"),
        (0 <= a.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS,
         f"--num-speculative-tokens {a.num_speculative_tokens}", f"an integer from 0 (off) to {MAX_SPECULATIVE_TOKENS}"),
        (a.model in ("smollm2", "gemma3", "random") or (Path(a.model) / "config.json").is_file(),
         f"--model {a.model!r} is not a checkpoint folder (no config.json)",
         "'smollm2', 'gemma3', 'random', or a local folder with a HF checkpoint"),
    ]
    for ok, what, allowed in rules:
        if not ok:
            raise UsageError(f"{what} (allowed: {allowed})")
    _check_kv_dtype(a)
    _check_speculative_config(a)
    try:  # bytes that are not UTF-8 reach Python as lone surrogates (surrogateescape)
        check_text(a.prompt, "the prompt")
    except ValueError:
        raise UsageError("the prompt holds bytes that are not UTF-8 (allowed: UTF-8 text)") from None


def _prompt_for(tokenizer, config, a: argparse.Namespace):
    """The prompt as the engine takes it: text (chat-templated with --chat), or token ids without a tokenizer."""
    if tokenizer is None:
        words = a.prompt.split()
        # ASCII digits only: int() also reads other scripts' digits ('٣' is 3), which no one means as a token id
        if not all(w.isascii() and w.lstrip("+-").isdigit() for w in words):
            raise UsageError(f"model {a.model!r} has no tokenizer: the prompt must be token ids "
                             "(allowed: space-separated integers, e.g. '1 5 7')")
        ids = [int(w) for w in words]
        if any(not 0 <= i < config.vocab_size for i in ids):
            raise UsageError(f"a prompt token id is out of range (allowed: 0 .. {config.vocab_size - 1})")
        return ids
    if a.chat and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": a.prompt}]
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return a.prompt


def blocks_for_request(policy: str, prompt_len: int, max_tokens: int, num_seqs: int, block_size: int,
                       max_model_len: int, model=None) -> int:
    """A KV pool (in blocks) that surely holds one request of num_seqs sequences under `policy`.

    NOTE: the CLI serves one request, so by default it sizes the pool for it instead of taking the engine's
    batch-sized default (1.4 GiB of float32 K/V on CPU: seconds just to zero-fill). The policy itself says what
    fits (sim.kv.pool_blocks_for asks its check_request): each sequence counted with its own copy of the
    prompt, a power of two of blocks. A prompt too long for the context is the engine's to refuse, so the
    lengths are clamped to the context here.
    """
    from sim.kv import pool_blocks_for

    final = min(prompt_len + max(1, min(max_tokens, max_model_len - prompt_len)), max_model_len)
    return pool_blocks_for(policy, min(prompt_len, final), final, num_seqs, block_size=block_size,
                           max_seq_len=max_model_len, model=model)


def _build_engine(a: argparse.Namespace):
    """(llm, prompt): load the model once, shape the prompt, size the pool (--kv-blocks, else for this request)."""
    from reference import LLM
    from reference.engine import executor
    from reference.models import load_model

    device = executor.default_device(None)
    model, tokenizer, config = load_model(a.model, dtype=executor.default_dtype(None, device), device=device)
    prompt = _prompt_for(tokenizer, config, a)
    blocks = a.kv_blocks
    if blocks is None:
        prompt_len = len(prompt) if isinstance(prompt, list) else len(tokenizer(prompt).input_ids)
        from reference.engine.kv_groups import model_spec
        from sim.kv import check_model

        spec = model_spec(config, model.dtype, a.model)  # hybrid groups its layers (and refuses a model without)
        check_model(a.policy, spec)
        blocks = blocks_for_request(a.policy, max(prompt_len, 1), a.max_tokens, max(a.n, a.beam_width),
                                    a.block_size, config.max_position_embeddings, spec)
    try:
        llm = LLM.from_loaded(model, tokenizer, policy=a.policy, block_size=a.block_size, num_gpu_blocks=blocks,
                              seed=a.seed, kv_dtype=a.kv_dtype, kv_cache_dtype=a.kv_cache_dtype,
                              num_speculative_tokens=a.num_speculative_tokens,
                              speculative_config=a.speculative_config)
    except (MemoryError, RuntimeError) as exc:  # torch's allocator: the pool does not fit this machine
        if not isinstance(exc, MemoryError) and "allocate" not in str(exc):
            raise
        raise UsageError(f"a KV pool of {blocks} blocks of {a.block_size} tokens does not fit in this machine's "
                         f"memory (allowed: fewer --kv-blocks, or a smaller --block-size)") from None
    return llm, prompt


def run_generate(a: argparse.Namespace) -> int:
    _check_generate_args(a)
    from reference import BeamSearchParams, SamplingParams

    if a.chrome_trace:  # before the model loads: an unwritable path is one line now, not after the run
        from sim.base.outfiles import check_outputs

        try:
            check_outputs({"--chrome-trace": a.chrome_trace})
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    try:  # NOTE: ValueError from the engine is a user error here (unknown model, pool too small, ...)
        llm, prompt = _build_engine(a)
        if a.beam_width > 1:
            params = BeamSearchParams(beam_width=a.beam_width, max_tokens=a.max_tokens, ignore_eos=a.ignore_eos)
        else:
            params = SamplingParams(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, max_tokens=a.max_tokens,
                                    n=a.n, seed=a.seed, ignore_eos=a.ignore_eos, stop=a.stop, min_tokens=a.min_tokens,
                                    min_p=a.min_p, repetition_penalty=a.repetition_penalty, logprobs=a.logprobs,
                                    presence_penalty=a.presence_penalty, frequency_penalty=a.frequency_penalty,
                                    prompt_logprobs=a.prompt_logprobs)
        request_id = llm.add_request(prompt, params)
    except ValueError as exc:
        message = str(exc)
        if a.kv_blocks is not None and message.startswith("request "):  # the scheduler: it can never fit the pool
            message = f"--kv-blocks {a.kv_blocks} is too small: {message.split(': ', 1)[-1]}"
        elif a.kv_blocks is not None and message.startswith("num_gpu_blocks "):  # the engine's bound, in this flag
            message = "--kv-blocks " + message.removeprefix("num_gpu_blocks ")
        raise UsageError(message) from None
    final = _run_steps(llm, request_id, stream=not a.json, hold=max(map(len, a.stop or [""]), default=0))
    if a.chrome_trace:
        from reference.engine.timeline import write_chrome_trace

        try:
            write_chrome_trace(llm, a.chrome_trace, title=f"python -m reference generate: {a.model}, policy {a.policy}")
        except OSError as exc:  # checked before the run, yet the disk can still be full (/dev/full): one line
            raise UsageError(f"--chrome-trace {a.chrome_trace}: cannot write it ({exc.strerror or exc})") from None
    if a.json:
        print(json.dumps(_summary(llm, a, prompt, final)))
    return 0


def _run_steps(llm, request_id: str, *, stream: bool, hold: int = 0):
    """Step the engine until the request is done. stream: n = 1 prints each step's new text at once; n > 1
    prints each completion when it finishes. Returns the request's final RequestOutput (None if it never ran).
    hold: the longest stop string; while running, that many characters but one stay unprinted, since a stop
    string completed later cuts them."""
    from reference.engine.outputs import settled_text

    printed, done, final = "", set(), None
    while llm.has_unfinished_requests():
        for out in llm.step():
            if out.request_id != request_id:
                continue
            final = out
            if stream and len(out.outputs) == 1:
                text = settled_text(out.outputs[0].text, False, hold)  # finished: the final print below
                if text.startswith(printed) and len(text) > len(printed):
                    print(text[len(printed):], end="", flush=True)
                    printed = text
            elif stream:
                for completion in out.outputs:
                    if completion.finish_reason is not None and completion.index not in done:
                        done.add(completion.index)
                        _print_completion(completion.index, completion)
    if stream and final is not None and len(final.outputs) == 1:
        rest = final.outputs[0].text
        print(rest[len(printed):] if rest.startswith(printed) else "", flush=True)
    return final


def _fields(out) -> dict:
    fields = {"text": out.text, "token_ids": list(out.token_ids), "cumulative_logprob": out.cumulative_logprob,
              "finish_reason": out.finish_reason, "stop_reason": getattr(out, "stop_reason", None)}
    if getattr(out, "logprobs", None) is not None:  # per token: [[token id, logprob, rank], ...], chosen first
        fields["logprobs"] = [[[t, lp.logprob, lp.rank] for t, lp in step.items()] for step in out.logprobs]
    return fields


def _print_completion(index: int, out) -> None:
    score = "" if out.cumulative_logprob is None else f", cumulative logprob {out.cumulative_logprob:.3f}"
    print(f"--- completion {index} (finish: {out.finish_reason}{score})")
    print(out.text, flush=True)


def _summary(llm, a: argparse.Namespace, prompt, final) -> dict:
    stats = llm.stats
    num_blocks = llm.kv_manager.num_blocks
    min_free = min((r.num_free_blocks for r in llm.step_log), default=num_blocks)
    extra = {}
    if a.prompt_logprobs is not None and final is not None:  # per prompt token: null, then [[id, logprob, rank], ...]
        extra["prompt_logprobs"] = [None if p is None else [[t, lp.logprob, lp.rank] for t, lp in p.items()]
                                    for p in final.prompt_logprobs]
    return {
        "prompt": a.prompt,
        "model_prompt": prompt,  # what the engine was given: chat-templated text, or token ids
        "outputs": [_fields(o) for o in (final.outputs if final is not None else [])],
        **extra,
        "stats": {
            "num_steps": stats.num_steps, "max_concurrent_requests": stats.max_concurrent_requests,
            "num_preemptions": stats.num_preemptions, "num_gpu_blocks": num_blocks,
            # NOTE: step_log counts free blocks AFTER each step, when finished sequences have already given
            # theirs back: this is the most blocks held between steps (a lower bound on the peak within one).
            "max_blocks_used_after_step": num_blocks - min_free,
            "policy": a.policy, "block_size": a.block_size,
        },
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench-kernels"]:  # every flag after it is the kernel benchmark's own (its --help too)
        from reference.attention import bench as kernel_bench

        return kernel_bench.main(argv[1:])
    if argv[:1] == ["bench-gpu"]:
        from reference.bench import bench_gpu

        return bench_gpu.main(argv[1:])
    args = build_parser().parse_args(argv)
    from sim.drivers.cli import broken_pipe, interruptible

    def body() -> int:
        try:
            return _dispatch(args, argv)
        except BrokenPipeError:  # the reader went away (`| head`): not bad input; stop quietly
            return broken_pipe()
        except UsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    return interruptible(body)


def _dispatch(args: argparse.Namespace, argv: list[str]) -> int:
    """Run the parsed command; UsageError for bad input (main prints it as one line)."""
    if args.command == "generate":
        return run_generate(args)
    if args.command == "serve":
        return run_serve(args)
    if args.command == "bench":
        from reference.bench import bench

        try:
            bench.check_args(args)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return bench.run(args, argv=["python", "-m", "reference", *argv])
    if args.command == "readme-numbers":
        from reference.validation import readme_numbers

        try:
            return readme_numbers.run(args)
        except (ValueError, OSError) as exc:  # no markers to --write into, a README or results file unreadable
            if isinstance(exc, BrokenPipeError):
                raise
            raise UsageError(" ".join(str(exc).split())) from None
    if args.command in ("bench-hybrid", "calibrate", "validate-sim", "loadtest", "kv-accuracy", "spec-bench",
                        "offload-bench"):
        from reference.bench import bench_hybrid, bench_offload, bench_speculative, loadtest
        from reference.validation import calibrate, kv_accuracy, validate_online, validate_sim

        command = {"bench-hybrid": bench_hybrid, "calibrate": calibrate, "loadtest": loadtest,
                   "kv-accuracy": kv_accuracy, "spec-bench": bench_speculative,
                   "offload-bench": bench_offload}.get(args.command, validate_sim)
        try:
            command.check_args(args)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if command is validate_sim and args.online:  # the same flags, checked by validate_sim; served over HTTP
            command = validate_online
        try:
            return command.run(args, argv=["python", "-m", "reference", *argv])
        except OSError as exc:  # an output that passed its checks and still cannot be written (a full disk)
            if isinstance(exc, BrokenPipeError):
                raise
            raise UsageError(f"cannot write the results: {exc.strerror or exc} ({exc.filename or 'an output'}); "
                             f"every output was left as it was") from None
    raise AssertionError(f"expected a known command, found {args.command!r}")  # argparse allows no other
