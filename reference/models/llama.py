"""A readable Llama-family forward pass whose attention reads and writes the paged KV cache.

The architecture (Touvron et al. 2023; also Mistral and Qwen2) is a stack of identical pre-norm blocks::

    h = embed(input_ids)
    for each layer:
        x = rms_norm(h);  q, k, v = x Wq, x Wk, x Wv;  rotate q, k by position (RoPE)
        store k, v in the cache slots of the new tokens            <- PagedAttention, Section 4.1
        a = attention(q, all cached K/V of the sequence)          <- reads through the block table
        h = h + a Wo
        h = h + swiglu_mlp(rms_norm(h))
    logits = rms_norm(h) W_lm_head

The only thing that differs from a textbook transformer is where K and V live: not in a per-sequence
contiguous tensor but in blocks of the shared `KVCache`, reached via `ForwardBatch.slot_mapping`
(writes) and the block tables (reads). Prefill rows and decode rows go to different attention kernels
(`reference.attention`), as in vLLM.

Weights are plain tensors in small dataclasses, read from a Hugging Face state dict by name; there
is no nn.Module, so every step of the computation is visible in `forward`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reference.attention import cpu_numba, paged_decode_attention, paged_prefill_attention, store_kv
from reference.engine.batch import ForwardBatch
from reference.engine.kv_cache import KVCache
from reference.models import cpu_fused
from reference.models.config import ModelConfig
from reference.models.layers import apply_rope, rms_norm, rope_cos_sin, rope_inv_freq, swiglu_mlp
from reference.models.matmul import PackedLinear, default_matmul


@dataclass(slots=True)
class LayerWeights:
    """One decoder layer. Projection weights are [out_features, in_features], as F.linear expects."""

    input_norm: torch.Tensor  # [hidden]
    q_proj: torch.Tensor  # [num_heads * head_dim, hidden]
    k_proj: torch.Tensor  # [num_kv_heads * head_dim, hidden]
    v_proj: torch.Tensor  # [num_kv_heads * head_dim, hidden]
    o_proj: torch.Tensor  # [hidden, num_heads * head_dim]
    post_attention_norm: torch.Tensor  # [hidden]
    gate_proj: torch.Tensor  # [intermediate, hidden]
    up_proj: torch.Tensor  # [intermediate, hidden]
    down_proj: torch.Tensor  # [hidden, intermediate]
    q_bias: torch.Tensor | None = None  # [num_heads * head_dim] (Qwen2 only)
    k_bias: torch.Tensor | None = None  # [num_kv_heads * head_dim]
    v_bias: torch.Tensor | None = None  # [num_kv_heads * head_dim]
    o_bias: torch.Tensor | None = None  # [hidden]
    # NOTE: the fused forms the forward pass multiplies with (one matrix product instead of three, and one instead
    # of two: fewer kernel launches per layer, which is what a small model's step costs on a GPU). q/k/v_proj,
    # gate/up_proj and the biases above are views into these, so nothing is stored twice.
    qkv_proj: torch.Tensor | None = None  # [(num_heads + 2 * num_kv_heads) * head_dim, hidden]
    qkv_bias: torch.Tensor | None = None  # [(num_heads + 2 * num_kv_heads) * head_dim]
    gate_up_proj: torch.Tensor | None = None  # [2 * intermediate, hidden]


def fused_layer(**w: torch.Tensor | None) -> LayerWeights:
    """A LayerWeights whose q/k/v and gate/up projections are views into one concatenated matrix each."""
    qkv = torch.cat([w["q_proj"], w["k_proj"], w["v_proj"]])
    sizes = [w["q_proj"].shape[0], w["k_proj"].shape[0], w["v_proj"].shape[0]]
    w["q_proj"], w["k_proj"], w["v_proj"] = qkv.split(sizes)
    if w.get("q_bias") is not None:
        w["qkv_bias"] = torch.cat([w["q_bias"], w["k_bias"], w["v_bias"]])
        w["q_bias"], w["k_bias"], w["v_bias"] = w["qkv_bias"].split(sizes)
    gate_up = torch.cat([w["gate_proj"], w["up_proj"]])
    w["gate_proj"], w["up_proj"] = gate_up.split([w["gate_proj"].shape[0], w["up_proj"].shape[0]])
    return LayerWeights(**w, qkv_proj=qkv, gate_up_proj=gate_up)


@dataclass(slots=True)
class LlamaWeights:
    embed_tokens: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [hidden], the final RMSNorm
    lm_head: torch.Tensor  # [vocab, hidden]; the same tensor as embed_tokens when tied


def weights_from_state_dict(config: ModelConfig, state: dict[str, torch.Tensor]) -> LlamaWeights:
    """Pick our tensors out of a Hugging Face `LlamaForCausalLM` state dict (names as on the Hub)."""

    def get(name: str) -> torch.Tensor:
        if name not in state:
            raise ValueError(f"checkpoint has no tensor {name!r} (a {config.model_type} checkpoint must have it)")
        return state[name]

    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        bias = (lambda n, p=p: get(p + f"self_attn.{n}.bias")) if config.attention_bias else (lambda n: None)
        layers.append(fused_layer(
            input_norm=get(p + "input_layernorm.weight"),
            q_proj=get(p + "self_attn.q_proj.weight"),
            k_proj=get(p + "self_attn.k_proj.weight"),
            v_proj=get(p + "self_attn.v_proj.weight"),
            o_proj=get(p + "self_attn.o_proj.weight"),
            post_attention_norm=get(p + "post_attention_layernorm.weight"),
            gate_proj=get(p + "mlp.gate_proj.weight"),
            up_proj=get(p + "mlp.up_proj.weight"),
            down_proj=get(p + "mlp.down_proj.weight"),
            q_bias=bias("q_proj"), k_bias=bias("k_proj"), v_bias=bias("v_proj"),
            o_bias=state.get(p + "self_attn.o_proj.bias"),  # Llama with attention_bias; never Qwen2
        ))
    embed = get("model.embed_tokens.weight")
    lm_head = embed if config.tie_word_embeddings else get("lm_head.weight")
    return LlamaWeights(embed_tokens=embed, layers=layers, norm=get("model.norm.weight"), lm_head=lm_head)


class LlamaForwardModel:
    """Runs one step of a batch (prefill and decode rows packed together) over a paged KV cache."""

    def __init__(self, config: ModelConfig, weights: LlamaWeights, matmul: str | None = None) -> None:
        """matmul: how projections multiply (reference.models.matmul): "torch" (F.linear, the oracle's) or
        "onednn" (weights prepacked once; CPU only); None picks "onednn" for float32 on a CPU, else "torch"."""
        self.config = config
        self.weights = weights
        self.scale = config.head_dim ** -0.5  # softmax(q.k * scale), the 1/sqrt(d) of attention
        self.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling).to(
            weights.embed_tokens.device)  # [head_dim / 2] float32
        self.matmul = default_matmul(matmul, self.device, self.dtype)
        # linear(x, W, b) = x W^T + b, as F.linear; every projection of forward() goes through it.
        self.linear = F.linear if self.matmul == "torch" else PackedLinear(
            [m for w in weights.layers for m in (w.qkv_proj, w.o_proj, w.gate_up_proj, w.down_proj)]
            + [weights.lm_head])

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.embed_tokens.dtype

    @property
    def device(self) -> torch.device:
        return self.weights.embed_tokens.device

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,
                kv_cache: KVCache, backend: str = "torch", *, all_logits: bool = False) -> torch.Tensor:
        """Logits [num_seqs, vocab] at each sequence's last new token (or [num_tokens, vocab] for all rows
        with `all_logits=True`). Writes the new tokens' K/V into `kv_cache` as a side effect.

        input_ids, positions: int64 [num_tokens], packed as `batch` describes (usually batch.input_ids
        and batch.positions); backend: "torch" (the oracle), "torch_batched" (vectorized torch) or "triton" (the kernels).
        """
        self._check(input_ids, positions, batch, kv_cache)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.dtype)  # [T, head_dim] each
        if backend == "numba":
            self._check_fused(kv_cache)
        fused = self._fused(backend)
        norm = self._fused_norm if fused else self._norm
        act = cpu_fused.silu_mul if fused else None
        h = F.embedding(input_ids, self.weights.embed_tokens)  # [T, hidden], the residual stream
        delta = None  # what the previous layer's MLP adds to h, added by the next norm (one pass over h)
        for layer_index, layer in enumerate(self.weights.layers):
            x = norm(h, delta, layer.input_norm)
            attn = self._attention(layer_index, layer, x, cos, sin, batch, kv_cache, backend)  # [T, heads*dim]
            x = norm(h, self.linear(attn, layer.o_proj, layer.o_bias), layer.post_attention_norm)  # h += attn Wo
            delta = swiglu_mlp(x, layer.gate_up_proj, layer.down_proj, self.linear, act)
        if delta is not None:
            h += delta  # in place: h is this step's own tensor
        if not all_logits:
            h = h[batch.logits_indices]  # [num_seqs, hidden]: only these rows need the vocab projection
        return self.linear(rms_norm(h, self.weights.norm, self.config.rms_norm_eps), self.weights.lm_head)

    def _norm(self, h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor) -> torch.Tensor:
        """h += delta (in place; none for the first layer), then RMSNorm of h."""
        if delta is not None:
            h += delta
        return rms_norm(h, weight, self.config.rms_norm_eps)

    def _fused_norm(self, h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor) -> torch.Tensor:
        """As _norm, in one compiled loop that reads h once."""
        return cpu_fused.add_rms_norm(h, delta, weight, self.config.rms_norm_eps)

    __call__ = forward

    def _attention(self, layer_index: int, w: LayerWeights, x: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, batch: ForwardBatch, kv_cache: KVCache, backend: str) -> torch.Tensor:
        """Grouped-query attention of the new rows over each sequence's cached context."""
        cfg = self.config
        num_tokens = x.shape[0]
        heads, kv_heads = cfg.num_heads, cfg.num_kv_heads
        qkv = self.linear(x, w.qkv_proj, w.qkv_bias).view(num_tokens, heads + 2 * kv_heads, cfg.head_dim)
        key_cache, value_cache = kv_cache.key_caches[layer_index], kv_cache.value_caches[layer_index]
        scales = kv_cache.scales(layer_index)  # an int8 cache's (reference.attention.quant); {} for a float cache
        # The cache stores K after RoPE, so a cached key never needs rotating again.
        if self._fused(backend) and not scales:  # rotate q and k, store k, v in one compiled loop (cpu_fused)
            q = cpu_fused.rope_store(qkv, cos, sin, heads, kv_heads, key_cache, value_cache, batch.slot_mapping)
        else:  # NOTE: an int8 cache quantizes in store_kv (torch_batched's vectorized pass under "numba")
            qk = apply_rope(qkv[:, :heads + kv_heads], cos, sin)  # q and k rotated together: [T, heads + kv, dim]
            q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads:]  # strided views; kernels take strides
            store_kv(k, v, key_cache, value_cache, batch.slot_mapping, backend=backend, **scales)

        n_pre = batch.num_prefill_tokens
        window = cfg.layer_window(layer_index)  # Mistral's sliding window, else None
        parts = []
        if batch.prefill is not None:  # rows [0, n_pre): causal attention over prefix + new tokens
            p = batch.prefill
            parts.append(paged_prefill_attention(q[:n_pre], key_cache, value_cache, p.block_tables,
                                                 p.query_start_loc, p.seq_lens, self.scale, backend=backend,
                                                 window=window, **scales))
        if batch.decode is not None:  # rows [n_pre, T): one query per sequence over its whole context
            d = batch.decode
            parts.append(paged_decode_attention(q[n_pre:], key_cache, value_cache, d.block_tables,
                                                d.seq_lens, self.scale, backend=backend, window=window, **scales))
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)  # [T, num_heads, head_dim]
        return out.reshape(num_tokens, cfg.num_heads * cfg.head_dim)

    def _fused(self, backend: str) -> bool:
        """Whether the small steps run fused (cpu_fused): backend "numba" on a float32 or bfloat16 model (cpu_fused's
        bfloat16 loops round where the torch path rounds)."""
        return backend == "numba" and self.dtype in cpu_fused.DTYPES

    def _check_fused(self, kv_cache: KVCache) -> None:
        """ValueError (one line) unless backend "numba" can run this model and cache (see _fused)."""
        cache = kv_cache.key_caches[0] if kv_cache.key_caches else None
        if not cpu_fused.available():
            raise ValueError("backend 'numba' needs the numba package (pip install numba), or use 'torch_batched'")
        if self.dtype not in cpu_numba.CACHE_DTYPES or self.device.type != "cpu" or (cache is not None and (
                cache.dtype not in (self.dtype, torch.int8) or cache.device.type != "cpu")):  # int8: kv_dtype
            raise ValueError(f"backend 'numba' runs float32 or bfloat16 models and caches on a CPU (model: "
                             f"{self.dtype} on {self.device}; allowed: torch_batched for other dtypes, triton on a "
                             "GPU)")

    def _check(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,
               kv_cache: KVCache) -> None:
        cfg = self.config
        if input_ids.shape != positions.shape or input_ids.shape[0] != batch.num_tokens:
            raise ValueError(
                f"input_ids {tuple(input_ids.shape)} and positions {tuple(positions.shape)} must both be "
                f"[{batch.num_tokens}] (the batch's num_tokens)"
            )
        if (kv_cache.num_layers, kv_cache.num_kv_heads, kv_cache.head_dim) != (
                cfg.num_layers, cfg.num_kv_heads, cfg.head_dim):
            raise ValueError(
                f"KV cache shaped for (layers, kv_heads, head_dim) = "
                f"{(kv_cache.num_layers, kv_cache.num_kv_heads, kv_cache.head_dim)}, the model needs "
                f"{(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)}"
            )
        if batch.max_seq_len > cfg.max_position_embeddings:
            raise ValueError(
                f"a sequence of {batch.max_seq_len} tokens is longer than the model's context "
                f"(allowed: up to {cfg.max_position_embeddings})"
            )
