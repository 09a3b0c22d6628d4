"""Llama-family models over a paged KV cache: config, weights loading, and our own forward pass.

    model, tokenizer, config = load_model("smollm2")      # or "random", or a local HF folder
    logits = model.forward(batch.input_ids, batch.positions, batch, kv_cache, backend="torch")
"""

from reference.models.config import SUPPORTED_MODEL_TYPES, Llama3RopeScaling, ModelConfig
from reference.models.llama import LayerWeights, LlamaForwardModel, LlamaWeights, weights_from_state_dict
from reference.models.loader import (
    TINY_CONFIG,
    cache_root,
    load_checkpoint,
    load_model,
    random_model,
    smollm2_checkpoint_dir,
)

__all__ = [
    "SUPPORTED_MODEL_TYPES", "Llama3RopeScaling", "ModelConfig", "LayerWeights", "LlamaForwardModel",
    "LlamaWeights", "weights_from_state_dict", "TINY_CONFIG", "cache_root", "load_checkpoint", "load_model",
    "random_model", "smollm2_checkpoint_dir",
]
