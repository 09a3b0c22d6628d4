"""The Python API refuses bad input whole, before queuing anything, with the exception and words that say why.

One table per entry point (input -> exception type, a fragment of its message). After every refused call nothing
of it is queued: a request queued before it is still the only one, and once that one finishes the pool is
entirely free. Integers must be integers (not bools, not floats; numpy integers are converted), numbers finite,
prompts a str, token ids, or vLLM's {"prompt": ...} / {"prompt_token_ids": ...} dicts (never bytes). Every
refusal is one line (no newline in the message).
The engine is the tiny random Llama with a byte tokenizer (text = its UTF-8 bytes), so text prompts work too; chat()
pairs SmolLM2's tokenizer and chat template with a random model of its vocabulary.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from reference import LLM, BeamSearchParams, SamplingParams
from reference.models import random_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


class ByteTokenizer:
    """Text <-> its UTF-8 bytes as token ids: the tiny model's vocabulary is 256."""

    def __call__(self, text: str):
        return SimpleNamespace(input_ids=list(text.encode()))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode(errors="replace")


@pytest.fixture(scope="module")
def tiny():
    return random_model(seed=5, tie_word_embeddings=False)  # untied: its tokens depend on the whole prompt


@pytest.fixture
def llm(tiny):
    return LLM.from_loaded(tiny, ByteTokenizer(), block_size=4, num_gpu_blocks=24, max_model_len=64)


def assert_nothing_queued_but(llm: LLM, bystander: str) -> None:
    """Only `bystander` is queued; it then finishes, and the pool is entirely free."""
    queued = llm.scheduler_request_id(bystander)
    assert llm.scheduler.waiting_request_ids() + llm.scheduler.running_request_ids() == [queued]
    assert list(llm._requests) == [queued]
    while llm.has_unfinished_requests():
        llm.step()
    kv = llm.kv_manager
    assert not llm._requests and kv.num_free_blocks == kv.num_blocks
    kv.check_invariants()


LONG = [7] * 64  # max_model_len 64: at most 63 prompt tokens

