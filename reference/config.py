"""The engine's settings: every keyword of `LLM(...)` with its default, in one frozen, keyword-only dataclass.

The settings the engine shares with the simulator take the simulator's defaults (sim/config.py: the policy and block
size of the KV pool, the scheduler's mode, sequence cap, preemption, victim, chunking and scheduling policy). The
engine's own:

    watermark 0.0                   vLLM v1 keeps no admission watermark (the simulator's 0.01 is the paper's v0)
    enable_prefix_caching False     as this engine has always run; turn it on per LLM
    num_cpu_blocks 0                no CPU swap space unless asked (or swap_space in GiB, vLLM's keyword)
    max_num_batched_tokens None     vLLM's offline LLM default: sim.config.default_max_num_batched_tokens with the
                                    device's budget (4096 on a CPU, 8192 or 16384 on a GPU)
    max_model_len None             the model's context
    kv_dtype "auto"                 K/V in the model's dtype (the bit-exact cache); "int8": 8-bit K/V with a float32
                                    scale per token and KV head (reference/attention/quant.py)
    device / dtype / backend None   the best the machine has (reference/executor.py)

`EngineConfig(...)` checks every value that needs no model (types, ranges, vLLM's keywords that change nothing here):
TypeError for a wrong type, ValueError for a wrong value, naming the setting. What needs the model (the pool in GPU or
CPU memory, max_model_len against the context, the policy against the model's layers) `LLM` checks once it has it.
"""
from __future__ import annotations

from dataclasses import dataclass

