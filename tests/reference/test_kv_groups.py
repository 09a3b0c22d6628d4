"""reference/engine/kv_groups.py: the cache's layout follows from the KV manager's `windows` alone (the KV contract), the same
for every policy that keeps one full-attention group, and for `hybrid` exactly vLLM's grouping of Gemma 3's layers."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from reference.engine.kv_groups import kv_layout, model_spec
from reference.models.loader import TINY_GEMMA3_CONFIG
from sim.kv import POLICIES, make_kv_manager


def gemma3(num_layers: int, window: int = 512, pattern: int = 6):
    """A Gemma 3 config of this many layers, every `pattern`-th full attention, the others sliding."""
    types = tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers))
    return dataclasses.replace(
        TINY_GEMMA3_CONFIG,
        num_layers=num_layers,
        sliding_window=window,
        max_position_embeddings=32_768,
        layer_types=types,
    )


def manager(config, policy: str):
    spec = model_spec(config, torch.float32)
    return make_kv_manager(policy, 4096 * 16, block_size=16, max_seq_len=config.max_position_embeddings, model=spec)


# what kv_layout gave before the groups were part of the contract (it read sim.kv.hybrid's grouping then): per layer,
# its group and its tensor (its place in the group)
SLIDING_27B = [i for i in range(62) if (i + 1) % 6]
HYBRID_LAYOUTS = {
    "gemma3-270m": (
        gemma3(18),
        (1, 1, 1, 2, 2, 0, 2, 3, 3, 3, 4, 0, 4, 4, 5, 5, 5, 0),
        (0, 1, 2, 0, 1, 0, 2, 0, 1, 2, 0, 1, 1, 2, 0, 1, 2, 2),
    ),
    "tiny": (TINY_GEMMA3_CONFIG, (1, 1, 0, 2, 2, 0), (0, 1, 0, 0, 1, 1)),
    "every-2nd-full": (gemma3(8, pattern=2), (1, 0, 1, 0, 1, 0, 1, 0), (0, 0, 1, 1, 2, 2, 3, 3)),
    "every-3rd-full": (gemma3(9, pattern=3), (1, 1, 0, 1, 2, 0, 2, 2, 0), (0, 1, 0, 2, 0, 1, 1, 2, 2)),
    # 10 full layers (5, 11, ..., 59) in group 0; 52 sliding ones in order, 10 a group, the last group holding 2
    "gemma3-27b": (
        gemma3(62, 1024),
        tuple(0 if (i + 1) % 6 == 0 else 1 + SLIDING_27B.index(i) // 10 for i in range(62)),
        tuple((i + 1) // 6 - 1 if (i + 1) % 6 == 0 else SLIDING_27B.index(i) % 10 for i in range(62)),
    ),
}


@pytest.mark.parametrize("name", HYBRID_LAYOUTS)
def test_hybrid_layout_is_vllms_grouping_as_before(name):
    config, layer_group, layer_tensor = HYBRID_LAYOUTS[name]
    layout = kv_layout(config, manager(config, "hybrid"))
    assert (layout.layer_group, layout.layer_tensor) == (layer_group, layer_tensor)


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "hybrid"])
def test_a_one_group_policy_lays_out_every_layer_in_its_own_tensor(policy):
    config = gemma3(18)  # sliding layers too: a full-attention pool keeps them whole
    kv = manager(config, policy)
    assert kv.windows == (None,)
    layout = kv_layout(config, kv)
    assert layout.layer_group == (0,) * 18 and layout.layer_tensor == tuple(range(18))


def test_the_layout_asks_the_manager_only_for_its_windows():
    class Groups:  # all the contract's groups say: tiny Gemma 3 has 2 full layers and 4 sliding ones, groups of 2
        def __init__(self, windows):
            self.windows = windows

    assert kv_layout(TINY_GEMMA3_CONFIG, Groups((None, 8, 8))).num_groups == 3
    with pytest.raises(ValueError, match="do not fit the model's layers"):
        kv_layout(TINY_GEMMA3_CONFIG, Groups((None, 8, 8, 8)))