GENERATE = {  # id: (prompts, params, exception, message fragment)
    "bytes": (b"hello", None, TypeError, "got bytes"),
    "bytearray": (bytearray(b"hi"), None, TypeError, "got bytearray"),
    "bytes in a list": (["hi", b"hi"], None, TypeError, "prompt 1: prompts must be a str"),
    "a str then an int": (["hi", 5], None, TypeError, "prompt 1: prompts must be a str, a list of token ids"),
    "None": (None, None, TypeError, "got NoneType"),
    "an int": (5, None, TypeError, "got int"),
    "a set": ({"hi"}, None, TypeError, "got set"),
    "a float token id": ([1, 2.0], None, TypeError, "token ids must be integers, got float"),
    "a bool token id": ([True, 3], None, TypeError, "got bool"),
    "a str among token ids": ([5, "hi"], None, TypeError, "got str 'hi' at position 1"),
    "a float id in the 2nd prompt": ([[1, 2], [3, 4.5]], None, TypeError, "prompt 1: token ids must be integers"),
    "a token id over the vocabulary": ([[1], [1, 256]], None, ValueError, "prompt 1: token id 256 is outside"),
    "a negative token id": ([-1, 4], None, ValueError, "token id -1 is outside the vocabulary"),
    "a float array": (np.array([1.0, 2.0]), None, TypeError, "integer dtype"),
    "a 3-D array": (np.zeros((1, 1, 2), dtype=np.int64), None, ValueError, "1-D"),
    "a dict with an unknown key": (
        {"text": "hi"},
        None,
        ValueError,
        "exactly one of the keys 'prompt', 'prompt_token_ids'",
    ),
    "a dict with both keys": ({"prompt": "hi", "prompt_token_ids": [1]}, None, ValueError, "exactly one of the keys"),
    "an empty dict": ({}, None, ValueError, "exactly one of the keys"),
    "a dict prompt not str": ({"prompt": 5}, None, TypeError, "'prompt' must be a str"),
    "a dict of ids as str": ({"prompt_token_ids": "12"}, None, TypeError, "'prompt_token_ids' must be a list"),
    "a dict of float ids": ({"prompt_token_ids": [1.5]}, None, TypeError, "token ids must be integers"),
    "a bad dict after a good one": ([{"prompt": "a"}, {"prompts": "b"}], None, ValueError, "prompt 1: a prompt dict"),
    "an empty str": ("", None, ValueError, "the prompt is empty"),
    "an empty id list": ([[1], []], None, ValueError, "prompt 1 is empty"),
    "too long after a good one": (["hi", LONG], None, ValueError, "prompt 1 has 64 tokens, too long"),
    "too many params": (["a", "b"], [GREEDY] * 3, ValueError, "got 3 SamplingParams for 2 prompts"),
    "params as a dict": (["a"], {"temperature": 0}, TypeError, "must be SamplingParams, got dict"),
    "a bad params in the list": (["a", "b"], [GREEDY, "x"], TypeError, "params[1] must be SamplingParams"),
    "beam params": (["a"], BeamSearchParams(beam_width=2, max_tokens=4), TypeError, "use beam_search()"),
    "more blocks than the pool (the scheduler's check)": (
        ["a", [5] * 30],
        [GREEDY, SamplingParams(n=4, max_tokens=30)],
        ValueError,
        "prompt 1: 4 sequence(s) of final length 59 need 60 blocks",
    ),
    "more sequences than max_num_seqs": (
        ["a", "b"],
        [GREEDY, SamplingParams(n=300)],
        ValueError,
        "prompt 1: 300 sequences (allowed: <= max_num_seqs, 256)",
    ),
    # a stop id the model can never sample: once failed inside a step (IndexError) when min_tokens masked it
    "a stop token id over the vocabulary": (
        "a",
        SamplingParams(stop_token_ids=[10**6], min_tokens=1),
        ValueError,
        "the prompt's SamplingParams: stop_token_ids holds 1000000, outside the "
        "vocabulary (allowed: token ids 0 .. 255)",
    ),
    "a stop token id over the vocabulary, 2nd params": (
        ["a", "b"],
        [GREEDY, SamplingParams(stop_token_ids=[3, 256])],
        ValueError,
        "prompt 1's SamplingParams: stop_token_ids holds 256",
    ),
}


@pytest.mark.parametrize("case", GENERATE)
def test_generate_refuses_bad_input_whole(llm, case):
    prompts, params, exc, fragment = GENERATE[case]
    bystander = llm.add_request([9, 9, 9], GREEDY)
    with pytest.raises(exc) as info:
        llm.generate(prompts, params)
    assert fragment in str(info.value) and "\n" not in str(info.value)
    assert_nothing_queued_but(llm, bystander)
    assert llm.stats.num_aborted_requests == 0


def test_beam_search_refuses_bad_input_whole(llm):
    bystander = llm.add_request([9, 9, 9], GREEDY)
    with pytest.raises(TypeError, match="takes BeamSearchParams, got SamplingParams"):
        llm.beam_search(["a"], GREEDY)
    with pytest.raises(ValueError, match="prompt 1 has 64 tokens"):
        llm.beam_search(["a", LONG], BeamSearchParams(beam_width=2, max_tokens=4))
    with pytest.raises(TypeError, match="got bytes"):
        llm.beam_search(b"a", BeamSearchParams(beam_width=2, max_tokens=4))
    with pytest.raises(TypeError, match="use_tqdm must be True or False"):
        llm.generate(["a"], GREEDY, use_tqdm="yes")
    assert_nothing_queued_but(llm, bystander)


