"""The three small pieces of a Llama block that are not attention: RMSNorm, rotary embeddings, SwiGLU.

Each is a plain function over tensors so that a reader sees every arithmetic step. They follow the
Llama papers (Touvron et al. 2023: RMSNorm, SwiGLU, RoPE) and compute what Hugging Face transformers'
`modeling_llama.py` computes, in the same order, so float32 results agree to rounding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from reference.models.config import Llama3RopeScaling


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, over the last dimension. Computed in float32."""
    # = x32 * rsqrt(mean(x32 ** 2) + eps) with x32 = x.float(), as HF's LlamaRMSNorm; torch's fused op does it in
    # one call (bit-identical on the CPU; on a GPU one kernel launch instead of five).
    if x.dtype == weight.dtype == torch.float32 and x.device.type == "cpu":
        # NOTE: the same operations as torch's composite rms_norm on the CPU (pow, mean, add eps, rsqrt, multiply,
        # then the weight), in place where it can: bit-identical (checked), 3x faster at 2,048 rows (1.0 vs 3.0 ms)
        return (x * x.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()).mul_(weight)
    normed = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)  # [T, hidden] float32
    return weight * normed.to(x.dtype)


def swiglu_mlp(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, linear=F.linear, act=None
               ) -> torch.Tensor:
    """down( silu(gate(x)) * up(x) ): the feed-forward block of every Llama layer. ``gate_up_proj`` is the gate and
    up matrices stacked ([2 * intermediate, hidden]): one matrix product computes both. ``linear`` multiplies
    (F.linear or the model's prepacked reference.models.matmul.PackedLinear); ``act``, when given, computes
    silu(gate) * up from the product in one call (reference.models.cpu_fused.silu_mul)."""
    gate_up = linear(x, gate_up_proj)
    if act is not None:
        return linear(act(gate_up), down_proj)
    gate, up = gate_up.chunk(2, dim=-1)
    # NOTE: silu of the strided half `gate` ran ~6x slower than of a contiguous copy on the CPU (8.9 vs 1.5 ms at
    # 2,048 x 1,536): copy first. The product is in place: one [T, intermediate] tensor fewer.
    return linear(F.silu(gate.contiguous()).mul_(up), down_proj)


def rope_inv_freq(head_dim: int, theta: float, scaling: Llama3RopeScaling | None) -> torch.Tensor:
    """The head_dim/2 rotation frequencies: theta ** (-2i / head_dim), i = 0 .. head_dim/2 - 1."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim  # [head_dim/2]
    inv_freq = 1.0 / (theta ** exponents)
    return inv_freq if scaling is None else _llama3_rescale(inv_freq, scaling)


def _llama3_rescale(inv_freq: torch.Tensor, s: Llama3RopeScaling) -> torch.Tensor:
    """Llama 3.1's context extension: slow down low frequencies by `factor`, keep high ones.

      wavelength:  short (< original/high_freq_factor) | medium              | long (> original/low_freq_factor)
      frequency:   kept                                | blend of both        | divided by factor
    """
    wavelen = 2 * math.pi / inv_freq
    short_limit = s.original_max_position_embeddings / s.high_freq_factor
    long_limit = s.original_max_position_embeddings / s.low_freq_factor
    scaled = torch.where(wavelen > long_limit, inv_freq / s.factor, inv_freq)
    # In the medium band, interpolate linearly (in 1/wavelength) between divided and kept.
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= short_limit) & (wavelen <= long_limit)
    return torch.where(medium, blended, scaled)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of angle position * frequency, each [T, head_dim] (both halves repeat the angles)."""
    angles = positions.float()[:, None] * inv_freq[None, :]  # [T, head_dim/2]
    angles = torch.cat([angles, angles], dim=-1)  # [T, head_dim]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (x[i], x[i + head_dim/2]) pair by its angle. x: [T, heads, head_dim].

    NOTE: this is the "rotate half" pairing of Hugging Face checkpoints, not the interleaved
    (x[2i], x[2i+1]) pairing of Meta's original code; HF's conversion script permutes q/k weights
    so that the two give the same attention scores.
    """
    half = x.shape[-1] // 2
    # = x * cos + cat([-x2, x1]) * sin with x1, x2 = the two halves, summed into one tensor in place (no cat, fewer
    # temporaries; the same products and sums, so the same bits: checked. addcmul_ would fuse them, and round once)
    out = x * cos[:, None, :]  # [T, heads, head_dim]
    out[..., :half] -= x[..., half:] * sin[:, None, :half]
    out[..., half:] += x[..., :half] * sin[:, None, half:]
    return out
