"""Writing new keys and values into the paged KV cache (vLLM's ``reshape_and_cache``).

After the model computes K and V for this step's tokens, each token's K/V goes to the cache slot its
sequence's block table gives it (Kwon et al., SOSP 2023, Section 4.1). The scheduler has already turned
(block table, position) into a flat *slot* for every token::

    slot = block_table[position // block_size] * block_size + position % block_size

so the kernel needs no block table at all: program ``t`` copies token ``t``'s ``[num_kv_heads, head_dim]``
tile of K and of V to ``key_cache[slot // block_size, slot % block_size]``.

The skip sentinel: ``slot_mapping[t] < 0`` means "do not store token ``t``" (vLLM uses -1 for padding
tokens). It is the only sentinel of this module and lives only inside the ``slot_mapping`` tensor.

An int8 cache (``QUANTIZED``; reference.attention.quant): the program quantizes each head's row of its token before
the store: ``scale = max |row| / 127`` (1 for an all-zero row), ``q = round(row / scale)`` rounded half to even as
torch.round does, and writes the row's scale to ``key_scale[block, offset, head]`` beside it. Without it the branch
is compiled out (a constexpr), and the float store is unchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference.attention._checks import FLOAT_DTYPES, check_cache, check_tensor, check_triton_device
from reference.attention.triton_common import next_pow2


@triton.jit
def _store_kv_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping_ptr,  # [num_tokens] int64, < 0 = skip
    key_scale_ptr,  # [num_blocks, block_size, num_kv_heads] float32 (QUANTIZED only)
    value_scale_ptr,  # [num_blocks, block_size, num_kv_heads] float32 (QUANTIZED only)
    num_slots,  # num_blocks * block_size
    stride_kt, stride_kh, stride_kd,  # key strides (token, head, dim)
    stride_vt, stride_vh, stride_vd,  # value strides (token, head, dim)
    stride_cb, stride_cs, stride_ch, stride_cd,  # cache strides (block, slot, head, dim)
    stride_sb, stride_ss, stride_sh,  # scale strides (block, slot, head)
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,  # NUM_KV_HEADS rounded up to a power of two
    HEAD_DIM_PAD: tl.constexpr,  # HEAD_DIM rounded up to a power of two
    BLOCK_SIZE: tl.constexpr,
    QUANTIZED: tl.constexpr,  # an int8 cache: quantize each head's row and store its scale
):
    """Grid ``(num_tokens,)``: program ``t`` copies token ``t``'s K and V into its cache slot."""
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    offs_h = tl.arange(0, HEADS_PAD)  # [HEADS_PAD]
    offs_d = tl.arange(0, HEAD_DIM_PAD)  # [HEAD_DIM_PAD]
    # NOTE: slots past the end of the cache are skipped too (memory safety without a host sync);
    # the torch backend raises for them instead.
    # NOTE: `slot` is broadcast to a vector before the test: under TRITON_INTERPRET=1 (Triton 3.9),
    # `bool tensor & bool scalar` yields an integer array that tl.load rejects as a mask.
    slots = slot + tl.zeros([HEADS_PAD], tl.int64)  # [HEADS_PAD], all equal to slot
    keep = (slots >= 0) & (slots < num_slots) & (offs_h < NUM_KV_HEADS)  # [HEADS_PAD]
    mask = keep[:, None] & (offs_d[None, :] < HEAD_DIM)  # [HEADS_PAD, HEAD_DIM_PAD]

    k = tl.load(key_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :] * stride_kd, mask=mask,
                other=0.0)
    v = tl.load(value_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :] * stride_vd, mask=mask,
                other=0.0)

    block = slots // BLOCK_SIZE  # [HEADS_PAD]
    offset = slots % BLOCK_SIZE  # [HEADS_PAD]
    cache_offs = (block * stride_cb + offset * stride_cs + offs_h * stride_ch)[:, None] + offs_d[None, :] * stride_cd
    if QUANTIZED:
        scale_offs = block * stride_sb + offset * stride_ss + offs_h * stride_sh  # [HEADS_PAD]
        # K and V alike: per head row, scale = absmax / 127, q = round(row / scale), ties to even
        # (r = floor(y + 0.5) is exact for |y| <= 127.5: float32 keeps 17 fraction bits there). div_rn: IEEE division,
        # as torch divides (a GPU's `/` may be approximate), so every backend stores the same int8 rows and scales.
        kf = k.to(tl.float32)  # [HEADS_PAD, HEAD_DIM_PAD]; masked lanes read 0
        k_absmax = tl.max(tl.abs(kf), axis=1)  # [HEADS_PAD]
        k_scale = tl.where(k_absmax > 0.0, tl.div_rn(k_absmax, 127.0), 1.0)
        ky = tl.div_rn(kf, k_scale[:, None])
        kr = tl.floor(ky + 0.5)
        kr = tl.where((kr - ky == 0.5) & (kr - 2.0 * tl.floor(kr * 0.5) != 0.0), kr - 1.0, kr)
        tl.store(key_cache_ptr + cache_offs, tl.minimum(tl.maximum(kr, -127.0), 127.0).to(tl.int8), mask=mask)
        tl.store(key_scale_ptr + scale_offs, k_scale, mask=keep)
        vf = v.to(tl.float32)
        v_absmax = tl.max(tl.abs(vf), axis=1)
        v_scale = tl.where(v_absmax > 0.0, tl.div_rn(v_absmax, 127.0), 1.0)
        vy = tl.div_rn(vf, v_scale[:, None])
        vr = tl.floor(vy + 0.5)
        vr = tl.where((vr - vy == 0.5) & (vr - 2.0 * tl.floor(vr * 0.5) != 0.0), vr - 1.0, vr)
        tl.store(value_cache_ptr + cache_offs, tl.minimum(tl.maximum(vr, -127.0), 127.0).to(tl.int8), mask=mask)
        tl.store(value_scale_ptr + scale_offs, v_scale, mask=keep)
    else:
        tl.store(key_cache_ptr + cache_offs, k, mask=mask)
        tl.store(value_cache_ptr + cache_offs, v, mask=mask)


