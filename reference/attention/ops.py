"""The public attention operations of the reference engine, each with four backends.

``backend="triton"`` runs the kernels in ``triton_store`` / ``triton_decode`` / ``triton_prefill``
(compiled on CUDA, interpreted on CPU under ``TRITON_INTERPRET=1``); ``backend="torch"`` runs the slow
oracle in ``torch_ref``; ``backend="torch_batched"`` runs the vectorized torch version in
``torch_batched``; ``backend="numba"`` is ``torch_batched`` with decode attention as a compiled CPU
kernel (``cpu_numba``, float32 or bfloat16): the engine's CPU default for float32 and bfloat16 models. All take
the same arguments and get the same checks, so a test can call one and then another. The layout follows vLLM
(Kwon et al., SOSP 2023, Section 4.1):
per layer, K and V each live in a cache ``[num_blocks, block_size, num_kv_heads, head_dim]``, and the
token at slot ``block_id * block_size + offset`` is ``cache[block_id, offset]``.

``k_scale`` / ``v_scale`` (every operation): an int8 cache (``kv_dtype="int8"``, reference.attention.quant) holds
one float32 scale per token and KV head beside it, ``[num_blocks, block_size, num_kv_heads]``; ``store_kv``
quantizes the new K/V and writes their scales, attention dequantizes what it reads. Every backend does both, so
each is tested against the float oracle within the quantization step. A float cache takes no scales.

``window`` (decode and prefill): a sliding-window layer (Gemma 3's local layers), whose query at position ``p``
attends to positions ``p - window + 1 .. p`` only; table entries wholly before the first query's window are never
read (the hybrid KV manager may have freed those blocks).
"""

from __future__ import annotations

import torch

from reference.attention import cpu_numba, torch_batched, torch_ref
from reference.attention._checks import (
    FLOAT_DTYPES,
    check_backend,
    check_cache,
    check_heads,
    check_kv_scales,
    check_scale,
    check_tensor,
)
from reference.attention.triton_decode import DecodeTuning, paged_decode_attention_triton
from reference.attention.triton_prefill import paged_prefill_attention_triton
from reference.attention.triton_store import check_store_args, store_kv_triton


