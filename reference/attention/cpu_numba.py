"""Paged decode attention as a CPU kernel: a loop nest compiled by numba that reads K/V in place.

The torch backends must *gather* a sequence's blocks into a contiguous tensor before a matmul can use
them: every cached key and value is read, written to the copy, and read again, and the copy is padded to
the longest sequence of its group. In a decode step that traffic is most of attention's cost, because
attention over a few hundred tokens is memory-bound. This kernel is what vLLM's CPU build does in C++
(``cpu_attention_with_kv_cache``) and the Triton kernel does on a GPU: follow the block table and read each
sequence's own tokens straight out of the cache, once, with no copy and no padding::

    for each sequence s (sequences dealt to the threads by length):
        for each block j of s:  b = block_tables[s, j]              <- the page-table lookup
            for each token o of block b that s owns, each KV head h, each query head g of h's group:
                score[g, o] = q[g] . key_cache[b, o, h] * scale        (each key row read once)
        p = softmax(scores) per head                                 (max subtracted first)
        out[g] = sum over the same walk of p[g, o] * value_cache[b, o, h]

Slots a sequence does not own (the tail of its last block, the padding columns of its table) are never
read, so stale values or the tests' NaN cannot leak in. Accumulation is float32, as the oracle's.
NOTE: ``fastmath`` lets LLVM reorder the float32 sums (that is what vectorizes the dot products), and exp is a
polynomial that vectorizes (``_exp_float32``, ~3 units in the last place), so results differ from the oracle's in
the last bits (measured max |difference| ~7e-7 on unit-scale inputs).

Measured on the 2-core box, 30 layers of a decode step (one cache per layer, SmolLM2's 3 KV heads x 64 dims,
block size 16), scratch benchmarks: first version, 1 thread, 64 sequences of 5-130 tokens, 39 ms per step
against 105 for ``torch_batched``; 16 sequences of up to 170 tokens, 17 ms against 34. This version (heads
inside the token walk, vectorized exp, OpenMP threads), 30 sequences of 20-190 tokens: 24.2 ms against 27.0 for
the first at 1 thread, 12.8 against 14.1 at 2 threads (best of 3).

Float32 or bfloat16 caches. numba has no bfloat16 type, but a bfloat16 is the upper half of a float32 (the same
sign, exponent and top 7 fraction bits): the kernel reads a bfloat16 cache as its raw 16-bit words and widens each
element exactly (``_to_float32``: the word shifted into the high half of a float32), so it follows the block table in
place as for float32, with no gathered float32 copy. The query is widened by torch and the output rounded to
bfloat16 at the end, as ``torch_batched`` does (scores, softmax and sums in float32 in both). Measured on the 2-core
box, the bench workload in bfloat16 at 1 thread (cProfile): ``torch_batched``'s decode attention took 4.2 of 12.6 s
(its gathers, their float32 copies and masks), this kernel 0.9 s of 8.7. The engine picks this
backend on a CPU for float32 and bfloat16 models and ``torch_batched`` otherwise (float16). The first call compiles
the kernel (~2 s; once per cache dtype); ``cache=True`` keeps the machine code on disk (numba's cache next to this
file, or NUMBA_CACHE_DIR), so later processes load it.

An int8 cache (reference.attention.quant) is read in place too: each key row's dot product with the query is
multiplied by that row's scale once (``q . (s k) = s (q . k)``), and each value row's probability by its scale before
the row is accumulated, so the int8 rows are never copied. numba compiles one version per argument type: with no
scales (``None``) ``_row_scale`` is the constant 1.0, which LLVM folds away (the float version is unchanged).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

try:
    import numba

    # NOTE: OpenMP first, the runtime torch's CPU ops already run on (torch's wheels bring libgomp; numba's layer
    # then uses the same library and so the same pool of warm threads). With numba's own "workqueue" pool, its
    # threads had to wake and then compete with torch's, still spinning after the last matmul: measured on the
    # 2-core box, 2 threads, the bench workload's decode attention took 1.14 s with workqueue, 0.64 s with OpenMP.
    # workqueue stays the fallback where numba has no OpenMP layer. See keep_torch_threads for the thread count,
    # which numba's OpenMP start-up changes.
    numba.config.THREADING_LAYER_PRIORITY = ["omp", "workqueue", "tbb"]
    numba.config.THREADING_LAYER = "default"
    from numba.extending import overload
except ImportError:  # numba is a dependency of the project; without it the engine uses torch_batched
    numba = overload = None

CACHE_DTYPES = (torch.float32, torch.bfloat16)  # the model's dtypes this kernel serves (and int8 caches for them)


def _to_float32(x):
    """A cache element as float32 (in the kernel; numba picks the version for the cache's element type below)."""
    return x


if numba is not None:
    @overload(_to_float32, inline="always")
    def _to_float32_typed(x):
        """float32: itself. A 16-bit word (a bfloat16 cache viewed as uint16): its bits moved to the high half of a
        float32, the low half zero, which is the bfloat16's exact value (bfloat16 is float32 cut to 16 bits). An int8
        (an int8 cache's element): its value, exactly (its scale is applied per row by the kernel)."""
        if isinstance(x, numba.types.Integer) and x.bitwidth == 16:
            return lambda x: np.uint32(np.uint32(x) << np.uint32(16)).view(np.float32)
        if isinstance(x, numba.types.Integer):
            return lambda x: np.float32(x)
        return lambda x: x


def _row_scale(scales, block, offset, kv_head):
    """The scale of one cached row (an int8 cache's), or 1.0 without scales (numba picks the version below)."""
    return scales[block, offset, kv_head]


if numba is not None:
    @overload(_row_scale, inline="always")
    def _row_scale_typed(scales, block, offset, kv_head):
        if isinstance(scales, numba.types.NoneType):
            return lambda scales, block, offset, kv_head: np.float32(1.0)
        return lambda scales, block, offset, kv_head: scales[block, offset, kv_head]


# NOTE: numba's parallel loop hands each thread an equal share of the *iterations*; with sequences of 20 and 190
# tokens in one step, an equal count of sequences is not an equal amount of work (measured on the 2-core box, 2
# threads, 30 sequences of 20-190 tokens sorted by length, 30 layers: 23.6 ms, 1 thread 32.4). So sequences are
# dealt into one bucket per thread by length first (_balance) and the loop runs over buckets: 17.8 ms.
PER_SEQ_COST = 8  # tokens: a sequence's fixed work (its scores and output buffers, 9 heads' setup), a rough guess


def available() -> bool:
    return numba is not None


def numba_threads() -> int:
    """As many numba threads as torch uses (the engine's thread setting), at most numba's own pool."""
    return max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))