from reference.attention.quant import check_kv_dtype
from reference.sampling import check_bool, check_int, check_real
from sim.config import MAX_SPECULATIVE_TOKENS, RUN_DEFAULTS, SCHEDULER_DEFAULTS, SCHEDULING_POLICIES
from sim.kv import POLICIES, takes_block_allocator
from sim.limits import MAX_COUNT, MAX_SEED, MAX_TOKENS


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineConfig:
    """Every setting of `LLM(...)`; see the module docstring for the defaults that are the engine's own."""

    model: object = "smollm2"  # a name (reference/models), or a model already loaded (LLM.from_loaded)
    # the KV pool
    policy: str = RUN_DEFAULTS["policy"]
    block_size: int = RUN_DEFAULTS["block_size"]
    num_gpu_blocks: int | None = None  # the pool in blocks; None: from kv_budget_bytes or the device's memory
    kv_budget_bytes: int | None = None  # the pool in bytes (vLLM's kv_cache_memory_bytes is the same)
    gpu_memory_utilization: float | None = None  # the share of the GPU the model and pool may take, in (0, 1]
    kv_dtype: str = "auto"  # "auto": the model's dtype; "int8": quantized K/V (reference.attention.quant)
    num_cpu_blocks: int = 0  # CPU swap space in blocks
    swap_space: float | None = None  # CPU swap space in GiB (vLLM's keyword), instead of num_cpu_blocks
    num_offload_blocks: int = 0  # the prefix cache's CPU offload tier in blocks (sim/kv/offload.py; paged); 0: none
    enable_prefix_caching: bool = False
    watermark: float = 0.0
    block_allocator: object = None  # paged: a class or function (num_blocks, block_size) -> the GPU pool's allocator
    # (a student's own, lab 03; sim.kv.paged.plugged_allocator checks it); None: sim.blocks.BlockAllocator
    # the scheduler
    scheduler: str = SCHEDULER_DEFAULTS.mode
    max_num_seqs: int = SCHEDULER_DEFAULTS.max_num_seqs
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = SCHEDULER_DEFAULTS.enable_chunked_prefill
    preemption: str = SCHEDULER_DEFAULTS.preemption
    victim: object = SCHEDULER_DEFAULTS.victim  # a name of sim.preemption.VICTIM_POLICIES, or a function
    scheduling_policy: str = SCHEDULER_DEFAULTS.scheduling_policy  # "fcfs" | "priority" (vLLM's scheduling_policy)
    # speculative decoding with an n-gram (prompt-lookup) draft (reference/speculative.py): draft tokens per step, 0 =
    # off. NOTE: vLLM takes it inside speculative_config={"method": "ngram", "num_speculative_tokens": k, ...}; here
    # the one number, the draft being always the n-gram one
    num_speculative_tokens: int = SCHEDULER_DEFAULTS.num_speculative_tokens
    # the model and the machine
    max_model_len: int | None = None
    device: str | None = None
    dtype: object = None  # a torch.dtype or vLLM's names ("float32", "bfloat16", "auto")
    backend: str | None = None
    seed: int = 0  # seeds the requests that bring none
    # vLLM's keywords: kv_cache_memory_bytes is kv_budget_bytes; the last three change nothing here (one device,
    # never CUDA graphs, no remote code) and are checked so that a vLLM script runs unchanged
    kv_cache_memory_bytes: int | None = None
    enforce_eager: bool = False
    tensor_parallel_size: int = 1
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if check_int("tensor_parallel_size", self.tensor_parallel_size, 1) != 1:
            raise ValueError(f"tensor_parallel_size {self.tensor_parallel_size}: this engine runs on one device "
                             "(allowed: 1)")  # fmt: skip
        check_bool("enforce_eager", self.enforce_eager)
        check_bool("trust_remote_code", self.trust_remote_code)
        checked = {}
        if self.kv_cache_memory_bytes is not None:
            if self.kv_budget_bytes is not None:
                raise ValueError("give kv_budget_bytes or kv_cache_memory_bytes (the same budget), not both")
            checked["kv_budget_bytes"] = self.kv_cache_memory_bytes
        if self.gpu_memory_utilization is not None:
            share = checked["gpu_memory_utilization"] = check_real("gpu_memory_utilization", self.gpu_memory_utilization)
            if not 0.0 < share <= 1.0:
                raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {share}")
        # NOTE: block sizes and pool sizes get their limits where the pool is sized (reference/executor.py: the
        # largest pool, the machine's memory); the others here
        for name, minimum, maximum in (("block_size", 1, None), ("max_num_seqs", 1, MAX_COUNT),
                                       ("num_cpu_blocks", 0, None), ("num_offload_blocks", 0, None),
                                       ("num_speculative_tokens", 0, MAX_SPECULATIVE_TOKENS),
                                       ("seed", 0, MAX_SEED)):  # fmt: skip
            checked[name] = check_int(name, getattr(self, name), minimum, maximum)
        for name, maximum in (("num_gpu_blocks", None), ("kv_budget_bytes", None),
                              ("max_num_batched_tokens", MAX_TOKENS), ("max_model_len", MAX_TOKENS)):  # fmt: skip
            value = checked.get(name, getattr(self, name))
            checked[name] = None if value is None else check_int(name, value, 1, maximum)
        checked["watermark"] = check_real("watermark", self.watermark)
        if self.block_allocator is not None:
            if not callable(self.block_allocator):
                raise TypeError(f"block_allocator must be a class or function (num_blocks, block_size) -> a block "
                                f"allocator, got {type(self.block_allocator).__name__}")  # fmt: skip
            if self.policy in POLICIES and not takes_block_allocator(self.policy):
                takes = ", ".join(p for p in POLICIES if takes_block_allocator(p))
                raise ValueError(f"block_allocator: policy {self.policy!r} runs its own allocator (allowed with "
                                 f"block_allocator: {takes})")  # fmt: skip
        check_kv_dtype(self.kv_dtype)
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy: got {self.scheduling_policy!r} (allowed: "
                             f"{', '.join(SCHEDULING_POLICIES)})")  # fmt: skip
        checked["enable_prefix_caching"] = check_bool("enable_prefix_caching", self.enable_prefix_caching)
        if self.enable_chunked_prefill is not None:
            checked["enable_chunked_prefill"] = check_bool("enable_chunked_prefill", self.enable_chunked_prefill)
        for name, value in checked.items():  # frozen: the checked, converted values replace the given ones
            object.__setattr__(self, name, value)

    @property
    def chunked(self) -> bool:
        """Whether the scheduler chunks prompts (v1 unless enable_chunked_prefill is False)."""
        return self.scheduler == "v1" and self.enable_chunked_prefill is not False


ENGINE_DEFAULTS = EngineConfig()