ADD_REQUEST = {  # id: (kwargs, exception, fragment)
    "request_id a float": (
        dict(request_id=7.0),
        TypeError,
        "request_id must be a str (or an int, converted with str()), got float 7.0",
    ),
    "request_id a bool": (dict(request_id=True), TypeError, "request_id must be a str (or an int"),
    "request_id a list": (dict(request_id=["7"]), TypeError, "request_id must be a str (or an int"),
    "request_id in use": (
        dict(request_id="0"),
        ValueError,
        "request_id '0' was already given to this engine (allowed: an id not given before, or None",
    ),
    "request_id in use, as an int": (dict(request_id=0), ValueError, "request_id '0' was already given"),
    "params a dict": (dict(params={"n": 2}), TypeError, "params must be SamplingParams or BeamSearchParams"),
    "prompt bytes": (dict(prompt=b"x"), TypeError, "got bytes"),
    "a stop token id over the vocabulary": (
        dict(params=SamplingParams(stop_token_ids=[2, 10**6], min_tokens=1)),
        ValueError,
        "stop_token_ids holds 1000000, outside the vocabulary",
    ),
}


@pytest.mark.parametrize("case", ADD_REQUEST)
def test_add_request_refuses_bad_input(llm, case):
    kwargs, exc, fragment = ADD_REQUEST[case]
    bystander = llm.add_request([9, 9, 9], GREEDY)  # request "0"
    kwargs = {"prompt": [1, 2], "params": GREEDY, **kwargs}
    with pytest.raises(exc) as info:
        llm.add_request(**kwargs)
    assert fragment in str(info.value) and "\n" not in str(info.value)
    assert_nothing_queued_but(llm, bystander)


def test_a_finished_request_id_stays_taken(llm):
    rid = llm.add_request([1, 2], GREEDY, request_id=5)
    assert rid == "5"  # an int is converted with str()
    while llm.has_unfinished_requests():
        llm.step()
    for again in (rid, 5, np.int64(5)):
        with pytest.raises(ValueError, match="request_id '5' was already given"):
            llm.add_request([1, 2], GREEDY, request_id=again)
    llm.abort("1")  # unknown: nothing to do
    assert llm.add_request([1, 2], GREEDY, request_id="1") == "1"
    llm.abort(["1"])  # a list, as vLLM's LLMEngine.abort_request takes
    # None: the engine's counter, as generate() numbers requests, skipping "1" (taken) but not "5" (not reached yet)
    assert [llm.add_request([1, 2], GREEDY) for _ in range(3)] == ["0", "2", "3"]
    assert [o.request_id for o in llm.generate([[1], [2], [3]], GREEDY)] == ["4", "6", "7"]


