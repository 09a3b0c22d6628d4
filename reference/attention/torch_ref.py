"""The torch oracle: paged attention written the slow, obviously correct way.

PagedAttention (Kwon et al., SOSP 2023, Section 4.1) stores a sequence's keys and values in fixed-size
blocks that need not be adjacent in memory; a per-sequence *block table* maps logical block ``i``
(tokens ``i*block_size .. (i+1)*block_size-1``) to a physical block of the cache::

    logical tokens   0 1 2 3 | 4 5 6 7 | 8 9          block_size = 4, seq_len = 10
    block_table      [   7   ,    2    ,  5 ]
    physical cache   block 2: t4 t5 t6 t7   block 5: t8 t9 -- --   block 7: t0 t1 t2 t3

Each function here *gathers* a sequence's K/V through its block table into one contiguous tensor and
then runs textbook attention in float32 with a plain softmax. No tiling, no online softmax, one
sequence at a time in a Python loop: these are the test oracles for the Triton kernels, not fast code.
Unlike the Triton wrappers they also check tensor *values* (slots in range, seq_lens consistent with
the block tables) since a sync costs nothing here.

Sliding-window attention (Gemma 3's local layers, ``window=W``): a query at position ``p`` attends to
positions ``p - W + 1 .. p`` only. The oracle gathers just the positions some query reads, from the first
query's window on: blocks before it may already be back in the pool (the hybrid KV manager frees them), so
their table entries are placeholders that must never be read.

An int8 cache (reference.attention.quant): ``store_kv_ref`` quantizes each token's heads and writes their scales;
the attention functions gather the int8 rows and their scales the same way and dequantize before attending.
"""

from __future__ import annotations

import torch

from .quant import dequantize_int8, quantize_int8


