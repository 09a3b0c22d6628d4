"""vLLM's offline API, both ways: scripts written for vLLM run with `vllm` replaced by `reference` in the import
(and the model name replaced by the embedded one: no model hub here), and vLLM's keywords are accepted with a
meaning or refused with one clear message."""

from __future__ import annotations

import textwrap

import pytest
import torch

from reference import LLM, SamplingParams, TokensPrompt
from reference.engine.kv_cache import kv_bytes_per_block

# After vLLM's examples/offline_inference/basic/basic.py and chat.py, and the docs' TokensPrompt and beam search
# snippets (vLLM 0.32 documentation), written for vLLM; only the import and the model name are changed by run().
VLLM_SCRIPTS = {
    "basic": """
        from vllm import LLM, SamplingParams
        prompts = ["Hello, my name is", "The capital of France is"]
        sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=8, seed=0)
        llm = LLM(model="facebook/opt-125m", dtype="float32", gpu_memory_utilization=0.9, max_model_len=256)
        outputs = llm.generate(prompts, sampling_params)
        for output in outputs:
            result.append((output.prompt, output.outputs[0].text, output.outputs[0].finished()))
    """,
    "keyword and tokens": """
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        llm = LLM(model="facebook/opt-125m", seed=0, enforce_eager=True, max_model_len=256)
        tokenizer = llm.get_tokenizer()
        ids = tokenizer("The capital of France is").input_ids
        outputs = llm.generate([TokensPrompt(prompt_token_ids=ids), {"prompt": "Hello"}],
                               sampling_params=SamplingParams(temperature=0, max_tokens=6, stop=["\\n"], logprobs=2))
        result.extend((o.outputs[0].token_ids, o.outputs[0].finish_reason, len(o.outputs[0].logprobs)) for o in outputs)
    """,
    "chat": """
        from vllm import LLM, SamplingParams
        llm = LLM(model="facebook/opt-125m", max_model_len=256)
        conversation = [{"role": "system", "content": "You are a helpful assistant"},
                        {"role": "user", "content": "Write one word."}]
        outputs = llm.chat(conversation, SamplingParams(temperature=0, max_tokens=8))
        result.append(outputs[0].outputs[0].text)
    """,
    "request ids and prompt logprobs": """
        from vllm import LLM, SamplingParams
        llm = LLM(model="facebook/opt-125m", max_model_len=256)
        outputs = llm.generate(["Hello, my name is", "Hi"], SamplingParams(max_tokens=1, prompt_logprobs=1))
        for out in outputs:
            scored, ids = out.prompt_logprobs[1:], out.prompt_token_ids[1:]
            result.append((out.request_id, out.prompt_logprobs[0], len(scored) == len(ids),
                           all(next(iter(p)) == t and 1 <= len(p) <= 2 for p, t in zip(scored, ids))))
    """,
    "beam search import": """
        from vllm.sampling_params import BeamSearchParams
        result.append(BeamSearchParams(beam_width=2, max_tokens=4).beam_width)
    """,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", VLLM_SCRIPTS)
def test_a_vllm_script_runs_with_the_import_changed(name, smol, monkeypatch):
    code = textwrap.dedent(VLLM_SCRIPTS[name]).replace("from vllm", "from reference")
    code = code.replace('model="facebook/opt-125m"', "model=MODEL")
    monkeypatch.setattr("reference.models.load_model", lambda *a, **k: smol)  # loaded once for the module
    result: list = []
    exec(compile(code, f"<vLLM example {name}>", "exec"), {"result": result, "MODEL": "smollm2"})
    assert result
    if name == "basic":
        assert [r[0] for r in result] == ["Hello, my name is", "The capital of France is"] and all(r[2] for r in result)
    if name == "keyword and tokens":
        assert all(reason in ("stop", "length") and n == len(ids) for ids, reason, n in result)
    if name == "request ids and prompt logprobs":  # vLLM's ids: str(next(counter)) per LLM
        assert result == [("0", None, True, True), ("1", None, True, True)]


def engine(smol, **kwargs):
    kwargs.setdefault("num_gpu_blocks", 64)
    kwargs.setdefault("max_model_len", 256)
    return LLM.from_loaded(*smol, **kwargs)


def test_generate_takes_sampling_params_by_name_and_prompt_dicts(smol):
    llm = engine(smol)
    tok = smol[1]
    ids = tok("The capital of France is").input_ids
    greedy = SamplingParams(temperature=0, max_tokens=5)
    by_position = llm.generate("The capital of France is", greedy)[0].outputs[0].token_ids
    assert (
        llm.generate(TokensPrompt(prompt_token_ids=ids), sampling_params=greedy)[0].outputs[0].token_ids == by_position
    )
    with pytest.raises(TypeError, match="give the SamplingParams once"):
        llm.generate("hi", greedy, sampling_params=greedy)


def test_chat_renders_the_template_and_generates(smol):
    llm = engine(smol)
    conversation = [{"role": "user", "content": "What is 2+2?"}]
    ids = list(smol[1].apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)["input_ids"])
    greedy = SamplingParams(temperature=0, max_tokens=6)
    [out] = llm.chat(conversation, greedy)
    assert out.prompt_token_ids == ids and out.prompt.endswith("<|im_start|>assistant\n")
    assert out.outputs[0].token_ids == llm.generate([ids], greedy)[0].outputs[0].token_ids
    assert len(llm.chat([conversation, conversation], greedy)) == 2
    with pytest.raises(TypeError, match="messages must be a conversation"):
        llm.chat(["What is 2+2?"], greedy)


