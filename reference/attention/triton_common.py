"""Host-side helpers shared by the decode and prefill kernels, and the one idea they share.

Both kernels read K/V the PagedAttention way (Kwon et al., SOSP 2023, Section 4.1): a tile of *logical*
token positions becomes addresses in the paged cache by looking each position up in the sequence's
block table::

    pos            = 0 1 2 3 4 5 6 7 8 9          block_size = 4
    pos // 4       = 0 0 0 0 1 1 1 1 2 2   -> block_table[...] = 7 7 7 7 2 2 2 2 5 5   (physical block)
    pos %  4       = 0 1 2 3 0 1 2 3 0 1   -> offset inside that block

NOTE: the kernels look up a block per *token* of the tile, not per block, so one kernel handles every
block size (1 .. 256) with the same tile shape (``tl.dot`` needs at least 16 rows, which a block of
size 1 could not give). When ``block_size >= tile`` all tokens of a tile share one block and the
repeated block-table reads hit the cache.

NOTE: the gather is written out inside each kernel rather than as a shared ``@triton.jit`` helper:
under ``TRITON_INTERPRET=1`` every call of a nested jit function re-patches the ``triton.language``
module (about a millisecond each in Triton 3.9), which made the CPU tests several times slower.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference.attention._checks import interpreting

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def dot_config(dtype: torch.dtype) -> dict:
    """Kernel arguments ``DOT_DTYPE`` / ``DOT_PRECISION``: the dtype ``tl.dot`` multiplies in, its flag.

    - float32 inputs: multiply in float32 with ``input_precision="ieee"``. Triton's GPU default is TF32
      (~1e-3 relative error), which would hide real bugs behind a loose test tolerance.
    - float16/bfloat16 inputs: multiply in the 16-bit dtype on the tensor cores, accumulate in float32;
      the softmax probabilities P are rounded to 16 bits before ``P @ V``, as FlashAttention does.
      The precision flag is the default ("tf32"), which Triton ignores for 16-bit operands.
    - bfloat16 under ``TRITON_INTERPRET=1``: upcast to float32 first. The interpreter stores bfloat16
      as raw uint16 bits and its ``tl.dot`` multiplies those bit patterns as integers (Triton 3.9).
    """
    if dtype == torch.float32 or (interpreting() and dtype == torch.bfloat16):
        return {"DOT_DTYPE": tl.float32, "DOT_PRECISION": "ieee"}
    return {"DOT_DTYPE": _TL_DTYPES[dtype], "DOT_PRECISION": "tf32"}


def output_buffer(query: torch.Tensor) -> torch.Tensor:
    """The tensor a kernel writes its output into: one like ``query``, except float32 for a bfloat16 query under
    ``TRITON_INTERPRET=1``, which the wrapper then rounds with torch (``finish_output``).

    NOTE: the interpreter converts float32 to bfloat16 by cutting the low 16 bits (round toward zero; Triton 3.9,
    measured: a bfloat16 decode's every output element equal to the float32 result truncated, 57 of 192 one unit
    below the correctly rounded value), where a GPU's conversion and torch's round to nearest even. On the CPU the
    Triton backend's bfloat16 outputs were biased toward zero and its greedy tokens parted from the oracle's."""
    if interpreting() and query.dtype == torch.bfloat16:
        return torch.empty_like(query, dtype=torch.float32)
    return torch.empty_like(query)


def finish_output(out: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """``out`` (from output_buffer) in the query's dtype, rounded to nearest even by torch where it is not."""
    return out if out.dtype == query.dtype else out.to(query.dtype)


def next_pow2(n: int, minimum: int = 1) -> int:
    """Triton tiles have power-of-two sides; pad ``n`` up (and to at least ``minimum``)."""
    return max(minimum, triton.next_power_of_2(max(1, n)))
