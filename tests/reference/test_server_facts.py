"""reference/validation/server_facts.py: what a server says about itself, read as vLLM 0.32 and this project write it.

The vLLM sample below is vLLM 0.32's `vllm:cache_config_info` as its code writes it (vllm/config/cache.py: every field
of CacheConfig, str() of its value; vllm/v1/metrics/loggers.py: the labels in that order, then engine), with the
values a CPU server of SmolLM2 would have. The property tests write labels with the server's own writer
(reference.server.metrics.info_line) and read them back.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.server.metrics import info_line
from reference.validation.server_facts import FACTS, facts_from, info_labels

URL = "http://127.0.0.1:8000"
VLLM_CACHE_FIELDS = {  # vLLM 0.32's CacheConfig fields, in declaration order, as metrics_info writes them
    "block_size": "16",
    "user_specified_block_size": "False",
    "kv_cache_layout": "None",
    "prefix_match_unit": "None",
    "gpu_memory_utilization": "0.92",
    "cache_dtype": "auto",
    "is_attention_free": "False",
    "num_gpu_blocks_override": "None",
    "sliding_window": "None",
    "enable_prefix_caching": "True",
    "prefix_caching_hash_algo": "sha256",
    "prefix_cache_retention_interval": "0",
    "kv_cache_dtype_skip_layers": "[]",
    "mamba_page_size_padded": "None",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_ssm_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "num_gpu_blocks": "7281",
    "num_cpu_blocks": "None",
    "kv_sharing_fast_prefill": "False",
    "kv_cache_memory_bytes": "None",
    "kv_offloading_size": "None",
    "kv_offloading_backend": "native",
    "engine": "0",
}
VLLM_METRICS = (
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0",model_name="HuggingFaceTB/SmolLM2-135M-Instruct"} 0.0\n'
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n" + info_line("vllm:cache_config_info", VLLM_CACHE_FIELDS) + "\n"
)
VERSION = {"version": "0.32.0"}
MODELS = {"object": "list", "data": [{"id": "HuggingFaceTB/SmolLM2-135M-Instruct", "object": "model"}]}


def test_vllms_pool_is_read_and_its_scheduler_limits_come_from_the_caller():
    facts = facts_from(URL, VERSION, MODELS, VLLM_METRICS, {"max_num_batched_tokens": 4096, "max_num_seqs": 256})
    assert (facts.version, facts.model) == ("0.32.0", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert (facts.block_size, facts.num_gpu_blocks, facts.enable_prefix_caching) == (16, 7281, True)
    assert (facts.max_num_batched_tokens, facts.max_num_seqs) == (4096, 256)
    assert facts.sources == {
        "block_size": "/metrics",
        "num_gpu_blocks": "/metrics",
        "enable_prefix_caching": "/metrics",
        "max_num_batched_tokens": "given",
        "max_num_seqs": "given",
    }


def test_a_fact_nobody_gives_is_one_line_naming_its_flag():
    with pytest.raises(ValueError) as e:
        facts_from(URL, VERSION, MODELS, VLLM_METRICS, {"max_num_seqs": 256})
    assert str(e.value) == (
        f"{URL}: the server does not tell its max_num_batched_tokens (vLLM publishes no scheduler limits): give "
        "--max-num-batched-tokens (allowed: the value the server was started with)"
    )
    with pytest.raises(ValueError, match=r"\(its /metrics has no vllm:cache_config_info\): give --block-size"):
        facts_from(URL, VERSION, MODELS, "", {"max_num_batched_tokens": 4096, "max_num_seqs": 256})


def test_the_server_and_the_caller_must_agree():
    given = {"max_num_batched_tokens": 4096, "max_num_seqs": 256, "block_size": 32}
    with pytest.raises(ValueError, match=r"the server says block_size=16, --block-size says 32"):
        facts_from(URL, VERSION, MODELS, VLLM_METRICS, given)
    same = facts_from(URL, VERSION, MODELS, VLLM_METRICS, {**given, "block_size": 16})  # the same value: fine
    assert same.block_size == 16 and same.sources["block_size"] == "/metrics"


@pytest.mark.parametrize(
    "fields, given, message",
    [
        ({"block_size": "sixteen"}, {}, "the server's vllm:cache_config_info gives block_size='sixteen'"),
        ({"block_size": "0"}, {}, r"block_size='0' \(allowed: an integer >= 1\)"),
        ({"enable_prefix_caching": "maybe"}, {}, r"enable_prefix_caching='maybe' \(allowed: True or False\)"),
        ({}, {"max_num_seqs": -1}, r"--max-num-seqs gives max_num_seqs=-1"),
        ({}, {"num_blocks": 4}, r"unknown server facts \['num_blocks'\]"),
    ],
)
def test_bad_values_are_one_line(fields, given, message):
    metrics = info_line("vllm:cache_config_info", {**VLLM_CACHE_FIELDS, **fields})
    with pytest.raises(ValueError, match=message):
        facts_from(URL, VERSION, MODELS, metrics, {"max_num_batched_tokens": 4096, "max_num_seqs": 8, **given})


LABEL_NAMES = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,12}", fullmatch=True)


@given(st.dictionaries(LABEL_NAMES, st.text(max_size=20), min_size=1, max_size=8))
def test_any_labels_the_server_writes_are_read_back(labels):
    """Quotes, backslashes, newlines, braces and commas in a value survive the writer and the reader."""
    text = "# TYPE x gauge\n" + info_line("lab:scheduler_config_info", labels) + "\n"
    assert info_labels(text, "lab:scheduler_config_info") == labels
    assert info_labels(text, "vllm:cache_config_info") is None


@given(
    st.fixed_dictionaries(
        {name: st.booleans() if kind is bool else st.integers(1, 10**9) for name, (kind, _, _) in FACTS.items()}
    )
)
def test_facts_the_project_server_writes_are_the_facts_read(values):
    """The project's server writes its facts as LLM.config_info's strings; read back, they are the same values."""
    cache = {k: str(values[k]) for k in ("block_size", "num_gpu_blocks", "enable_prefix_caching")}
    scheduler = {k: str(values[k]) for k in ("max_num_batched_tokens", "max_num_seqs")}
    text = "\n".join(
        (
            info_line("vllm:cache_config_info", {**cache, "cache_dtype": "auto", "engine": "0"}),
            info_line("lab:scheduler_config_info", {**scheduler, "scheduler": "v1", "engine": "0"}),
        )
    )
    facts = facts_from(URL, {"version": "x"}, {"data": []}, text)
    assert {name: getattr(facts, name) for name in FACTS} == values
    assert set(facts.sources.values()) == {"/metrics"} and facts.model == ""


def test_a_server_that_cannot_be_asked_is_described_so_and_refused_in_one_line():
    from reference.validation.server_facts import describe, read_facts

    url = "http://127.0.0.1:9"  # the discard port: nothing serves HTTP there
    assert describe(url, timeout=2).startswith(f"not asked ({url}: no server answers GET /version (")
    with pytest.raises(ValueError, match=r"^http://127.0.0.1:9: no server answers GET /version \(.*\(allowed: the"):
        read_facts(url, timeout=2)