PARAMS = {  # id: (class, kwargs, exception, fragment)
    "n float": (SamplingParams, dict(n=1.5), TypeError, "n must be an integer, got float 1.5"),
    "n integral float": (SamplingParams, dict(n=2.0), TypeError, "n must be an integer, got float"),
    "n bool": (SamplingParams, dict(n=True), TypeError, "n must be an integer, got bool"),
    "n zero": (SamplingParams, dict(n=0), ValueError, "n must be >= 1, got 0"),
    "max_tokens float": (SamplingParams, dict(max_tokens=2.5), TypeError, "max_tokens must be an integer"),
    "max_tokens str": (SamplingParams, dict(max_tokens="16"), TypeError, "max_tokens must be an integer, got str"),
    "max_tokens None": (SamplingParams, dict(max_tokens=None), TypeError, "max_tokens must be an integer"),
    "top_k float": (SamplingParams, dict(top_k=2.5, temperature=0.7), TypeError, "top_k must be an integer"),
    "top_k -2": (SamplingParams, dict(top_k=-2), ValueError, "top_k must be -1 or 0 (off) or >= 1"),
    "temperature inf": (SamplingParams, dict(temperature=math.inf), ValueError, "temperature must be a finite number"),
    "temperature nan": (SamplingParams, dict(temperature=math.nan), ValueError, "temperature must be a finite number"),
    "temperature negative": (SamplingParams, dict(temperature=-0.1), ValueError, "temperature must be >= 0"),
    "temperature str": (SamplingParams, dict(temperature="0.7"), TypeError, "temperature must be a number, got str"),
    "temperature bool": (SamplingParams, dict(temperature=False), TypeError, "temperature must be a number, got bool"),
    "top_p zero": (SamplingParams, dict(top_p=0.0), ValueError, "top_p must be in (0, 1]"),
    "top_p over 1": (SamplingParams, dict(top_p=1.5), ValueError, "top_p must be in (0, 1]"),
    "top_p nan": (SamplingParams, dict(top_p=math.nan), ValueError, "top_p must be a finite number"),
    "seed negative": (SamplingParams, dict(seed=-1), ValueError, "seed must be None or an integer >= 0"),
    "seed float": (SamplingParams, dict(seed=1.0), TypeError, "seed must be an integer, got float"),
    "ignore_eos int": (SamplingParams, dict(ignore_eos=1), TypeError, "ignore_eos must be True or False"),
    "presence_penalty 3": (SamplingParams, dict(presence_penalty=3), ValueError, "presence_penalty must be in [-2, 2]"),
    "frequency_penalty nan": (SamplingParams, dict(frequency_penalty=math.nan), ValueError, "finite number"),
    "repetition_penalty 0": (
        SamplingParams,
        dict(repetition_penalty=0),
        ValueError,
        "repetition_penalty must be in [0.0001, 100] (1 = off), got 0",
    ),
    # once inf logits, then NaN probabilities inside a step (RuntimeError from torch.multinomial)
    "repetition_penalty 1e-300": (
        SamplingParams,
        dict(repetition_penalty=1e-300),
        ValueError,
        "repetition_penalty must be in [0.0001, 100] (1 = off), got 1e-300",
    ),
    "repetition_penalty 101": (
        SamplingParams,
        dict(repetition_penalty=101),
        ValueError,
        "repetition_penalty must be in [0.0001, 100]",
    ),
    "min_p over 1": (SamplingParams, dict(min_p=1.5), ValueError, "min_p must be in [0, 1]"),
    "min_tokens over max": (
        SamplingParams,
        dict(min_tokens=20, max_tokens=4),
        ValueError,
        "min_tokens must be <= max_tokens=4",
    ),
    "min_tokens negative": (SamplingParams, dict(min_tokens=-1), ValueError, "min_tokens must be >= 0"),
    "logprobs 100": (SamplingParams, dict(logprobs=100), ValueError, "logprobs must be None or an integer in [0, 20]"),
    "logprobs bool": (SamplingParams, dict(logprobs=True), TypeError, "logprobs must be an integer"),
    "logprobs negative": (
        SamplingParams,
        dict(logprobs=-1),
        ValueError,
        "logprobs must be None or an integer in [0, 20], got -1",
    ),
    "prompt_logprobs negative": (
        SamplingParams,
        dict(prompt_logprobs=-1),
        ValueError,
        "prompt_logprobs must be None or an integer in [0, 20], got -1",
    ),
    "prompt_logprobs 21": (
        SamplingParams,
        dict(prompt_logprobs=21),
        ValueError,
        "prompt_logprobs must be None or an integer in [0, 20], got 21",
    ),
    "prompt_logprobs float": (
        SamplingParams,
        dict(prompt_logprobs=1.0),
        TypeError,
        "prompt_logprobs must be an integer, got float",
    ),
    "prompt_logprobs bool": (
        SamplingParams,
        dict(prompt_logprobs=True),
        TypeError,
        "prompt_logprobs must be an integer, got bool",
    ),
    "prompt_logprobs str": (SamplingParams, dict(prompt_logprobs="2"), TypeError, "prompt_logprobs must be an integer"),
    "stop empty": (SamplingParams, dict(stop=""), TypeError, "stop must be None, a non-empty str"),
    "stop int": (SamplingParams, dict(stop=[3]), TypeError, "stop must be None, a non-empty str"),
    "stop_token_ids str": (SamplingParams, dict(stop_token_ids="2"), TypeError, "stop_token_ids must be None or"),
    "stop_token_ids negative": (SamplingParams, dict(stop_token_ids=[-1]), ValueError, "stop_token_ids[] must be >= 0"),
    "skip_special_tokens None": (SamplingParams, dict(skip_special_tokens=None), TypeError, "True or False"),
    "beam_width zero": (BeamSearchParams, dict(beam_width=0, max_tokens=4), ValueError, "beam_width must be >= 1"),
    "beam_width float": (
        BeamSearchParams,
        dict(beam_width=2.0, max_tokens=4),
        TypeError,
        "beam_width must be an integer",
    ),
    "beam max_tokens float": (
        BeamSearchParams,
        dict(beam_width=2, max_tokens=4.5),
        TypeError,
        "max_tokens must be an integer",
    ),
    "length_penalty inf": (
        BeamSearchParams,
        dict(beam_width=2, max_tokens=4, length_penalty=math.inf),
        ValueError,
        "length_penalty must be a finite number",
    ),
    "length_penalty huge": (
        BeamSearchParams,
        dict(beam_width=2, max_tokens=4, length_penalty=500.0),
        ValueError,
        "length_penalty must be in [-10.0, 10.0]",
    ),
    "length_penalty str": (
        BeamSearchParams,
        dict(beam_width=2, max_tokens=4, length_penalty="1"),
        TypeError,
        "length_penalty must be a number",
    ),
    "beam ignore_eos None": (
        BeamSearchParams,
        dict(beam_width=2, max_tokens=4, ignore_eos=None),
        TypeError,
        "ignore_eos must be True or False",
    ),
}


