"""How long one engine iteration takes: the simulator's clock (docs/ARCHITECTURE.md, "The layers").

Two interchangeable models behind one protocol:

- `RooflineCostModel`: a roofline from the GPU and model specs. One iteration (one forward pass over the
  batch) takes max(compute time, memory time) plus a fixed overhead. Decode is memory-bound (every step
  reads all weights once plus the K/V of every running sequence), prefill is compute-bound: the split the
  vLLM paper's section 2-3 argument rests on (batching amortizes the weight reads, so memory for the KV
  cache decides throughput).
- `CalibratedCostModel` and `PiecewiseCostModel`: fits to step times measured on the reference engine.

Both are called 10^5-10^6 times per simulation, so `step_time` is plain float arithmetic (no numpy).
"""
from __future__ import annotations

import csv
import inspect
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol, Sequence

import numpy as np

from sim.base.limits import MAX_TIME_S
from sim.base.specs import GPUSpec, ModelSpec, get_gpu, get_model


class CostModel(Protocol):
    def step_time(self, num_prefill_tokens: int, num_decode_seqs: int, num_context_tokens: int,
                  num_prefill_pairs: int = 0, num_shared_context_tokens: int = 0) -> float:
        """Seconds for one iteration. num_prefill_tokens: prompt tokens computed this step; num_decode_seqs:
        sequences generating one token; num_context_tokens: tokens whose K/V the batch's attention reads
        (a decoding sequence's whole context; a prefilling prompt counts its own tokens, cached prefix included);
        num_prefill_pairs: query-key pairs of the prompt chunks' attention (sim.scheduling.step_shape.prefill_pairs:
        quadratic in a prompt's length); num_shared_context_tokens: those of the context tokens read from blocks
        another sequence of the step reads too (sim.scheduling.step_shape.shared_context_tokens; counting them costs O(blocks) a
        step, so sim.run counts them only for a fitted model that prices them, PiecewiseCostModel.uses_shared_reads,
        and passes 0 otherwise). A model may ignore the last two, as the roofline does."""
        ...

    def swap_time(self, num_bytes: int, num_blocks: int = 0) -> float:
        """Seconds to move `num_bytes` of KV cache, in `num_blocks` blocks, between GPU and CPU memory
        (one direction)."""
        ...


