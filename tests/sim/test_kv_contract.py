"""What the KV contract (sim/kv/base.py) and the policy registry (sim/kv/__init__.py) promise every caller: which model
layers each KV cache group serves (`layer_groups`, by vLLM's rule, agreeing with the hybrid manager's groups), and
capability flags that say what a built manager does."""

from __future__ import annotations

import pytest

from sim.base.specs import get_model
from sim.kv import (
    POLICIES,
    NewSequence,
    allocates_blocks_on_demand,
    always_caches_prefixes,
    has_prefix_cache,
    has_swap_space,
    layer_groups,
    make_kv_manager,
)
from sim.kv.base import cdiv
from sim.kv.groups import group_size
from sim.kv.hybrid import kv_cache_groups


def layer_windows(model) -> list[int | None]:
    """Each layer's window (None: full attention): every sliding_window_pattern-th layer is full (Gemma 3)."""
    pattern = model.sliding_window_pattern
    return [
        None if pattern is None or (i + 1) % pattern == 0 else model.sliding_window for i in range(model.num_layers)
    ]


# --- which layers each KV cache group serves --------------------------------------------------------------------
def test_gemma3_270m_groups_serve_the_layers_vllm_gives_them():
    model = get_model("gemma3-270m")  # layers 5, 11, 17 full; the 15 others slide over 512 tokens
    _, windows = kv_cache_groups(model)
    assert layer_groups(layer_windows(model), windows) == [
        [5, 11, 17],
        [0, 1, 2],
        [3, 4, 6],
        [7, 8, 9],
        [10, 12, 13],
        [14, 15, 16],
    ]


def test_gemma3_27b_groups_are_of_ten_layers_and_the_last_sliding_one_is_padded():
    model = get_model("gemma3-27b")  # 10 full, 52 sliding: groups of 10, the sixth sliding group holds 2 layers
    _, windows = kv_cache_groups(model)
    groups = layer_groups(layer_windows(model), windows)
    full = [i for i in range(62) if (i + 1) % 6 == 0]
    sliding = [i for i in range(62) if (i + 1) % 6]
    assert groups == [full] + [sliding[g * 10 : (g + 1) * 10] for g in range(6)]
    assert [len(g) for g in groups] == [10, 10, 10, 10, 10, 10, 2]


def test_one_full_attention_group_serves_every_layer():
    for name in ("gemma3-270m", "opt-13b"):
        model = get_model(name)
        assert layer_groups(layer_windows(model), (None,)) == [list(range(model.num_layers))]
    assert layer_groups([7, 7, 7], (None,)) == [[0, 1, 2]]  # all sliding (Mistral) kept whole


def test_the_group_size_is_vllms_and_the_hybrid_manager_agrees():
    assert group_size([3, 15]) == 3 and group_size([10, 52]) == 10 and group_size([10, 12]) == 12
    for name in ("gemma3-270m", "gemma3-27b"):
        model = get_model(name)
        size, windows = kv_cache_groups(model)
        assert size == group_size([model.num_full_layers, model.num_sliding_layers])
        assert all(len(g) <= size for g in layer_groups(layer_windows(model), windows))
        assert len(windows) == cdiv(model.num_full_layers, size) + cdiv(model.num_sliding_layers, size)


@pytest.mark.parametrize(
    "windows",
    [(None, 8), (None, 8, 8, 8), (None, None, 8), (None, 4, 4), (8,)],
    ids=["too-few", "too-many", "two-full", "other-window", "sliding-only"],
)
def test_groups_that_do_not_fit_the_layers_are_refused_in_one_line(windows):
    with pytest.raises(ValueError, match="do not fit the model's layers") as err:
        layer_groups([8, 8, None, 8, 8, None], windows)  # 2 full + 4 sliding: groups of 2, (None, 8, 8)
    assert "\n" not in str(err.value)
    assert layer_groups([8, 8, None, 8, 8, None], (None, 8, 8)) == [[2, 5], [0, 1], [3, 4]]


# --- capability flags agree with what a built manager does ---------------------------------------------------------
def _manager(policy: str, enable_prefix_caching: bool):
    return make_kv_manager(
        policy,
        4096,
        block_size=4,
        max_seq_len=1024,
        enable_prefix_caching=enable_prefix_caching,
        num_cpu_blocks=8,
        model=get_model("gemma3-270m"),
    )


def _hits_after_a_cached_prompt(kv) -> int:
    """Tokens a lookup finds after a 9-token prompt (two whole blocks of 4) was admitted and computed."""
    prompt = list(range(100, 109))
    assert kv.allocate_slots([0], [9], [NewSequence(9, 20, prompt)]) is not None
    return kv.get_computed_tokens(prompt, 9)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_registry_says_what_a_built_manager_does(policy):
    kv = _manager(policy, enable_prefix_caching=True)
    assert (kv.num_cpu_blocks > 0) == has_swap_space(policy), "CPU swap space exists only where the registry says"
    assert kv.allocate_slots([1], [1], [NewSequence(1, 1000)]) is not None
    held = kv.num_blocks - kv.num_free_blocks  # blocks one token of a long sequence holds
    assert (held < cdiv(1000, kv.block_size)) == allocates_blocks_on_demand(policy), f"{held} blocks held"
    assert kv.can_swap_out([1]) == has_swap_space(policy)
    kv.free(1)
    assert (_hits_after_a_cached_prompt(kv) > 0) == has_prefix_cache(policy)
    assert kv.enable_prefix_caching == has_prefix_cache(policy)
    off = _manager(policy, enable_prefix_caching=False)
    assert (_hits_after_a_cached_prompt(off) > 0) == always_caches_prefixes(policy)
    assert off.enable_prefix_caching == always_caches_prefixes(policy)
    assert not always_caches_prefixes(policy) or has_prefix_cache(policy)


def test_the_contiguous_baselines_declare_no_swap_and_no_prefix_cache():
    for policy in ("max", "pow2", "oracle"):
        assert not has_swap_space(policy) and not has_prefix_cache(policy) and not always_caches_prefixes(policy)
        assert not allocates_blocks_on_demand(policy)
    assert [p for p in POLICIES if has_swap_space(p)] == ["paged"]
    assert [p for p in POLICIES if has_prefix_cache(p)] == ["paged", "radix"]
    assert [p for p in POLICIES if always_caches_prefixes(p)] == ["radix"]