@pytest.mark.parametrize("case", PARAMS)
def test_params_refuse_bad_values_when_built(case):
    cls, kwargs, exc, fragment = PARAMS[case]
    with pytest.raises(exc) as info:
        cls(**kwargs)
    assert fragment in str(info.value) and "\n" not in str(info.value)


ENGINE = {  # id: (kwargs, exception, fragment)
    "block_size float": (dict(block_size=2.5), TypeError, "block_size must be an integer"),
    "num_gpu_blocks bool": (dict(num_gpu_blocks=True), TypeError, "num_gpu_blocks must be an integer, got bool"),
    "max_num_seqs float": (dict(max_num_seqs=1.5), TypeError, "max_num_seqs must be an integer"),
    "seed negative": (dict(seed=-1), ValueError, "seed must be >= 0, got -1"),
    "max_model_len float": (dict(max_model_len=32.0), TypeError, "max_model_len must be an integer"),
    "watermark nan": (dict(watermark=math.nan), ValueError, "watermark must be a finite number"),
    # pools past sim.base.limits.MAX_POOL_BLOCKS: once an OverflowError (or a Python list of 10**9 free blocks)
    "num_gpu_blocks huge": (
        dict(num_gpu_blocks=10**30),
        ValueError,
        "num_gpu_blocks 1,000,000,000,000,000,000,000,"
        "000,000,000 is more than the largest paged pool (sim.base.limits.MAX_POOL_BLOCKS) "
        "(allowed: 1 .. 8,388,608)",
    ),
    "num_gpu_blocks one past": (dict(num_gpu_blocks=2**23 + 1), ValueError, "(allowed: 1 .. 8,388,608)"),
    # once accepted: a server started on 10**29 sequences, and one on a 10**29-token budget died at start-up
    "max_num_seqs huge": (
        dict(max_num_seqs=10**29),
        ValueError,
        "max_num_seqs must be <= 10,000,000, got 100,000,000,000,000,000,000,000,000,000 (allowed: 1 .. 10,000,000)",
    ),
    "max_num_batched_tokens huge": (dict(max_num_batched_tokens=2**20 + 1), ValueError, "(allowed: 1 .. 1,048,576)"),
    "max_model_len huge": (dict(max_model_len=10**29), ValueError, "max_model_len must be <= 1,048,576"),
    "kv_budget_bytes huge": (
        dict(num_gpu_blocks=None, kv_budget_bytes=10**30),
        ValueError,
        "kv_budget_bytes (kv_cache_memory_bytes) 1,000,000,000,000,000,000,000,000,000,000 is "
        "more than the largest paged pool (sim.base.limits.MAX_POOL_BLOCKS) (allowed: at most "
        "17,179,869,184 bytes, 8,388,608 blocks of 2,048)",
    ),
    "kv_cache_memory_bytes huge": (
        dict(num_gpu_blocks=None, kv_cache_memory_bytes=10**30),
        ValueError,
        "(allowed: at most 17,179,869,184 bytes",
    ),
    "num_cpu_blocks huge": (dict(num_cpu_blocks=10**30), ValueError, "(allowed: 0 .. 8,388,608)"),
    "swap_space huge": (
        dict(swap_space=1e300),
        ValueError,
        "swap_space 1e+300 GiB is more than the largest paged pool "
        "(sim.base.limits.MAX_POOL_BLOCKS) (allowed: 0 .. 16 GiB, 8,388,608 blocks of 2,048 bytes)",
    ),
    # 512 MiB a block of 2**20 tokens: 2**23 of them are 4 PiB, more than any machine's memory
    "a pool past the memory": (
        dict(block_size=2**20, num_gpu_blocks=2**23),
        ValueError,
        "num_gpu_blocks 8,388,608 is more than the cpu memory of ",
    ),
    "a block past the memory": (
        dict(block_size=2**40),
        ValueError,
        "one KV block takes 562,949,953,421,312 bytes, more than the cpu memory of",
    ),
    # once accepted, and every preemption silently recomputed
    "swap without CPU blocks": (
        dict(preemption="swap"),
        ValueError,
        "preemption='swap' needs num_cpu_blocks > 0 "
        "(or swap_space of at least one block) to swap to (allowed without CPU blocks: "
        "preemption='recompute')",
    ),
    "swap without a block of swap_space": (
        dict(preemption="swap", swap_space=1e-9),
        ValueError,
        "preemption='swap' needs num_cpu_blocks > 0",
    ),
    "swap with a policy that has none": (
        dict(preemption="swap", policy="max"),
        ValueError,
        "preemption='swap' needs CPU swap space, and policy 'max' has none",
    ),
}


