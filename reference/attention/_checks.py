"""Host-side argument checks shared by the attention wrappers (both backends).

A kernel that receives a tensor of the wrong shape, dtype or device does not fail politely: it reads
the wrong memory. So every public entry point runs these checks first and raises ``ValueError`` with a
message naming the argument, what was expected and what was found.

NOTE: the checks look only at metadata (shape, dtype, device, strides), never at tensor *values*:
reading a value of a CUDA tensor (``seq_lens.max().item()``) forces a device-to-host sync on every
call. Value preconditions (``seq_lens[i] <= max_blocks_per_seq * block_size`` and so on) are checked
by the torch oracle, which is slow anyway; the Triton kernels clamp their reads so a bad value gives a
wrong answer, never an out-of-bounds access.
"""

from __future__ import annotations

import os

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CACHE_DTYPES = FLOAT_DTYPES + (torch.int8,)  # int8: the 8-bit cache of reference.attention.quant, with scales


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (env ``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


BACKENDS = ("triton", "torch", "torch_batched", "numba")


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def check_triton_device(device: torch.device) -> None:
    """The compiled Triton path needs CUDA tensors; the interpreter needs CPU tensors."""
    if interpreting() and device.type != "cpu":
        raise ValueError(f"TRITON_INTERPRET=1 runs kernels on CPU tensors, got tensors on {device}")
    if not interpreting() and device.type != "cuda":
        raise ValueError(
            f"the Triton backend needs CUDA tensors, got tensors on {device} "
            "(set TRITON_INTERPRET=1 before importing triton to run on CPU, or use backend='torch')"
        )


def check_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    """Caches are ``[num_blocks, block_size, num_kv_heads, head_dim]``, identical in shape, dtype, strides."""
    if key_cache.dim() != 4:
        raise ValueError(
            "key_cache must be 4-D [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got shape {tuple(key_cache.shape)}"
        )
    if value_cache.shape != key_cache.shape:
        raise ValueError(
            f"value_cache shape {tuple(value_cache.shape)} must equal key_cache shape {tuple(key_cache.shape)}"
        )
    if key_cache.dtype not in CACHE_DTYPES or value_cache.dtype != key_cache.dtype:
        raise ValueError(
            f"caches must share one dtype out of (float32, float16, bfloat16, int8), "
            f"got key_cache {key_cache.dtype} and value_cache {value_cache.dtype}"
        )
    # NOTE: the kernels take one set of cache strides for K and V (fewer arguments); both caches are
    # always allocated the same way, so we require it rather than pass a second set.
    if value_cache.stride() != key_cache.stride():
        raise ValueError(
            f"key_cache and value_cache must have the same strides, "
            f"got {key_cache.stride()} and {value_cache.stride()}"
        )
    if value_cache.device != key_cache.device:
        raise ValueError(f"caches on different devices: {key_cache.device} and {value_cache.device}")


def check_tensor(name: str, t: torch.Tensor, dim: int, dtypes: tuple, device: torch.device) -> None:
    """``t`` has ``dim`` dimensions, a dtype out of ``dtypes`` and lives on ``device``."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name} dtype must be one of ({allowed}), got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the caches are on {device}")


def check_heads(query: torch.Tensor, key_cache: torch.Tensor) -> int:
    """Check the head layout of ``query`` against the cache; return the GQA group size."""
    num_heads, head_dim = query.shape[-2], query.shape[-1]
    num_kv_heads, cache_head_dim = key_cache.shape[2], key_cache.shape[3]
    if head_dim != cache_head_dim:
        raise ValueError(f"query head_dim {head_dim} must equal the cache head_dim {cache_head_dim}")
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}) (GQA)"
        )
    if query.dtype != key_cache.dtype and key_cache.dtype != torch.int8:  # an int8 cache serves any float query
        raise ValueError(f"query dtype {query.dtype} must equal the cache dtype {key_cache.dtype}")
    return num_heads // num_kv_heads


def check_kv_scales(key_cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> None:
    """An int8 cache comes with its scales (reference.attention.quant): ``[num_blocks, block_size, num_kv_heads]``
    float32 each, on the caches' device, with the same strides (the kernels take one set); a float cache with none."""
    if key_cache.dtype != torch.int8:
        if k_scale is not None or v_scale is not None:
            raise ValueError(f"k_scale / v_scale belong to an int8 cache, got them with a {key_cache.dtype} cache")
        return
    expected = tuple(key_cache.shape[:3])
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        if t is None:
            raise ValueError(f"an int8 cache needs {name} [num_blocks, block_size, num_kv_heads] float32, got None")
        check_tensor(name, t, 3, (torch.float32,), key_cache.device)
        if tuple(t.shape) != expected:
            raise ValueError(f"{name} must be [num_blocks, block_size, num_kv_heads] = {list(expected)}, "
                             f"got {list(t.shape)}")
    if v_scale.stride() != k_scale.stride():
        raise ValueError(f"k_scale and v_scale must have the same strides, got {k_scale.stride()} and "
                         f"{v_scale.stride()}")


def check_scale(scale: float) -> float:
    scale = float(scale)
    if not scale > 0.0 or scale == float("inf"):
        raise ValueError(f"scale must be a finite positive number, got {scale}")
    return scale
