"""`python -m reference serve` (reference/server/), driven by real clients on the loopback address: the `openai`
package (completions, chat, streaming, n > 1, stop, logprobs), raw HTTP for what a client library would never send,
and a few hundred concurrent requests from an asyncio client.

What must hold: the server's greedy text is the engine's own (`LLM.generate` on the same settings); a stream's pieces
add up to the whole response and end with [DONE]; every bad request is an OpenAI error object with status 400 (404
for an unknown model) naming the field, never a 500; under load no request is lost, every stream is well-formed, and
the pool is entirely free afterwards; a client that disconnects mid-stream is aborted and its blocks freed.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from reference import LLM, SamplingParams  # noqa: E402

SETTINGS = {"num_gpu_blocks": 192, "block_size": 16, "max_num_seqs": 32}


@pytest.fixture(scope="module")
def server(smol):
    from reference.server.run import serve_in_thread

    llm = LLM.from_loaded(*smol[:2], **SETTINGS)
    srv, base = serve_in_thread(llm, "smollm2")
    yield base, llm
    srv.should_exit = True


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0)


def metrics(base: str) -> dict[str, float]:
    """/metrics by series: vLLM's labels model_name and engine left out of the key, any other kept
    ('vllm:request_success_total{finished_reason="stop"}'); every series must carry model_name, but an info series
    (`..._info`: settings as labels), which vLLM writes with its settings and engine only."""
    out = {}
    for line in httpx.get(base + "/metrics").text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        if name.endswith("_info"):
            assert 'model_name="' not in labels and 'engine="0"' in labels, line
            continue
        assert 'model_name="smollm2"' in labels, line
        rest = [x for x in labels.rstrip("}").split(",") if x and not x.startswith(("model_name=", "engine="))]
        out[name + ("{" + ",".join(rest) + "}" if rest else "")] = float(value)
    return out


def finished(m: dict[str, float], reasons=("stop", "length")) -> float:
    return sum(m[f'vllm:request_success_total{{finished_reason="{r}"}}'] for r in reasons)


def settle(base: str, timeout: float = 20.0) -> dict[str, float]:
    """/metrics once nothing runs or waits (the engine loop may still be finishing a step)."""
    deadline = time.time() + timeout
    while True:
        m = metrics(base)
        if m["vllm:num_requests_running"] == m["vllm:num_requests_waiting"] == 0 or time.time() > deadline:
            return m
        time.sleep(0.05)


def test_greedy_completion_is_the_engines_own_text(server, client, smol):
    prompt = "The capital of France is"
    got = client.completions.create(model="smollm2", prompt=prompt, max_tokens=12, temperature=0)
    own = LLM.from_loaded(*smol[:2], **SETTINGS).generate([prompt], SamplingParams(max_tokens=12, temperature=0))
    assert got.choices[0].text == own[0].outputs[0].text and got.choices[0].finish_reason == "length"
    assert got.usage.completion_tokens == 12 and got.usage.prompt_tokens == len(own[0].prompt_token_ids)
    assert got.model == "smollm2" and got.object == "text_completion"


def test_chat_streamed_adds_up_to_the_whole_response(client):
    messages = [{"role": "user", "content": "Name three colours."}]
    whole = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=16, temperature=0)
    stream = client.chat.completions.create(
        model="smollm2",
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and whole.choices[0].message.role == "assistant"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_n_samples_stop_strings_and_logprobs(client):
    out = client.completions.create(
        model="smollm2", prompt="Once upon a time", max_tokens=10, temperature=1.0, n=3, seed=7
    )
    assert sorted(c.index for c in out.choices) == [0, 1, 2] and out.usage.completion_tokens <= 30
    stopped = client.completions.create(
        model="smollm2", prompt="def fibonacci(n):", max_tokens=40, temperature=0, stop=["\n"]
    )
    assert "\n" not in stopped.choices[0].text[1:] and stopped.choices[0].finish_reason == "stop"
    lp = client.completions.create(model="smollm2", prompt="Water boils at", max_tokens=5, temperature=0, logprobs=2)
    lp = lp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 5 and all(len(t) >= 2 for t in lp.top_logprobs)
    chat = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    assert httpx.get(server[0] + "/health").status_code == 200
    m = metrics(server[0])
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        'vllm:time_to_first_token_seconds_bucket{le="0.1"}',
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_sum",
        "lab:num_requests_swapped",
        "lab:kv_cache_blocks_used",
        "lab:kv_cache_blocks_total",
    ):
        assert name in m, name


@pytest.mark.parametrize(
    "path, body, status, param",
    [
        ("/v1/completions", {"model": "smollm2", "prompt": "x", "temperature": -1}, 400, "temperature"),
        ("/v1/completions", {"model": "smollm2", "prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
        ("/v1/completions", {"model": "smollm2", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"model": "smollm2", "prompt": "x", "n": 0}, 400, "n"),
        ("/v1/completions", {"model": "smollm2", "prompt": "x", "logprobs": 50}, 400, "logprobs"),
        ("/v1/completions", {"model": "smollm2"}, 400, "prompt"),
        ("/v1/completions", {"model": "smollm2", "prompt": ""}, 400, "prompt"),
        ("/v1/completions", {"model": "smollm2", "prompt": [1, "a"]}, 400, "prompt"),
        ("/v1/completions", {"model": "smollm2", "prompt": "x " * 9000}, 400, "prompt"),
        ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404, "model"),
        ("/v1/chat/completions", {"model": "smollm2", "messages": "hello"}, 400, "messages"),
        ("/v1/chat/completions", {"model": "smollm2", "messages": [{"content": "no role"}]}, 400, "messages"),
        (
            "/v1/chat/completions",
            {"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 99, "logprobs": True},
            400,
            "top_logprobs",
        ),
        ("/v1/completions", [1, 2], 400, None),
        # found by probing from outside (none of these was a clean 400 naming the field before)
        (
            "/v1/completions",
            {"prompt": "Hi", "min_tokens": 3, "temperature": 1, "stop_token_ids": list(range(49152))},
            400,
            "min_tokens",
        ),  # every token a stop id: the sampler had nothing to draw, and the step failed
        ("/v1/completions", {"prompt": "Hi", "stop_token_ids": [99999]}, 400, "stop_token_ids"),  # was "prompt"
        ("/v1/completions", {"prompt": "Hi", "stop_token_ids": "x"}, 400, "stop_token_ids"),  # was "stop"
        ("/v1/completions", {"prompt": "a\udfff b"}, 400, "prompt"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "\udfff"}], "max_tokens": 3},
            400,
            "messages",
        ),
        (
            "/v1/chat/completions",
            {"messages": [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]], "max_tokens": 2},
            400,
            "messages",
        ),  # a batch of conversations: was cut to the first
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2},
            400,
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Say hi"}]},
            400,
            "max_tokens",
        ),  # > the pool
        ("/v1/completions", {"prompt": "Hi", "echo": True}, 400, "echo"),
        ("/v1/completions", {"prompt": "Hi", "best_of": 3}, 400, "best_of"),
        ("/v1/completions", {"prompt": "Hi", "logit_bias": {"5": 1}}, 400, "logit_bias"),
        (
            "/v1/completions",
            {"prompt": "hello world " * 200_000, "max_tokens": 2},
            400,
            "prompt",
        ),  # refused untokenized
    ],
)
def test_a_bad_request_is_an_openai_error_naming_the_field(server, path, body, status, param):
    # json.dumps escapes a lone surrogate as JSON may ("\\udfff"; httpx's json= cannot encode it)
    response = httpx.post(server[0] + path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and "Traceback" not in error["message"]


@pytest.mark.parametrize("content", [b"not json", b"[" * 200_000 + b"]" * 200_000], ids=["text", "nested"])
def test_a_body_that_is_not_json_is_a_400(server, content):
    response = httpx.post(server[0] + "/v1/completions", content=content, headers={"content-type": "application/json"})
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]


def test_unknown_paths_and_methods_get_openai_errors(server):
    base = server[0]
    for response, status in ((httpx.get(base + "/v1/nope"), 404), (httpx.put(base + "/v1/completions"), 405)):
        assert response.status_code == status and response.json()["error"]["message"], response.text
    assert httpx.head(base + "/health").status_code == 200
    assert httpx.head(base + "/metrics").status_code == 200  # aiperf asks HEAD /metrics first, as vLLM answers it


def test_a_no_op_value_of_an_unserved_field_is_accepted(server):
    body = {"prompt": "Hi", "max_tokens": 2, "echo": False, "best_of": 1, "logit_bias": {}}
    assert httpx.post(server[0] + "/v1/completions", json=body, timeout=60).status_code == 200


def test_a_streamed_text_of_multi_token_characters_is_the_whole_text(client):
    """Chinese and emoji take several tokens each: the stream once sent U+FFFD for them, and then nothing."""
    for prompt in ("中文翻译：我爱你。你好吗？", "Reply with emoji only: 😊🌸🐶"):
        kwargs = dict(model="smollm2", prompt=prompt, max_tokens=8, temperature=0)
        whole = client.completions.create(**kwargs).choices[0].text
        parts = [c.choices[0].text for c in client.completions.create(**kwargs, stream=True) if c.choices]
        # (the whole text itself may end in U+FFFD: max_tokens can cut a character's bytes; only the last part may)
        assert "".join(parts) == whole and not any("\ufffd" in p for p in parts[:-1]), (parts, whole)


def test_a_failed_step_fails_only_the_requests_it_touched(smol):
    """A step that raises aborts the requests in it; the server fails those and no other: a request still waiting
    (max_num_seqs 1) is served afterwards, and /metrics no longer counts the aborted request's blocks."""
    from reference.server.run import serve_in_thread

    llm = LLM.from_loaded(*smol[:2], num_gpu_blocks=64, block_size=16, max_num_seqs=1)
    execute, armed = llm.executor.execute, threading.Event()

    def failing(plan, *args):  # a fault in the model, once armed: the step running request "0" raises
        if armed.is_set() and plan.request_ids():
            armed.clear()
            raise RuntimeError("injected: the model failed")
        return execute(plan, *args)

    llm.executor.execute = failing
    srv, base = serve_in_thread(llm, "smollm2")
    try:
        results = {}

        def post(name: str, body: dict) -> None:
            results[name] = httpx.post(base + "/v1/completions", json=body, timeout=120)

        first = threading.Thread(
            target=post, args=("first", {"prompt": "Once", "max_tokens": 400, "ignore_eos": True, "temperature": 0})
        )
        first.start()
        while metrics(base)["vllm:num_requests_running"] < 1:
            time.sleep(0.01)
        second = threading.Thread(
            target=post, args=("second", {"prompt": "Water boils at", "max_tokens": 4, "temperature": 0})
        )
        second.start()
        while metrics(base)["vllm:num_requests_waiting"] < 1:
            time.sleep(0.01)
        armed.set()
        first.join(120), second.join(120)
        assert results["first"].status_code == 500 and "injected" in results["first"].json()["error"]["message"]
        assert results["second"].status_code == 200, results["second"].text
        expected = llm_text(smol, "Water boils at", 4)
        assert results["second"].json()["choices"][0]["text"] == expected
        after = settle(base)
        assert after["lab:kv_cache_blocks_used"] == 0 and after["vllm:num_requests_running"] == 0
    finally:
        srv.should_exit = True