@pytest.mark.parametrize("case", ENGINE)
def test_the_engine_refuses_bad_settings(tiny, case):
    kwargs, exc, fragment = ENGINE[case]
    kwargs = {"block_size": 4, "num_gpu_blocks": 24, **kwargs}
    with pytest.raises(exc) as info:
        LLM.from_loaded(tiny, **kwargs)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_every_prompt_form_and_numpy_integers_give_the_same_tokens(llm):
    ids = list("hi".encode())
    expected = llm.generate("hi", GREEDY)[0].outputs[0].token_ids
    forms = [
        ["hi"],
        ("hi",),
        ids,
        [ids],
        tuple(ids),
        np.array(ids),
        np.array([ids]),
        {"prompt": "hi"},
        {"prompt_token_ids": ids},
        [{"prompt": "hi"}, {"prompt_token_ids": np.array(ids, dtype=np.int32)}],
        [np.int64(t) for t in ids],
    ]
    for form in forms:
        outs = llm.generate(form, GREEDY)
        assert all(o.outputs[0].token_ids == expected and o.prompt_token_ids == ids for o in outs), form
    text_out, ids_out = llm.generate([{"prompt": "hi"}, {"prompt_token_ids": ids}], GREEDY)
    assert (text_out.prompt, ids_out.prompt) == ("hi", None)  # as vLLM: the text when given as text
    numpy_params = SamplingParams(
        temperature=np.float32(0),
        max_tokens=np.int64(4),
        n=np.int8(1),
        ignore_eos=np.bool_(True),
        seed=np.uint32(3),
        top_k=np.int64(-1),
    )
    assert type(numpy_params.max_tokens) is int and type(numpy_params.ignore_eos) is bool
    assert llm.generate(ids, numpy_params)[0].outputs[0].token_ids == expected
    assert llm.generate([], GREEDY) == []
    assert llm.stats.num_aborted_requests == 0


