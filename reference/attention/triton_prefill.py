"""Paged prefill attention in Triton: causal attention of new tokens over a paged KV cache.

Prompt processing in PagedAttention (Kwon et al., SOSP 2023, Section 4.1) with two things a serving
system needs beyond a textbook causal kernel: several sequences packed into one batch, and a cached
prefix (tokens from the prefix cache, Section 4.4, or from earlier chunks of a chunked prefill)::

    sequence i:  | cached prefix (ctx_before tokens) | q_len new tokens |      seq_len = ctx_before + q_len
    new token j sits at absolute position  ctx_before + j  and attends to positions 0 .. ctx_before + j

The new tokens' K/V are already in the cache (``store_kv`` ran first), so every key, old or new, is
read the same way: through the block table, one gathered tile at a time.

How the grid maps onto the work::

    grid = (num_seqs, num_heads, cdiv(num_tokens, BLOCK_M))

    program (s, h, t): query rows t*BLOCK_M .. t*BLOCK_M + BLOCK_M - 1 of sequence s, head h
                       loops over key tiles of BLOCK_N positions from 0 up to the last position its
                       rows may see (causal), with an online softmax (FlashAttention-2 style)

NOTE: ``cdiv(num_tokens, BLOCK_M)`` is an upper bound on any sequence's number of query tiles that the
host knows without reading ``query_start_loc`` back from the GPU; programs past the end of their
sequence's tokens do no work. Prefill is compute bound, so unlike decode each program serves one query
head and simply re-reads its KV head (GQA) from cache.

An int8 cache (``QUANTIZED``; reference.attention.quant): each gathered K and V row is widened and multiplied by its
own scale, gathered by the same addresses, before the dots (as in the decode kernel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference.attention._checks import check_triton_device
from reference.attention.triton_common import dot_config, finish_output, next_pow2, output_buffer

BLOCK_M = 16  # query rows per program (>= 16 for tl.dot)
BLOCK_N = 32  # key positions per inner-loop step


@triton.jit
def _prefill_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]
    query_ptr,  # [num_tokens, num_heads, head_dim]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    key_scale_ptr,  # [num_blocks, block_size, num_kv_heads] float32 (QUANTIZED only)
    value_scale_ptr,  # [num_blocks, block_size, num_kv_heads] float32 (QUANTIZED only)
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    query_start_loc_ptr,  # [num_seqs + 1] int32
    seq_lens_ptr,  # [num_seqs] int32
    scale,  # softmax scale, usually 1/sqrt(head_dim)
    max_context,  # max_blocks_per_seq * block_size: no read past the block table
    window,  # > 0: each query attends to its last `window` positions only; 0: causal over the whole context
    stride_qt, stride_qh, stride_qd,  # query strides (token, head, dim)
    stride_ot, stride_oh, stride_od,  # out strides (token, head, dim)
    stride_cb, stride_cs, stride_ch, stride_cd,  # cache strides (block, slot, head, dim)
    stride_bts, stride_btb,  # block table strides (seq, block)
    stride_sb, stride_ss, stride_sh,  # scale strides (block, slot, head)
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,  # >= 16, power of two
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # dtype tl.dot multiplies in (see triton_common.dot_config)
    DOT_PRECISION: tl.constexpr,
    QUANTIZED: tl.constexpr,  # an int8 cache: each loaded row times its scale (compiled out otherwise)
):
    """Grid ``(num_seqs, num_heads, cdiv(num_tokens, BLOCK_M))``: program (s, h, t) computes causal
    attention for query rows t*BLOCK_M .. t*BLOCK_M + BLOCK_M - 1 of sequence s, head h."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_tile = tl.program_id(2)
    kv_head = head // GROUP

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.minimum(tl.load(seq_lens_ptr + seq), max_context)
    ctx_before = seq_len - q_len  # cached prefix length
    if q_tile * BLOCK_M >= q_len:  # this sequence has fewer query tiles than the grid allows
        return

    offs_m = q_tile * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] index among this sequence's new tokens
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask_m = offs_m < q_len
    mask_d = offs_d < HEAD_DIM
    q_pos = ctx_before + offs_m  # [BLOCK_M] absolute positions
    rows = (q_start + offs_m).to(tl.int64)  # [BLOCK_M] rows of the packed query/out (int64: no overflow)
    q_ptrs = query_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=mask_m[:, None] & mask_d[None, :], other=0.0).to(DOT_DTYPE)  # [BLOCK_M, HEAD_DIM_PAD]

    # Causal: the tile's last row sees positions 0 .. ctx_before + last_row - 1, no further.
    last_row = tl.minimum(q_tile * BLOCK_M + BLOCK_M, q_len)
    kv_end = tl.minimum(ctx_before + last_row, seq_len)

    # Sliding window: the tile's first row sees from ctx_before + first_row - window + 1 on; nothing before that
    # is loaded (those table entries may name blocks already freed). Later rows mask the start of that range.
    kv_begin = tl.where(window > 0, tl.maximum(ctx_before + q_tile * BLOCK_M - window + 1, 0), 0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    block_table_ptr = block_tables_ptr + seq * stride_bts
    for kv_start in range(kv_begin, kv_end, BLOCK_N):
        pos = kv_start + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        valid = pos < kv_end
        # Gather through the block table (see triton_common). Masked rows read 0.0, never the memory
        # behind them: unused slots may hold anything (tests fill them with NaN), and 0 * NaN = NaN.
        physical_block = tl.load(block_table_ptr + (pos // BLOCK_SIZE) * stride_btb, mask=valid, other=0)
        # int64: block * stride_cb overflows int32 once the cache passes 2**31 elements.
        offs_tok = physical_block.to(tl.int64) * stride_cb + (pos % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
        kv_offs = offs_tok[:, None] + offs_d[None, :] * stride_cd  # [BLOCK_N, HEAD_DIM_PAD]
        kv_mask = valid[:, None] & mask_d[None, :]
        if QUANTIZED:  # int8 rows times their scales (masked rows: 0 times 0)
            s_offs = physical_block.to(tl.int64) * stride_sb + (pos % BLOCK_SIZE) * stride_ss + kv_head * stride_sh
            k_row_scale = tl.load(key_scale_ptr + s_offs, mask=valid, other=0.0)  # [BLOCK_N]
            v_row_scale = tl.load(value_scale_ptr + s_offs, mask=valid, other=0.0)  # [BLOCK_N]
            k = tl.load(key_cache_ptr + kv_offs, mask=kv_mask, other=0).to(tl.float32) * k_row_scale[:, None]
            v = tl.load(value_cache_ptr + kv_offs, mask=kv_mask, other=0).to(tl.float32) * v_row_scale[:, None]
            k, v = k.to(DOT_DTYPE), v.to(DOT_DTYPE)  # [BLOCK_N, HEAD_DIM_PAD]
        else:
            k = tl.load(key_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(DOT_DTYPE)  # [BLOCK_N, HEAD_DIM_PAD]
            v = tl.load(value_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(DOT_DTYPE)  # [BLOCK_N, HEAD_DIM_PAD]
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # [BLOCK_M, BLOCK_N]
        visible = valid[None, :] & (pos[None, :] <= q_pos[:, None])
        visible = visible & ((window <= 0) | (pos[None, :] > q_pos[:, None] - window))
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        # A row may see nothing in this tile (its max stays -inf); subtract 0 then, so that
        # exp(-inf - (-inf)) = NaN never happens: its p and alpha come out 0 instead.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(scores - m_safe[:, None])  # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    o_ptrs = out_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def paged_prefill_attention_triton(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32: an int8 cache's scales
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Launch the prefill kernel. Arguments checked by the caller."""
    check_triton_device(key_cache.device)
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    num_seqs = seq_lens.shape[0]
    out = output_buffer(query)
    if num_tokens == 0 or num_seqs == 0:
        return finish_output(out, query)
    query_start_loc = query_start_loc.contiguous()  # NOTE: tiny index vectors; copying them is free
    seq_lens = seq_lens.contiguous()
    grid = (num_seqs, num_heads, triton.cdiv(num_tokens, BLOCK_M))
    quantized = k_scale is not None  # without scales: the caches as placeholder pointers, never read
    _prefill_kernel[grid](
        out, query, key_cache, value_cache, k_scale if quantized else key_cache,
        v_scale if quantized else value_cache, block_tables, query_start_loc, seq_lens,
        scale, block_tables.shape[1] * block_size, window or 0,
        *query.stride(), *out.stride(), *key_cache.stride(), *block_tables.stride(),
        *(k_scale.stride() if quantized else (0, 0, 0)),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=next_pow2(head_dim, minimum=16),
        GROUP=num_heads // num_kv_heads, BLOCK_SIZE=block_size,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        **dot_config(query.dtype), QUANTIZED=quantized,
    )
    return finish_output(out, query)
