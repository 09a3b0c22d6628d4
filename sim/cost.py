"""How long one engine iteration takes: the simulator's clock (docs/ARCHITECTURE.md, "The layers").

Two interchangeable models behind one protocol:

- `RooflineCostModel`: a roofline from the GPU and model specs. One iteration (one forward pass over the
  batch) takes max(compute time, memory time) plus a fixed overhead. Decode is memory-bound (every step
  reads all weights once plus the K/V of every running sequence), prefill is compute-bound: the split the
  vLLM paper's section 2-3 argument rests on (batching amortizes the weight reads, so memory for the KV
  cache decides throughput).
- `CalibratedCostModel`: a linear fit to step times measured on the reference engine.

Both are called 10^5-10^6 times per simulation, so `step_time` is plain float arithmetic (no numpy).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol

import numpy as np

from sim.specs import GPUSpec, ModelSpec, get_gpu, get_model


class CostModel(Protocol):
    def step_time(self, num_prefill_tokens: int, num_decode_seqs: int, num_context_tokens: int) -> float:
        """Seconds for one iteration. num_prefill_tokens: prompt tokens computed this step; num_decode_seqs:
        sequences generating one token; num_context_tokens: tokens whose K/V the batch's attention reads
        (a decoding sequence's whole context; a prefilling prompt counts its own tokens, cached prefix included)."""
        ...

    def swap_time(self, num_bytes: int, num_blocks: int = 0) -> float:
        """Seconds to move `num_bytes` of KV cache, in `num_blocks` blocks, between GPU and CPU memory
        (one direction)."""
        ...


@dataclass(frozen=True, slots=True)
class RooflineEfficiency:
    """Fractions of the datasheet peaks that real kernels reach, and the fixed cost of an iteration.

    Modelling approximations, stated rather than measured here:
    - memory 0.80: large streaming reads (weight GEMVs, paged attention) reach ~80-90% of peak HBM bandwidth.
    - compute 0.60: large fp16 GEMMs in a prefill reach ~60-70% of peak tensor-core FLOP/s.
    - pcie 0.80: pinned-memory copies reach ~25 of PCIe Gen4's 32 GB/s one way.
    - overhead_s 2 ms: per-iteration scheduling, Python and kernel-launch cost (vLLM's 2023 Python scheduler
      and sampler cost a few ms a step; smaller for CUDA-graph engines).
    - block_gather_tokens 4: a paged attention kernel reads K/V block by block through the block table, a
      dependent lookup and a short burst per block; each block read costs as much as reading 4 more tokens.
      Attention over blocks of 16 is then 25% slower than over contiguous K/V, the paper's measured kernel
      overhead (section 7.1: 20-26% over FasterTransformer's); blocks of 1 are 5x slower, blocks of 256 ~2%.
    - copy_overhead_s 5 us: vLLM v0 swaps with one cudaMemcpyAsync per block, per layer, for K and for V;
      each copy pays a fixed few microseconds of launch and DMA set-up, so many small blocks swap slowly
      (the paper's Fig. 19a: swap latency grows sharply below block size 16).
    """

    memory: float = 0.80
    compute: float = 0.60
    pcie: float = 0.80
    overhead_s: float = 0.002
    block_gather_tokens: float = 4.0
    copy_overhead_s: float = 5e-6

    def __post_init__(self) -> None:
        for field in ("memory", "compute", "pcie"):
            if not 0 < getattr(self, field) <= 1:
                raise ValueError(f"RooflineEfficiency.{field} must be in (0, 1], got {getattr(self, field)}")
        for field in ("overhead_s", "block_gather_tokens", "copy_overhead_s"):
            if not getattr(self, field) >= 0:
                raise ValueError(f"RooflineEfficiency.{field} must be >= 0, got {getattr(self, field)}")


class RooflineCostModel:
    """time = max(FLOPs / (num_gpus * peak * eff), bytes / (num_gpus * bandwidth * eff)) + overhead.

        bytes = weights (read once per iteration, however many tokens the batch holds)
              + num_context_tokens * kv_bytes_per_token * gather   (attention reads K/V)
              + (num_prefill_tokens + num_decode_seqs) * kv_bytes_per_token   (new K/V written)
        FLOPs = 2 * num_params * (num_prefill_tokens + num_decode_seqs)       (every matmul, per token)
              + 4 * layers * heads * head_dim * num_context_tokens            (QK^T and PV)

    Modelling approximations: activations' memory traffic is ignored; attention FLOPs count one query per
    context token read, which is exact for decode and undercounts a prompt's quadratic term (p^2/2 query-key
    pairs instead of p) by at most p / (12 * hidden) of the linear FLOPs (< 4% for OPT-13B at p = 2048);
    tensor parallelism divides both sides evenly over the GPUs and its all-reduce time is ignored.

    `block_size`: the paged KV cache's block size; the attention read then costs
    gather = (block_size + efficiency.block_gather_tokens) / block_size times a contiguous read (counted per
    token, i.e. as if every block were full). None: contiguous K/V (the Orca baselines), gather = 1.
    Swaps cost bytes over PCIe plus efficiency.copy_overhead_s per copy, 2 * layers copies per block.
    """

    def __init__(
        self,
        model: ModelSpec | str,
        gpu: GPUSpec | str,
        num_gpus: int = 1,
        efficiency: RooflineEfficiency = RooflineEfficiency(),
        block_size: int | None = None,
    ) -> None:
        self.model = get_model(model) if isinstance(model, str) else model
        self.gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
        if num_gpus < 1:
            raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
        if block_size is not None and block_size < 1:
            raise ValueError(f"block_size must be >= 1 (or None for contiguous K/V), got {block_size}")
        self.num_gpus, self.block_size = num_gpus, block_size
        self.efficiency = efficiency
        m, g = self.model, self.gpu
        bandwidth = num_gpus * g.mem_bandwidth * efficiency.memory
        flops = num_gpus * g.peak_flops * efficiency.compute
        # Precomputed seconds per unit, so step_time is a handful of multiply-adds.
        self._weights_s = m.weight_bytes / bandwidth
        self._kv_token_s = m.kv_bytes_per_token / bandwidth
        gather = 1.0 if block_size is None else (block_size + efficiency.block_gather_tokens) / block_size
        self._kv_read_s = self._kv_token_s * gather
        self._token_flop_s = 2.0 * m.num_params / flops
        self._attn_flop_s = 4.0 * m.num_layers * m.num_heads * m.head_dim / flops
        self._overhead_s = efficiency.overhead_s
        self._swap_bandwidth = num_gpus * g.pcie_bandwidth * efficiency.pcie  # each GPU has its own link
        # Each GPU copies its own slice of every block, K and V for every layer, in parallel with the others.
        self._block_copy_s = 2 * m.num_layers * efficiency.copy_overhead_s

    def step_time(self, num_prefill_tokens: int, num_decode_seqs: int, num_context_tokens: int) -> float:
        new_tokens = num_prefill_tokens + num_decode_seqs
        memory = self._weights_s + self._kv_read_s * num_context_tokens + self._kv_token_s * new_tokens
        compute = self._token_flop_s * new_tokens + self._attn_flop_s * num_context_tokens
        return (memory if memory > compute else compute) + self._overhead_s

    def swap_time(self, num_bytes: int, num_blocks: int = 0) -> float:
        return num_bytes / self._swap_bandwidth + num_blocks * self._block_copy_s


# Modelling approximation: a fitted line can dip below zero when extrapolated to tiny batches; the clock
# must still advance, so a step never takes less than this.
MIN_STEP_TIME_S = 1e-6
CSV_COLUMNS = ("num_prefill_tokens", "num_decode_seqs", "num_context_tokens", "step_time_s")


@dataclass(frozen=True, slots=True)
class CalibratedCostModel:
    """step_time = a + b * prefill_tokens + c * decode_seqs + d * context_tokens, least-squares fitted to
    step times measured on the reference engine. Swaps are priced at `swap_bandwidth` bytes/s (the CSV
    holds no swap measurements; the default is the roofline's 80% of PCIe Gen4's 32 GB/s one way)."""

    a: float
    b: float
    c: float
    d: float
    swap_bandwidth: float = 25.6e9

    def __post_init__(self) -> None:
        if not self.swap_bandwidth > 0:
            raise ValueError(f"swap_bandwidth must be > 0 bytes/s, got {self.swap_bandwidth}")

    def step_time(self, num_prefill_tokens: int, num_decode_seqs: int, num_context_tokens: int) -> float:
        t = self.a + self.b * num_prefill_tokens + self.c * num_decode_seqs + self.d * num_context_tokens
        return t if t > MIN_STEP_TIME_S else MIN_STEP_TIME_S

    def swap_time(self, num_bytes: int, num_blocks: int = 0) -> float:
        return num_bytes / self.swap_bandwidth  # NOTE: no per-copy cost: the CSV holds no swap measurements

    @classmethod
    def fit(cls, rows: Iterable[tuple[float, float, float, float]], swap_bandwidth: float = 25.6e9) -> "CalibratedCostModel":
        """rows: (num_prefill_tokens, num_decode_seqs, num_context_tokens, step_time_s) per measured step."""
        data = np.asarray(list(rows), dtype=np.float64)
        if data.ndim != 2 or data.shape[1] != 4:
            raise ValueError(f"each row must have 4 numbers {CSV_COLUMNS}, got an array of shape {data.shape}")
        design = np.column_stack([np.ones(len(data)), data[:, :3]])
        if len(data) < 4 or np.linalg.matrix_rank(design) < 4:
            raise ValueError(
                f"need >= 4 rows that vary prefill tokens, decode seqs and context tokens independently "
                f"to fit 4 coefficients, got {len(data)} rows of rank {np.linalg.matrix_rank(design) if len(data) else 0}"
            )
        coef, *_ = np.linalg.lstsq(design, data[:, 3], rcond=None)
        return cls(*(float(x) for x in coef), swap_bandwidth=swap_bandwidth)

    @classmethod
    def from_csv(cls, path: str | Path, swap_bandwidth: float = 25.6e9) -> "CalibratedCostModel":
        """Fit from a CSV with header num_prefill_tokens,num_decode_seqs,num_context_tokens,step_time_s."""
        path = Path(path)
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise ValueError(f"{path} line 1: missing column(s) {', '.join(missing)} (need {', '.join(CSV_COLUMNS)})")
            rows = []
            for line, record in enumerate(reader, start=2):
                try:
                    row = tuple(float(record[c]) for c in CSV_COLUMNS)
                except (TypeError, ValueError):
                    row = (float("nan"),)
                if not all(0 <= x < float("inf") for x in row):
                    raise ValueError(f"{path} line {line}: every column must be a finite number >= 0, got {dict(record)}")
                rows.append(row)
        try:
            return cls.fit(rows, swap_bandwidth=swap_bandwidth)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