def check_cost_model(cost) -> None:
    """A cost object must price a step from its four numbers and a swap from its bytes (CostModel); else one line."""
    for name, args in (("step_time", (0, 1, 1, 0, 0)), ("swap_time", (0, 0))):
        method = getattr(cost, name, None)
        try:
            inspect.signature(method).bind(*args)
        except ValueError:  # callable, but shows no signature: a method compiled by `make fast` (the project's own)
            continue
        except TypeError:  # missing, not callable, or not with these arguments
            raise ValueError(
                f"cost_model: {type(cost).__name__}.{name} must take {len(args)} positional numbers (allowed: a "
                f"sim.clock.cost.CostModel, with step_time(num_prefill_tokens, num_decode_seqs, num_context_tokens, "
                f"num_prefill_pairs=0, num_shared_context_tokens=0) and swap_time(num_bytes, num_blocks=0), or the "
                f"path of a calibrated model)"
            ) from None


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
    - interconnect 0.80: NCCL's ring all-reduce of large messages reaches a bus bandwidth of ~80% of NVLink's
      one-way peak (about 240 of 300 GB/s on 8 A100s); only used with num_gpus > 1.
    """

    memory: float = 0.80
    compute: float = 0.60
    pcie: float = 0.80
    overhead_s: float = 0.002
    block_gather_tokens: float = 4.0
    copy_overhead_s: float = 5e-6
    interconnect: float = 0.80

    def __post_init__(self) -> None:
        for field in ("memory", "compute", "pcie", "interconnect"):
            if not 0 < getattr(self, field) <= 1:
                raise ValueError(f"RooflineEfficiency.{field} must be in (0, 1], got {getattr(self, field)}")
        for field in ("overhead_s", "block_gather_tokens", "copy_overhead_s"):
            if not getattr(self, field) >= 0:
                raise ValueError(f"RooflineEfficiency.{field} must be >= 0, got {getattr(self, field)}")


class RooflineCostModel:
    """time = max(FLOPs / (num_gpus * peak * eff), bytes / (num_gpus * bandwidth * eff)) + overhead + all_reduce.

        bytes = weights (read once per iteration, however many tokens the batch holds)
              + num_context_tokens * kv_bytes_per_token * gather   (attention reads K/V)
              + (num_prefill_tokens + num_decode_seqs) * kv_bytes_per_token   (new K/V written)
        FLOPs = 2 * num_params * (num_prefill_tokens + num_decode_seqs)       (every matmul, per token)
              + 4 * layers * heads * head_dim * num_context_tokens            (QK^T and PV)

    Modelling approximations: activations' memory traffic is ignored; attention FLOPs count one query per
    context token read, which is exact for decode and undercounts a prompt's quadratic term (p^2/2 query-key
    pairs instead of p) by at most p / (12 * hidden) of the linear FLOPs (< 4% for OPT-13B at p = 2048).
    kv_bytes_per_token follows the model's kv_dtype (sim.base.specs: an 8-bit KV cache reads and writes about half the
    bytes); quantizing and dequantizing K/V are taken as free, and the FLOPs do not change.

    Tensor parallelism over n = num_gpus GPUs (Megatron-LM, Shoeybi et al. 2019, section 3, as vLLM runs OPT-66B and
    -175B): each GPU holds 1/n of every weight matrix and of every token's K/V heads, so both sides of the max divide
    evenly by n; then each layer sums the GPUs' partial outputs twice, after attention's output projection and after
    the MLP, in an all-reduce of the step's new tokens' activations (T = num_prefill_tokens + num_decode_seqs tokens
    of hidden_size values each). A ring all-reduce sends 2 (n - 1) / n of those bytes from every GPU while it
    receives as much, so it runs at the interconnect's one-way bandwidth (GPUSpec.interconnect_bandwidth, times
    efficiency.interconnect), plus a fixed GPUSpec.interconnect_latency_s per all-reduce:

        all_reduce = 2 * layers * (latency + 2 (n - 1) / n * T * hidden_size * dtype_bytes / (link * eff))

    added to the step, not overlapped with it (each all-reduce waits for the matmul before it and the next layer
    waits for it, as in vLLM's model code). With n = 1 it is exactly 0. Modelling approximations: only these two
    all-reduces per layer (the embedding's and the logits' collectives, once a step, are left out; no pipeline
    parallelism), the ring's time as bandwidth plus a constant (for small messages NCCL switches to tree or NVLS
    algorithms, which the constant stands for); a fitted model (CalibratedCostModel, PiecewiseCostModel) has no such
    term, and sim.clock.cost_file refuses one for num_gpus > 1.

    `block_size`: the paged KV cache's block size; the attention read then costs
    gather = (block_size + efficiency.block_gather_tokens) / block_size times a contiguous read (counted per
    token, i.e. as if every block were full). None: contiguous K/V (the Orca baselines), gather = 1.
    Swaps cost bytes over PCIe plus efficiency.copy_overhead_s per copy, 2 * layers copies per block.

    A model with sliding-window layers (Gemma 3, sim.base.specs.ModelSpec.sliding_window W): those layers read, for an entry
    feeding k tokens after c, only min(c + k, k + W - 1) tokens of K/V, both in bytes and in attention FLOPs; the full
    layers read c + k. NOTE: step_time sees only the batch's total context C, so the sliding layers' reads are taken
    as min(C, P + D + (D + [P > 0]) * (W - 1)) (P prompt tokens, D decodes): exact when every decoding sequence holds
    at least W tokens and a step has at most one prompt chunk (long-context serving), an overestimate when some
    sequences are shorter than the window, an underestimate only for steps with several prompt chunks. This depends on
    the model, not on the KV policy: a paged pool that keeps every layer's K/V still reads only the window.
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
        self._window = m.sliding_window  # None: every layer full attention (the plain formula above)
        if m.sliding_window is not None:
            full, sliding = m.num_full_layers / m.num_layers, m.num_sliding_layers / m.num_layers
            self._full_read_s, self._sliding_read_s = self._kv_read_s * full, self._kv_read_s * sliding
            self._full_attn_s, self._sliding_attn_s = self._attn_flop_s * full, self._attn_flop_s * sliding
        # Tensor parallelism's all-reduces (class docstring): a fixed part per step and a part per new token;
        # both exactly 0.0 on one GPU, so a single-GPU step's price is untouched.
        ring = 2 * (num_gpus - 1) / num_gpus
        self._allreduce_s = 2 * m.num_layers * g.interconnect_latency_s if num_gpus > 1 else 0.0
        self._allreduce_token_s = (2 * m.num_layers * ring * m.hidden_size * m.dtype_bytes
                                   / (g.interconnect_bandwidth * efficiency.interconnect))
        self._swap_bandwidth = num_gpus * g.pcie_bandwidth * efficiency.pcie  # each GPU has its own link
        # Each GPU copies its own slice of every block, K and V for every layer, in parallel with the others.
        self._block_copy_s = 2 * m.num_layers * efficiency.copy_overhead_s

    def step_time(self, num_prefill_tokens: int, num_decode_seqs: int, num_context_tokens: int,
                  num_prefill_pairs: int = 0, num_shared_context_tokens: int = 0) -> float:
        """(The last two are not used: see the class docstring's note on a prompt's quadratic term.)"""
        if self._window is not None:
            return self._windowed_step_time(num_prefill_tokens, num_decode_seqs, num_context_tokens)
        new_tokens = num_prefill_tokens + num_decode_seqs
        memory = self._weights_s + self._kv_read_s * num_context_tokens + self._kv_token_s * new_tokens
        compute = self._token_flop_s * new_tokens + self._attn_flop_s * num_context_tokens
        step = (memory if memory > compute else compute) + self._overhead_s
        return step + (self._allreduce_s + self._allreduce_token_s * new_tokens)  # + 0.0 on one GPU

    def _windowed_step_time(self, num_prefill_tokens: int, num_decode_seqs: int, num_context_tokens: int) -> float:
        """step_time for a model with sliding-window layers (see the class docstring)."""
        new_tokens = num_prefill_tokens + num_decode_seqs
        entries = num_decode_seqs + (num_prefill_tokens > 0)
        windowed = min(num_context_tokens, new_tokens + entries * (self._window - 1))
        memory = (self._weights_s + self._full_read_s * num_context_tokens + self._sliding_read_s * windowed
                  + self._kv_token_s * new_tokens)
        compute = (self._token_flop_s * new_tokens + self._full_attn_s * num_context_tokens
                   + self._sliding_attn_s * windowed)
        step = (memory if memory > compute else compute) + self._overhead_s
        return step + (self._allreduce_s + self._allreduce_token_s * new_tokens)  # + 0.0 on one GPU

    def all_reduce_time(self, num_tokens: int) -> float:
        """Seconds of one step's tensor-parallel all-reduces over `num_tokens` new tokens (0.0 on one GPU)."""
        return self._allreduce_s + self._allreduce_token_s * num_tokens

    def swap_time(self, num_bytes: int, num_blocks: int = 0) -> float:
        return num_bytes / self._swap_bandwidth + num_blocks * self._block_copy_s