def test_a_tiny_temperature_samples_greedily(llm):
    """1e-30 would overflow the logits (inf, then NaN probabilities inside the step): below 1e-5 is greedy, as vLLM."""
    expected = llm.generate([[5, 6, 7]], GREEDY)[0].outputs[0].token_ids
    tiny_t = SamplingParams(temperature=1e-30, max_tokens=4, ignore_eos=True, seed=0)
    assert tiny_t.greedy and llm.generate([[5, 6, 7]], tiny_t)[0].outputs[0].token_ids == expected


def test_the_extreme_repetition_penalties_sample_finite_logits(llm):
    """The ends of [1e-4, 100] scale a logit 1e4-fold, and temperature 1e-5 (the least that samples) 1e5 more: still
    finite in float32, so a step samples; sensible values (0.5 .. 2) are inside, and the same seed gives the same
    tokens after a refused value."""
    for penalty in (1e-4, 0.5, 2.0, 100.0):
        params = SamplingParams(repetition_penalty=penalty, temperature=1e-5, max_tokens=4, ignore_eos=True, seed=0)
        assert len(llm.generate([[5, 6, 7, 5]], params)[0].outputs[0].token_ids) == 4
    params = SamplingParams(repetition_penalty=1.3, temperature=0.8, max_tokens=6, ignore_eos=True, seed=1)
    expected = llm.generate([[5, 6, 7, 5]], params)[0].outputs[0].token_ids
    with pytest.raises(ValueError, match=r"repetition_penalty must be in \[0.0001, 100\]"):
        SamplingParams(repetition_penalty=1e-5)
    assert llm.generate([[5, 6, 7, 5]], params)[0].outputs[0].token_ids == expected


def test_beam_search_of_width_1_is_greedy(llm):
    """One beam: each step keeps the best continuation. With no end token in the way it is greedy decoding."""
    prompts = [[5, 17, 99, 3, 42], [100, 101, 102]]
    greedy = [
        o.outputs[0]
        for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0))
    ]
    beams = llm.beam_search(prompts, BeamSearchParams(beam_width=1, max_tokens=6, ignore_eos=True))
    for prompt, g, out in zip(prompts, greedy, beams):
        [best] = out.sequences
        assert best.tokens == prompt + g.token_ids and best.finish_reason == "length"
        assert best.cum_logprob == pytest.approx(g.cumulative_logprob, abs=1e-4)
    kv = llm.kv_manager
    assert not llm.has_unfinished_requests() and kv.num_free_blocks == kv.num_blocks


def test_a_refused_generate_draws_no_seeds(tiny, llm):
    """Unseeded sampling draws its seed from the engine's generator: a refused call must not use any up."""
    sampled = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True)
    fresh = LLM.from_loaded(tiny, block_size=4, num_gpu_blocks=24, max_model_len=64)
    expected = fresh.generate([[5, 6, 7]], sampled)[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="max_num_seqs"):  # the first prompt was queued, then withdrawn
        llm.generate([[5, 6, 7], [1]], [sampled, SamplingParams(n=300)])
    assert llm.generate([[5, 6, 7]], sampled)[0].outputs[0].token_ids == expected


@pytest.fixture(scope="module")
def chat_llm():
    """SmolLM2's tokenizer and chat template over a tiny random model of its 49,152-token vocabulary: the template is
    real, the model cheap (its tokens mean nothing)."""
    from transformers import AutoTokenizer

    from reference.models import smollm2_checkpoint_dir

    tokenizer = AutoTokenizer.from_pretrained(smollm2_checkpoint_dir(), local_files_only=True)
    model = random_model(seed=5, vocab_size=len(tokenizer), tie_word_embeddings=False)
    return LLM.from_loaded(model, tokenizer, block_size=4, num_gpu_blocks=64, max_model_len=128)