@contextlib.contextmanager
def keep_torch_threads():
    """Around a numba call: torch's thread count afterwards is what it was before. NOTE: numba's OpenMP layer sets
    OpenMP's thread count to all cores when it starts (measured: torch's 1 became 2), and torch reads the same
    setting. Every numba call of the engine (this kernel, reference.models.cpu_fused) goes through here."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def _balance(seq_lens, num_workers):
    """Sequences dealt to `num_workers` buckets, longest first, each to the least loaded bucket so far (LPT):
    (order, starts), bucket w being order[starts[w]:starts[w + 1]]. A sequence's cost is its length plus
    PER_SEQ_COST tokens of fixed work."""
    n = seq_lens.shape[0]
    by_length = np.argsort(-seq_lens.astype(np.int64), kind="mergesort")
    bucket = np.empty(n, np.int64)
    load = np.zeros(num_workers, np.int64)
    count = np.zeros(num_workers, np.int64)
    for s in by_length:
        w = np.argmin(load)
        bucket[s] = w
        load[w] += seq_lens[s] + PER_SEQ_COST
        count[w] += 1
    starts = np.zeros(num_workers + 1, np.int64)
    starts[1:] = np.cumsum(count)
    order = np.empty(n, np.int64)
    fill = starts[:-1].copy()
    for s in by_length:
        order[fill[bucket[s]]] = s
        fill[bucket[s]] += 1
    return order, starts


def _decode_kernel(query, key_cache, value_cache, block_tables, seq_lens, scale, out, order, starts, window,
                   k_scale, v_scale):
    num_seqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    for w in numba.prange(starts.shape[0] - 1):  # one bucket of sequences per thread (see _balance)
        for i in range(starts[w], starts[w + 1]):
            s = order[i]
            seq_len = seq_lens[s]
            if seq_len == 0:  # nothing to attend to: zeros, as the oracle
                out[s, :, :] = 0.0
                continue
            num_blocks = (seq_len + block_size - 1) // block_size
            first = max(0, seq_len - window) if window > 0 else 0  # a sliding window's first position
            span = seq_len - first
            scores = np.empty((num_heads, span), np.float32)
            # Scores of all heads, token by token: each key row is read once, in cache order (GQA: query head
            # kv_head * group + g reads KV head kv_head). Blocks before the window are never read.
            for j in range(first // block_size, num_blocks):
                block = block_tables[s, j]
                for o in range(max(0, first - j * block_size), min(block_size, seq_len - j * block_size)):
                    for kv_head in range(num_kv_heads):
                        row_scale = _row_scale(k_scale, block, o, kv_head) * scale  # an int8 row's scale, or 1
                        for head in range(kv_head * group, (kv_head + 1) * group):
                            dot = np.float32(0.0)
                            for d in range(head_dim):
                                dot += query[s, head, d] * _to_float32(key_cache[block, o, kv_head, d])
                            scores[head, j * block_size + o - first] = dot * row_scale
            inv_total = np.empty(num_heads, np.float32)
            for head in range(num_heads):  # softmax numerators (max subtracted first) and 1 / their sum
                top = np.float32(-np.inf)
                for t in range(span):
                    top = max(top, scores[head, t])
                total = np.float32(0.0)
                for t in range(span):
                    p = fast_exp(scores[head, t] - top)
                    scores[head, t] = p
                    total += p
                inv_total[head] = np.float32(1.0) / total
            acc = np.zeros((num_heads, head_dim), np.float32)
            for j in range(first // block_size, num_blocks):  # the same walk over the values
                block = block_tables[s, j]
                for o in range(max(0, first - j * block_size), min(block_size, seq_len - j * block_size)):
                    for kv_head in range(num_kv_heads):
                        row_scale = _row_scale(v_scale, block, o, kv_head)
                        for head in range(kv_head * group, (kv_head + 1) * group):
                            p = scores[head, j * block_size + o - first] * row_scale
                            for d in range(head_dim):
                                acc[head, d] += p * _to_float32(value_cache[block, o, kv_head, d])
            for head in range(num_heads):
                for d in range(head_dim):
                    out[s, head, d] = acc[head, d] * inv_total[head]


def _exp_float32(x):
    """exp of a float32 that LLVM vectorizes, unlike math.exp (Cephes' expf: 2^n times a degree-7 polynomial on
    [-ln2/2, ln2/2]; measured max relative error 1.7e-7, ~3 units in the last place; 6x faster in silu)."""
    x = min(max(x, np.float32(-87.3)), np.float32(88.0))  # 2^n stays a normal float32: n in -126..127
    n = np.floor(x * np.float32(1.44269504088896341) + np.float32(0.5))
    r = x - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)  # x - n ln2, ln2 split in two parts
    p = ((((np.float32(1.9875691500e-4) * r + np.float32(1.3981999507e-3)) * r + np.float32(8.3334519073e-3)) * r
          + np.float32(4.1665795894e-2)) * r + np.float32(1.6666665459e-1)) * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    return p * np.int32((np.int32(n) + np.int32(127)) << np.int32(23)).view(np.float32)  # times 2^n


fast_exp = numba.njit(fastmath=True, inline="always")(_exp_float32) if numba is not None else None


_compiled = None


def _kernel():
    """(balance, kernel), compiled on first use."""
    global _compiled
    if _compiled is None:
        _compiled = (numba.njit(cache=True)(_balance),
                     numba.njit(parallel=True, fastmath=True, cache=True, boundscheck=False,
                                error_model="numpy")(_decode_kernel))
    return _compiled


def paged_decode_attention_numba(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim] float32 or bfloat16, the caches' dtype
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] float32 or bfloat16
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] the same dtype
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32, values checked by the caller
    seq_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    window: int | None = None,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32: an int8 cache's scales
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim] in the query's dtype
    """One new query token per sequence over its ``seq_lens[i]`` cached tokens (the last ``window`` of them when
    given), read through the block table.

    The caller (reference.attention.ops) checks shapes, and the block-table values (ids in the cache, enough
    columns) through torch_batched's once-per-step plan: the kernel itself does not bounds-check."""
    if not available():
        raise ValueError("backend 'numba' needs the numba package (pip install numba), or use 'torch_batched'")
    quantized = key_cache.dtype == torch.int8  # an int8 cache of a float32 or bfloat16 model
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        if quantized and name != "query":
            continue
        if t.dtype not in CACHE_DTYPES or (t.dtype != key_cache.dtype and not quantized) or t.device.type != "cpu":
            raise ValueError(f"backend 'numba' runs float32 or bfloat16 CPU tensors of one dtype, got {name} of "
                             f"{t.dtype} on {t.device} (caches of {key_cache.dtype}; allowed: torch_batched for "
                             "other dtypes)")
    out_dtype = query.dtype
    if key_cache.dtype == torch.bfloat16:  # the caches' raw words, widened in the kernel (see _to_float32)
        key_cache, value_cache = key_cache.view(torch.uint16), value_cache.view(torch.uint16)
    query = query.float()  # (a float32 query: itself)
    scales = (k_scale.contiguous().numpy(), v_scale.contiguous().numpy()) if quantized else (None, None)
    out = torch.empty(query.shape, dtype=torch.float32)
    if query.shape[0]:
        with keep_torch_threads():
            threads = numba_threads()
            numba.set_num_threads(threads)  # the first call starts numba's threading layer
            balance, kernel = _kernel()
            lens = seq_lens.contiguous().numpy()
            order, starts = balance(lens if window is None else np.minimum(lens, window), threads)  # work: spans
            kernel(query.contiguous().numpy(), key_cache.numpy(), value_cache.numpy(),
                   block_tables.contiguous().numpy(), lens, np.float32(scale), out.numpy(), order, starts,
                   window or 0, *scales)
    return out if out_dtype == torch.float32 else out.to(out_dtype)
