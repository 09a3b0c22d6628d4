"""The API half of `make peer` (tools/peer_vllm.py): does vLLM's offline API move to this engine by changing the
import? One process per system runs every check below and writes what each returned (JSON); tools/peer/api_table.py
compares the two systems check by check and writes figures/peer_api.csv and the README's table.

    python tools/peer/api_checks.py {vllm|engine} MODEL_DIR OUT.json

Each check is one piece of vLLM's offline API written as vLLM's documentation writes it (`from vllm import LLM,
SamplingParams`, `from vllm.inputs import TokensPrompt, TextPrompt`, `from vllm.sampling_params import
BeamSearchParams`); the engine's side imports the same names from `reference` and nothing else differs, not even
the model (the same SmolLM2 checkpoint folder). A check returns a small JSON-able dict (token ids, texts, types,
finish reasons), so that equal results mean the script would behave the same. Greedy or seeded, a few tokens each,
all in one process with one LLM: vLLM takes 70-160 s to start. A check that raises is recorded with the
exception's type and first line, and the run goes on. Not timed: the throughput runs are side.py's.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from types import SimpleNamespace

PROMPT = "The capital of France is"
OTHER = "def fibonacci(n):"
CHAT = [{"role": "user", "content": "What is 2+2?"}]
CHECKS: list[tuple[str, str, object]] = []  # (name, the vLLM code it runs, function of the API namespace)


def check(name: str, what: str):
    def register(fn):
        CHECKS.append((name, what, fn))
        return fn

    return register


def completion(c) -> dict:
    return {
        "token_ids": list(c.token_ids),
        "text": c.text,
        "finish_reason": c.finish_reason,
        "stop_reason": c.stop_reason,
    }


def top_logprobs(position) -> list | None:
    """One position of `logprobs` / `prompt_logprobs` ({token id: Logprob}) as [[id, logprob, rank], ...]."""
    if position is None:
        return None
    return sorted([int(t), lp.logprob, lp.rank] for t, lp in position.items())


@check("construct", '`LLM(model=path, dtype="float32", seed=0, enforce_eager=True, max_model_len=2048)`')
def construct(api):
    return {"type": type(api.llm).__name__}


@check("get_tokenizer", "`tok = llm.get_tokenizer()`; `tok.encode(text)`, `tok.decode(ids)`, `tok.eos_token_id`")
def get_tokenizer(api):
    tok = api.llm.get_tokenizer()
    ids = tok.encode(PROMPT)
    return {"ids": ids, "decoded": tok.decode(ids), "eos_token_id": tok.eos_token_id}


@check("generate_str", '`llm.generate("text", SamplingParams(temperature=0, max_tokens=8))`: one str prompt')
def generate_str(api):
    outs = api.llm.generate(PROMPT, api.SamplingParams(temperature=0, max_tokens=8))
    return {"outputs": len(outs), **completion(outs[0].outputs[0])}


@check("sampling_params_keyword", "`llm.generate(prompts, sampling_params=sp)`")
def sampling_params_keyword(api):
    outs = api.llm.generate([PROMPT], sampling_params=api.SamplingParams(temperature=0, max_tokens=8))
    return {"token_ids": list(outs[0].outputs[0].token_ids)}


@check("tokens_prompt", "`TokensPrompt(prompt_token_ids=ids)` as the prompt")
def tokens_prompt(api):
    ids = api.llm.get_tokenizer().encode(PROMPT)
    out = api.llm.generate([api.TokensPrompt(prompt_token_ids=ids)], api.SamplingParams(temperature=0, max_tokens=8))
    return {"token_ids": list(out[0].outputs[0].token_ids), "prompt": out[0].prompt}


@check("token_ids_dict", '`{"prompt_token_ids": ids}` as the prompt')
def token_ids_dict(api):
    ids = api.llm.get_tokenizer().encode(PROMPT)
    out = api.llm.generate([{"prompt_token_ids": ids}], api.SamplingParams(temperature=0, max_tokens=8))
    return {"token_ids": list(out[0].outputs[0].token_ids)}


@check("text_prompt", '`TextPrompt(prompt="text")` and `{"prompt": "text"}` as prompts')
def text_prompt(api):
    out = api.llm.generate(
        [api.TextPrompt(prompt=PROMPT), {"prompt": OTHER}], api.SamplingParams(temperature=0, max_tokens=8)
    )
    return {"prompts": [o.prompt for o in out], "token_ids": [list(o.outputs[0].token_ids) for o in out]}


@check("batch_order", "`llm.generate([p1, p2, p3], sp)`: one output per prompt, in order")
def batch_order(api):
    prompts = [OTHER, PROMPT, "Water boils at"]
    out = api.llm.generate(prompts, api.SamplingParams(temperature=0, max_tokens=6))
    return {"prompts": [o.prompt for o in out], "token_ids": [list(o.outputs[0].token_ids) for o in out]}


@check("params_per_prompt", "`llm.generate([p1, p2], [sp1, sp2])`: one SamplingParams per prompt")
def params_per_prompt(api):
    sps = [api.SamplingParams(temperature=0, max_tokens=2), api.SamplingParams(temperature=0, max_tokens=5)]
    out = api.llm.generate([PROMPT, OTHER], sps)
    return {"lengths": [len(o.outputs[0].token_ids) for o in out]}


@check("request_output", "`RequestOutput`: `.prompt`, `.prompt_token_ids`, `.finished`, `len(.outputs)`")
def request_output(api):
    out = api.llm.generate([PROMPT], api.SamplingParams(temperature=0, max_tokens=4))[0]
    return {
        "prompt": out.prompt,
        "prompt_token_ids": list(out.prompt_token_ids),
        "finished": out.finished,
        "outputs": len(out.outputs),
    }


@check("request_id", "`RequestOutput.request_id`: its type; distinct per request")
def request_id(api):
    out = api.llm.generate([PROMPT, OTHER], api.SamplingParams(temperature=0, max_tokens=2))
    return {"type": type(out[0].request_id).__name__, "distinct": out[0].request_id != out[1].request_id}


@check("completion_output", "`CompletionOutput`: `.index`, `.text`, `.token_ids`, `.finish_reason`, `.finished()`")
def completion_output(api):
    c = api.llm.generate([PROMPT], api.SamplingParams(temperature=0, max_tokens=8))[0].outputs[0]
    return {"index": c.index, "finished()": c.finished(), **completion(c)}


@check("cumulative_logprob", "`CompletionOutput.cumulative_logprob`, without and with `logprobs=0`")
def cumulative_logprob(api):
    plain, with_lp = (
        api.llm.generate([PROMPT], api.SamplingParams(temperature=0, max_tokens=6, logprobs=lp))[0]
        .outputs[0]
        .cumulative_logprob
        for lp in (None, 0)
    )
    return {"without": plain, "logprobs=0": with_lp}


@check("logprobs", "`SamplingParams(logprobs=2)`: `CompletionOutput.logprobs`, {token id: `Logprob`} per token")
def logprobs(api):
    c = api.llm.generate([PROMPT], api.SamplingParams(temperature=0, max_tokens=3, logprobs=2))[0].outputs[0]
    return {"token_ids": list(c.token_ids), "logprobs": [top_logprobs(p) for p in c.logprobs]}


@check("logprob_rank", "`Logprob.rank` and `.decoded_token` of each sampled token (greedy: rank 1)")
def logprob_rank(api):
    c = api.llm.generate([PROMPT], api.SamplingParams(temperature=0, max_tokens=4, logprobs=1))[0].outputs[0]
    chosen = [p[t] for t, p in zip(c.token_ids, c.logprobs)]
    return {"ranks": [lp.rank for lp in chosen], "decoded": [lp.decoded_token for lp in chosen]}


@check("prompt_logprobs", "`SamplingParams(prompt_logprobs=1)`: `RequestOutput.prompt_logprobs`")
def prompt_logprobs(api):
    out = api.llm.generate([PROMPT], api.SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1))[0]
    return {"prompt_logprobs": [top_logprobs(p) for p in out.prompt_logprobs]}


@check("stop", '`SamplingParams(stop=["."])`: text ends before it; `.stop_reason` is the string')
def stop(api):
    c = api.llm.generate([PROMPT], api.SamplingParams(temperature=0, max_tokens=16, stop=["."]))[0].outputs[0]
    return completion(c)


@check("include_stop_str_in_output", '`SamplingParams(stop=["."], include_stop_str_in_output=True)`')
def include_stop_str(api):
    sp = api.SamplingParams(temperature=0, max_tokens=16, stop=["."], include_stop_str_in_output=True)
    return completion(api.llm.generate([PROMPT], sp)[0].outputs[0])


@check("stop_token_ids", "`SamplingParams(stop_token_ids=[id])`: `.stop_reason` is the id")
def stop_token_ids(api):
    ids = api.llm.generate([PROMPT], api.SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].token_ids
    sp = api.SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[ids[2]])
    return completion(api.llm.generate([PROMPT], sp)[0].outputs[0])


@check("min_tokens", "`SamplingParams(min_tokens=5, stop_token_ids=[id])`: no stop before 5 tokens")
def min_tokens(api):
    ids = api.llm.generate([PROMPT], api.SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].token_ids
    sp = api.SamplingParams(temperature=0, max_tokens=12, min_tokens=5, stop_token_ids=[ids[1]])
    return completion(api.llm.generate([PROMPT], sp)[0].outputs[0])


@check("eos", "end of sequence: `finish_reason`, `stop_reason`, EOS among `token_ids`; `ignore_eos=True`")
def eos(api):
    conv = api.llm.get_tokenizer().apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    stopped = api.llm.generate([conv], api.SamplingParams(temperature=0, max_tokens=64))[0].outputs[0]
    ignored = api.llm.generate([conv], api.SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0]
    return {
        "stopped": completion(stopped),
        "ignore_eos": [len(ignored.outputs[0].token_ids), ignored.outputs[0].finish_reason],
    }


@check("penalties", "`SamplingParams(presence_penalty=1.0, frequency_penalty=0.5)`, greedy")
def penalties(api):
    sp = api.SamplingParams(temperature=0, max_tokens=16, presence_penalty=1.0, frequency_penalty=0.5)
    return {"token_ids": list(api.llm.generate([OTHER], sp)[0].outputs[0].token_ids)}


@check("repetition_penalty", "`SamplingParams(repetition_penalty=1.3)`, greedy")
def repetition_penalty(api):
    sp = api.SamplingParams(temperature=0, max_tokens=16, repetition_penalty=1.3)
    return {"token_ids": list(api.llm.generate([OTHER], sp)[0].outputs[0].token_ids)}


@check("min_p_top_k", "`SamplingParams(temperature=1.0, seed=0, min_p=1.0)` and `top_k=1`: the greedy tokens")
def min_p_top_k(api):
    greedy = api.llm.generate([PROMPT], api.SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].token_ids
    min_p, top_k = (
        api.llm.generate([PROMPT], api.SamplingParams(temperature=1.0, seed=0, max_tokens=8, **kw))[0]
        .outputs[0]
        .token_ids
        for kw in ({"min_p": 1.0}, {"top_k": 1})
    )
    return {"min_p=1 is greedy": list(min_p) == list(greedy), "top_k=1 is greedy": list(top_k) == list(greedy)}


@check("skip_special_tokens", "`SamplingParams(skip_special_tokens=False)`: special tokens in `.text`")
def skip_special_tokens(api):
    conv = api.llm.get_tokenizer().apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    texts = [
        api.llm.generate(
            [conv], api.SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, skip_special_tokens=skip)
        )[0]
        .outputs[0]
        .text
        for skip in (False, True)
    ]
    return {"skip=False": texts[0], "skip=True": texts[1]}


@check("seed", "`SamplingParams(temperature=0.8, seed=123)`: the same text in one batch and across calls")
def seed(api):
    sp = api.SamplingParams(temperature=0.8, seed=123, max_tokens=8)
    first = [list(o.outputs[0].token_ids) for o in api.llm.generate([PROMPT, PROMPT], sp)]
    again = list(api.llm.generate([PROMPT], sp)[0].outputs[0].token_ids)
    return {"same in batch": first[0] == first[1], "same across calls": first[0] == again}


@check("n_samples", "`SamplingParams(n=3, temperature=0.8, seed=0)`: `.outputs` and their `.index`")
def n_samples(api):
    sp = api.SamplingParams(n=3, temperature=0.8, seed=0, max_tokens=6)
    runs = [api.llm.generate([PROMPT], sp)[0].outputs for _ in range(2)]
    return {
        "outputs": len(runs[0]),
        "indices": sorted(c.index for c in runs[0]),
        "reproducible": [list(c.token_ids) for c in runs[0]] == [list(c.token_ids) for c in runs[1]],
    }


@check("chat", "`llm.chat(messages, SamplingParams(temperature=0, max_tokens=8))`")
def chat(api):
    out = api.llm.chat(CHAT, api.SamplingParams(temperature=0, max_tokens=8))
    return {"outputs": len(out), "prompt_token_ids": list(out[0].prompt_token_ids), **completion(out[0].outputs[0])}


@check("chat_batch", "`llm.chat([conversation1, conversation2], sp)`")
def chat_batch(api):
    other = [{"role": "user", "content": "Name a planet."}]
    out = api.llm.chat([CHAT, other], api.SamplingParams(temperature=0, max_tokens=6))
    return {"token_ids": [list(o.outputs[0].token_ids) for o in out]}


@check("beam_search", "`llm.beam_search([TokensPrompt(...)], BeamSearchParams(beam_width=2, max_tokens=6))`")
def beam_search(api):
    ids = api.llm.get_tokenizer().encode(PROMPT)
    out = api.llm.beam_search(
        [api.TokensPrompt(prompt_token_ids=ids)], api.BeamSearchParams(beam_width=2, max_tokens=6)
    )
    return {"sequences": [[list(s.tokens), s.text, s.cum_logprob] for s in out[0].sequences]}


@check("beam_search_text", '`llm.beam_search([{"prompt": "text"}], BeamSearchParams(beam_width=3, max_tokens=4))`')
def beam_search_text(api):
    out = api.llm.beam_search([{"prompt": OTHER}], api.BeamSearchParams(beam_width=3, max_tokens=4))
    return {"tokens": [list(s.tokens) for s in out[0].sequences]}


@check("sampling_params_defaults", "`SamplingParams()`: the defaults a script relies on")
def sampling_params_defaults(api):
    sp = api.SamplingParams()
    names = ("n", "temperature", "top_p", "top_k", "min_p", "max_tokens", "repetition_penalty", "logprobs", "stop")
    return {name: getattr(sp, name) for name in names}


@check("sampling_params_refused", "`SamplingParams(temperature=-1.0)`: refused; with a ValueError?")
def sampling_params_refused(api):
    try:
        api.SamplingParams(temperature=-1.0)
    except Exception as exc:  # noqa: BLE001 - which class is the question
        return {"refused": True, "is a ValueError": isinstance(exc, ValueError)}
    return {"refused": False}


def jsonable(value):
    return json.loads(json.dumps(value, default=repr))


def error(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:200]


def main() -> None:
    system, model_dir, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
    package = "vllm" if system == "vllm" else "reference"  # the one difference between the two sides
    top = importlib.import_module(package)
    inputs, params = importlib.import_module(f"{package}.inputs"), importlib.import_module(f"{package}.sampling_params")
    if system == "vllm":
        version = f"vllm {top.__version__}"
    else:
        from importlib.metadata import version as installed

        import torch

        version = f"paged-attention-lab {installed('paged-attention-lab')}, torch {torch.__version__}"
    api = SimpleNamespace(
        LLM=top.LLM,
        SamplingParams=top.SamplingParams,
        TokensPrompt=inputs.TokensPrompt,
        TextPrompt=inputs.TextPrompt,
        BeamSearchParams=params.BeamSearchParams,
        llm=None,
    )
    results: dict[str, dict] = {}
    started = time.perf_counter()
    try:
        api.llm = api.LLM(model=model_dir, dtype="float32", seed=0, enforce_eager=True, max_model_len=2048)
    except Exception as exc:  # the keywords refused: record it, and go on with the model alone
        results["construct"] = {"error": error(exc)}
        try:
            api.llm = api.LLM(model=model_dir)
        except Exception as again:  # no LLM at all: every check fails with this
            results.update({name: {"error": f"no LLM: {error(again)}"} for name, _, _ in CHECKS})
    load_s = time.perf_counter() - started
    for name, _, fn in CHECKS:
        if name in results:
            continue
        try:
            results[name] = {"value": jsonable(fn(api))}
        except Exception as exc:
            results[name] = {"error": error(exc)}
        print(
            f"{system} {name}: {'error ' + results[name]['error'] if 'error' in results[name] else 'ok'}",
            file=sys.stderr,
            flush=True,
        )
    with open(out_path, "w") as f:
        json.dump(
            {
                "version": version,
                "load_s": load_s,
                "checks_s": time.perf_counter() - started - load_s,
                "results": results,
            },
            f,
        )


if __name__ == "__main__":  # vLLM's CPU build starts worker processes: the guard is required
    main()
