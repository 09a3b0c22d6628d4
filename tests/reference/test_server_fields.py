"""Every field of vLLM's request models, honoured or refused by the server, never passed over (reference/server/
requests.py, FIELDS).

The field lists are vLLM's own: tests/reference/data/vllm_request_fields.json, written by tools/vllm_request_fields.py
from an installed vLLM (its version is in the file). The walk sends each field to the server: a refused one, set to a
value that asks for something, must be a 400 naming it (and its do-nothing values accepted); a field of no effect must
change nothing; an honoured one must be named in HONOURED_BY with the tests below that show it honoured. A field
vLLM adds, once the file is rewritten, fails the walk until the table names it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from reference import LLM, SamplingParams  # noqa: E402
from reference.server.requests import FIELDS, HONOURED, NO_EFFECT, OPENAI_ONLY, REFUSED  # noqa: E402

DATA = json.loads((Path(__file__).parent / "data" / "vllm_request_fields.json").read_text())
KIND = {m["model"].rsplit(".", 1)[1]: m for m in DATA["models"]}
SETTINGS = {"num_gpu_blocks": 192, "block_size": 16, "max_num_seqs": 32}
CHAT = [{"role": "user", "content": "Name a colour."}]
BASE = {  # (route, a body that asks for little) per request kind
    "CompletionRequest": ("/v1/completions", {"prompt": "The sky is", "max_tokens": 3, "temperature": 0}),
    "ChatCompletionRequest": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 3, "temperature": 0}),
    "TokenizeCompletionRequest": ("/tokenize", {"prompt": "The sky is"}),
    "TokenizeChatRequest": ("/tokenize", {"messages": CHAT}),
    "DetokenizeRequest": ("/detokenize", {"tokens": [504, 6145, 314]}),
    "StreamOptions": ("/v1/completions", {"prompt": "The sky is", "max_tokens": 3, "temperature": 0, "stream": True}),
}
# each honoured field, and the tests of this module that show it honoured (test_server.py's where named so)
HONOURED_BY = {
    **{
        name: ["test_sampling_fields_reach_the_engine"]
        for name in (
            "n",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "stop",
            "stop_token_ids",
            "ignore_eos",
            "min_tokens",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
            "include_stop_str_in_output",
            "skip_special_tokens",
        )
    },
    "model": ["test_server.py::test_a_bad_request_is_an_openai_error_naming_the_field", "test_models_routes"],
    "max_tokens": ["test_max_tokens_past_max_model_len_is_a_400_and_past_the_context_is_cut"],
    "max_completion_tokens": ["test_max_tokens_past_max_model_len_is_a_400_and_past_the_context_is_cut"],
    "stream": ["test_server.py::test_chat_streamed_adds_up_to_the_whole_response"],
    "stream_options": ["test_usage_in_every_chunk_with_continuous_usage_stats"],
    "include_usage": ["test_usage_in_every_chunk_with_continuous_usage_stats"],
    "continuous_usage_stats": ["test_usage_in_every_chunk_with_continuous_usage_stats"],
    "prompt": ["test_a_list_of_prompts_gets_a_choice_per_prompt_and_sample", "test_tokenize_and_detokenize"],
    "logprobs": ["test_server.py::test_n_samples_stop_strings_and_logprobs", "test_logprob_tokens_as_token_ids"],
    "top_logprobs": ["test_server.py::test_n_samples_stop_strings_and_logprobs"],
    "messages": ["test_chat_rendering_fields", "test_tokenize_and_detokenize"],
    "truncate_prompt_tokens": ["test_truncate_prompt_tokens_keeps_the_end_or_the_start"],
    "truncation_side": ["test_truncate_prompt_tokens_keeps_the_end_or_the_start"],
    "priority": ["test_priority_orders_the_queue"],
    "request_id": ["test_request_id_names_the_response"],
    "return_tokens_as_token_ids": ["test_logprob_tokens_as_token_ids"],
    "return_token_ids": ["test_token_ids_in_the_response_whole_and_streamed"],
    "stream_interval": ["test_stream_interval_gathers_tokens_into_fewer_chunks"],
    "add_special_tokens": ["test_add_special_tokens"],
    "add_generation_prompt": ["test_chat_rendering_fields"],
    "continue_final_message": ["test_chat_rendering_fields"],
    "return_prompt_text": ["test_chat_rendering_fields"],
    "return_token_strs": ["test_tokenize_and_detokenize"],
    "tokens": ["test_tokenize_and_detokenize"],
}


class SpecialTokenizer:
    """SmolLM2's tokenizer, adding a special token in front when add_special_tokens (as Llama's and Gemma's add BOS):
    SmolLM2's own adds none, so add_special_tokens could not be told from its absence."""

    BOS = 1  # <|im_start|>, a special token of SmolLM2's vocabulary

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def __call__(self, text, add_special_tokens: bool = True, **kwargs):
        encoded = self._tokenizer(text, add_special_tokens=False, **kwargs)
        if add_special_tokens:
            encoded["input_ids"] = [self.BOS] + list(encoded["input_ids"])
        return encoded


