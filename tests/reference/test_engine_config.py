"""reference/engine/config.py: every keyword of LLM(...) has one default, EngineConfig's, and the shared ones are the
simulator's (sim/config.py); EngineConfig checks what needs no model; the budget an engine gets is the rule's."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from reference import LLM
from reference.engine.config import ENGINE_DEFAULTS, EngineConfig
from reference.models import random_model
from sim.config import RUN_DEFAULTS, SCHEDULER_DEFAULTS, default_max_num_batched_tokens


def test_every_llm_keyword_defaults_to_the_engine_config():
    params = inspect.signature(LLM.__init__).parameters
    fields = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    keywords = {name: p.default for name, p in params.items() if name not in ("self", "tokenizer")}
    assert keywords.keys() == fields.keys()
    for name, default in keywords.items():
        assert default == fields[name], name


def test_llm_lists_its_keywords_once_and_shows_them_all():
    """LLM.__init__ takes **settings and hands them to EngineConfig; its signature, as inspect and help() show it, is
    built from EngineConfig's fields, so a keyword is written once and still seen with its default."""
    shown = inspect.signature(LLM).parameters  # the class, as help(LLM) shows it
    assert list(shown)[:2] == ["model", "tokenizer"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for name, p in shown.items() if name != "model")
    for f in dataclasses.fields(EngineConfig):
        assert shown[f.name].default == f.default, f.name
    import pydoc

    shown_by_help = pydoc.render_doc(LLM, renderer=pydoc.plaintext)
    assert "tokenizer=None, policy: 'str' = 'paged', block_size: 'int' = 16" in shown_by_help
    assert "num_offload_blocks: 'int' = 0" in shown_by_help


class LLMLike:  # a signature without the keyword: what Python itself says
    def __init__(self, model="smollm2", *, policy="paged"):
        pass


def test_an_unknown_keyword_is_pythons_own_type_error():
    """Refused before anything is built or loaded, in the words Python uses for a signature that lacks the keyword."""
    with pytest.raises(TypeError) as python:
        LLMLike(polcy="max")
    for call in (
        lambda: LLM(polcy="max"),
        lambda: LLM("no-such-model", polcy="max"),
        lambda: LLM.from_loaded(None, polcy="max"),
    ):
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value) == str(python.value).replace("LLMLike", "LLM")
    with pytest.raises(TypeError, match=r"takes from 1 to 2 positional arguments but 3 were given"):
        LLM("smollm2", "paged")


def test_the_settings_shared_with_the_simulator_take_its_defaults():
    for name in ("policy", "block_size"):
        assert getattr(ENGINE_DEFAULTS, name) == RUN_DEFAULTS[name], name
    for name, scheduler_name in (
        ("scheduler", "mode"),
        ("max_num_seqs", "max_num_seqs"),
        ("preemption", "preemption"),
        ("victim", "victim"),
        ("enable_chunked_prefill", "enable_chunked_prefill"),
    ):
        assert getattr(ENGINE_DEFAULTS, name) == getattr(SCHEDULER_DEFAULTS, scheduler_name), name


@pytest.mark.parametrize(
    "settings, error, message",
    [
        ({"block_size": 0}, ValueError, "block_size must be >= 1, got 0"),
        ({"seed": True}, TypeError, "seed must be an integer, got bool True"),
        ({"watermark": float("nan")}, ValueError, "watermark must be a finite number"),
        ({"gpu_memory_utilization": 1.5}, ValueError, "gpu_memory_utilization must be in (0, 1], got 1.5"),
        ({"kv_budget_bytes": 10, "kv_cache_memory_bytes": 10}, ValueError, "not both"),
        ({"tensor_parallel_size": 2}, ValueError, "one device (allowed: 1)"),
        ({"enable_chunked_prefill": "yes"}, TypeError, "enable_chunked_prefill must be True or False"),
        ({"block_allocator": 3}, TypeError, "block_allocator must be a class or function (num_blocks, block_size)"),
        (
            {"policy": "max", "block_allocator": dict},
            ValueError,
            "block_allocator: policy 'max' runs its own allocator",
        ),
        ({"prompt_lookup_min": 0}, ValueError, "prompt_lookup_min must be >= 1, got 0"),
        (
            {"prompt_lookup_max": 2, "prompt_lookup_min": 3},
            ValueError,
            "prompt_lookup_min 3 is more than prompt_lookup_max 2 (allowed: 1 <= prompt_lookup_min <= prompt_lookup_max)",
        ),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(settings, error, message):
    with pytest.raises(error) as info:
        EngineConfig(**settings)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_vllms_spellings_are_folded_into_the_engines_names():
    """kv_cache_dtype and speculative_config leave the config once read: the engine reads one name for each setting."""
    config = EngineConfig(
        kv_cache_dtype="int8",
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": 2,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 2,
        },
    )
    assert config == EngineConfig(kv_dtype="int8", num_speculative_tokens=2, prompt_lookup_max=4, prompt_lookup_min=2)
    assert config.kv_cache_dtype is None and config.speculative_config is None
    assert dataclasses.replace(config, kv_dtype="auto").kv_dtype == "auto"  # nothing left over to disagree with


def test_values_are_converted_once_and_keyword_only():
    import numpy as np

    config = EngineConfig(block_size=np.int64(8), kv_cache_memory_bytes=4096)
    assert type(config.block_size) is int and config.kv_budget_bytes == 4096
    with pytest.raises(TypeError):
        EngineConfig("smollm2")  # type: ignore[misc]


@pytest.mark.parametrize("scheduler, chunked", [("v1", None), ("v1", False), ("v0", None)])
def test_an_engine_gets_the_budget_of_the_rule(scheduler, chunked):
    model = random_model(seed=1)
    llm = LLM.from_loaded(model, scheduler=scheduler, enable_chunked_prefill=chunked, num_gpu_blocks=64)
    config = llm.scheduler.config
    assert config.max_num_batched_tokens == default_max_num_batched_tokens(
        scheduler, config.chunked, llm.max_model_len, offline_budget=4096
    )  # a CPU's, as vLLM's LLM class
    assert llm.engine_config.scheduler == scheduler