def llm_text(smol, prompt: str, max_tokens: int) -> str:
    llm = LLM.from_loaded(*smol[:2], num_gpu_blocks=64, block_size=16)
    return llm.generate([prompt], SamplingParams(max_tokens=max_tokens, temperature=0))[0].outputs[0].text


@pytest.mark.slow
def test_a_few_hundred_concurrent_requests_lose_nothing_and_free_the_pool(server):
    base = server[0]
    before = finished(metrics(base))

    async def one(http: httpx.AsyncClient, i: int, gate: asyncio.Semaphore) -> str:
        body = {
            "model": "smollm2",
            "prompt": f"Request {i}: the number {i} is",
            "max_tokens": 1 + i % 6,
            "temperature": 0,
            "stream": i % 2 == 0,
        }
        async with gate:
            await asyncio.sleep((i % 20) * 0.01)  # arrivals spread over 0.2 s
            if not body["stream"]:
                r = await http.post(base + "/v1/completions", json=body)
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["finish_reason"]
            lines = []
            async with http.stream("POST", base + "/v1/completions", json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line:
                        lines.append(line)
            assert lines[-1] == "data: [DONE]" and all(x.startswith("data: ") for x in lines)
            chunks = [json.loads(x[6:]) for x in lines[:-1]]
            return chunks[-1]["choices"][0]["finish_reason"]

    async def main() -> list[str]:
        gate = asyncio.Semaphore(96)
        async with httpx.AsyncClient(timeout=120) as http:
            return await asyncio.gather(*(one(http, i, gate) for i in range(240)))

    reasons = asyncio.run(main())
    assert len(reasons) == 240 and set(reasons) <= {"length", "stop"}
    after = settle(base)
    assert finished(after) - before == 240
    assert after["lab:kv_cache_blocks_used"] == 0 and after["vllm:num_requests_running"] == 0


def test_a_client_that_disconnects_is_aborted_and_its_blocks_freed(server):
    base = server[0]
    before, aborts = finished(metrics(base)), finished(metrics(base), ("abort",))
    body = {
        "model": "smollm2",
        "prompt": "Tell me a long story about a dragon.",
        "max_tokens": 2000,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as r:
        for n, _ in enumerate(r.iter_lines()):
            if n >= 6:
                break  # leave mid-stream
    after = settle(base)
    assert after["vllm:num_requests_running"] == 0 and after["lab:kv_cache_blocks_used"] == 0
    assert finished(after) == before  # aborted, not finished
    assert finished(after, ("abort",)) == aborts + 1  # as vLLM counts it: finished_reason="abort"


def test_a_client_that_gives_up_on_a_whole_response_is_aborted_too(server):
    """Not streamed: the client times out and closes the connection; the server notices, aborts, frees the blocks."""
    base = server[0]
    before, aborts = finished(metrics(base)), finished(metrics(base), ("abort",))
    body = {
        "model": "smollm2",
        "prompt": "Write a very long essay.",
        "max_tokens": 2000,
        "temperature": 0,
        "ignore_eos": True,
    }
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(base + "/v1/completions", json=body, timeout=1.0)
    after = settle(base)
    assert after["vllm:num_requests_running"] == 0 and after["lab:kv_cache_blocks_used"] == 0
    assert finished(after) == before
    assert finished(after, ("abort",)) == aborts + 1


def test_a_bad_flag_is_one_line_and_exit_2():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "reference", "serve", "--port", "70000"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stderr.strip() == "error: --port 70000 (allowed: an integer from 0 to 65535)"


def test_a_port_in_use_is_one_line_before_the_model_loads():
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "reference", "serve", "--model", "random", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"error: --host 127.0.0.1 --port {port}: cannot listen there"), done.stderr


# --- the live page of the pool -------------------------------------------------------------------------------------
def _busy(base: str, prompts: list[str], max_tokens: int, n: int = 1) -> list[threading.Thread]:
    """Streams running in the background (each read to its end), so that the engine steps while a test looks."""

    def read(prompt: str) -> None:
        body = {
            "model": "smollm2",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "n": n,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as r:
            for _ in r.iter_lines():
                pass

    threads = [threading.Thread(target=read, args=(p,), daemon=True) for p in prompts]
    for t in threads:
        t.start()
    return threads


def test_every_kept_step_holds_the_engines_used_blocks(server):
    """The pool page draws a block for every block the KV manager holds, as many as the engine counts used; in a
    paged pool those are exactly the blocks the running tables hold (swapped sequences hold CPU blocks; freed cached
    ones are free). Shared prompt blocks (n = 3) appear in several tables and are marked with their count."""
    base = server[0]
    for t in _busy(base, ["Once upon a time", "The sea is"], 24, n=3):
        t.join(120)
    history = httpx.get(base + "/pool/history").json()
    assert history and [s["step"] for s in history] == sorted({s["step"] for s in history})
    for snap in history:
        assert snap["used_blocks"] == snap["kv_used_blocks"], snap["step"]
        assert sum(r[4] * (r[1] - r[0]) for r in snap["runs"]) == snap["used_blocks"]
        assert sum(snap["counts"]) == snap["num_slots"]
    assert any(n == 3 for s in history for n in s["refs"].values())  # a prompt block shared by the three samples
    assert "<canvas" in httpx.get(base + "/pool").text


def test_the_page_follows_the_engine_step_by_step(server):
    base = server[0]
    seen: list[int] = []
    with httpx.stream("GET", base + "/pool/events", timeout=60) as r:
        threads = _busy(base, ["A list of fruits:"], 12)
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen.append(json.loads(line[6:])["step"])
                if len(seen) >= 5:
                    break
    for t in threads:
        t.join(120)
    assert seen == sorted(seen) and len(set(seen)) == 5


@pytest.fixture(scope="module")
def chromium():
    from tests.browser import need_chromium

    return need_chromium()


@pytest.mark.slow
def test_the_page_in_a_headless_browser_draws_the_engines_blocks(server, chromium, tmp_path):
    from sim.views.pool_page import page_dom, screenshot

    base = server[0]
    threads = _busy(base, ["Tell me a story about a ship.", "Write a poem about rain."], 200, n=2)
    deadline = time.time() + 60
    while not any(s["kv_used_blocks"] for s in httpx.get(base + "/pool/history").json()[-1:]):
        assert time.time() < deadline
        time.sleep(0.1)
    import re

    dom = page_dom(base + "/pool")
    body = re.search(r'<body data-step="(-?\d+)" data-used="(\d+)"', dom)
    assert body, dom[:500]
    step, used = int(body.group(1)), int(body.group(2))
    drawn = sum(int(n) for n in re.findall(r'class="block used[^"]*"[^>]*data-blocks="(\d+)"', dom))
    history = {s["step"]: s for s in httpx.get(base + "/pool/history").json()}
    assert step in history and drawn == used == history[step]["kv_used_blocks"] > 0
    path = tmp_path / "pool.png"
    screenshot(base + "/pool", str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    for t in threads:
        t.join(120)


@pytest.mark.parametrize("policy", ["paged", "max", "pow2", "vattention"])
def test_the_page_draws_every_block_the_engine_holds_under_every_policy(smol, policy):
    """A contiguous policy's reservations are held blocks no block table lists: the page draws them (from the KV
    manager's slot segments), so what it draws is the engine's own count of used blocks at every step."""
    from sim.views.pool_page import snapshot_json
    from sim.views.viewer import snapshot

    llm = LLM.from_loaded(*smol[:2], policy=policy, num_gpu_blocks=64, block_size=16, max_model_len=256)
    for prompt in ("Once upon a time", "The sea is"):
        llm.add_request(prompt, SamplingParams(max_tokens=12, n=2, temperature=0.0))
    steps, beyond_tables = 0, 0
    while llm.has_unfinished_requests():
        llm.step()
        snap = snapshot(llm.scheduler, step=steps, time=0.0, num_prefills=0, num_decodes=0)
        page = snapshot_json(snap)
        kv = llm.kv_manager
        assert page["used_blocks"] == kv.num_blocks - kv.num_free_blocks, (policy, steps)
        in_tables = len({b for table in snap.block_tables.values() for b in table})
        beyond_tables = max(beyond_tables, page["used_blocks"] - in_tables)
        steps += 1
    assert steps > 10
    assert (beyond_tables > 0) == (policy in ("max", "pow2"))  # reserved ahead: drawn, though in no table