@pytest.fixture(scope="module")
def server(smol):
    from reference.server.run import serve_in_thread

    llm = LLM.from_loaded(smol[0], SpecialTokenizer(smol[1]), **SETTINGS)
    srv, base = serve_in_thread(llm, "smollm2")
    yield base, llm
    srv.should_exit = True


def post(base: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(base + path, json=body, timeout=120)


def events(base: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", base + path, json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


# --- the walk over vLLM's fields ----------------------------------------------------------------------------------
def walk(kinds: tuple[str, ...]) -> list:
    return [
        pytest.param(kind, f["name"], id=f"{kind}.{f['name']}")
        for kind in KIND
        for f in KIND[kind]["fields"]
        if FIELDS[kind].get(f["name"]) is not None and FIELDS[kind][f["name"]].kind in kinds
    ]


def test_the_table_names_every_field_of_vllms_models_and_no_other():
    assert DATA["vllm_version"] and set(KIND) == set(FIELDS), (DATA["vllm_version"], set(KIND) ^ set(FIELDS))
    for kind, model in KIND.items():
        theirs = {f["name"] for f in model["fields"]}
        ours = set(FIELDS[kind]) - (set(OPENAI_ONLY) if kind == "CompletionRequest" else set())
        assert theirs - ours == set(), f"vLLM {DATA['vllm_version']}'s {kind}: not in the server's table"
        assert ours - theirs == set(), f"in the server's table, not in vLLM {DATA['vllm_version']}'s {kind}"
    counts = {
        kind: {k: sum(r.kind == k for r in FIELDS[kind].values()) for k in (HONOURED, REFUSED, NO_EFFECT)}
        for kind in FIELDS
    }
    print(f"vLLM {DATA['vllm_version']}:", counts)


@pytest.mark.parametrize("kind, name", walk((REFUSED,)))
def test_a_refused_field_is_a_400_naming_it(server, kind, name):
    route, base = BASE[kind]
    rule = FIELDS[kind][name]
    body = {**base, name: rule.example}
    if kind == "StreamOptions":
        body = {**base, "stream_options": {name: rule.example}}
    r = post(server[0], route, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == name, r.text
    for value in rule.no_op:  # what asks for nothing is accepted
        r = post(server[0], route, {**base, name: value})
        assert r.status_code == 200, (value, r.text)


@pytest.mark.parametrize("kind, name", walk((NO_EFFECT,)))
def test_a_field_of_no_effect_changes_nothing(server, kind, name):
    route, base = BASE[kind]
    plain = post(server[0], route, base).json()
    given = post(server[0], route, {**base, name: FIELDS[kind][name].example})
    assert given.status_code == 200, given.text
    assert [c.get("text", c.get("message")) for c in given.json()["choices"]] == [
        c.get("text", c.get("message")) for c in plain["choices"]
    ]


@pytest.mark.parametrize("kind, name", walk((HONOURED,)))
def test_an_honoured_field_has_its_tests(kind, name):
    import tests.reference.test_server as other

    tests = HONOURED_BY.get(name)
    assert tests, f"{kind}.{name} is honoured: name the tests that show it in HONOURED_BY"
    for test in tests:
        module, _, function = test.rpartition("::")
        assert callable(getattr(other if module else __import__(__name__, fromlist=["_"]), function, None)), test


# --- the honoured fields ------------------------------------------------------------------------------------------
def engine_outputs(smol, prompt, params: SamplingParams, **settings):
    llm = LLM.from_loaded(smol[0], SpecialTokenizer(smol[1]), **{**SETTINGS, **settings})
    return llm.generate([prompt], params)[0]


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0, "max_tokens": 8},
        {"temperature": 1.0, "seed": 7, "n": 2, "max_tokens": 6},
        {"temperature": 0.8, "top_p": 0.5, "top_k": 5, "min_p": 0.1, "seed": 3, "max_tokens": 6},
        {
            "temperature": 0,
            "presence_penalty": 1.5,
            "frequency_penalty": 1.0,
            "repetition_penalty": 1.3,
            "max_tokens": 12,
        },
        {"temperature": 0, "stop": [" the"], "include_stop_str_in_output": True, "max_tokens": 16},
        {"temperature": 0, "stop_token_ids": [13], "max_tokens": 16},
        {"temperature": 0, "min_tokens": 6, "ignore_eos": True, "max_tokens": 8, "skip_special_tokens": False},
    ],
    ids=["greedy", "seed-n", "filters", "penalties", "stop-included", "stop-ids", "min-tokens"],
)
def test_sampling_fields_reach_the_engine(server, smol, fields):
    prompt = "Once upon a time, in a quiet village,"
    got = post(server[0], "/v1/completions", {"prompt": prompt, **fields}).json()
    own = engine_outputs(smol, prompt, SamplingParams(**fields))
    assert [c["text"] for c in got["choices"]] == [c.text for c in own.outputs], got
    assert [c["finish_reason"] for c in got["choices"]] == [c.finish_reason for c in own.outputs]