def store_kv(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64
    backend: str = "triton",
    *,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32, an int8 cache's
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write token ``t``'s K/V into ``cache[slot // block_size, slot % block_size]``, in place (an int8 cache:
    quantized, with its scales in ``k_scale`` / ``v_scale`` at the same place).

    ``slot_mapping[t] < 0`` is the one sentinel: token ``t`` is skipped (e.g. a padding token).
    A slot past the end of the cache is a caller bug: the torch backends raise ValueError, the Triton
    backend skips it (checking would need a device-to-host sync).
    """
    check_backend(backend)
    check_store_args(key, value, key_cache, value_cache, slot_mapping)
    check_kv_scales(key_cache, k_scale, v_scale)
    scales = {} if k_scale is None else {"k_scale": k_scale, "v_scale": v_scale}
    if backend == "torch":
        torch_ref.store_kv_ref(key, value, key_cache, value_cache, slot_mapping, **scales)
    elif backend in ("torch_batched", "numba"):
        torch_batched.store_kv_batched(key, value, key_cache, value_cache, slot_mapping, **scales)
    else:
        store_kv_triton(key, value, key_cache, value_cache, slot_mapping, **scales)


def _check_paged_args(query, key_cache, value_cache, block_tables, seq_lens, scale, window=None, k_scale=None,
                      v_scale=None) -> float:
    """Checks shared by decode and prefill; returns ``scale`` as a float."""
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise ValueError(f"window must be None (full attention) or an int >= 1, got {window!r}")
    check_cache(key_cache, value_cache)
    check_kv_scales(key_cache, k_scale, v_scale)
    device = key_cache.device
    check_tensor("query", query, 3, FLOAT_DTYPES, device)
    check_heads(query, key_cache)
    check_tensor("block_tables", block_tables, 2, (torch.int32,), device)
    check_tensor("seq_lens", seq_lens, 1, (torch.int32,), device)
    if block_tables.shape[0] != seq_lens.shape[0]:
        raise ValueError(
            f"block_tables has {block_tables.shape[0]} rows but seq_lens has {seq_lens.shape[0]} "
            "entries (expected one of each per sequence)"
        )
    return check_scale(scale)


def paged_decode_attention(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    backend: str = "triton",
    *,
    num_splits: int | None = None,
    tuning: DecodeTuning | None = None,
    window: int | None = None,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32, an int8 cache's
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """Attention of each sequence's one new query token over its ``seq_lens[i]`` cached tokens.

    ``seq_lens[i]`` counts the current token too (its K/V is already stored). A sequence with
    ``seq_lens[i] == 0`` gets zeros. ``num_splits`` (Triton only) forces the split-KV factor; by default
    it is chosen from the batch size and ``max_blocks_per_seq * block_size``. ``tuning`` (Triton only)
    overrides the launch knobs (``triton_decode.DecodeTuning``; the benchmark's sweep uses it).
    """
    check_backend(backend)
    scale = _check_paged_args(query, key_cache, value_cache, block_tables, seq_lens, scale, window, k_scale, v_scale)
    scales = {} if k_scale is None else {"k_scale": k_scale, "v_scale": v_scale}
    if block_tables.shape[0] != query.shape[0]:
        raise ValueError(
            f"query has {query.shape[0]} sequences but block_tables has {block_tables.shape[0]} rows"
        )
    if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be None or an int >= 1, got {num_splits!r}")
    if backend == "torch":
        return torch_ref.paged_decode_attention_ref(query, key_cache, value_cache, block_tables, seq_lens, scale,
                                                    window, **scales)
    if backend == "torch_batched":
        return torch_batched.paged_decode_attention_batched(
            query, key_cache, value_cache, block_tables, seq_lens, scale, window, **scales
        )
    if backend == "numba":
        torch_batched.check_block_tables(block_tables, seq_lens, *key_cache.shape[:2])
        return cpu_numba.paged_decode_attention_numba(query, key_cache, value_cache, block_tables, seq_lens, scale,
                                                      window, **scales)
    return paged_decode_attention_triton(
        query, key_cache, value_cache, block_tables, seq_lens, scale, num_splits=num_splits, tuning=tuning,
        window=window, **scales)


def paged_prefill_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    backend: str = "triton",
    *,
    window: int | None = None,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32, an int8 cache's
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Causal attention of packed new tokens over each sequence's cached prefix plus themselves.

    Sequence ``i`` owns query rows ``query_start_loc[i] .. query_start_loc[i+1]-1`` (its ``q_len``
    new tokens); ``seq_lens[i]`` is its context length *including* them, so its cached prefix is
    ``seq_lens[i] - q_len`` tokens. New token ``j`` sits at position ``seq_lens[i] - q_len + j`` and
    attends to positions ``0 ..`` that position.
    """
    check_backend(backend)
    scale = _check_paged_args(query, key_cache, value_cache, block_tables, seq_lens, scale, window, k_scale, v_scale)
    scales = {} if k_scale is None else {"k_scale": k_scale, "v_scale": v_scale}
    check_tensor("query_start_loc", query_start_loc, 1, (torch.int32,), key_cache.device)
    if query_start_loc.shape[0] != seq_lens.shape[0] + 1:
        raise ValueError(
            f"query_start_loc must have num_seqs + 1 = {seq_lens.shape[0] + 1} entries, "
            f"got {query_start_loc.shape[0]}"
        )
    if backend == "torch":
        return torch_ref.paged_prefill_attention_ref(
            query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale, window, **scales
        )
    if backend in ("torch_batched", "numba"):  # numba: decode only; a prefill is compute-bound (SDPA)
        return torch_batched.paged_prefill_attention_batched(
            query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale, window, **scales
        )
    return paged_prefill_attention_triton(
        query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale, window, **scales
    )
