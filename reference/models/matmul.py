"""How the forward pass multiplies activations by weight matrices: `F.linear`, or oneDNN with prepacked weights.

Every projection of a Llama layer is ``y = x W^T``, x of [rows, in] and W of [out, in]. On a CPU, `F.linear` hands
W to MKL's sgemm, which copies it into its own blocked layout on *every* call before multiplying. In a decode step
(a few dozen rows) the product itself is cheap and W is read from memory anyway, so that copy roughly doubles the
cost: measured on the 2-core box, 60 projections of 3072x576 in a chain (weights not in cache) at 1 thread ran at
4.7 GB/s of weights with F.linear and 7.8 GB/s prepacked at 16 rows, 7.0 vs 12.0 at 4 rows, and the same speed at
256 rows and more, where the product is compute-bound (/tmp scratch benchmarks, numbers from one run).

So, as vLLM's CPU build does (``dispatch_cpu_unquantized_gemm`` in vllm/model_executor/layers/utils.py prepacks
every linear weight once for oneDNN), `PackedLinear` reorders each weight once, at load, into oneDNN's layout
(``torch.ops.mkldnn._reorder_linear_weight``) and multiplies with ``torch.ops.mkldnn._linear_pointwise``, the same
library and call torch's own compiler uses. Above ``max_rows`` rows (a prefill of many tokens) it calls `F.linear`,
which was as fast or faster there.

Numerics: oneDNN sums the products in another order than MKL's sgemm, so results differ in the last bits
(max |difference| ~1e-4 on outputs of magnitude ~20 in float32); the engine's greedy output equal to HF's is
tested with this path on, and the plain path (`F.linear`) stays for the oracle runs.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from reference.cpu_paths import cpu_paths

MATMULS = ("torch", "onednn")
PACKED_MAX_ROWS = 256  # measured crossover (see above): at 512 rows and more F.linear was as fast or faster



def default_matmul(matmul: str | None, device: torch.device, dtype: torch.dtype) -> str:
    """The projection path: given, or "onednn" for float32, and for bfloat16 where this CPU lets oneDNN pack it
    (reference.cpu_paths, decided once per process), on a CPU whose torch has oneDNN; else "torch".

    NOTE: bfloat16: F.linear already goes to oneDNN (on the 2-core box its AMX kernel, brg_matmul avx10_1_512_amx,
    ONEDNN_VERBOSE=1), but reorders the weight on every call as MKL does for float32; prepacked, 60 projections of
    3072x576 / 1536x576 at 1 thread took 340 instead of 505 us each at 16 rows, 452 instead of 668 at 64, with the
    very same bits at 4, 64 and 300 rows (the same kernel, the same order of sums; scratch benchmark, numbers from
    one run). float16 is not prepacked (not measured)."""
    paths = cpu_paths()
    if matmul is None:
        return "onednn" if device.type == "cpu" and paths.packs(dtype) else "torch"
    if matmul not in MATMULS:
        raise ValueError(f"unknown matmul {matmul!r} (allowed: {', '.join(MATMULS)})")
    if matmul == "onednn" and (device.type != "cpu" or not paths.onednn):
        raise ValueError(f"matmul 'onednn' runs on a CPU with torch's oneDNN (this model is on {device})")
    if matmul == "onednn" and not paths.packs(dtype):
        raise ValueError(f"matmul 'onednn' cannot prepack {str(dtype).removeprefix('torch.')} weights on this CPU "
                         f"(bfloat16 needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT; float32 works everywhere): use 'torch'")
    return matmul


class PackedLinear:
    """``linear(x, weight, bias)`` with `F.linear`'s meaning, for weights packed once at construction.

    A weight that was not packed (or an input of more than ``max_rows`` rows) goes to `F.linear`. Weights are
    looked up by identity: they must be the very tensors given here, which the model keeps for its lifetime.
    """

    def __init__(self, weights: Iterable[torch.Tensor], max_rows: int = PACKED_MAX_ROWS) -> None:
        self.max_rows = max_rows
        self._packed: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for w in weights:
            if id(w) not in self._packed:
                self._packed[id(w)] = (w, torch.ops.mkldnn._reorder_linear_weight(w.contiguous()))

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        entry = self._packed.get(id(weight))
        if entry is None or entry[0] is not weight or x.numel() > self.max_rows * x.shape[-1]:
            return F.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, entry[1], bias, "none", [], "")

    @property
    def num_packed(self) -> int:
        return len(self._packed)