def test_chat_without_a_template_is_refused():
    from reference.models import random_model

    with pytest.raises(ValueError, match="no chat template"):
        LLM.from_loaded(random_model(), num_gpu_blocks=8).chat([{"role": "user", "content": "hi"}])


def test_vllms_memory_keywords_size_the_pools(smol):
    model, _, config = smol
    per_block = kv_bytes_per_block(config.num_layers, 16, config.num_kv_heads, config.head_dim, torch.float32)
    llm = LLM.from_loaded(
        *smol[:2], kv_cache_memory_bytes=10 * per_block + 5, swap_space=4 * per_block / 2**30, max_model_len=256
    )
    assert llm.kv_manager.num_free_blocks == 10 and llm.kv_manager.num_cpu_blocks == 4
    # on the CPU, gpu_memory_utilization changes nothing (as in vLLM's CPU build); explicit sizes win anyway
    assert engine(smol, gpu_memory_utilization=0.5).kv_manager.num_free_blocks == 64


@pytest.mark.parametrize(
    "kwargs, exc, fragment",
    [
        (dict(tensor_parallel_size=2), ValueError, "this engine runs on one device (allowed: 1)"),
        (dict(enforce_eager="yes"), TypeError, "enforce_eager must be True or False"),
        (dict(trust_remote_code=None), TypeError, "trust_remote_code must be True or False"),
        (dict(gpu_memory_utilization=1.5), ValueError, "gpu_memory_utilization must be in (0, 1]"),
        (dict(kv_cache_memory_bytes=10**6, kv_budget_bytes=10**6), ValueError, "not both"),
        (dict(swap_space=-1.0), ValueError, "swap_space must be >= 0"),
        (dict(swap_space=1.0, num_cpu_blocks=4), ValueError, "num_cpu_blocks or swap_space"),
        (dict(dtype="float64"), ValueError, "unknown dtype 'float64' (allowed: auto, float32"),
    ],
)
def test_vllms_keywords_refused_with_one_message(kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        LLM("random", **kwargs)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("float32", torch.float32),
        ("float", torch.float32),
        ("auto", torch.float32),
        ("bfloat16", torch.bfloat16),
        (torch.float32, torch.float32),
    ],
)
def test_dtype_names_are_vllms(name, dtype):
    assert LLM("random", dtype=name, num_gpu_blocks=4).dtype == dtype


