"""Attention over a paged KV cache: Triton kernels and their torch oracle.

PagedAttention (Kwon et al., SOSP 2023, Section 4.1) as the reference engine runs it:

- ``store_kv``: write this step's keys/values into their cache slots (``slot_mapping``);
- ``paged_decode_attention``: one new token per sequence over its whole paged context;
- ``paged_prefill_attention``: packed new tokens of several sequences, causal, over a cached prefix.

Each takes ``backend="triton"`` (default), ``"torch"`` (the slow oracle in ``torch_ref``) or ``"torch_batched"``
(a vectorized torch version in ``torch_batched``: the engine's CPU default, checked against the oracle).
Layout per layer: ``key_cache`` and ``value_cache`` are ``[num_blocks, block_size, num_kv_heads,
head_dim]``; the token at slot ``block_id * block_size + offset`` is ``cache[block_id, offset]``.
"""

import os

import torch

# NOTE: Triton decides at *decoration* time (when the kernel modules below are imported) whether a
# kernel is compiled for a GPU or run by its CPU interpreter. Without CUDA the only way the Triton
# backend can run is the interpreter, so we default TRITON_INTERPRET to 1 here, before those imports.
# An explicit setting in the environment always wins (setdefault).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from reference.attention.ops import paged_decode_attention, paged_prefill_attention, store_kv  # noqa: E402
from reference.attention.torch_ref import (  # noqa: E402
    paged_decode_attention_ref,
    paged_prefill_attention_ref,
    store_kv_ref,
)

__all__ = [
    "store_kv",
    "paged_decode_attention",
    "paged_prefill_attention",
    "store_kv_ref",
    "paged_decode_attention_ref",
    "paged_prefill_attention_ref",
]