def store_kv_triton(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32: an int8 cache's scales
    v_scale: torch.Tensor | None = None,
) -> None:
    """Check the arguments and launch one program per token (arguments checked by the caller)."""
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    check_triton_device(key_cache.device)
    slot_mapping = slot_mapping.contiguous()  # NOTE: a tiny index vector; copying it is free
    quantized = k_scale is not None
    _store_kv_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        # without scales: any tensor as a placeholder pointer, never read (QUANTIZED is False)
        k_scale if quantized else key_cache, v_scale if quantized else value_cache,
        num_blocks * block_size,
        *key.stride(), *value.stride(), *key_cache.stride(), *(k_scale.stride() if quantized else (0, 0, 0)),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS_PAD=next_pow2(num_kv_heads),
        HEAD_DIM_PAD=next_pow2(head_dim),
        BLOCK_SIZE=block_size,
        QUANTIZED=quantized,
    )


def check_store_args(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Shapes, dtypes and devices of ``store_kv``'s arguments (both backends)."""
    check_cache(key_cache, value_cache)
    device, dtype = key_cache.device, key_cache.dtype
    dtypes = FLOAT_DTYPES if dtype == torch.int8 else (dtype,)  # an int8 cache quantizes any float K/V
    check_tensor("key", key, 3, dtypes, device)
    check_tensor("value", value, 3, dtypes, device)
    check_tensor("slot_mapping", slot_mapping, 1, (torch.int64,), device)
    expected = (slot_mapping.shape[0], key_cache.shape[2], key_cache.shape[3])
    for name, t in (("key", key), ("value", value)):
        if tuple(t.shape) != expected:
            raise ValueError(
                f"{name} must be [num_tokens, num_kv_heads, head_dim] = {list(expected)} "
                f"(num_tokens from slot_mapping, the rest from the cache), got {list(t.shape)}"
            )
