"""What the shared KV manager needs to know about a real model, and how its KV cache groups map onto tensors.

The engine drives `sim.kv.make_kv_manager`, which speaks of models as `sim.specs.ModelSpec`s (layers, heads,
sliding windows): `model_spec` turns a checkpoint's `ModelConfig` into one. The `hybrid` policy groups layers by
vLLM's rule (`sim.kv.hybrid.kv_cache_groups`: equally many layers per group, full-attention groups first) and hands
each sequence one block table per group; `kv_layout` assigns the model's layers to those groups in order (the
full layers 5, 11, 17 of Gemma 3 270M form group 0, sliding layers 0-2 group 1, 3, 4, 6 group 2, ...) and each
layer to the tensor of its place in its group (reference/kv_cache.py, `KVLayout`).
"""
from __future__ import annotations

import torch

from reference.kv_cache import KVLayout
from reference.models.config import ModelConfig
from sim.specs import ModelSpec


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


def model_spec(config: ModelConfig, dtype: torch.dtype, name: str = "engine model") -> ModelSpec:
    """The checkpoint as the simulator's KV managers see it."""
    pattern = sliding_pattern(config)
    return ModelSpec(name, config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads,
                     config.head_dim, config.intermediate_size, config.vocab_size, num_params(config),
                     config.max_position_embeddings, torch.empty((), dtype=dtype).element_size(),
                     sliding_window=config.sliding_window if pattern else None, sliding_window_pattern=pattern)


def kv_layout(config: ModelConfig, kv_manager) -> KVLayout:
    """One group (layer i in tensor i) unless the manager keeps a table per KV cache group (`group_tables`):
    then the groups of `sim.kv.hybrid.kv_cache_groups`, layers in order, full-attention groups first."""
    windows = getattr(kv_manager, "windows", None)
    if not hasattr(kv_manager, "group_tables") or windows is None:
        return KVLayout.one_group(config.num_layers)
    full = [i for i in range(config.num_layers) if config.layer_window(i) is None]
    sliding = [i for i in range(config.num_layers) if config.layer_window(i) is not None]
    from sim.kv.hybrid import kv_cache_groups

    size, _ = kv_cache_groups(model_spec(config, torch.float32))
    num_full = sum(w is None for w in windows)
    groups = [full[g * size:(g + 1) * size] for g in range(num_full)]
    groups += [sliding[g * size:(g + 1) * size] for g in range(len(windows) - num_full)]
    if any(not g for g in groups) or any(config.layer_window(i) != w for g, w in zip(groups, windows) for i in g):
        raise ValueError(f"the KV manager's groups (windows {list(windows)}) do not match the model's layers")
    return KVLayout.grouped(groups)
