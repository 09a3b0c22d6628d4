"""The small steps of a layer fused into compiled CPU loops: the forward pass's path for backend "numba".

Between its matrix products, a Llama layer runs a dozen small tensor operations: the residual add, RMSNorm (pow,
mean, add, rsqrt, two products), RoPE (five products and sums over slices), the K/V store (a scatter and its
checks), SwiGLU's activation (a copy, silu, a product). In a decode step each of them touches a few dozen rows
and costs torch's fixed ~5-10 us per call, far more than its arithmetic: measured on the 2-core box over the bench
workload (64 requests, 2 threads), 0.7 s of 7.3 s went to RMSNorm, RoPE and the store. vLLM's CPU build compiles
the same steps into few kernels (torch.compile, and C++ ``rms_norm``/``rotary_embedding``/``reshape_and_cache``).
Here each group is one numba loop over the rows (in parallel over rows when there are many):

- `add_rms_norm`: ``h += delta; x = rms_norm(h) * weight`` (the residual add and the next norm read h once);
- `rope_store`: rotate q and k (Hugging Face's rotate-half pairing), write k and v to their cache slots, return q;
- `silu_mul`: ``silu(gate) * up`` from the gate/up product's two halves.

Numerics: float32 throughout, as the torch path; the sums of RMSNorm and the exp of silu run in another order or
with another exp than torch's vectorized kernels, so results differ in the last bits (`fastmath` lets LLVM reorder
the sums to vectorize them). RoPE and the store are exact: the same products and sums as
reference.models.layers.apply_rope, in the same order, without fastmath (no fused multiply-add). The torch path
(backends "torch", "torch_batched") stays the bit-exact reference; tests compare the two.

bfloat16: the same three loops over the tensors' raw 16-bit words (numba has no bfloat16), a second version of each
(`_bf16` names) that rounds where the torch path rounds: torch computes every bfloat16 operation in float32 and
rounds its result to nearest even, so the loops widen each word exactly, compute in float32 and round (`_to_bf16`,
torch's c10::BFloat16 rounding) after each operation the torch path runs as one (the residual add, RMSNorm's
float32 result, the product with the weight; each RoPE product and sum; silu, then the product with up). RoPE and
the store are then bit-exact; RMSNorm's sum and silu's exp differ in the last float32 bits as above, which moves a
bfloat16 result only across a rounding boundary: by one bfloat16 unit, rarely. Measured on the 2-core box, 1
thread, the bench workload in bfloat16: these steps in torch took about a fifth of the run (torch.profiler).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from reference.attention import cpu_numba

_exp = cpu_numba.fast_exp  # float32 exp that vectorizes (see there)
numba = cpu_numba.numba  # None without numba: the model then never takes this path (see available())
available = cpu_numba.available
PARALLEL_ROWS = 64  # rows from which the loops run on all threads (fewer: one thread; a wake-up costs more)


def _add_rms_norm(h, delta, weight, eps, out):
    rows, hidden = h.shape
    for r in numba.prange(rows):
        total = np.float32(0.0)
        for c in range(hidden):
            v = h[r, c] + delta[r, c]
            h[r, c] = v
            total += v * v
        scale = np.float32(1.0) / np.float32(math.sqrt(total / np.float32(hidden) + eps))
        for c in range(hidden):
            out[r, c] = h[r, c] * scale * weight[c]


def _rms_norm(h, weight, eps, out):
    rows, hidden = h.shape
    for r in numba.prange(rows):
        total = np.float32(0.0)
        for c in range(hidden):
            total += h[r, c] * h[r, c]
        scale = np.float32(1.0) / np.float32(math.sqrt(total / np.float32(hidden) + eps))
        for c in range(hidden):
            out[r, c] = h[r, c] * scale * weight[c]


def _silu_mul(gate_up, out):
    rows, width = out.shape
    for r in numba.prange(rows):
        for c in range(width):
            g = gate_up[r, c]
            out[r, c] = g / (np.float32(1.0) + _exp(-g)) * gate_up[r, width + c]


def _first_slot_past(slot_mapping, num_slots):
    """-1, or the first token whose slot is past the end of the cache."""
    for t in range(slot_mapping.shape[0]):
        if slot_mapping[t] >= num_slots:
            return t
    return -1


def _store_token(qkv, t, slot, key_cache, value_cache, num_heads, num_kv_heads):
    """Token t's k (rotated where it lies) and v into its cache slot; slot < 0: a token not to store (see
    reference.attention.store_kv). The caches' element type is the qkv's (float32, or bfloat16 words)."""
    if slot >= 0:
        block_size, head_dim = key_cache.shape[1], qkv.shape[2]
        block, offset = slot // block_size, slot % block_size
        for kv_head in range(num_kv_heads):
            for d in range(head_dim):
                key_cache[block, offset, kv_head, d] = qkv[t, num_heads + kv_head, d]
                value_cache[block, offset, kv_head, d] = qkv[t, num_heads + num_kv_heads + kv_head, d]


def _rope_store(qkv, cos, sin, slot_mapping, key_cache, value_cache, num_heads, num_kv_heads, q_out):
    """Returns -1, or the first token whose slot is past the end of the cache (nothing written for it or after)."""
    tokens, _, head_dim = qkv.shape
    half = head_dim // 2
    past = _first_slot_past(slot_mapping, key_cache.shape[0] * key_cache.shape[1])
    if past >= 0:
        return past
    for t in numba.prange(tokens):
        for head in range(num_heads + num_kv_heads):
            rotated = q_out[t, head] if head < num_heads else qkv[t, head]  # k is rotated where it lies, then stored
            for d in range(half):  # out = x * cos, then -= x2 * sin (first half), += x1 * sin (second half)
                x1, x2 = qkv[t, head, d], qkv[t, head, half + d]
                rotated[d] = x1 * cos[t, d] - x2 * sin[t, d]
                rotated[half + d] = x2 * cos[t, half + d] + x1 * sin[t, half + d]
        _store_token(qkv, t, slot_mapping[t], key_cache, value_cache, num_heads, num_kv_heads)
    return -1


# --- bfloat16: the loops above over raw 16-bit words, rounding where the torch path rounds (module docstring) ---


def _from_bf16(word):
    """A bfloat16 (its uint16 word) as float32: exact."""
    return np.uint32(np.uint32(word) << np.uint32(16)).view(np.float32)


def _to_bf16(x):
    """A float32 rounded to bfloat16, as its uint16 word: to nearest, ties to even (torch's c10::BFloat16); NaN is
    0x7FC0. NOTE: integer arithmetic on the bits, so fastmath cannot drop the NaN test."""
    bits = np.float32(x).view(np.uint32)
    if (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16(0x7FC0)
    return np.uint16((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


def _round(x):
    """x rounded to bfloat16, kept as float32."""
    return _from_bf16(_to_bf16(x))


def _add_rms_norm_bf16(h, delta, weight, eps, out):
    rows, hidden = h.shape
    for r in numba.prange(rows):
        total = np.float32(0.0)
        for c in range(hidden):
            word = _to_bf16(_from_bf16(h[r, c]) + _from_bf16(delta[r, c]))  # h += delta, in bfloat16
            h[r, c] = word
            v = _from_bf16(word)
            total += v * v
        scale = np.float32(1.0) / np.float32(math.sqrt(total / np.float32(hidden) + eps))
        for c in range(hidden):  # weight * (the float32 norm rounded to bfloat16), rounded
            out[r, c] = _to_bf16(_from_bf16(weight[c]) * _round(_from_bf16(h[r, c]) * scale))


def _rms_norm_bf16(h, weight, eps, out):
    rows, hidden = h.shape
    for r in numba.prange(rows):
        total = np.float32(0.0)
        for c in range(hidden):
            v = _from_bf16(h[r, c])
            total += v * v
        scale = np.float32(1.0) / np.float32(math.sqrt(total / np.float32(hidden) + eps))
        for c in range(hidden):
            out[r, c] = _to_bf16(_from_bf16(weight[c]) * _round(_from_bf16(h[r, c]) * scale))


def _silu_mul_bf16(gate_up, out):
    rows, width = out.shape
    for r in numba.prange(rows):
        for c in range(width):
            g = _from_bf16(gate_up[r, c])
            out[r, c] = _to_bf16(_round(g / (np.float32(1.0) + _exp(-g))) * _from_bf16(gate_up[r, width + c]))


def _rope_store_bf16(qkv, cos, sin, slot_mapping, key_cache, value_cache, num_heads, num_kv_heads, q_out):
    """As _rope_store, over bfloat16 words: out = x * cos, then -= x2 * sin / += x1 * sin, each rounded."""
    tokens, _, head_dim = qkv.shape
    half = head_dim // 2
    past = _first_slot_past(slot_mapping, key_cache.shape[0] * key_cache.shape[1])
    if past >= 0:
        return past
    for t in numba.prange(tokens):
        for head in range(num_heads + num_kv_heads):
            rotated = q_out[t, head] if head < num_heads else qkv[t, head]
            for d in range(half):
                x1, x2 = _from_bf16(qkv[t, head, d]), _from_bf16(qkv[t, head, half + d])
                c1, c2 = _from_bf16(cos[t, d]), _from_bf16(cos[t, half + d])
                s1, s2 = _from_bf16(sin[t, d]), _from_bf16(sin[t, half + d])
                rotated[d] = _to_bf16(_round(x1 * c1) - _round(x2 * s1))
                rotated[half + d] = _to_bf16(_round(x2 * c2) + _round(x1 * s2))
        _store_token(qkv, t, slot_mapping[t], key_cache, value_cache, num_heads, num_kv_heads)
    return -1


if numba is not None:  # the helpers, inlined into the loops that call them
    _first_slot_past = numba.njit(inline="always")(_first_slot_past)
    _store_token = numba.njit(inline="always")(_store_token)
    _from_bf16 = numba.njit(inline="always")(_from_bf16)
    _to_bf16 = numba.njit(inline="always")(_to_bf16)
    _round = numba.njit(inline="always")(_round)


_compiled: dict[tuple[str, bool], object] = {}


def _kernel(name: str, parallel: bool):
    """The named loop compiled (once per process; numba's on-disk cache keeps the machine code between runs)."""
    key = (name, parallel)
    if key not in _compiled:
        exact = name.startswith("rope_store")  # no fastmath: the same roundings as the torch path
        _compiled[key] = numba.njit(parallel=parallel, fastmath=not exact, cache=True, boundscheck=False,
                                    error_model="numpy")(globals()["_" + name])
    return _compiled[key]


def _launch(name: str, rows: int, *args):
    parallel = rows >= PARALLEL_ROWS and torch.get_num_threads() > 1
    with cpu_numba.keep_torch_threads():
        if parallel:
            numba.set_num_threads(cpu_numba.numba_threads())
        return _kernel(name, parallel)(*args)


# NOTE: no checks per call: the forward pass checks once per step that the model, its cache and so every tensor
# here are float32 (or every one bfloat16) on the CPU (LlamaForwardModel.forward), and creates h, qkv and gate_up
# itself, contiguous. A check per call cost more than the loop it guards (~4 us each in the engine, 4 per call;
# cProfile).
DTYPES = (torch.float32, torch.bfloat16)


def _arrays(*tensors: torch.Tensor) -> tuple[str, list[np.ndarray]]:
    """The kernels' name suffix for the tensors' dtype ("" for float32, "_bf16") and the tensors as numpy arrays (a
    bfloat16 tensor as its uint16 words: the same memory)."""
    if tensors[0].dtype == torch.bfloat16:
        return "_bf16", [t.view(torch.uint16).numpy() for t in tensors]
    return "", [t.numpy() for t in tensors]


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``h += delta`` in place (skipped for None), then RMSNorm of h times weight: a new [rows, hidden] tensor.
    h, delta: contiguous float32 (or bfloat16) [rows, hidden]; weight: the same dtype [hidden]."""
    out = torch.empty_like(h)
    if h.shape[0]:
        if delta is None:
            kind, (h_, weight_, out_) = _arrays(h, weight, out)
            _launch("rms_norm" + kind, h.shape[0], h_, weight_, np.float32(eps), out_)
        else:
            kind, (h_, delta_, weight_, out_) = _arrays(h, delta, weight, out)
            _launch("add_rms_norm" + kind, h.shape[0], h_, delta_, weight_, np.float32(eps), out_)
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate_up[:, :I]) * gate_up[:, I:] for a contiguous float32 (or bfloat16) gate_up of [rows, 2 I]: SwiGLU's
    activation."""
    out = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2, dtype=gate_up.dtype)
    if gate_up.shape[0]:
        kind, arrays = _arrays(gate_up, out)
        _launch("silu_mul" + kind, gate_up.shape[0], *arrays)
    return out


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
               key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """RoPE of q and k (qkv: contiguous float32 or bfloat16 [T, num_heads + 2 num_kv_heads, head_dim], k rotated in
    place), k and v written to their slots (slot < 0: skipped; past the cache: ValueError); returns the rotated q,
    [T, num_heads, head_dim]. cos, sin: [T, head_dim] as reference.models.layers.rope_cos_sin makes them."""
    q = torch.empty(qkv.shape[0], num_heads, qkv.shape[2], dtype=qkv.dtype)
    if qkv.shape[0]:
        slots = slot_mapping.numpy()
        kind, (qkv_, cos_, sin_, key_, value_, q_) = _arrays(qkv, cos, sin, key_cache, value_cache, q)
        bad = _launch("rope_store" + kind, qkv.shape[0], qkv_, cos_, sin_, slots, key_, value_, num_heads,
                      num_kv_heads, q_)
        if bad >= 0:
            num_slots = key_cache.shape[0] * key_cache.shape[1]
            raise ValueError(f"slot_mapping[{bad}] = {int(slots[bad])} is outside the cache "
                             f"(allowed: 0..{num_slots - 1})")
    return q
