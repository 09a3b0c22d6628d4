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
"""

from __future__ import annotations

import math

import numpy as np
import torch

from reference.attention import cpu_numba

_exp = cpu_numba._exp  # float32 exp that vectorizes (see there)
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


def _rope_store(qkv, cos, sin, slot_mapping, key_cache, value_cache, num_heads, num_kv_heads, q_out):
    """Returns -1, or the first token whose slot is past the end of the cache (nothing written for it or after)."""
    tokens, _, head_dim = qkv.shape
    half = head_dim // 2
    block_size = key_cache.shape[1]
    num_slots = key_cache.shape[0] * block_size
    for t in range(tokens):
        if slot_mapping[t] >= num_slots:
            return t
    for t in numba.prange(tokens):
        slot = slot_mapping[t]
        for head in range(num_heads + num_kv_heads):
            rotated = q_out[t, head] if head < num_heads else qkv[t, head]  # k is rotated where it lies, then stored
            for d in range(half):  # out = x * cos, then -= x2 * sin (first half), += x1 * sin (second half)
                x1, x2 = qkv[t, head, d], qkv[t, head, half + d]
                rotated[d] = x1 * cos[t, d] - x2 * sin[t, d]
                rotated[half + d] = x2 * cos[t, half + d] + x1 * sin[t, half + d]
        if slot >= 0:  # slot < 0: a token not to store (see reference.attention.store_kv)
            block, offset = slot // block_size, slot % block_size
            for kv_head in range(num_kv_heads):
                for d in range(head_dim):
                    key_cache[block, offset, kv_head, d] = qkv[t, num_heads + kv_head, d]
                    value_cache[block, offset, kv_head, d] = qkv[t, num_heads + num_kv_heads + kv_head, d]
    return -1


_compiled: dict[tuple[str, bool], object] = {}


def _kernel(name: str, parallel: bool):
    """The named loop compiled (once per process; numba's on-disk cache keeps the machine code between runs)."""
    key = (name, parallel)
    if key not in _compiled:
        exact = name == "rope_store"  # no fastmath: the same roundings as the torch path
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
# here are float32 on the CPU (LlamaForwardModel.forward), and creates h, qkv and gate_up itself, contiguous. A
# check per call cost more than the loop it guards (~4 us each in the engine, 4 per call; cProfile).


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``h += delta`` in place (skipped for None), then RMSNorm of h times weight: a new [rows, hidden] tensor.
    h, delta: contiguous float32 [rows, hidden]; weight: float32 [hidden]."""
    out = torch.empty_like(h)
    if h.shape[0]:
        if delta is None:
            _launch("rms_norm", h.shape[0], h.numpy(), weight.numpy(), np.float32(eps), out.numpy())
        else:
            _launch("add_rms_norm", h.shape[0], h.numpy(), delta.numpy(), weight.numpy(), np.float32(eps),
                    out.numpy())
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate_up[:, :I]) * gate_up[:, I:] for a contiguous float32 gate_up of [rows, 2 I]: SwiGLU's activation."""
    out = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2, dtype=torch.float32)
    if gate_up.shape[0]:
        _launch("silu_mul", gate_up.shape[0], gate_up.numpy(), out.numpy())
    return out


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
               key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """RoPE of q and k (qkv: contiguous float32 [T, num_heads + 2 num_kv_heads, head_dim], k rotated in place), k
    and v written to their slots (slot < 0: skipped; past the cache: ValueError); returns the rotated q,
    [T, num_heads, head_dim]. cos, sin: [T, head_dim] as reference.models.layers.rope_cos_sin makes them."""
    q = torch.empty(qkv.shape[0], num_heads, qkv.shape[2], dtype=torch.float32)
    if qkv.shape[0]:
        slots = slot_mapping.numpy()
        bad = _launch("rope_store", qkv.shape[0], qkv.numpy(), cos.numpy(), sin.numpy(), slots, key_cache.numpy(),
                      value_cache.numpy(), num_heads, num_kv_heads, q.numpy())
        if bad >= 0:
            num_slots = key_cache.shape[0] * key_cache.shape[1]
            raise ValueError(f"slot_mapping[{bad}] = {int(slots[bad])} is outside the cache "
                             f"(allowed: 0..{num_slots - 1})")
    return q
