"""What the shared KV manager needs to know about a real model, and how its KV cache groups map onto tensors.

The engine drives `sim.kv.make_kv_manager`, which speaks of models as `sim.base.specs.ModelSpec`s (layers, heads,
sliding windows): `model_spec` turns a checkpoint's `ModelConfig` into one. Every KV manager keeps KV cache groups
(the KV contract's `windows` and `group_tables`): one full-attention group for most policies, several for `hybrid`
(vLLM's rule: equally many layers per group, full-attention groups first). `kv_layout` assigns the model's layers to
those groups from the windows alone (`sim.kv.layer_groups`: the full layers 5, 11, 17 of Gemma 3 270M form group 0,
sliding layers 0-2 group 1, 3, 4, 6 group 2, ...) and each layer to the tensor of its place in its group
(reference/engine/kv_cache.py, `KVLayout`).
"""
from __future__ import annotations

import torch

from reference.engine.kv_cache import KVLayout
from reference.models.config import ModelConfig
from sim.base.specs import ModelSpec
from sim.kv import layer_groups


def num_params(config: ModelConfig) -> int:
    """Weights counted from the config (embedding, projections, norms; a tied output projection once)."""
    c, hd = config, config.head_dim
    attn = c.hidden_size * hd * (2 * c.num_heads + 2 * c.num_kv_heads)
    norms = (4 if config.family == "gemma3" else 2) * c.hidden_size + (2 * hd if config.family == "gemma3" else 0)
    layer = attn + 3 * c.hidden_size * c.intermediate_size + norms
    head = 0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size
    return c.vocab_size * c.hidden_size + c.num_layers * layer + c.hidden_size + head


def sliding_pattern(config: ModelConfig) -> int | None:
    """N when every N-th layer is full attention and the others slide (Gemma 3: 6), None when none slides. A
    ValueError for another arrangement (the KV manager's hybrid grouping counts layers by that rule)."""
    types = config.layer_types
    if "sliding_attention" not in types:
        return None
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    pattern = full[0] + 1 if full else 0
    expected = ["full_attention" if pattern and (i + 1) % pattern == 0 else "sliding_attention"
                for i in range(len(types))]
    if not full or list(types) != expected:
        raise ValueError("the KV manager needs every N-th layer full attention and the others sliding (as Gemma 3), "
                         f"got layer_types {list(types)}")
    return pattern


def model_spec(config: ModelConfig, dtype: torch.dtype, name: str = "engine model", kv_dtype: str = "auto"
               ) -> ModelSpec:
    """The checkpoint as the simulator's KV managers see it (`kv_dtype`: the engine's, whose bytes per token the
    simulator's table of the same name gives: sim.base.specs.KV_CACHE_DTYPES)."""
    pattern = sliding_pattern(config)
    return ModelSpec(name, config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads,
                     config.head_dim, config.intermediate_size, config.vocab_size, num_params(config),
                     config.max_position_embeddings, torch.empty((), dtype=dtype).element_size(),
                     sliding_window=config.sliding_window if pattern else None, sliding_window_pattern=pattern,
                     kv_dtype=kv_dtype)


def kv_layout(config: ModelConfig, kv_manager) -> KVLayout:
    """The model's layers over the manager's KV cache groups (`kv_manager.windows`, by `sim.kv.layer_groups`), the
    i-th layer of a group in tensor i: one group (layer i in tensor i) for a manager of one full-attention group."""
    layer_windows = [config.layer_window(i) for i in range(config.num_layers)]
    return KVLayout.grouped(layer_groups(layer_windows, kv_manager.windows))
