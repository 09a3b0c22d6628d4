"""Which compute paths this CPU allows: decided once per process, from the CPU and from what the libraries accept.

x86 CPUs differ in their vector instructions (SSE4 only; AVX; AVX2 and FMA; AVX-512 with BF16, VNNI, AMX), and
each library the engine uses picks its own kernels from them when it loads:

    library   what it decides                                  its own switch (read once, when it loads)
    -------   ----------------------------------------------   -----------------------------------------
    torch     ATen's vector kernels: DEFAULT, AVX2, AVX512      ATEN_CPU_CAPABILITY=default|avx2|avx512
    oneDNN    matrix products (F.linear in bfloat16, and the   ONEDNN_MAX_CPU_ISA=AVX|AVX2|AVX512_CORE|...
              prepacked weights of reference.models.matmul)
    MKL       float32 matrix products (F.linear)               MKL_ENABLE_INSTRUCTIONS=AVX|AVX2|AVX512
    numba     the compiled CPU kernels (attention/cpu_numba,   NUMBA_CPU_NAME=generic|<an LLVM cpu name>
              models/cpu_fused): LLVM compiles for this CPU

Every library has a path for every x86-64 CPU except one the engine asks for: **oneDNN prepacks bfloat16 weights
only with AVX-512 (BW, VL and DQ) or AVX-NE-CONVERT** (torch's `mkldnn_reorder_linear_weight` raises "bf16 path
needs the cpu support ..." otherwise, for instance on an AMD EPYC or Intel Core without AVX-512). F.linear in
bfloat16 works on every CPU (oneDNN picks a slower kernel, or widens to float32 itself). So a bfloat16 model
multiplies through F.linear where prepacking is refused: the same dtype, the same answers within bfloat16's
rounding, slower. Nothing else here needs a CPU feature.

NOTE: decided once, by asking torch (its own bfloat16 check, which honours ONEDNN_MAX_CPU_ISA) and by packing one
small weight, never by catching a failure per call. `CpuPaths` is what the engine uses; `describe()` is the line
the engine benchmarks print in their headers.

To prove the lesser paths on any machine, the tests start a process with the switches above set (`LESSER_CPU`
below: an AVX-only CPU without AVX2 or AVX-512), and the engine takes the fallbacks a real such CPU takes:

    python -m reference.cpu_paths                     # this process's paths, one line
    python -m reference.cpu_paths --lesser -- CMD     # CMD as on an AVX-only CPU (make test-lesser-cpu: the suite)
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass

import torch

# The environment of a process that computes as an x86-64 CPU with AVX but without AVX2, FMA3's wide paths or
# AVX-512 does (the oldest CPUs the lab's machines have been: no AVX2, no AVX-512); numba compiles for generic x86-64.
LESSER_CPU = {
    "ATEN_CPU_CAPABILITY": "default",
    "ONEDNN_MAX_CPU_ISA": "AVX",
    "MKL_ENABLE_INSTRUCTIONS": "AVX",
    "NUMBA_CPU_NAME": "generic",
}


@dataclass(frozen=True, slots=True)
class CpuPaths:
    aten: str  # torch's vector kernels for this CPU: "DEFAULT", "AVX2", "AVX512" ...
    onednn: bool  # torch was built with oneDNN (reference.models.matmul can prepack float32 weights)
    onednn_bfloat16: bool  # ... and oneDNN packs and multiplies bfloat16 weights on this CPU
    numba: bool  # numba is installed: the compiled decode kernel and fused small steps exist
    numba_cpu: str  # the CPU numba's LLVM compiles for ("host": this one)

    def packs(self, dtype: torch.dtype) -> bool:
        """Whether reference.models.matmul may prepack weights of `dtype` for oneDNN here."""
        if dtype == torch.float32:
            return self.onednn
        return dtype == torch.bfloat16 and self.onednn_bfloat16

    def describe(self) -> str:
        bf16 = "prepacked (oneDNN)" if self.onednn_bfloat16 else "F.linear (oneDNN cannot prepack bfloat16 here)"
        numba = f"numba for {self.numba_cpu}" if self.numba else "no numba (torch_batched attention)"
        return f"torch vector kernels {self.aten}; bfloat16 projections {bf16}; {numba}"


@functools.cache
def cpu_paths() -> CpuPaths:
    """This process's paths (computed on the first call, then the same object)."""
    onednn = torch.backends.mkldnn.is_available()
    try:
        import numba
    except ImportError:
        numba = None
    numba_cpu = (os.environ.get("NUMBA_CPU_NAME") or "host") if numba is not None else ""
    return CpuPaths(aten=torch.backends.cpu.get_cpu_capability(), onednn=onednn,
                    onednn_bfloat16=onednn and _onednn_packs_bfloat16(), numba=numba is not None,
                    numba_cpu=numba_cpu)


def _onednn_packs_bfloat16() -> bool:
    """torch's own check, then one small weight packed and multiplied: both must agree that bfloat16 works."""
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if supported is not None and not supported():
        return False
    weight = torch.ones(16, 16, dtype=torch.bfloat16)
    try:  # NOTE: the one place a refusal is caught: here, once per process, to decide the path
        packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 16, dtype=torch.bfloat16), packed, None, "none",
                                                 [], "")
    except RuntimeError:
        return False
    return bool((out == 16).all())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(cpu_paths().describe())
        return 0
    command = argv[2:] if argv[:2] == ["--lesser", "--"] else argv[1:] if argv[:1] == ["--lesser"] else None
    if not command:
        print("usage: python -m reference.cpu_paths [--lesser -- COMMAND ...]", file=sys.stderr)
        return 2
    try:
        return subprocess.run(command, env={**os.environ, **LESSER_CPU}).returncode
    except FileNotFoundError:
        print(f"error: no such command: {command[0]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
