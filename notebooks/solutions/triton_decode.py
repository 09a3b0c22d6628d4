"""Solution to exercise 10: a paged decode attention kernel in Triton (notebooks/exercises/10_triton_decode.ipynb).

PagedAttention's decode kernel (vLLM paper, section 4.1; vLLM's paged_attention_v1): one program per
(sequence, query head) walks the sequence's blocks in order, looking each one up in the block table, and
keeps an ONLINE softmax (FlashAttention's, Dao et al. 2022): a running max m, a running sum l of
exp(score - m) and a running sum acc of exp(score - m) * v. When a block brings a larger max, what was summed
so far is rescaled by exp(m_old - m_new). At the end, out = acc / l. No block is ever copied out of the cache.
Without CUDA the kernel runs on CPU tensors through Triton's interpreter (TRITON_INTERPRET=1).
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

# NOTE: imported BEFORE triton for what it sets: without CUDA, TRITON_INTERPRET=1, so that triton runs kernels on
# CPU tensors through its interpreter (Triton reads it when it is imported). An import, not an os.environ line,
# because the autograder runs only a notebook's imports and definitions.
import reference.attention  # noqa: F401


class MyPagedDecode:
    def __init__(self) -> None:
        # NOTE: `kernel` has no `self`: a Triton kernel is a free function, run once per program of the grid.
        # It is written in the class so one class holds the exercise; triton.jit compiles it here.
        self._kernel = triton.jit(type(self).kernel)

    def forward(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
        """Paged decode attention: out [num_seqs, num_heads, head_dim] (see `kernel`). Launches one program per
        (sequence, query head)."""
        num_seqs, num_heads, head_dim = query.shape
        _, block_size, num_kv_heads, _ = key_cache.shape
        if query.dtype != torch.float32 or key_cache.dtype != torch.float32 or value_cache.dtype != torch.float32:
            raise ValueError(f"this kernel takes float32 tensors, got {query.dtype}, {key_cache.dtype}")
        if block_tables.dtype != torch.int32 or seq_lens.dtype != torch.int32:
            raise ValueError(f"block_tables and seq_lens must be int32, got {block_tables.dtype}, {seq_lens.dtype}")
        if num_heads % num_kv_heads or key_cache.stride() != value_cache.stride():
            raise ValueError("num_heads must be a multiple of num_kv_heads, and both caches laid out alike")
        query, block_tables, seq_lens = query.contiguous(), block_tables.contiguous(), seq_lens.contiguous()
        if key_cache.stride(3) != 1:
            raise ValueError("the caches' last dimension (head_dim) must be contiguous")
        out = torch.empty_like(query)
        with triton.knobs.compilation.scope():
            # NOTE: under the interpreter, an error inside the kernel then surfaces as itself, with its line,
            # rather than as an InterpreterError that only repeats its text.
            triton.knobs.compilation.front_end_debugging = True
            self._kernel[(num_seqs, num_heads)](
                out, query, key_cache, value_cache, block_tables, seq_lens, scale,
                query.stride(0), query.stride(1), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
                block_tables.stride(0),
                BLOCK_SIZE=block_size, BLOCK_PAD=triton.next_power_of_2(block_size), HEAD_DIM=head_dim,
                HEAD_DIM_PAD=triton.next_power_of_2(head_dim), GROUP=num_heads // num_kv_heads,
            )
        return out

    # --- the exercise ---------------------------------------------------------------------------
    def online_softmax_step(self, m: float, l: float, acc: np.ndarray, scores: np.ndarray,
                            values: np.ndarray) -> tuple[float, float, np.ndarray]:
        """Fold one block into the running (m, l, acc): scores [n] (-inf for a masked slot, at least one finite),
        values [n, head_dim]. Start from (-inf, 0.0, zeros); after the last block, out = acc / l."""
        m_new = max(m, float(np.max(scores)))
        alpha = np.exp(m - m_new)  # 0 before the first block (m = -inf), 1 if the max did not move
        p = np.exp(scores - m_new)
        return m_new, l * alpha + float(p.sum()), acc * alpha + p @ values

    def kernel(
        out_ptr,  # [num_seqs, num_heads, head_dim] float32, written
        query_ptr,  # [num_seqs, num_heads, head_dim] float32
        key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
        value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
        block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
        seq_lens_ptr,  # [num_seqs] int32
        scale,  # softmax scale
        stride_qs, stride_qh,  # query (and out) strides: sequence, head; head_dim is contiguous
        stride_cb, stride_cs, stride_ch,  # cache strides: block, slot, KV head; head_dim is contiguous
        stride_bt,  # block table stride: sequence
        BLOCK_SIZE: tl.constexpr,  # tokens per block
        BLOCK_PAD: tl.constexpr,  # BLOCK_SIZE rounded up to a power of two (tl.arange needs one)
        HEAD_DIM: tl.constexpr,
        HEAD_DIM_PAD: tl.constexpr,  # HEAD_DIM rounded up to a power of two
        GROUP: tl.constexpr,  # query heads per KV head (GQA)
    ):
        """Program (seq, head): out[seq, head] = softmax(scale * q . K^T) @ V over the seq_lens[seq] cached tokens
        of KV head head // GROUP, one block of the block table at a time, with an online softmax."""
        seq = tl.program_id(0)
        head = tl.program_id(1)
        kv_head = head // GROUP
        seq_len = tl.load(seq_lens_ptr + seq)
        offs_t = tl.arange(0, BLOCK_PAD)  # [BLOCK_PAD] slots of a block
        offs_d = tl.arange(0, HEAD_DIM_PAD)  # [HEAD_DIM_PAD]
        mask_d = offs_d < HEAD_DIM
        q = tl.load(query_ptr + seq * stride_qs + head * stride_qh + offs_d, mask=mask_d, other=0.0)
        m_i = tl.full([], float("-inf"), tl.float32)  # running max of the scores
        l_i = tl.full([], 0.0, tl.float32)  # running sum of exp(score - m_i)
        acc = tl.zeros([HEAD_DIM_PAD], tl.float32)  # running sum of exp(score - m_i) * v
        for logical in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
            block = tl.load(block_tables_ptr + seq * stride_bt + logical)  # the physical block
            valid = (offs_t < BLOCK_SIZE) & (logical * BLOCK_SIZE + offs_t < seq_len)  # [BLOCK_PAD]
            offs = block.to(tl.int64) * stride_cb + offs_t[:, None] * stride_cs + kv_head * stride_ch + offs_d[None, :]
            mask = valid[:, None] & mask_d[None, :]  # masked slots read 0.0, never the NaN behind them
            k = tl.load(key_cache_ptr + offs, mask=mask, other=0.0)  # [BLOCK_PAD, HEAD_DIM_PAD]
            v = tl.load(value_cache_ptr + offs, mask=mask, other=0.0)  # [BLOCK_PAD, HEAD_DIM_PAD]
            scores = tl.where(valid, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))  # [BLOCK_PAD]
            m_new = tl.maximum(m_i, tl.max(scores, axis=0))
            alpha = tl.exp(m_i - m_new)  # rescales what was summed under the old max (0 on the first block)
            p = tl.exp(scores - m_new)  # [BLOCK_PAD]; 0 where masked
            l_i = l_i * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            m_i = m_new
        tl.store(out_ptr + seq * stride_qs + head * stride_qh + offs_d, acc / l_i, mask=mask_d)