# Modelling approximation: a fitted line can dip below zero when extrapolated to tiny batches; the clock
# must still advance, so a step never takes less than this.
MIN_STEP_TIME_S = 1e-6
# A fitted model's bounds, so that no step within the simulator's limits costs an infinite or a NaN time: a coefficient
# (seconds per token, sequence, pair, or a value of g) at most MAX_TIME_S, swaps at least 1 KB/s. A model right at
# these bounds is absurd but finite; a step it prices past MAX_TIME_S is refused where it is priced (check_step_time).
MIN_SWAP_BANDWIDTH = 1e3


def check_bounds(swap_bandwidth: float, **coefficients: float | None) -> None:
    """ValueError unless every coefficient is at most MAX_TIME_S in magnitude and swaps move >= MIN_SWAP_BANDWIDTH."""
    if not swap_bandwidth >= MIN_SWAP_BANDWIDTH:
        raise ValueError(f"swap_bandwidth must be >= {MIN_SWAP_BANDWIDTH:g} bytes/s, got {swap_bandwidth}")
    for name, value in coefficients.items():
        if value is not None and not abs(value) <= MAX_TIME_S:
            raise ValueError(f"{name} must be at most {MAX_TIME_S:g} seconds a unit, got {value}")


def check_step_time(seconds: float, shape: tuple) -> float:
    """`seconds` if a step of `shape` (prefill tokens, decode sequences, context tokens, ...) may take it, else
    ValueError: a cost model that prices one step past MAX_TIME_S, or at NaN, is not a model of any machine."""
    if not seconds <= MAX_TIME_S:
        raise ValueError(f"the cost model priced a step of (prefill tokens, decode sequences, K/V tokens, ...) "
                         f"{shape} at {seconds:g} s (allowed: at most {MAX_TIME_S:g} s; check the cost model)")
    return seconds
