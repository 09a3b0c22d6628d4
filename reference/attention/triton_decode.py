"""Paged decode attention in Triton: one new token per sequence reads its whole paged KV cache.

This is PagedAttention's decode kernel (Kwon et al., SOSP 2023, Section 4.1; vLLM's
``paged_attention_v1/v2``), written the way FlashDecoding splits long contexts.

What it computes: for sequence ``s`` and query head ``h``,
``out[s, h] = softmax(q[s, h] . K[s, 0:seq_len]^T * scale) @ V[s, 0:seq_len]``, where K/V of position
``p`` live in physical block ``block_tables[s, p // block_size]`` at offset ``p % block_size``.

How the grid maps onto the work::

    grid = (num_seqs, num_kv_heads, num_splits)

    program (s, g, i): the GQA group of KV head g  -> a [GROUP, head_dim] tile of queries
                       the i-th range of tokens      -> positions [i*tokens_per_split, (i+1)*tokens_per_split)
                       loops over TILE tokens at a time (gathered through the block table),
                       keeping an online softmax: running max m, running sum l, accumulator acc

All ``GROUP = num_heads // num_kv_heads`` query heads that share KV head ``g`` are one tile, so each
K/V byte is read once per group, not once per query head. Decode is memory bound: that byte count
is the cost.

Split-KV: with few sequences and long contexts, ``num_seqs * num_kv_heads`` programs cannot fill a GPU.
Then each sequence's tokens are cut into ``num_splits`` ranges; every split writes a partial output
``o_i`` (already normalized by its own softmax sum) and its log-sum-exp ``lse_i``, and a second small
kernel merges them exactly::

    lse = log(sum_i exp(lse_i))          out = sum_i exp(lse_i - lse) * o_i

A split whose range lies past the end of a short sequence is empty: ``lse_i = -inf``, weight 0.

Sliding window (``window > 0``, Gemma 3's local layers): the query at position ``seq_len - 1`` reads positions
``seq_len - window .. seq_len - 1`` only, so every split starts no earlier than that; the table's entries before
it (blocks the hybrid KV manager may have freed) are never loaded. A split wholly before it is empty.

An int8 cache (``QUANTIZED``; reference.attention.quant): each gathered K and V row is loaded as int8 (a quarter of
float32's bytes, half of bfloat16's: the cost of a memory-bound decode), widened and multiplied by its own scale
(``key_scale[block, offset, head]``, gathered by the same addresses) before the dots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from reference.attention._checks import check_triton_device
from reference.attention.triton_common import dot_config, finish_output, next_pow2, output_buffer


@dataclass(frozen=True)
class DecodeTuning:
    """The kernel's launch knobs. ``python -m reference bench-kernels --sweep`` times a grid of them on the
    GPU and saves the table (figures/bench_attention_sweep_gpu.csv, measured on an H100 in bfloat16 with 32 query
    over 8 KV heads, head_dim 128, block size 16); ``DEFAULT_TUNING`` is the variant that ranked first there.

    - ``tile``: tokens per inner-loop step (>= 16 for tl.dot); K and V tiles of ``tile x head_dim``.
    - ``num_warps`` / ``num_stages``: Triton's launch options (warps per program, software-pipeline depth of
      the loads in the token loop).
    - ``target_programs``: split a sequence until ``num_seqs * num_kv_heads * num_splits`` reaches this, so
      that a few sequences with long contexts still keep every SM busy with loads in flight ...
    - ``min_tokens_per_split``: ... but never into splits shorter than this (merging costs more than it wins).
    """

    tile: int = 64
    num_warps: int = 4
    num_stages: int = 3
    target_programs: int = 512
    min_tokens_per_split: int = 256
    max_splits: int = 32

    def __post_init__(self):
        for name in ("tile", "num_warps", "num_stages", "target_programs", "min_tokens_per_split", "max_splits"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"DecodeTuning.{name} must be an int >= 1, got {value!r}")
        if self.tile < 16 or self.tile & (self.tile - 1):
            raise ValueError(f"DecodeTuning.tile must be a power of two >= 16 (tl.dot), got {self.tile}")


DEFAULT_TUNING = DecodeTuning()


@triton.jit
def _decode_kernel(
    out_ptr,  # [num_seqs, num_heads, head_dim]                      (written when not IS_SPLIT)
    part_out_ptr,  # [num_seqs, num_heads, num_splits, head_dim] f32  (written when IS_SPLIT)
    part_lse_ptr,  # [num_seqs, num_heads, num_splits] f32            (written when IS_SPLIT)
    query_ptr,  # [num_seqs, num_heads, head_dim]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    key_scale_ptr,  # [num_blocks, block_size, num_kv_heads] float32 (QUANTIZED only)
    value_scale_ptr,  # [num_blocks, block_size, num_kv_heads] float32 (QUANTIZED only)
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs] int32
    scale,  # softmax scale, usually 1/sqrt(head_dim)
    max_context,  # max_blocks_per_seq * block_size: no read past the block table
    tokens_per_split,  # a multiple of TILE
    window,  # > 0: attend to the last `window` positions only; 0: the whole context
    num_heads, num_splits,
    stride_qs, stride_qh, stride_qd,  # query strides (seq, head, dim)
    stride_os, stride_oh, stride_od,  # out strides (seq, head, dim)
    stride_cb, stride_cs, stride_ch, stride_cd,  # cache strides (block, slot, head, dim)
    stride_bts, stride_btb,  # block table strides (seq, block)
    stride_sb, stride_ss, stride_sh,  # scale strides (block, slot, head)
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,  # >= 16, power of two
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # >= 16 (tl.dot), power of two; padded rows are zero queries
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    IS_SPLIT: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # dtype tl.dot multiplies in (see triton_common.dot_config)
    DOT_PRECISION: tl.constexpr,
    QUANTIZED: tl.constexpr,  # an int8 cache: each loaded row times its scale (compiled out otherwise)
):
    """Grid ``(num_seqs, num_kv_heads, num_splits)``: program (s, g, i) attends the GROUP query heads of
    KV head g of sequence s over token range i, with an online softmax (see the module docstring)."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.minimum(tl.load(seq_lens_ptr + seq), max_context)
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)  # empty range when start >= seq_len
    # a window: start at the first position it keeps (a split wholly before it is empty)
    start = tl.where(window > 0, tl.maximum(start, seq_len - window), start)

    offs_g = tl.arange(0, GROUP_PAD)  # [GROUP_PAD]
    offs_d = tl.arange(0, HEAD_DIM_PAD)  # [HEAD_DIM_PAD]
    mask_g = offs_g < GROUP
    mask_d = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_g  # [GROUP_PAD] query heads of this group
    q_ptrs = query_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=mask_g[:, None] & mask_d[None, :], other=0.0).to(DOT_DTYPE)  # [GROUP_PAD, HEAD_DIM_PAD]

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max of the scores
    l_i = tl.zeros([GROUP_PAD], tl.float32)  # running sum of exp(score - m_i)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)  # running sum of exp(score - m_i) * v
    block_table_ptr = block_tables_ptr + seq * stride_bts
    for tile_start in range(start, end, TILE):
        pos = tile_start + tl.arange(0, TILE)  # [TILE] logical positions
        valid = pos < end  # at least pos[0] is valid, so every row below gets a finite max
        # Gather through the block table (see triton_common). Masked rows read 0.0, never the memory
        # behind them: unused slots may hold anything (tests fill them with NaN), and 0 * NaN = NaN.
        physical_block = tl.load(block_table_ptr + (pos // BLOCK_SIZE) * stride_btb, mask=valid, other=0)
        # int64: block * stride_cb overflows int32 once the cache passes 2**31 elements.
        offs_tok = physical_block.to(tl.int64) * stride_cb + (pos % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
        kv_offs = offs_tok[:, None] + offs_d[None, :] * stride_cd  # [TILE, HEAD_DIM_PAD]
        kv_mask = valid[:, None] & mask_d[None, :]
        if QUANTIZED:  # int8 rows times their scales (masked rows: 0 times 0)
            s_offs = physical_block.to(tl.int64) * stride_sb + (pos % BLOCK_SIZE) * stride_ss + kv_head * stride_sh
            k_row_scale = tl.load(key_scale_ptr + s_offs, mask=valid, other=0.0)  # [TILE]
            v_row_scale = tl.load(value_scale_ptr + s_offs, mask=valid, other=0.0)  # [TILE]
            k = tl.load(key_cache_ptr + kv_offs, mask=kv_mask, other=0).to(tl.float32) * k_row_scale[:, None]
            v = tl.load(value_cache_ptr + kv_offs, mask=kv_mask, other=0).to(tl.float32) * v_row_scale[:, None]
            k, v = k.to(DOT_DTYPE), v.to(DOT_DTYPE)  # [TILE, HEAD_DIM_PAD]
        else:
            k = tl.load(key_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(DOT_DTYPE)  # [TILE, HEAD_DIM_PAD]
            v = tl.load(value_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(DOT_DTYPE)  # [TILE, HEAD_DIM_PAD]
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # [GROUP_PAD, TILE]
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))  # [GROUP_PAD]
        alpha = tl.exp(m_i - m_new)  # rescales what was summed under the old max (0 on the first tile)
        p = tl.exp(scores - m_new[:, None])  # [GROUP_PAD, TILE]; exactly 0 where masked
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
        m_i = m_new

    has_tokens = l_i > 0.0  # False only for an empty split (or seq_len 0)
    out = acc / tl.where(has_tokens, l_i, 1.0)[:, None]  # empty -> 0, not 0/0
    if IS_SPLIT:
        lse = tl.where(has_tokens, m_i + tl.log(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
        row = (seq * num_heads + heads) * num_splits + split  # [GROUP_PAD]
        tl.store(part_lse_ptr + row, lse, mask=mask_g)
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out,
                 mask=mask_g[:, None] & mask_d[None, :])
    else:
        o_ptrs = out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :] * stride_od
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_g[:, None] & mask_d[None, :])


@triton.jit
def _merge_splits_kernel(
    out_ptr,  # [num_seqs, num_heads, head_dim]
    part_out_ptr,  # [num_seqs, num_heads, num_splits, head_dim] f32
    part_lse_ptr,  # [num_seqs, num_heads, num_splits] f32
    num_heads, num_splits,
    stride_os, stride_oh, stride_od,  # out strides (seq, head, dim)
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,  # num_splits rounded up to a power of two
):
    """Grid ``(num_seqs, num_heads)``: merge one head's split partials, weighted by exp(lse_i - lse)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask_s = offs_s < num_splits
    mask_d = offs_d < HEAD_DIM
    row = (seq * num_heads + head) * num_splits + offs_s  # [SPLITS_PAD]
    lse = tl.load(part_lse_ptr + row, mask=mask_s, other=float("-inf"))  # [SPLITS_PAD]
    lse_max = tl.max(lse, axis=0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)  # all splits empty: weights 0, not NaN
    weight = tl.exp(lse - lse_max)  # [SPLITS_PAD]; 0 for empty splits
    parts = tl.load(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=mask_s[:, None] & mask_d[None, :], other=0.0)  # [SPLITS_PAD, HEAD_DIM_PAD]
    total = tl.sum(weight, axis=0)
    out = tl.sum(weight[:, None] * parts, axis=0) / tl.where(total > 0.0, total, 1.0)
    o_ptrs = out_ptr + seq * stride_os + head * stride_oh + offs_d * stride_od
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_d)


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context: int,
                      tuning: DecodeTuning = DEFAULT_TUNING) -> int:
    """How many splits per sequence: enough programs to fill the GPU, each split long enough to pay.

    NOTE: decided from ``max_context = max_blocks_per_seq * block_size`` (a shape, known on the host)
    rather than from ``seq_lens.max()``, which would cost a device-to-host sync every decode step.
    """
    by_length = triton.cdiv(max(max_context, 1), tuning.min_tokens_per_split)
    by_occupancy = triton.cdiv(tuning.target_programs, max(num_seqs * num_kv_heads, 1))
    return max(1, min(by_length, by_occupancy, tuning.max_splits))


def paged_decode_attention_triton(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    num_splits: int | None = None,
    tuning: DecodeTuning | None = None,
    window: int | None = None,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32: an int8 cache's scales
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """Launch the decode kernel (and the merge kernel when split). Arguments checked by the caller."""
    tuning = tuning or DEFAULT_TUNING
    check_triton_device(key_cache.device)
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    max_context = block_tables.shape[1] * block_size
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_context, tuning)
    tile = tuning.tile
    tokens_per_split = triton.cdiv(triton.cdiv(max(max_context, 1), num_splits), tile) * tile
    seq_lens = seq_lens.contiguous()  # NOTE: a tiny index vector; copying it is free
    out = output_buffer(query)
    if num_seqs == 0:
        return finish_output(out, query)
    is_split = num_splits > 1
    if is_split:
        part_out = torch.empty((num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32,
                               device=query.device)
        part_lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=query.device)
    else:  # not read by the kernel; any tensor will do as a placeholder pointer
        part_out = part_lse = out
    head_dim_pad = next_pow2(head_dim, minimum=16)
    quantized = k_scale is not None  # without scales: the caches as placeholder pointers, never read
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        out, part_out, part_lse, query, key_cache, value_cache,
        k_scale if quantized else key_cache, v_scale if quantized else value_cache, block_tables, seq_lens,
        scale, max_context, tokens_per_split, window or 0, num_heads, num_splits,
        *query.stride(), *out.stride(), *key_cache.stride(), *block_tables.stride(),
        *(k_scale.stride() if quantized else (0, 0, 0)),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        GROUP=group, GROUP_PAD=next_pow2(group, minimum=16),
        BLOCK_SIZE=block_size, TILE=tile, IS_SPLIT=is_split,
        **dot_config(query.dtype), QUANTIZED=quantized, num_warps=tuning.num_warps, num_stages=tuning.num_stages,
    )
    if is_split:
        _merge_splits_kernel[(num_seqs, num_heads)](
            out, part_out, part_lse, num_heads, num_splits, *out.stride(),
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, SPLITS_PAD=next_pow2(num_splits),
        )
    return finish_output(out, query)
