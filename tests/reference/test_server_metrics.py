"""/metrics under vLLM's names (reference/server/metrics.py), read as vLLM's own dashboard reads them.

What must hold: every `vllm:` series that a query of vLLM's published Grafana dashboard names is on /metrics after
some requests ran, with the labels the query filters or groups on (model_name, finished_reason); the inter-token
histogram observes every gap between two token steps (not one mean per request); prompt tokens are counted; an aborted
request is counted under finished_reason="abort".
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from reference import LLM  # noqa: E402

DASHBOARD = json.loads((Path(__file__).parent / "data" / "vllm_grafana_queries.json").read_text())
SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")


@pytest.fixture(scope="module")
def server(smol):
    from reference.server.run import serve_in_thread

    llm = LLM.from_loaded(*smol[:2], num_gpu_blocks=128, block_size=16, max_num_seqs=8)
    srv, base = serve_in_thread(llm, "smollm2")
    yield base, llm
    srv.should_exit = True


def scrape(base: str) -> list[tuple[str, dict[str, str], float]]:
    """/metrics as (name, labels, value) per series line."""
    out = []
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, labels, value = SERIES.match(line).groups()
            out.append((name, dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels or "")), float(value)))
    return out


def value(series, name: str, **labels) -> float:
    return sum(v for n, ls, v in series if n == name and all(ls.get(k) == x for k, x in labels.items()))


def test_every_series_of_vllms_grafana_dashboard_is_served(server):
    base = server[0]
    for i in range(3):  # some requests, so that every histogram has observations
        httpx.post(
            base + "/v1/completions",
            json={"prompt": f"Count to {i + 3}:", "max_tokens": 6, "temperature": 0},
            timeout=120,
        )
    series = scrape(base)
    found, missing = [], []
    for panel in DASHBOARD["panels"]:
        for expr in panel["exprs"]:
            for name, filters in re.findall(r"(vllm:[a-zA-Z0-9_:]+)(?:\{([^}]*)\})?", expr):
                wanted = dict(re.findall(r'(\w+)="([^"]*)"', filters))
                wanted = {k: "smollm2" if v == "$model_name" else v for k, v in wanted.items()}
                grouped = re.findall(r"by\s*\(([^)]*)\)", expr)
                keys = {k.strip() for g in grouped for k in g.split(",")} - {"le"}
                hit = [
                    ls
                    for n, ls, _ in series
                    if n == name and all(ls.get(k) == v for k, v in wanted.items()) and keys <= set(ls)
                ]
                (found if hit else missing).append(f"{panel['title']}: {name} {wanted} by {sorted(keys)}")
    print(
        f"{len(DASHBOARD['panels'])} panels of the dashboard at {DASHBOARD['commit'][:10]}: {len(found)} series "
        f"found, {len(missing)} missing"
    )
    assert not missing, missing
    assert value(series, "vllm:request_success_total", finished_reason="length") >= 3


def test_every_inter_token_gap_is_observed_and_prompt_tokens_counted(server):
    base = server[0]
    before = scrape(base)
    body = {"prompt": "The sky is blue because", "max_tokens": 9, "temperature": 0, "ignore_eos": True}
    got = httpx.post(base + "/v1/completions", json=body, timeout=120).json()
    after = scrape(base)

    def grew(name: str, **labels) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("vllm:inter_token_latency_seconds_count") == 8  # 9 tokens, one per step: 8 gaps
    assert grew("vllm:request_time_per_output_token_seconds_count") == 1  # one mean per request
    assert grew("vllm:time_to_first_token_seconds_count") == 1
    assert grew("vllm:prompt_tokens_total") == got["usage"]["prompt_tokens"]
    assert grew("vllm:generation_tokens_total") == 9
    assert grew("vllm:request_generation_tokens_sum") == 9


def test_an_aborted_request_is_counted_as_abort(server):
    base = server[0]
    before = scrape(base)
    body = {"prompt": "Write a long story.", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as r:
        for n, _ in enumerate(r.iter_lines()):
            if n >= 4:
                break  # the client leaves
    for _ in range(400):  # (the server notices the client left within a step or two)
        after = scrape(base)
        if value(after, "vllm:num_requests_running") == 0:
            break
        time.sleep(0.05)
    assert (
        value(after, "vllm:request_success_total", finished_reason="abort")
        - value(before, "vllm:request_success_total", finished_reason="abort")
        == 1
    )
    assert value(after, "lab:kv_cache_blocks_used") == 0


def test_the_server_tells_a_client_its_pool_and_scheduler_limits(server):
    """vllm:cache_config_info (vLLM's name and labels) and lab:scheduler_config_info carry the engine's settings, and
    server_facts reads them back as a client of vLLM would: nothing has to be given."""
    from importlib.metadata import version

    from reference.validation.server_facts import read_facts

    base, llm = server
    facts = read_facts(base)
    assert (facts.block_size, facts.num_gpu_blocks, facts.max_num_seqs) == (16, 128, 8)
    assert facts.max_num_batched_tokens == llm.scheduler.config.max_num_batched_tokens
    assert facts.enable_prefix_caching is False and facts.model == "smollm2"
    assert facts.version == version("paged-attention-lab") and set(facts.sources.values()) == {"/metrics"}
    info = [ls for n, ls, v in scrape(base) if n == "vllm:cache_config_info" and v == 1.0]
    assert info == [
        {
            "block_size": "16",
            "num_gpu_blocks": "128",
            "cache_dtype": "auto",
            "enable_prefix_caching": "False",
            "engine": "0",
        }
    ]
    with pytest.raises(ValueError, match=r"the server says max_num_seqs=8, --max-num-seqs says 4"):
        read_facts(base, {"max_num_seqs": 4})