# ---- vLLM's spellings of the engine's own settings: kv_cache_dtype, speculative_config --------------------------
REPETITIVE = [[5, 6, 7, 8, 9] * 3 + [5, 6], [1, 2, 3, 4] * 6, list(range(30, 60))]


def _greedy(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(REPETITIVE, params)]


@pytest.mark.parametrize("value", ["auto", "int8"])
def test_kv_cache_dtype_is_vllms_name_for_kv_dtype(value):
    from reference.models import random_model

    tiny = random_model(seed=1)
    theirs = LLM.from_loaded(tiny, num_gpu_blocks=64, kv_cache_dtype=value)
    ours = LLM.from_loaded(tiny, num_gpu_blocks=64, kv_dtype=value)
    # the same settings (vLLM's name folded into kv_dtype), the same cache, the same greedy tokens
    assert theirs.engine_config == ours.engine_config and theirs.engine_config.kv_cache_dtype is None
    assert theirs.kv_cache.cache_dtype == ours.kv_cache.cache_dtype == (torch.int8 if value == "int8" else tiny.dtype)
    assert _greedy(theirs) == _greedy(ours)
    both = LLM.from_loaded(tiny, num_gpu_blocks=64, kv_dtype=value, kv_cache_dtype=value)  # agreeing: allowed
    assert both.engine_config == ours.engine_config


def test_speculative_config_is_vllms_spelling_of_the_ngram_settings():
    from reference.models import random_model

    tiny = random_model(seed=1)
    config = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 1}
    theirs = LLM.from_loaded(tiny, num_gpu_blocks=64, speculative_config=config)
    ours = LLM.from_loaded(tiny, num_gpu_blocks=64, num_speculative_tokens=3, prompt_lookup_max=2, prompt_lookup_min=1)
    plain = LLM.from_loaded(tiny, num_gpu_blocks=64)
    assert theirs.engine_config == ours.engine_config and theirs.engine_config.speculative_config is None
    assert _greedy(theirs) == _greedy(ours) == _greedy(plain)  # greedy verification: plain decoding's tokens
    assert theirs.stats.num_draft_tokens == ours.stats.num_draft_tokens > 0  # the same drafts, step by step
    # the lookup sizes reach the draft: only 20-grams may match now, which these short texts rarely repeat
    longest = LLM.from_loaded(
        tiny, num_gpu_blocks=64, speculative_config={**config, "prompt_lookup_max": 20, "prompt_lookup_min": 20}
    )
    assert _greedy(longest) == _greedy(plain) and longest.stats.num_draft_tokens < ours.stats.num_draft_tokens


@pytest.mark.parametrize(
    "config, settings",
    [
        ({"method": "ngram", "num_speculative_tokens": 4}, (4, 5, 5)),  # vLLM's defaults for its ngram method
        (
            {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3},
            (4, 3, 3),
        ),  # one: the other equals it
        ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2}, (4, 2, 2)),
        ({"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_max": 4, "prompt_lookup_min": 2}, (1, 4, 2)),
    ],
)
def test_speculative_config_is_completed_by_vllms_rules(config, settings):
    from reference.engine.config import EngineConfig

    c = EngineConfig(speculative_config=config)
    assert (c.num_speculative_tokens, c.prompt_lookup_max, c.prompt_lookup_min) == settings
    # the same keys given both ways, agreeing, are allowed
    assert EngineConfig(speculative_config=config, num_speculative_tokens=settings[0]) == c


NGRAM = {"method": "ngram", "num_speculative_tokens": 3}