CSV_COLUMNS = ("num_prefill_tokens", "num_decode_seqs", "num_context_tokens", "step_time_s")


@dataclass(frozen=True, slots=True)
class CalibratedCostModel:
    """step_time = a + max(floor_s, b * prefill_tokens + c * decode_seqs) + d * context_tokens, fitted to step
    times measured on the reference engine (`python -m reference calibrate` writes one to a file, sim.clock.cost_file).

    The max is a roofline's knee, learnt instead of derived: a step over a few tokens costs what reading the
    weights costs (`floor_s`), a step over many costs per token. With floor_s = 0 the model is the plain line
    a + b * prefill_tokens + c * decode_seqs + d * context_tokens. Swaps are priced at `swap_bandwidth` bytes/s
    (the engine's steps hold no swap measurements; the default is the roofline's 80% of PCIe Gen4's 32 GB/s)."""

    a: float
    b: float
    c: float
    d: float
    swap_bandwidth: float = 25.6e9
    floor_s: float = 0.0

    def __post_init__(self) -> None:
        check_bounds(self.swap_bandwidth, a=self.a, b=self.b, c=self.c, d=self.d, floor_s=self.floor_s)
        if not self.floor_s >= 0:
            raise ValueError(f"floor_s must be >= 0 seconds, got {self.floor_s}")

    def step_time(self, num_prefill_tokens: int, num_decode_seqs: int, num_context_tokens: int,
                  num_prefill_pairs: int = 0, num_shared_context_tokens: int = 0) -> float:
        """(The last two are not used: this model is linear in the prompt's tokens.)"""
        work = self.b * num_prefill_tokens + self.c * num_decode_seqs
        t = self.a + (work if work > self.floor_s else self.floor_s) + self.d * num_context_tokens
        return t if t > MIN_STEP_TIME_S else MIN_STEP_TIME_S

    def swap_time(self, num_bytes: int, num_blocks: int = 0) -> float:
        return num_bytes / self.swap_bandwidth  # NOTE: no per-copy cost: the CSV holds no swap measurements

    @classmethod
    def fit(cls, rows: Iterable[tuple[float, float, float, float]], swap_bandwidth: float = 25.6e9,
            with_floor: bool = False) -> "CalibratedCostModel":
        """rows: (num_prefill_tokens, num_decode_seqs, num_context_tokens, step_time_s) per measured step.

        Default: ordinary least squares of the plain line (floor_s = 0). `with_floor`: the knee too, fitted to
        RELATIVE errors (each step weighs 1 / its time, so a 20 ms decode counts as much as a 5 s prefill): for
        each candidate floor on a grid up to the median step time, the line is fitted by weighted least squares
        on the steps above the floor, the steps are re-split by the fitted line until the split is stable, and
        the floor with the smallest root-mean-square relative error wins."""
        data = np.asarray(list(rows), dtype=np.float64)
        if data.ndim != 2 or data.shape[1] != 4:
            raise ValueError(f"each row must have 4 numbers {CSV_COLUMNS}, got an array of shape {data.shape}")
        design = np.column_stack([np.ones(len(data)), data[:, :3]])
        if len(data) < 4 or np.linalg.matrix_rank(design) < 4:
            raise ValueError(
                f"need >= 4 rows that vary prefill tokens, decode seqs and context tokens independently "
                f"to fit 4 coefficients, got {len(data)} rows of rank {np.linalg.matrix_rank(design) if len(data) else 0}"
            )
        if not with_floor:
            coef, *_ = np.linalg.lstsq(design, data[:, 3], rcond=None)
            return cls(*(float(x) for x in coef), swap_bandwidth=swap_bandwidth)
        if not (data[:, 3] > 0).all():
            raise ValueError("a fit of relative errors needs every step time > 0")
        best = min((_fit_knee(data, floor) for floor in np.linspace(0.0, np.median(data[:, 3]), 101)),
                   key=lambda fit: fit[0])
        _, floor, (a, b, c, d) = best
        return cls(float(a), float(b), float(c), float(d), swap_bandwidth=swap_bandwidth, floor_s=float(floor))

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