def store_kv_ref(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64; slot < 0 means "skip this token"
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32: an int8 cache's scales
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write token ``t``'s K/V into cache slot ``slot_mapping[t]`` (in place), one token at a time (quantized,
    with its scales, into an int8 cache)."""
    num_blocks, block_size = key_cache.shape[:2]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:  # the skip sentinel (see reference.attention.store_kv)
            continue
        if slot >= num_blocks * block_size:
            raise ValueError(
                f"slot_mapping[{t}] = {slot} is outside the cache (allowed: 0..{num_blocks * block_size - 1})"
            )
        block, offset = divmod(slot, block_size)
        if k_scale is None:
            key_cache[block, offset] = key[t]
            value_cache[block, offset] = value[t]
        else:
            key_cache[block, offset], k_scale[block, offset] = quantize_int8(key[t])
            value_cache[block, offset], v_scale[block, offset] = quantize_int8(value[t])


def gather_kv(
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_table: torch.Tensor,  # [max_blocks_per_seq] int32
    seq_len: int,
    first: int = 0,
) -> torch.Tensor:  # [seq_len - first, num_kv_heads, head_dim]
    """Copy one sequence's tokens at positions ``first .. seq_len - 1`` out of the paged cache into a contiguous
    tensor (the table's entries before block ``first // block_size`` are not read)."""
    block_size = cache.shape[1]
    num_blocks_used = -(-seq_len // block_size)  # ceil division
    if num_blocks_used > block_table.shape[0]:
        raise ValueError(
            f"seq_len {seq_len} needs {num_blocks_used} blocks but the block table has "
            f"{block_table.shape[0]} columns"
        )
    skip = first // block_size
    blocks = block_table[skip:num_blocks_used].long()  # [num_blocks_used - skip]
    if blocks.numel() and (blocks.min() < 0 or blocks.max() >= cache.shape[0]):
        raise ValueError(f"block table entries must be in 0..{cache.shape[0] - 1}, got {blocks.tolist()}")
    tokens = cache[blocks].reshape(-1, cache.shape[2], cache.shape[3])  # [blocks * block_size, H_kv, D]
    return tokens[first - skip * block_size : seq_len - skip * block_size]


def gather_dequantized(
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    cache_scale: torch.Tensor | None,  # [num_blocks, block_size, num_kv_heads] float32 (an int8 cache), or None
    block_table: torch.Tensor,  # [max_blocks_per_seq] int32
    seq_len: int,
    first: int = 0,
) -> torch.Tensor:  # [seq_len - first, num_kv_heads, head_dim]
    """gather_kv, then for an int8 cache each row times its scale (gathered through the same table)."""
    rows = gather_kv(cache, block_table, seq_len, first)
    if cache_scale is None:
        return rows
    return dequantize_int8(rows, gather_kv(cache_scale[..., None], block_table, seq_len, first)[..., 0])


def window_start(first_query: int, window: int | None) -> int:
    """The first position a query at ``first_query`` (or any later one) reads: 0, or first_query - window + 1."""
    return 0 if window is None else max(0, first_query - window + 1)


def _attend(
    query: torch.Tensor,  # [q_len, num_heads, head_dim]
    keys: torch.Tensor,  # [seq_len, num_kv_heads, head_dim]
    values: torch.Tensor,  # [seq_len, num_kv_heads, head_dim]
    scale: float,
    window: int | None = None,
    first: int = 0,  # the position of keys[0]
) -> torch.Tensor:  # [q_len, num_heads, head_dim] float32
    """Causal attention of the *last* ``q_len`` positions of a sequence over positions ``first .. seq_len - 1``
    (each query only over its last ``window`` positions, when given)."""
    q_len, num_heads, _ = query.shape
    num_keys, num_kv_heads, _ = keys.shape
    seq_len = first + num_keys
    group = num_heads // num_kv_heads
    # GQA: query head h reads KV head h // group, so repeat each KV head `group` times.
    keys = keys.float().repeat_interleave(group, dim=1)  # [seq_len, num_heads, D]
    values = values.float().repeat_interleave(group, dim=1)  # [seq_len, num_heads, D]
    scores = torch.einsum("qhd,khd->hqk", query.float(), keys) * scale  # [num_heads, q_len, seq_len]
    # Query j sits at absolute position seq_len - q_len + j and sees keys 0..that position.
    q_pos = torch.arange(seq_len - q_len, seq_len, device=scores.device).unsqueeze(1)  # [q_len, 1]
    k_pos = torch.arange(first, seq_len, device=scores.device).unsqueeze(0)  # [1, num_keys]
    hidden = k_pos > q_pos
    if window is not None:  # sliding window: query p sees p - window + 1 .. p
        hidden |= k_pos <= q_pos - window
    scores = scores.masked_fill(hidden, float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # [num_heads, q_len, seq_len]
    return torch.einsum("hqk,khd->qhd", probs, values)


def paged_decode_attention_ref(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    window: int | None = None,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32: an int8 cache's scales
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """One new query token per sequence attends to all ``seq_lens[i]`` cached tokens (itself included), or to
    the last ``window`` of them."""
    out = torch.zeros_like(query)
    for i, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:  # nothing to attend to: zeros, as the Triton kernel does
            continue
        first = window_start(seq_len - 1, window)
        keys = gather_dequantized(key_cache, k_scale, block_tables[i], seq_len, first)
        values = gather_dequantized(value_cache, v_scale, block_tables[i], seq_len, first)
        out[i] = _attend(query[i : i + 1], keys, values, scale, window, first)[0].to(query.dtype)
    return out


def packed_query_lens(
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32, cumulative new-token counts
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including the new tokens
    num_tokens: int,
) -> tuple[list[int], list[int], list[int]]:
    """Read a packed prefill batch's lengths on the host and check them: (starts, new tokens, seq lens).

    NOTE: a value check (it reads the tensors), so only the torch backends call it; see _checks.py.
    """
    starts = query_start_loc.tolist()
    if starts[0] != 0 or starts[-1] != num_tokens or any(b < a for a, b in zip(starts, starts[1:])):
        raise ValueError(f"query_start_loc must rise from 0 to num_tokens={num_tokens}, got {starts}")
    q_lens, lens = [b - a for a, b in zip(starts, starts[1:])], seq_lens.tolist()
    for i, (q_len, seq_len) in enumerate(zip(q_lens, lens)):
        if q_len > seq_len:
            raise ValueError(f"sequence {i} has {q_len} new tokens but seq_len {seq_len} (must be >= new tokens)")
    return starts, q_lens, lens


def paged_prefill_attention_ref(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim], sequences packed one after another
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32, cumulative new-token counts
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including the new tokens
    scale: float,
    window: int | None = None,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32: an int8 cache's scales
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Causal attention of each sequence's new tokens over its cached prefix plus the new tokens (each over its
    last ``window`` positions only, when given)."""
    out = torch.zeros_like(query)
    starts, q_lens, lens = packed_query_lens(query_start_loc, seq_lens, query.shape[0])
    for i, (q_len, seq_len) in enumerate(zip(q_lens, lens)):
        q_begin, q_end = starts[i], starts[i + 1]
        if q_len == 0:
            continue
        first = window_start(seq_len - q_len, window)
        keys = gather_dequantized(key_cache, k_scale, block_tables[i], seq_len, first)
        values = gather_dequantized(value_cache, v_scale, block_tables[i], seq_len, first)
        out[q_begin:q_end] = _attend(query[q_begin:q_end], keys, values, scale, window, first).to(query.dtype)
    return out