def test_a_list_of_prompts_gets_a_choice_per_prompt_and_sample(server, smol):
    prompts = ["The sky is", "Water boils at", "My favourite food is"]
    tok = server[1].get_tokenizer()
    for given in (prompts, [tok(p).input_ids for p in prompts]):
        got = post(server[0], "/v1/completions", {"prompt": given, "n": 2, "max_tokens": 4, "temperature": 0}).json()
        assert [c["index"] for c in got["choices"]] == list(range(6))
        for p, prompt in enumerate(prompts):
            own = engine_outputs(smol, prompt, SamplingParams(max_tokens=4, temperature=0, n=2))
            assert [got["choices"][p * 2 + i]["text"] for i in range(2)] == [c.text for c in own.outputs]
        streamed = events(
            server[0], "/v1/completions", {"prompt": given, "n": 2, "max_tokens": 4, "temperature": 0, "stream": True}
        )
        texts = ["".join(c["choices"][0]["text"] for c in streamed if c["choices"][0]["index"] == i) for i in range(6)]
        assert texts == [c["text"] for c in got["choices"]]
    r = post(server[0], "/v1/completions", {"prompt": ["a", [1, 2]], "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_max_tokens_past_max_model_len_is_a_400_and_past_the_context_is_cut(server, smol):
    from reference.server.run import serve_in_thread

    for path, field, body in (
        ("/v1/completions", "max_tokens", {"prompt": "Hi"}),
        ("/v1/chat/completions", "max_completion_tokens", {"messages": CHAT}),
    ):
        r = post(server[0], path, {**body, field: server[1].max_model_len + 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    chat = post(
        server[0],
        "/v1/chat/completions",
        {"messages": CHAT, "max_completion_tokens": 3, "max_tokens": 9, "ignore_eos": True},
    )
    assert chat.json()["usage"]["completion_tokens"] == 3
    llm = LLM.from_loaded(*smol[:2], num_gpu_blocks=16, block_size=16, max_model_len=64)
    srv, base = serve_in_thread(llm, "smollm2")
    try:  # as vLLM 0.32 (get_max_tokens): max_tokens within max_model_len, cut to the context the prompt leaves
        got = post(base, "/v1/completions", {"prompt": "One two three four", "max_tokens": 64, "ignore_eos": True})
        usage = got.json()["usage"]
        assert (
            usage["prompt_tokens"] + usage["completion_tokens"] == 64
            and got.json()["choices"][0]["finish_reason"] == "length"
        )
    finally:
        srv.should_exit = True


def test_usage_in_every_chunk_with_continuous_usage_stats(server):
    body = {"prompt": "The sky is", "max_tokens": 5, "temperature": 0, "ignore_eos": True, "stream": True}
    plain = events(server[0], "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert all("usage" not in c for c in plain[:-1]) and plain[-1]["usage"]["completion_tokens"] == 5
    chunks = events(
        server[0],
        "/v1/completions",
        {**body, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    )
    counts = [c["usage"]["completion_tokens"] for c in chunks[:-1]]
    assert counts == sorted(counts) and counts[-1] == 5 and chunks[-1]["choices"] == []
    assert (
        events(server[0], "/v1/completions", {**body, "stream_options": {"continuous_usage_stats": True}})[0].get(
            "usage"
        )
        is None
    )  # as vLLM: only with include_usage


def test_truncate_prompt_tokens_keeps_the_end_or_the_start(server, smol):
    prompt = "one two three four five six seven eight nine ten"
    ids = server[1].get_tokenizer()(prompt).input_ids
    for side, kept in (("left", ids[-4:]), ("right", ids[:4])):
        got = post(
            server[0],
            "/v1/completions",
            {
                "prompt": prompt,
                "truncate_prompt_tokens": 4,
                "truncation_side": side,
                "max_tokens": 3,
                "temperature": 0,
                "return_token_ids": True,
            },
        ).json()
        assert got["choices"][0]["prompt_token_ids"] == kept
        assert (
            got["choices"][0]["text"]
            == engine_outputs(smol, kept, SamplingParams(max_tokens=3, temperature=0)).outputs[0].text
        )
    r = post(server[0], "/v1/completions", {"prompt": prompt, "truncate_prompt_tokens": 10**6})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"


def test_add_special_tokens(server):
    tok, bos = server[1].get_tokenizer(), SpecialTokenizer.BOS
    for special in (True, False):
        got = post(
            server[0],
            "/v1/completions",
            {"prompt": "Hello there", "add_special_tokens": special, "max_tokens": 1, "return_token_ids": True},
        ).json()
        assert got["choices"][0]["prompt_token_ids"] == tok("Hello there", add_special_tokens=special).input_ids
        assert (got["choices"][0]["prompt_token_ids"][0] == bos) == special
        tokens = post(server[0], "/tokenize", {"prompt": "Hello there", "add_special_tokens": special}).json()["tokens"]
        assert tokens == tok("Hello there", add_special_tokens=special).input_ids
    # chat: without them by default (the template writes its own), as vLLM
    text = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    for body, special in (({}, False), ({"add_special_tokens": True}, True)):
        got = post(
            server[0], "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "return_token_ids": True, **body}
        ).json()
        assert got["prompt_token_ids"] == tok(text, add_special_tokens=special).input_ids


def test_chat_rendering_fields(server):
    tok = server[1].get_tokenizer()
    prefill = [*CHAT, {"role": "assistant", "content": "My favourite colour is"}]
    for body, expected in (
        ({"messages": CHAT}, tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)),
        ({"messages": CHAT, "add_generation_prompt": False}, tok.apply_chat_template(CHAT, tokenize=False)),
        (
            {"messages": prefill, "continue_final_message": True, "add_generation_prompt": False},
            tok.apply_chat_template(prefill, continue_final_message=True, tokenize=False),
        ),
    ):
        got = post(server[0], "/v1/chat/completions", {**body, "max_tokens": 2, "return_prompt_text": True}).json()
        assert got["prompt_text"] == expected, got
        first = events(
            server[0], "/v1/chat/completions", {**body, "max_tokens": 2, "return_prompt_text": True, "stream": True}
        )[0]
        assert first["prompt_text"] == expected
        tokens = post(server[0], "/tokenize", {k: v for k, v in body.items()}).json()["tokens"]
        assert tokens == tok(expected, add_special_tokens=False).input_ids
    r = post(
        server[0],
        "/v1/chat/completions",
        {"messages": prefill, "continue_final_message": True, "add_generation_prompt": True},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"


def test_tokenize_and_detokenize(server):
    tok = server[1].get_tokenizer()
    got = post(server[0], "/tokenize", {"prompt": "Hello world", "return_token_strs": True}).json()
    ids = tok("Hello world").input_ids
    assert got == {
        "count": len(ids),
        "max_model_len": server[1].max_model_len,
        "tokens": ids,
        "token_strs": tok.convert_ids_to_tokens(ids),
    }
    assert post(server[0], "/detokenize", {"tokens": ids}).json() == {"prompt": tok.decode(ids)}
    chat = post(server[0], "/tokenize", {"messages": CHAT}).json()
    assert (
        chat["tokens"]
        == tok(
            tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False), add_special_tokens=False
        ).input_ids
    )
    for path, body, param in (
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "x", "model": "gpt-4"}, "model"),
    ):
        r = post(server[0], path, body)
        assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, r.text


def test_models_routes(server):
    import openai

    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0)
    assert client.models.retrieve("smollm2").id == "smollm2"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    assert httpx.get(server[0] + "/version").json()["version"]
    assert httpx.get(server[0] + "/ping").status_code == httpx.post(server[0] + "/ping").status_code == 200


def test_request_id_names_the_response(server):
    got = post(server[0], "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "request_id": "my-req-7"}).json()
    assert got["id"].startswith("cmpl-my-req-7-")


def test_logprob_tokens_as_token_ids(server):
    got = post(
        server[0],
        "/v1/completions",
        {
            "prompt": "The sky is",
            "max_tokens": 3,
            "temperature": 0,
            "logprobs": 2,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
        },
    ).json()["choices"][0]
    assert got["logprobs"]["tokens"] == [f"token_id:{t}" for t in got["token_ids"]]
    assert all(k.startswith("token_id:") for row in got["logprobs"]["top_logprobs"] for k in row)


def test_token_ids_in_the_response_whole_and_streamed(server, smol):
    body = {"prompt": "The sky is", "max_tokens": 6, "temperature": 0, "return_token_ids": True}
    whole = post(server[0], "/v1/completions", body).json()["choices"][0]
    own = engine_outputs(smol, "The sky is", SamplingParams(max_tokens=6, temperature=0))
    assert whole["token_ids"] == own.outputs[0].token_ids and whole["prompt_token_ids"] == own.prompt_token_ids
    chunks = events(server[0], "/v1/completions", {**body, "stream": True})
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == whole["token_ids"]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == own.prompt_token_ids


def test_stream_interval_gathers_tokens_into_fewer_chunks(server):
    body = {
        "prompt": "The sky is",
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    every, gathered = (
        events(server[0], "/v1/completions", body),
        events(server[0], "/v1/completions", {**body, "stream_interval": 4}),
    )
    sizes = [len(c["choices"][0]["token_ids"]) for c in gathered]
    assert len(every) == 12 and sizes[0] == 1 and all(s >= 4 for s in sizes[1:-1]) and sum(sizes) == 12, sizes
    assert "".join(c["choices"][0]["text"] for c in gathered) == "".join(c["choices"][0]["text"] for c in every)


def test_priority_orders_the_queue(server, smol):
    """Under scheduling_policy="priority" the waiting request with the lower priority runs first; without it, a
    priority other than 0 is a 400 naming it (as vLLM)."""
    import threading

    from reference.server.run import serve_in_thread

    llm = LLM.from_loaded(*smol[:2], num_gpu_blocks=64, block_size=16, max_num_seqs=1, scheduling_policy="priority")
    srv, base = serve_in_thread(llm, "smollm2")
    try:
        order: list[str] = []

        def run(name: str, priority: int, max_tokens: int) -> None:
            post(
                base,
                "/v1/completions",
                {"prompt": name, "max_tokens": max_tokens, "ignore_eos": True, "priority": priority},
            )
            order.append(name)

        first = threading.Thread(target=run, args=("first", 0, 60))
        first.start()
        while llm_running(base) < 1:
            pass
        late = [threading.Thread(target=run, args=(name, p, 2)) for name, p in (("low", 5), ("high", -5))]
        for t in late:
            t.start()
            while llm_waiting(base) < late.index(t) + 1:
                pass
        for t in (first, *late):
            t.join(120)
        assert order == ["first", "high", "low"]
    finally:
        srv.should_exit = True
    r = post(server[0], "/v1/completions", {"prompt": "x", "priority": 3})  # the module's server: FCFS
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text


def llm_running(base: str) -> float:
    return _gauge(base, "vllm:num_requests_running")


def llm_waiting(base: str) -> float:
    return _gauge(base, "vllm:num_requests_waiting")


def _gauge(base: str, name: str) -> float:
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(name)
