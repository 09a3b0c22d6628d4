"""sim/config.py: every setting's default in one place, checked fields, and the defaults every front end shows."""

from __future__ import annotations

import argparse
import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.base.specs import MODELS
from sim.config import (
    RUN_DEFAULTS,
    RUN_FIELDS,
    SCHEDULER_DEFAULTS,
    RunConfig,
    SchedulerConfig,
    allowed,
    check_field,
    default_max_num_batched_tokens,
)
from sim.drivers.cli import FLAG_KEYWORDS, build_parser


def _run_flags() -> dict[str, argparse.Action]:
    """`python -m sim run`'s flags that set a RunConfig field, by field name."""
    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions)
    return {
        FLAG_KEYWORDS.get(a.dest, a.dest): a
        for a in sub.choices["run"]._actions
        if FLAG_KEYWORDS.get(a.dest, a.dest) in RUN_FIELDS
    }


def test_every_run_flag_defaults_to_the_config_and_its_help_says_so():
    flags = _run_flags()
    assert len(flags) >= 35, sorted(flags)
    for name, action in flags.items():
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)) or name in (
            "enable_prefix_caching",
            "enable_chunked_prefill",
        ):  # flags spelled another way (on/off, --no-...)
            continue
        assert action.default == RUN_DEFAULTS[name], name
        if action.default is not None:
            assert "%(default)s" in action.help, f"--{action.dest}: its help types the default by hand"


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("mode,chunked", [("v1", True), ("v1", False), ("v0", False), ("static", False)])
def test_the_budget_help_names_the_budget_a_run_really_gets(model, mode, chunked):
    """The default the help promises per model is the one sim.run's scheduler is built with."""
    context = MODELS[model].max_seq_len
    budget = (
        RunConfig(
            model=model, scheduler=mode, enable_chunked_prefill=None if chunked else (False if mode == "v1" else None)
        )
        .scheduler_config(context)
        .max_num_batched_tokens
    )
    assert budget == default_max_num_batched_tokens(mode, chunked, context)
    helptext = " ".join(_run_flags()["max_num_batched_tokens"].help.split())
    if chunked:
        assert f"{budget:,} in v1 with chunked prefill" in helptext
    else:
        v1, v0 = (default_max_num_batched_tokens(m, False, context) for m in ("v1", "v0"))
        assert f"{model} {v1:,} / {v0:,}" in helptext


def test_a_run_reports_the_budget_its_scheduler_used():
    summary = sim.run(num_requests=3, rate=1.0, scheduler="v0", model="opt-13b").summary
    assert summary["max_num_batched_tokens"] == default_max_num_batched_tokens("v0", False, 2048) == 2560
    summary = sim.run(num_requests=3, rate=1.0).summary
    assert summary["max_num_batched_tokens"] == default_max_num_batched_tokens("v1", True) == 2048


def test_the_budget_rule_follows_vllm():
    assert default_max_num_batched_tokens("v1", True, 8192) == 2048  # chunked: the base
    assert default_max_num_batched_tokens("v1", False, 8192) == 8192  # unchunked: a whole context fits one step
    assert default_max_num_batched_tokens("v0", False, 2048) == 2560  # the paper's vLLM: 2560 at least
    assert default_max_num_batched_tokens("v1", True, 8192, offline_budget=4096) == 4096  # the LLM class on a CPU
    assert default_max_num_batched_tokens("v1", False, 8192, offline_budget=4096) == 8192


def test_configs_take_keywords_only():
    with pytest.raises(TypeError):
        SchedulerConfig(256)  # type: ignore[misc]
    with pytest.raises(TypeError):
        RunConfig("opt-13b")  # type: ignore[misc]
    assert SchedulerConfig().max_num_batched_tokens == 2048 and SCHEDULER_DEFAULTS.mode == RUN_DEFAULTS["scheduler"]


def test_the_scheduler_defaults_of_a_run_are_the_scheduler_configs():
    """One home: RunConfig's scheduler fields default to SchedulerConfig's."""
    pairs = {
        "scheduler": "mode",
        "max_num_seqs": "max_num_seqs",
        "enable_chunked_prefill": "enable_chunked_prefill",
        "preemption": "preemption",
        "victim": "victim",
        "scheduling_policy": "scheduling_policy",
    }
    for run_name, name in pairs.items():
        assert RUN_DEFAULTS[run_name] == getattr(SCHEDULER_DEFAULTS, name), run_name


def test_run_takes_a_config_and_shortcuts():
    config = RunConfig(num_requests=4, rate=1.0, policy="max")
    a = sim.run(config).summary
    b = sim.run(num_requests=4, rate=1.0, policy="max").summary
    c = sim.run(dataclasses.replace(config, policy="paged"), policy="max").summary
    for key in ("num_requests", "throughput_req_per_s", "normalized_latency_s_per_token", "policy"):
        assert a[key] == b[key] == c[key], key
    with pytest.raises(TypeError, match="RunConfig"):
        sim.run({"rate": 1.0})
    with pytest.raises(TypeError):
        sim.run(rat=1.0)  # a misspelt keyword is refused, as a function's would be


_SAMPLES = {
    "int": st.one_of(st.integers(-5, 10**7), st.booleans(), st.floats(allow_nan=True), st.none(), st.text()),
    "real": st.one_of(
        st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**6), st.booleans(), st.none(), st.text()
    ),
    "bool": st.one_of(st.booleans(), st.integers(0, 1), st.none(), st.text()),
    "choice": st.one_of(st.text(max_size=12), st.none(), st.integers()),
}


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_field_is_built_or_refused_in_one_line_naming_it(data):
    """Whatever a caller passes for one field, RunConfig is built or says `name: got ... (allowed: ...)`."""
    checked = [n for n, f in RUN_FIELDS.items() if f.metadata["kind"].rstrip("?") in _SAMPLES]
    name = data.draw(st.sampled_from(checked))
    kind = RUN_FIELDS[name].metadata["kind"].rstrip("?")
    value = data.draw(st.one_of(_SAMPLES[kind], st.sampled_from(RUN_FIELDS[name].metadata["choices"] or (0,))))
    try:
        config = RunConfig(**{name: value})
    except ValueError as e:
        assert str(e) == f"{name}: got {value!r} (allowed: {allowed(name)})"
        assert "\n" not in str(e)
        return
    assert getattr(config, name) == value or (isinstance(value, float) and math.isnan(value))
    check_field(name, value)  # what was built passes the same check


def test_documented_fields_are_the_runs_keywords():
    """sim.run's docstring speaks of its fields: every name it puts in backquotes is a RunConfig field or a module."""
    import re

    doc = sim.run.__doc__
    names = {n for n in re.findall(r"`([a-z_]+)`", doc)}
    assert names <= set(RUN_FIELDS) | {"config", "settings"}, names - set(RUN_FIELDS)