def test_chat_serves_openai_text_parts_as_vllm_does(chat_llm):
    """OpenAI's content as a list of parts: vLLM joins the text parts with newlines for a template that takes a str."""
    as_str = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi\nthere"}]
    as_parts = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]},
    ]
    expected = chat_llm.chat(as_str, GREEDY)[0]
    [out] = chat_llm.chat(as_parts, GREEDY)
    assert out.prompt == expected.prompt and "<|im_start|>user\nhi\nthere<|im_end|>" in out.prompt
    assert out.outputs[0].token_ids == expected.outputs[0].token_ids
    assert as_parts[1]["content"][0] == {"type": "text", "text": "hi"}  # the caller's messages are left as they were


USER = {"role": "user", "content": "hi"}
_FORM = "{'role': str, 'content': str or a list of {'type': 'text', 'text': str} parts}"

CHAT = {  # id: (messages, exception, message); each once raised from inside the Jinja template or later
    "content None": (
        [USER, {"role": "assistant", "content": None}],
        ValueError,
        f"messages[1]: its 'content' is None (allowed: a message {_FORM})",
    ),
    "no role": ([{"content": "hi"}], ValueError, f"messages[0]: it has no 'role' (allowed: a message {_FORM})"),
    "no content, 2nd conversation": (
        [[USER], [USER, {"role": "user"}]],
        ValueError,
        "messages[1][1]: it has no 'content'",
    ),
    "a str message": ([USER, "hi"], TypeError, f"messages[1]: a message must be a dict {_FORM}, got str 'hi'"),
    "a role not str": ([{"role": 1, "content": "hi"}], TypeError, "messages[0]: 'role' must be a str, got int 1"),
    "content a number": (
        [{"role": "user", "content": 5}],
        TypeError,
        "messages[0]: 'content' must be a str or a list of parts, got int 5",
    ),
    "an image part": (
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "x.png"}}],
            }
        ],
        ValueError,
        "messages[0]: content part 1 has type 'image_url': this engine serves text only "
        "(allowed: {'type': 'text', 'text': str})",
    ),
    "a part without text": (
        [{"role": "user", "content": [{"type": "text"}]}],
        TypeError,
        "messages[0]: content part 0: 'text' must be a str, got NoneType",
    ),
    "a part as a str": ([{"role": "user", "content": ["hi"]}], TypeError, "messages[0]: content part 0 must be a dict"),
    "a conversation of str": (["hi"], TypeError, "messages must be a conversation"),
    "None": (None, TypeError, "messages must be a conversation"),
}


@pytest.mark.parametrize("case", CHAT)
def test_chat_refuses_a_bad_message_by_its_index(chat_llm, case):
    messages, exc, message = CHAT[case]
    bystander = chat_llm.add_request([9, 9, 9], GREEDY)
    with pytest.raises(exc) as info:
        chat_llm.chat(messages, GREEDY)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert_nothing_queued_but(chat_llm, bystander)


def test_a_template_that_refuses_is_one_line(tiny):
    """A template's own rule (raise_exception, e.g. "roles must alternate") is one ValueError line naming it."""
    import jinja2

    class Refusing(ByteTokenizer):
        chat_template = "{{ raise_exception('Conversation roles must alternate') }}"

        def apply_chat_template(self, conversation, **kwargs):
            raise jinja2.TemplateError("Conversation roles must alternate\nuser/assistant/user/assistant/...")

    llm = LLM.from_loaded(tiny, Refusing(), block_size=4, num_gpu_blocks=24, max_model_len=64)
    with pytest.raises(ValueError) as info:
        llm.chat([[USER], [USER, USER]], GREEDY)
    assert str(info.value) == (
        "messages[0]: the chat template refuses the conversation: Conversation roles must "
        "alternate user/assistant/user/assistant/..."
    )
    assert not llm.has_unfinished_requests()