@pytest.mark.parametrize(
    "kwargs, exc, fragment",
    [
        # a cache vLLM has and this engine has not: refused, never approximated by another
        (dict(kv_cache_dtype="fp8"), ValueError, "kv_cache_dtype must be one of auto, int8 (auto: the model's dtype; "),
        (dict(kv_cache_dtype="fp8_e4m3"), ValueError, "vLLM's fp8 caches are not in this engine), got 'fp8_e4m3'"),
        (dict(kv_cache_dtype="fp8_e5m2"), ValueError, "got 'fp8_e5m2'"),
        (dict(kv_cache_dtype="bfloat16"), ValueError, "kv_cache_dtype must be one of auto, int8"),
        (dict(kv_cache_dtype=8), ValueError, "kv_cache_dtype must be one of auto, int8"),
        (
            dict(kv_dtype="int8", kv_cache_dtype="auto"),
            ValueError,
            "kv_dtype 'int8' and kv_cache_dtype 'auto' (vLLM's name for the same setting) disagree (allowed: one of them",
        ),
        (dict(kv_dtype="fp8"), ValueError, "kv_dtype must be one of auto, int8"),
        # speculative_config: the n-gram method only, vLLM's keys for it only, in range, agreeing with the keywords
        (
            dict(
                speculative_config={
                    "method": "eagle",
                    "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B",
                    "num_speculative_tokens": 3,
                }
            ),
            ValueError,
            "speculative_config: key 'model' is not",
        ),
        (
            dict(speculative_config={"method": "eagle", "num_speculative_tokens": 3}),
            ValueError,
            "speculative_config: method 'eagle': this engine drafts by prompt lookup only",
        ),
        (dict(speculative_config={"method": "medusa", "num_speculative_tokens": 3}), ValueError, "(allowed: 'ngram')"),
        (dict(speculative_config={"method": "draft_model", "num_speculative_tokens": 3}), ValueError, "'draft_model'"),
        (dict(speculative_config={"num_speculative_tokens": 3}), ValueError, "method None"),
        (
            dict(speculative_config={**NGRAM, "disable_logprobs": False}),
            ValueError,
            "key 'disable_logprobs' is not taken here: the engine's draft is vLLM's n-gram one (allowed keys: method, ",
        ),
        (
            dict(speculative_config={"method": "ngram"}),
            ValueError,
            "num_speculative_tokens is missing (allowed: an int",
        ),
        (
            dict(speculative_config={**NGRAM, "num_speculative_tokens": 0}),
            ValueError,
            "speculative_config num_speculative_tokens must be >= 1, got 0",
        ),
        (dict(speculative_config={**NGRAM, "num_speculative_tokens": 65}), ValueError, "(allowed: 1 .. 64)"),
        (
            dict(speculative_config={**NGRAM, "num_speculative_tokens": 2.5}),
            TypeError,
            "speculative_config num_speculative_tokens must be an integer, got float 2.5",
        ),
        (dict(speculative_config={**NGRAM, "prompt_lookup_max": 0}), ValueError, "prompt_lookup_max must be >= 1"),
        (
            dict(speculative_config={**NGRAM, "prompt_lookup_max": 2, "prompt_lookup_min": 3}),
            ValueError,
            "speculative_config: prompt_lookup_min 3 is more than prompt_lookup_max 2 (allowed: 1 <= prompt_lookup_min",
        ),
        (dict(speculative_config='{"method": "ngram"}'), TypeError, "speculative_config must be a dict such as"),
        (
            dict(speculative_config=NGRAM, num_speculative_tokens=2),
            ValueError,
            "num_speculative_tokens 2 and speculative_config's num_speculative_tokens 3 disagree (allowed: one of them",
        ),
        (
            dict(speculative_config=NGRAM, prompt_lookup_max=4),
            ValueError,
            "prompt_lookup_max 4 and speculative_config's prompt_lookup_max 5 disagree",
        ),
    ],
)
def test_vllms_spellings_refused_with_one_message(kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        LLM("random", **kwargs)
    assert fragment in str(info.value) and "\n" not in str(info.value)
