"""Paged decode attention as a CPU kernel: a loop nest compiled by numba that reads K/V in place.

The torch backends must *gather* a sequence's blocks into a contiguous tensor before a matmul can use
them: every cached key and value is read, written to the copy, and read again, and the copy is padded to
the longest sequence of its group. In a decode step that traffic is most of attention's cost, because
attention over a few hundred tokens is memory-bound. This kernel is what vLLM's CPU build does in C++
(``cpu_attention_with_kv_cache``) and the Triton kernel does on a GPU: follow the block table and read each
sequence's own tokens straight out of the cache, once, with no copy and no padding::

    for each sequence s (in parallel), each KV head h, each query head g of h's group:
        for each block j of s:  b = block_tables[s, j]              <- the page-table lookup
            for each token o of block b that s owns:  score = q . key_cache[b, o, h] * scale
        p = softmax(scores)                                          (max subtracted first)
        out = sum over the same tokens of p * value_cache[b, o, h]

Slots a sequence does not own (the tail of its last block, the padding columns of its table) are never
read, so stale values or the tests' NaN cannot leak in. Accumulation is float32, as the oracle's.
NOTE: ``fastmath`` lets LLVM reorder the float32 sums (that is what vectorizes the dot products), so results
differ from the oracle's in the last bits (measured max |difference| ~7e-7 on unit-scale inputs).

Measured on the 2-core box, 1 thread, 30 layers of a decode step (one cache per layer, SmolLM2's 3 KV heads
x 64 dims, block size 16): 64 sequences of 5-130 tokens, 39 ms per step against 105 for ``torch_batched``;
16 sequences of up to 170 tokens, 17 ms against 34 (scratch benchmark, one run).

Float32 caches only (numba has no bfloat16); the engine picks this backend on a CPU for float32 models and
``torch_batched`` otherwise. The first call compiles the kernel (~2 s); ``cache=True`` keeps the machine
code on disk (numba's cache next to this file, or NUMBA_CACHE_DIR), so later processes load it.
"""

from __future__ import annotations

import math

import numpy as np
import torch

try:
    import numba

    # NOTE: numba's default threading layer here is OpenMP, the same runtime as torch's: its set_num_threads
    # then changed torch's thread count too (measured: 1 -> 2). Its own "workqueue" pool leaves torch alone.
    numba.config.THREADING_LAYER = "workqueue"
except ImportError:  # numba is a dependency of the project; without it the engine uses torch_batched
    numba = None


def available() -> bool:
    return numba is not None


def _decode_kernel(query, key_cache, value_cache, block_tables, seq_lens, scale, out):
    num_seqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    for s in numba.prange(num_seqs):
        seq_len = seq_lens[s]
        if seq_len == 0:  # nothing to attend to: zeros, as the oracle
            out[s, :, :] = 0.0
            continue
        num_blocks = (seq_len + block_size - 1) // block_size
        scores = np.empty(seq_len, np.float32)
        acc = np.empty(head_dim, np.float32)
        for head in range(num_heads):
            kv_head = head // group  # GQA: query head `head` reads KV head head // group
            top = np.float32(-np.inf)
            for j in range(num_blocks):
                block = block_tables[s, j]
                for o in range(min(block_size, seq_len - j * block_size)):
                    dot = np.float32(0.0)
                    for d in range(head_dim):
                        dot += query[s, head, d] * key_cache[block, o, kv_head, d]
                    dot *= scale
                    scores[j * block_size + o] = dot
                    top = max(top, dot)
            total = np.float32(0.0)
            for t in range(seq_len):
                scores[t] = math.exp(scores[t] - top)
                total += scores[t]
            acc[:] = 0.0
            for j in range(num_blocks):
                block = block_tables[s, j]
                for o in range(min(block_size, seq_len - j * block_size)):
                    p = scores[j * block_size + o]
                    for d in range(head_dim):
                        acc[d] += p * value_cache[block, o, kv_head, d]
            for d in range(head_dim):
                out[s, head, d] = acc[d] / total


_compiled = None


def _kernel():
    global _compiled
    if _compiled is None:
        _compiled = numba.njit(parallel=True, fastmath=True, cache=True, boundscheck=False,
                               error_model="numpy")(_decode_kernel)
    return _compiled


def paged_decode_attention_numba(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim] float32
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32, values checked by the caller
    seq_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim] float32
    """One new query token per sequence over its ``seq_lens[i]`` cached tokens, read through the block table.

    The caller (reference.attention.ops) checks shapes, and the block-table values (ids in the cache, enough
    columns) through torch_batched's once-per-step plan: the kernel itself does not bounds-check."""
    if not available():
        raise ValueError("backend 'numba' needs the numba package (pip install numba), or use 'torch_batched'")
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        if t.dtype != torch.float32 or t.device.type != "cpu":
            raise ValueError(f"backend 'numba' runs float32 CPU tensors, got {name} of {t.dtype} on {t.device} "
                             "(allowed: torch_batched for other dtypes)")
    out = torch.empty(query.shape, dtype=torch.float32)
    if query.shape[0]:
        # NOTE: as many numba threads as torch uses (the engine's thread setting), at most numba's own pool.
        numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
        _kernel()(query.contiguous().numpy(), key_cache.numpy(), value_cache.numpy(),
                  block_tables.contiguous().numpy(), seq_lens.contiguous().numpy(), np.float32(scale), out.numpy())
    return out
