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
    prompt_lookup_max 3, _min 1     the n-gram draft's longest and shortest suffix (reference/engine/speculative.py)
    device / dtype / backend None   the best the machine has (reference/engine/executor.py)

`EngineConfig(...)` checks every value that needs no model (types, ranges, vLLM's keywords that change nothing here):
TypeError for a wrong type, ValueError for a wrong value, naming the setting. What needs the model (the pool in GPU or
CPU memory, max_model_len against the context, the policy against the model's layers) `LLM` checks once it has it.

vLLM's spellings of the engine's own settings are folded into them here, once, so the rest of the engine reads one
name: `kv_cache_dtype` ("auto" | "int8") into `kv_dtype`, and `speculative_config={"method": "ngram",
"num_speculative_tokens": k, "prompt_lookup_max": n, "prompt_lookup_min": m}` (vLLM's SpeculativeConfig) into
`num_speculative_tokens`, `prompt_lookup_max` and `prompt_lookup_min`; both are None afterwards. A value vLLM takes and
this engine has no path for (an fp8 cache, an EAGLE or draft-model speculator) is refused, never approximated.
NOTE: a project keyword at its default counts as not given (as num_cpu_blocks=0 beside swap_space); given with
another value beside vLLM's spelling, the two must agree.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import NamedTuple

from reference.attention.quant import check_kv_dtype
from reference.engine.sampling import check_bool, check_int, check_real
from reference.engine.speculative import PROMPT_LOOKUP_MAX, PROMPT_LOOKUP_MIN
from sim.base.limits import MAX_COUNT, MAX_SEED, MAX_TOKENS
from sim.config import MAX_SPECULATIVE_TOKENS, RUN_DEFAULTS, SCHEDULER_DEFAULTS, SCHEDULING_POLICIES
from sim.kv import POLICIES, takes_block_allocator

# vLLM's kv_cache_dtype values this engine has, each the kv_dtype of the same name. vLLM's others are refused: its fp8
# caches (fp8, fp8_e4m3, fp8_e5m2, ...) have no path here (reference/attention/quant.py says why int8, not fp8), and
# "float16" / "bfloat16" name the model's dtype, which is `dtype=`'s to choose ("auto" then follows it)
VLLM_KV_CACHE_DTYPES = ("auto", "int8")
# the keys of vLLM's speculative_config this engine takes: its draft is vLLM's "ngram" method (prompt lookup)
SPECULATIVE_CONFIG_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")


def kv_dtype_of(kv_dtype: object, kv_cache_dtype: object, names: tuple[str, str] = ("kv_dtype", "kv_cache_dtype")
                ) -> str:
    """The cache's kv_dtype from the project's keyword and vLLM's (`kv_cache_dtype`, None: not given); ValueError
    naming `names` (the CLI passes its flags) for a value this engine has no cache for, or for two that disagree."""
    if kv_cache_dtype is None:
        return check_kv_dtype(kv_dtype)
    ours, theirs = names
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in VLLM_KV_CACHE_DTYPES:
        raise ValueError(f"{theirs} must be one of {', '.join(VLLM_KV_CACHE_DTYPES)} (auto: the model's dtype; int8: "
                         f"8-bit K/V with a float32 scale per token and KV head; vLLM's fp8 caches are not in this "
                         f"engine), got {kv_cache_dtype!r}")
    if kv_dtype != ENGINE_DEFAULTS.kv_dtype and kv_dtype != kv_cache_dtype:
        raise ValueError(f"{ours} {kv_dtype!r} and {theirs} {kv_cache_dtype!r} (vLLM's name for the same setting) "
                         f"disagree (allowed: one of them, or both the same)")
    return kv_cache_dtype


class NgramSettings(NamedTuple):
    """The n-gram draft's settings, under the engine's (and vLLM's) names."""

    num_speculative_tokens: int
    prompt_lookup_max: int
    prompt_lookup_min: int


def ngram_settings(speculative_config: object, name: str = "speculative_config") -> NgramSettings:
    """vLLM's `speculative_config` dict as the engine's settings, completed by vLLM's rules (SpeculativeConfig):
    num_speculative_tokens is required (>= 1); without prompt_lookup_max and _min both are 5, with one the other equals
    it. TypeError / ValueError in one line naming `name` and the key: a method other than "ngram" (EAGLE, Medusa, MTP,
    a draft model: weights this engine does not have), a key it does not take, a value out of range."""
    if not isinstance(speculative_config, Mapping):
        raise TypeError(f"{name} must be a dict such as {{\"method\": \"ngram\", \"num_speculative_tokens\": 4}}, got "
                        f"{type(speculative_config).__name__}")
    for key in speculative_config:
        if key not in SPECULATIVE_CONFIG_KEYS:
            raise ValueError(f"{name}: key {key!r} is not taken here: the engine's draft is vLLM's n-gram one "
                             f"(allowed keys: {', '.join(SPECULATIVE_CONFIG_KEYS)})")
    method = speculative_config.get("method")
    if method != "ngram":
        raise ValueError(f"{name}: method {method!r}: this engine drafts by prompt lookup only; EAGLE, Medusa, MTP and "
                         f"draft models need weights it does not have (allowed: 'ngram')")
    if "num_speculative_tokens" not in speculative_config:
        raise ValueError(f"{name}: num_speculative_tokens is missing (allowed: an integer from 1 to "
                         f"{MAX_SPECULATIVE_TOKENS})")
    k = check_int(f"{name} num_speculative_tokens", speculative_config["num_speculative_tokens"], 1,
                  MAX_SPECULATIVE_TOKENS)
    longest, shortest = (speculative_config.get(key) for key in ("prompt_lookup_max", "prompt_lookup_min"))
    if longest is None and shortest is None:
        longest = shortest = 5  # vLLM's defaults for its ngram method
    longest = check_int(f"{name} prompt_lookup_max", shortest if longest is None else longest, 1, MAX_TOKENS)
    shortest = check_int(f"{name} prompt_lookup_min", longest if shortest is None else shortest, 1, MAX_TOKENS)
    if shortest > longest:
        raise ValueError(f"{name}: prompt_lookup_min {shortest} is more than prompt_lookup_max {longest} (allowed: "
                         f"1 <= prompt_lookup_min <= prompt_lookup_max)")
    return NgramSettings(k, longest, shortest)


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
    kv_cache_dtype: str | None = None  # vLLM's name for kv_dtype ("auto" | "int8"); folded into it, then None
    num_cpu_blocks: int = 0  # CPU swap space in blocks
    swap_space: float | None = None  # CPU swap space in GiB (vLLM's keyword), instead of num_cpu_blocks
    num_offload_blocks: int = 0  # the prefix cache's CPU offload tier in blocks (sim/kv/offload.py; paged); 0: none
    enable_prefix_caching: bool = False
    watermark: float = 0.0
    block_allocator: object = None  # paged: a class or function (num_blocks, block_size) -> the GPU pool's allocator
    # (a student's own, lab 03; sim.kv.plug.plugged_allocator checks it); None: sim.kv.blocks.BlockAllocator
    # the scheduler
    scheduler: str = SCHEDULER_DEFAULTS.mode
    max_num_seqs: int = SCHEDULER_DEFAULTS.max_num_seqs
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = SCHEDULER_DEFAULTS.enable_chunked_prefill
    preemption: str = SCHEDULER_DEFAULTS.preemption
    victim: object = SCHEDULER_DEFAULTS.victim  # a name of sim.scheduling.preemption.VICTIM_POLICIES, or a function
    scheduling_policy: str = SCHEDULER_DEFAULTS.scheduling_policy  # "fcfs" | "priority" (vLLM's scheduling_policy)
    # speculative decoding with an n-gram (prompt-lookup) draft (reference/engine/speculative.py): draft tokens per step, 0 =
    # off; the draft matches the sequence's last n tokens, n from prompt_lookup_max down to prompt_lookup_min
    num_speculative_tokens: int = SCHEDULER_DEFAULTS.num_speculative_tokens
    prompt_lookup_max: int = PROMPT_LOOKUP_MAX
    prompt_lookup_min: int = PROMPT_LOOKUP_MIN
    # vLLM's spelling of those three: {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": n,
    # "prompt_lookup_min": m} (ngram_settings); folded into them, then None
    speculative_config: dict | None = None
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
                             "(allowed: 1)")
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
        # NOTE: block sizes and pool sizes get their limits where the pool is sized (reference/engine/executor.py: the
        # largest pool, the machine's memory); the others here
        for name, minimum, maximum in (("block_size", 1, None), ("max_num_seqs", 1, MAX_COUNT),
                                       ("num_cpu_blocks", 0, None), ("num_offload_blocks", 0, None),
                                       ("num_speculative_tokens", 0, MAX_SPECULATIVE_TOKENS),
                                       ("prompt_lookup_max", 1, MAX_TOKENS), ("prompt_lookup_min", 1, MAX_TOKENS),
                                       ("seed", 0, MAX_SEED)):
            checked[name] = check_int(name, getattr(self, name), minimum, maximum)
        if checked["prompt_lookup_min"] > checked["prompt_lookup_max"]:
            raise ValueError(f"prompt_lookup_min {checked['prompt_lookup_min']} is more than prompt_lookup_max "
                             f"{checked['prompt_lookup_max']} (allowed: 1 <= prompt_lookup_min <= prompt_lookup_max)")
        if self.speculative_config is not None:
            checked.update(self._fold_speculative_config(checked))
        for name, maximum in (("num_gpu_blocks", None), ("kv_budget_bytes", None),
                              ("max_num_batched_tokens", MAX_TOKENS), ("max_model_len", MAX_TOKENS)):
            value = checked.get(name, getattr(self, name))
            checked[name] = None if value is None else check_int(name, value, 1, maximum)
        checked["watermark"] = check_real("watermark", self.watermark)
        if self.block_allocator is not None:
            if not callable(self.block_allocator):
                raise TypeError(f"block_allocator must be a class or function (num_blocks, block_size) -> a block "
                                f"allocator, got {type(self.block_allocator).__name__}")
            if self.policy in POLICIES and not takes_block_allocator(self.policy):
                takes = ", ".join(p for p in POLICIES if takes_block_allocator(p))
                raise ValueError(f"block_allocator: policy {self.policy!r} runs its own allocator (allowed with "
                                 f"block_allocator: {takes})")
        checked["kv_dtype"] = kv_dtype_of(self.kv_dtype, self.kv_cache_dtype)
        checked["kv_cache_dtype"] = None
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy: got {self.scheduling_policy!r} (allowed: "
                             f"{', '.join(SCHEDULING_POLICIES)})")
        checked["enable_prefix_caching"] = check_bool("enable_prefix_caching", self.enable_prefix_caching)
        if self.enable_chunked_prefill is not None:
            checked["enable_chunked_prefill"] = check_bool("enable_chunked_prefill", self.enable_chunked_prefill)
        for name, value in checked.items():  # frozen: the checked, converted values replace the given ones
            object.__setattr__(self, name, value)

    def _fold_speculative_config(self, checked: dict) -> dict:
        """The three n-gram settings from vLLM's speculative_config; ValueError where a project keyword given beside it
        (not at its default) disagrees."""
        settings = ngram_settings(self.speculative_config)
        for name, value in settings._asdict().items():
            given = checked[name]
            if given != getattr(ENGINE_DEFAULTS, name) and given != value:
                raise ValueError(f"{name} {given} and speculative_config's {name} {value} disagree (allowed: one of "
                                 f"them, or both the same)")
        return {**settings._asdict(), "speculative_config": None}

    @property
    def chunked(self) -> bool:
        """Whether the scheduler chunks prompts (v1 unless enable_chunked_prefill is False)."""
        return self.scheduler == "v1" and self.enable_chunked_prefill is not False


ENGINE_DEFAULTS = EngineConfig()
# LLM's keywords besides `model` (and `tokenizer`, which is no setting): EngineConfig's fields are the one list
ENGINE_SETTINGS = tuple(f.name for f in fields(EngineConfig) if f.name != "model")