def _fit_knee(data: np.ndarray, floor: float) -> tuple[float, float, np.ndarray]:
    """(rms relative error, floor, [a, b, c, d]) of the knee model at this floor (see CalibratedCostModel.fit)."""
    prefill, decode, context, t = data.T
    weight = 1.0 / t
    at_floor = np.zeros(len(t), dtype=bool)
    for _ in range(50):  # re-split until stable; a few rounds in practice
        above = ~at_floor
        design = np.column_stack([np.ones(len(t)), prefill * above, decode * above, context])
        coef = _nonnegative_slopes(design * weight[:, None], (t - floor * at_floor) * weight)
        split = coef[1] * prefill + coef[2] * decode < floor
        if (split == at_floor).all():
            break
        at_floor = split
    predicted = coef[0] + np.maximum(floor, coef[1] * prefill + coef[2] * decode) + coef[3] * context
    return float(np.sqrt(np.mean(((predicted - t) * weight) ** 2))), floor, coef


def _nonnegative_slopes(design: np.ndarray, target: np.ndarray, nonnegative: Sequence[int] | None = None) -> np.ndarray:
    """Least squares with the coefficients `nonnegative` (default: all but the intercept, column 0) >= 0: a token, a
    sequence or a K/V read never makes a step faster. One that comes out negative is pinned to 0 and the rest refitted
    (a small active set)."""
    bounded = range(1, design.shape[1]) if nonnegative is None else nonnegative
    free = np.ones(design.shape[1], dtype=bool)
    while True:
        coef = np.zeros(design.shape[1])
        coef[free], *_ = np.linalg.lstsq(design[:, free], target, rcond=None)
        negative = [i for i in bounded if coef[i] < 0]
        if not negative:
            return coef
        free[min(negative, key=lambda i: coef[i])] = False


# The piecewise model's inputs, one measured step a row (what `python -m reference calibrate` writes).
PIECEWISE_COLUMNS = ("num_prefill_tokens", "num_decode_seqs", "num_context_tokens", "num_prefill_pairs",
                     "num_shared_context_tokens", "step_time_s")


