"""Gemma 3 (text) over a paged KV cache: the engine's second model family, and its first hybrid one.

Gemma 3 (Gemma Team, 2025) is a decoder like Llama, with five differences that matter here::

    h = embed(input_ids) * sqrt(hidden)                            <- a scaled embedding
    for each layer:
        x = norm(h);  q, k, v = x Wq, x Wk, x Wv
        q, k = norm(q), norm(k)  per head                          <- query/key norms
        rotate q, k by position: base 10,000 (sliding) or 1,000,000 (full)   <- two RoPE tables
        a = attention(q, cached K/V): only the last 512 positions in 5 of every 6 layers   <- sliding window
        h = h + norm(a Wo)
        h = h + norm(mlp(norm(h)))  with gelu_tanh(x Wg) * (x Wu)   <- four norms per layer
    logits = norm(h) W_embed^T

Every norm is Gemma's RMSNorm, which scales by (1 + w) rather than w, in float32. Scores are scaled by
query_pre_attn_scalar ** -0.5 (256 ** -0.5 for the 270M model: its head_dim).

Where K and V live: the cache's `KVLayout` says which tensor and which KV cache group each layer uses. Under the
`paged` policy there is one group (every layer keeps every block; sliding layers just read less of it). Under
`hybrid` (sim/kv/hybrid.py: vLLM's hybrid KV cache manager) the 3 full and 15 sliding layers form 6 groups of 3,
each with its own block tables over one pool of pages, and sliding groups give back blocks that fall out of the
window: this forward pass reads each layer's group tables from the batch (`ForwardBatch.tables(g)`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reference.attention import paged_decode_attention, paged_prefill_attention, store_kv
from reference.engine.batch import ForwardBatch
from reference.engine.kv_cache import KVCache
from reference.models.config import ModelConfig
from reference.models.layers import apply_rope, rope_cos_sin, rope_inv_freq
from reference.models.llama import LlamaForwardModel
from reference.models.matmul import PackedLinear, default_matmul


@dataclass(slots=True)
class Gemma3LayerWeights:
    """One decoder layer; projections [out_features, in_features], norms [hidden] (q/k norms [head_dim])."""

    input_norm: torch.Tensor
    qkv_proj: torch.Tensor  # q, k and v stacked: [(num_heads + 2 * num_kv_heads) * head_dim, hidden]
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o_proj: torch.Tensor
    post_attention_norm: torch.Tensor
    pre_feedforward_norm: torch.Tensor
    gate_up_proj: torch.Tensor  # gate and up stacked: [2 * intermediate, hidden]
    down_proj: torch.Tensor
    post_feedforward_norm: torch.Tensor


@dataclass(slots=True)
class Gemma3Weights:
    embed_tokens: torch.Tensor  # [vocab, hidden]; also the output projection (tied)
    layers: list[Gemma3LayerWeights]
    norm: torch.Tensor  # [hidden]

    @property
    def lm_head(self) -> torch.Tensor:
        return self.embed_tokens


def gemma3_weights_from_state_dict(config: ModelConfig, state: dict[str, torch.Tensor]) -> Gemma3Weights:
    """Our tensors out of a Hugging Face `Gemma3ForCausalLM` state dict (names as transformers writes them)."""

    def get(name: str) -> torch.Tensor:
        if name not in state:
            raise ValueError(f"checkpoint has no tensor {name!r} (a gemma3_text checkpoint must have it)")
        return state[name]

    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        layers.append(Gemma3LayerWeights(
            input_norm=get(p + "input_layernorm.weight"),
            qkv_proj=torch.cat([get(attn + f"{n}_proj.weight") for n in "qkv"]),
            q_norm=get(attn + "q_norm.weight"), k_norm=get(attn + "k_norm.weight"),
            o_proj=get(attn + "o_proj.weight"),
            post_attention_norm=get(p + "post_attention_layernorm.weight"),
            pre_feedforward_norm=get(p + "pre_feedforward_layernorm.weight"),
            gate_up_proj=torch.cat([get(mlp + "gate_proj.weight"), get(mlp + "up_proj.weight")]),
            down_proj=get(mlp + "down_proj.weight"),
            post_feedforward_norm=get(p + "post_feedforward_layernorm.weight"),
        ))
    return Gemma3Weights(get("model.embed_tokens.weight"), layers, get("model.norm.weight"))


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * (1 + weight), in float32, back to x's dtype (transformers' Gemma3RMSNorm)."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.float())).to(x.dtype)


class Gemma3ForwardModel(LlamaForwardModel):
    """Runs one step of a batch over a paged KV cache, as LlamaForwardModel does (same arguments and results)."""

    def __init__(self, config: ModelConfig, weights: Gemma3Weights, matmul: str | None = None) -> None:
        if config.family != "gemma3":
            raise ValueError(f"Gemma3ForwardModel runs gemma3_text checkpoints, got model_type {config.model_type!r}")
        self.config = config
        self.weights = weights
        self.scale = config.attention_scale
        device = weights.embed_tokens.device
        self.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling).to(device)
        self.local_inv_freq = rope_inv_freq(config.head_dim, config.rope_local_theta or 10_000.0, None).to(device)
        self.embed_scale = torch.tensor(config.hidden_size ** 0.5, dtype=self.dtype)  # rounded to the weights' dtype
        self.matmul = default_matmul(matmul, self.device, self.dtype)
        self.linear = F.linear if self.matmul == "torch" else PackedLinear(
            [m for w in weights.layers for m in (w.qkv_proj, w.o_proj, w.gate_up_proj, w.down_proj)]
            + [weights.embed_tokens])

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,
                kv_cache: KVCache, backend: str = "torch", *, all_logits: bool = False) -> torch.Tensor:
        """Logits at each sequence's last new token (every row with `all_logits`); writes the new K/V (see
        LlamaForwardModel.forward). backend "numba" runs its decode kernel in full-attention layers only."""
        self._check(input_ids, positions, batch, kv_cache)
        cfg, eps = self.config, self.config.rms_norm_eps
        rope = {None: rope_cos_sin(positions, self.inv_freq, self.dtype)}
        if cfg.sliding_window is not None:
            rope[cfg.sliding_window] = rope_cos_sin(positions, self.local_inv_freq, self.dtype)
        h = F.embedding(input_ids, self.weights.embed_tokens) * self.embed_scale.to(self.device)  # [T, hidden]
        for i, layer in enumerate(self.weights.layers):
            window = cfg.layer_window(i)
            x = gemma_rms_norm(h, layer.input_norm, eps)
            attn = self._gemma_attention(i, layer, x, *rope[window], window, batch, kv_cache, backend)
            h = h + gemma_rms_norm(self.linear(attn, layer.o_proj), layer.post_attention_norm, eps)
            x = gemma_rms_norm(h, layer.pre_feedforward_norm, eps)
            gate, up = self.linear(x, layer.gate_up_proj).chunk(2, dim=-1)
            mlp = self.linear(F.gelu(gate, approximate="tanh") * up, layer.down_proj)
            h = h + gemma_rms_norm(mlp, layer.post_feedforward_norm, eps)
        if not all_logits:
            h = h[batch.logits_indices]
        return self.linear(gemma_rms_norm(h, self.weights.norm, eps), self.weights.embed_tokens)

    __call__ = forward

    def _gemma_attention(self, layer_index: int, w: Gemma3LayerWeights, x: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, window: int | None, batch: ForwardBatch, kv_cache: KVCache,
                         backend: str) -> torch.Tensor:
        cfg = self.config
        heads, kv_heads, num_tokens = cfg.num_heads, cfg.num_kv_heads, x.shape[0]
        qkv = self.linear(x, w.qkv_proj).view(num_tokens, heads + 2 * kv_heads, cfg.head_dim)
        q = gemma_rms_norm(qkv[:, :heads], w.q_norm, cfg.rms_norm_eps)
        k = gemma_rms_norm(qkv[:, heads:heads + kv_heads], w.k_norm, cfg.rms_norm_eps)
        q, k, v = apply_rope(q, cos, sin), apply_rope(k, cos, sin), qkv[:, heads + kv_heads:]
        tensor, group = kv_cache.layout.layer_tensor[layer_index], kv_cache.layout.layer_group[layer_index]
        key_cache, value_cache = kv_cache.key_caches[tensor], kv_cache.value_caches[tensor]
        slot_mapping, prefill_tables, decode_tables = batch.tables(group)
        scales = kv_cache.scales(tensor)  # an int8 cache's (reference.attention.quant); {} for a float cache
        store_kv(k, v, key_cache, value_cache, slot_mapping, backend=backend, **scales)
        n_pre, parts = batch.num_prefill_tokens, []
        if batch.prefill is not None:
            p = batch.prefill
            parts.append(paged_prefill_attention(q[:n_pre], key_cache, value_cache, prefill_tables, p.query_start_loc,
                                                 p.seq_lens, self.scale, backend=backend, window=window, **scales))
        if batch.decode is not None:
            parts.append(paged_decode_attention(q[n_pre:], key_cache, value_cache, decode_tables, batch.decode.seq_lens,
                                                self.scale, backend=backend, window=window, **scales))
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        return out.reshape(num_tokens, heads * cfg.head_dim)

    def _check(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch, kv_cache: KVCache) -> None:
        cfg, layout = self.config, kv_cache.layout
        if input_ids.shape != positions.shape or input_ids.shape[0] != batch.num_tokens:
            raise ValueError(f"input_ids {tuple(input_ids.shape)} and positions {tuple(positions.shape)} must both be "
                             f"[{batch.num_tokens}] (the batch's num_tokens)")
        if len(layout.layer_group) != cfg.num_layers or (kv_cache.num_kv_heads, kv_cache.head_dim) != (
                cfg.num_kv_heads, cfg.head_dim):
            raise ValueError(f"KV cache laid out for {len(layout.layer_group)} layers of (kv_heads, head_dim) = "
                             f"{(kv_cache.num_kv_heads, kv_cache.head_dim)}, the model needs {cfg.num_layers} of "
                             f"{(cfg.num_kv_heads, cfg.head_dim)}")
        if batch.num_groups != layout.num_groups:
            raise ValueError(f"the batch has block tables for {batch.num_groups} KV cache group(s), the cache's "
                             f"layout has {layout.num_groups}")
        if batch.max_seq_len > cfg.max_position_embeddings:
            raise ValueError(f"a sequence of {batch.max_seq_len} tokens is longer than the model's context "
                             f"(allowed: up to {cfg.max_position_embeddings})")