@dataclass(frozen=True, slots=True)
class PiecewiseCostModel:
    """step_time = g(prefill_tokens + decode_seqs) + c * decode_seqs + d * (context_tokens - shared_context_tokens)
    + d_shared * shared_context_tokens + e * prefill_pairs, fitted to step times measured on the reference engine
    (`python -m reference calibrate`).

    g is piecewise linear in the tokens the forward pass computes, through (knots[i], values[i]): what the matrix
    multiplications cost, measured at each size instead of derived. c prices what a decoding sequence costs beyond
    its token (its logits and sampling: a prompt samples only at its end), d each K/V token the attention reads,
    d_shared each read of a block another sequence of the step reads too (n samples or k beams of one prompt, a cached
    system prompt: on the project's 2-core machine such a read costs about half, the block being in cache already),
    e each query-key pair of a prompt's attention (a prompt of p tokens has p (p + 1) / 2: on that machine half of a
    4,096-token prompt's time, which a model linear in tokens prices the same whether the 4,096 tokens are one
    prompt or four).

    It cannot be absurd: g is non-negative and non-decreasing (values[0] >= 0, each value >= the one before) and
    c, d, d_shared, e >= 0, checked here, so every step costs at least g at its smallest and more work never costs less;
    and every coefficient and slope of g is at most MAX_TIME_S seconds a unit (check_bounds), so no step within the
    simulator's limits costs an infinite time (one priced past MAX_TIME_S stops the run: check_step_time).
    Below the first knot g is values[0]; past the last it goes on along its last segment (a slope >= 0).

    The calibrated range: knots[0] .. knots[-1] tokens, and at most `max_decode_seqs`, `max_context_tokens` and
    `max_prefill_pairs` (the largest the calibration measured; None: no bound, a model written by hand). A step
    outside it is priced by extrapolation, which a run counts and reports (sim.api.run: `extrapolated_steps`).
    Swaps are priced at `swap_bandwidth` bytes/s, as CalibratedCostModel."""

    knots: tuple[float, ...]
    values: tuple[float, ...]
    c: float
    d: float
    e: float = 0.0
    d_shared: float | None = None  # None: a shared read costs d, as any other (a model made by hand)
    swap_bandwidth: float = 25.6e9
    max_decode_seqs: float | None = None
    max_context_tokens: float | None = None
    max_prefill_pairs: float | None = None

    def __post_init__(self) -> None:
        if len(self.knots) < 2 or len(self.knots) != len(self.values):
            raise ValueError(f"need >= 2 knots and one value per knot, got {len(self.knots)} knots, {len(self.values)} values")
        if any(b <= a for a, b in zip(self.knots, self.knots[1:])) or self.knots[0] < 0:
            raise ValueError(f"knots must be >= 0 and strictly increasing, got {list(self.knots)}")
        if self.values[0] < 0:
            raise ValueError(f"values must be >= 0 seconds (a step cannot take negative time), got {self.values[0]} "
                             f"at {self.knots[0]:g} tokens")
        for k, a, b in zip(self.knots[1:], self.values, self.values[1:]):
            if b < a:
                raise ValueError(f"values must not decrease (more tokens never cost less), got {b} at {k:g} tokens "
                                 f"after {a}")
        if not (self.c >= 0 and self.d >= 0 and self.e >= 0 and (self.d_shared is None or self.d_shared >= 0)):
            raise ValueError(f"c, d, d_shared and e must be >= 0, got {self.c}, {self.d}, {self.d_shared}, {self.e}")
        slopes = {f"g's slope from {a:g} to {b:g} tokens": (v - u) / (b - a)
                  for a, b, u, v in zip(self.knots, self.knots[1:], self.values, self.values[1:])}
        check_bounds(self.swap_bandwidth, c=self.c, d=self.d, e=self.e, d_shared=self.d_shared,
                     **{"the last value": self.values[-1]}, **slopes)
        for name in ("max_decode_seqs", "max_context_tokens", "max_prefill_pairs"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be >= 0 (or None: no bound), got {value}")

    def tokens_time(self, num_tokens: float) -> float:
        """g: seconds of a forward pass over `num_tokens` tokens, before per-sequence and attention costs."""
        k, v = self.knots, self.values
        if num_tokens <= k[0]:
            return v[0]
        i = bisect_left(k, num_tokens, 1, len(k) - 1)  # the segment [k[i-1], k[i]] (the last one past the end)
        return v[i - 1] + (v[i] - v[i - 1]) * (num_tokens - k[i - 1]) / (k[i] - k[i - 1])

    @property
    def uses_shared_reads(self) -> bool:
        """Does this model price a shared read apart (so the loop must count them, at O(blocks) a step)?"""
        return self.d_shared is not None

    def step_time(self, num_prefill_tokens: int, num_decode_seqs: int, num_context_tokens: int,
                  num_prefill_pairs: int = 0, num_shared_context_tokens: int = 0) -> float:
        shared = num_shared_context_tokens if self.d_shared is not None else 0
        t = (self.tokens_time(num_prefill_tokens + num_decode_seqs) + self.c * num_decode_seqs
             + self.d * (num_context_tokens - shared) + self.e * num_prefill_pairs)
        if shared:
            t += self.d_shared * shared
        return t if t > MIN_STEP_TIME_S else MIN_STEP_TIME_S

    def in_range(self, num_prefill_tokens: int, num_decode_seqs: int, num_context_tokens: int,
                 num_prefill_pairs: int = 0, num_shared_context_tokens: int = 0) -> bool:
        """Is a step of this shape inside the calibrated range (the class docstring)?"""
        tokens = num_prefill_tokens + num_decode_seqs
        return (self.knots[0] <= tokens <= self.knots[-1]
                and (self.max_decode_seqs is None or num_decode_seqs <= self.max_decode_seqs)
                and (self.max_context_tokens is None or num_context_tokens <= self.max_context_tokens)
                and (self.max_prefill_pairs is None or num_prefill_pairs <= self.max_prefill_pairs))

    def describe_range(self) -> str:
        bounds = [f"{self.knots[0]:g} to {self.knots[-1]:g} tokens a step"]
        for name, what in (("max_decode_seqs", "decoding sequences"), ("max_context_tokens", "K/V tokens read"),
                           ("max_prefill_pairs", "prompt attention pairs")):
            if getattr(self, name) is not None:
                bounds.append(f"<= {getattr(self, name):g} {what}")
        return ", ".join(bounds)

    def swap_time(self, num_bytes: int, num_blocks: int = 0) -> float:
        return num_bytes / self.swap_bandwidth  # NOTE: no per-copy cost: the engine's steps hold no swap measurements

    @classmethod
    def fit(cls, rows: Iterable[Sequence[float]], *, swap_bandwidth: float = 25.6e9, knot_ratio: float = 1.2,
            robust: bool = True) -> "PiecewiseCostModel":
        """Fit to measured steps: rows of (num_prefill_tokens, num_decode_seqs, num_context_tokens, num_prefill_pairs,
        num_shared_context_tokens, step_time_s) (PIECEWISE_COLUMNS; a row of 4 numbers has neither pairs nor shared
        reads, one of 5 no shared reads: 0). With no shared read in any row, d_shared is None (not measured).

        Knots sit where the steps are: at the measured token counts, thinned so that each is at least `knot_ratio`
        times the one before (always the smallest and the largest), so every knot is a measured size and nothing
        is guessed between the measured ones but a straight line.

        Why a constrained fit: an unconstrained spline over knots that few steps pin down takes any value there (a
        committed fit once had g = -18.9 s at 1,536 tokens, between a 1,024- and a 2,048-token prompt). Here g is
        written as values[0] + the sum of the increments up to each knot, and every increment, values[0], c, d and
        e are fitted >= 0 (non-negative least squares, Lawson and Hanson's active set): monotone and non-negative by
        construction, not by a check after the fact. The loss is relative (each step weighs 1 / its time, so a
        50 ms decode counts as much as a 10 s prompt); `robust`: Huber weights on those relative residuals
        (iteratively reweighted; residuals beyond 1.345 robust standard deviations count linearly), so a step
        that a noisy machine slowed down pulls the fit less than a square would."""
        padded = [(*r[:-1], *(0.0,) * (6 - len(r)), r[-1]) if 4 <= len(r) <= 6 else tuple(r) for r in rows]
        data = np.asarray(padded, dtype=np.float64)
        if data.ndim != 2 or data.shape[1] != 6 or len(data) < 4:
            raise ValueError(f"need >= 4 rows of {', '.join(PIECEWISE_COLUMNS)}, got an array of shape {data.shape}")
        if not np.isfinite(data).all() or (data[:, :5] < 0).any():
            raise ValueError("every number must be finite and >= 0")
        if (data[:, 4] > data[:, 2]).any():
            raise ValueError("num_shared_context_tokens must be <= num_context_tokens")
        if not (data[:, 5] > 0).all():
            raise ValueError("a fit of relative errors needs every step time > 0")
        if not knot_ratio > 1:
            raise ValueError(f"knot_ratio must be > 1, got {knot_ratio}")
        prefill, decodes, context, pairs, shared, t = data.T
        tokens = prefill + decodes
        grid = place_knots(tokens, knot_ratio)
        # g at each row = hats @ values = hats @ cumsum(theta) = (hats' reversed cumulative sums) @ theta
        increments = np.cumsum(_hats(grid, tokens)[:, ::-1], axis=1)[:, ::-1]
        design = np.column_stack([increments, decodes, context - shared, pairs, shared])
        weight = 1.0 / t
        huber = np.ones(len(t))
        for _ in range(30 if robust else 1):
            w = weight * np.sqrt(huber)
            theta = nonnegative_least_squares(design * w[:, None], t * w)
            residual = (design @ theta - t) / t
            if not robust:
                break
            scale = max(1.4826 * float(np.median(np.abs(residual))), 1e-3)
            new = np.minimum(1.0, 1.345 * scale / np.maximum(np.abs(residual), 1e-300))
            if np.abs(new - huber).max() < 1e-4:
                break
            huber = new
        values = np.cumsum(theta[:len(grid)])
        c, d, e, d_shared = (float(x) for x in theta[len(grid):])
        return cls(tuple(float(k) for k in grid), tuple(float(v) for v in values), c, d, e,
                   d_shared if shared.any() else None, swap_bandwidth, float(decodes.max()), float(context.max()),
                   float(pairs.max()))


def place_knots(tokens: np.ndarray, ratio: float = 1.2) -> np.ndarray:
    """Knots at measured token counts: the smallest, then each count at least `ratio` times the last knot taken,
    and the largest (which replaces the last one taken if closer to it than `ratio`). ValueError with fewer than
    two distinct counts (a line needs two sizes)."""
    sizes = np.unique(tokens)
    if len(sizes) < 2:
        raise ValueError(f"the steps do not determine the model: every step computed {sizes[0] if len(sizes) else 0:g} "
                         f"tokens (vary the tokens per step)")
    knots = [float(sizes[0])]
    for x in sizes[1:-1]:
        if x >= knots[-1] * ratio:
            knots.append(float(x))
    last = float(sizes[-1])
    if len(knots) > 1 and last < knots[-1] * ratio:
        knots[-1] = last
    else:
        knots.append(last)
    return np.asarray(knots)


def nonnegative_least_squares(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0: Lawson and Hanson's active-set method (Solving Least Squares Problems,
    1974, ch. 23). Columns are scaled to unit norm first (the step shapes' columns differ by ten orders of
    magnitude: pairs reach 10^7, a decode count 64), so the tolerance means the same for each."""
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    a = a / norms
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tolerance = 10 * np.finfo(float).eps * max(m, n) * max(1.0, float(np.abs(a).sum(axis=0).max()))
    for _ in range(3 * n + 10):
        gradient = a.T @ (b - a @ x)
        candidates = np.where(~passive & (gradient > tolerance), gradient, -np.inf)
        if not np.isfinite(candidates).any():
            break
        passive[int(np.argmax(candidates))] = True
        while True:
            z = np.zeros(n)
            z[passive], *_ = np.linalg.lstsq(a[:, passive], b, rcond=None)
            if (z[passive] > tolerance).all():
                x = z
                break
            blocked = passive & (z <= tolerance)
            step = np.min(x[blocked] / np.maximum(x[blocked] - z[blocked], 1e-300))
            x = x + step * (z - x)
            passive &= x > tolerance
            x[~passive] = 0.0
    return np.maximum(x, 0.0) / norms


def _hats(grid: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Linear-interpolation weights of each x on the grid (one row per x, summing to 1; below the grid all on the first
    knot, as PiecewiseCostModel.tokens_time; past it the last segment's line continues, so weights may be negative)."""
    i = np.clip(np.searchsorted(grid, x, side="left"), 1, len(grid) - 1)
    w = np.maximum((x - grid[i - 1]) / (grid[i] - grid[i - 1]), 0.0)
    out = np.zeros((len(x), len(grid)))
    rows = np.arange(len(x))
    out[rows, i - 1] = 1 - w
    out[rows, i] = w
    return out
