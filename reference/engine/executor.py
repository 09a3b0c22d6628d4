"""The model executor: carries out one scheduler `StepPlan` on real tensors and returns logits.

vLLM v0's worker / model runner (Kwon et al., SOSP 2023, section 4.5 and 5) in one small class. The plan's
block tables are already allocated by the shared scheduler and KV manager (sim/); here they only become
tensors. In the order sim/scheduling/plan.py prescribes:

    1. swap out  (gpu_block -> cpu_block)   before anything can overwrite those GPU blocks
       then the prefix cache's offload-tier copies, in the order the KV manager decided (sim/kv/offload.py)
    2. swap in   (cpu_block -> gpu_block)
    3. copies    (src -> dst)               copy-on-write, contiguous beam forks
    4. one forward pass over every FED entry: prefill-shaped first, then decodes (ForwardBatch's rule); a
       prompt chunk attends to its earlier chunks through the block table, like a prompt over a cached prefix

Row mapping, for a plan with a shared-prompt group R (fed entry r0, sample-only sibling r1) and a decode d:

    plan entries   prefills: r0 (feeds P tokens), r1 (feeds 0)   decodes: d
    forward rows   r0 -> logits row 0                              d -> logits row 1
    sampled from   r0: row 0, r1: row 0 (its group's fed entry)    d: row 1

The forward pass projects only each fed entry's last row onto the vocabulary, except in a step where an entry
asks for the logits of every token it feeds (prompt log-probs, reference/engine/prompt_logprobs.py): that step runs the
model with `all_logits=True` and hands those entries their rows as well.

Also here: the defaults the engine derives from the device (backend, dtype, KV pool size).
"""
from __future__ import annotations

import os
from typing import Callable, NamedTuple

import torch

from reference.engine.batch import ForwardBatch
from reference.engine.kv_cache import KVCache, kv_bytes_per_block, total_device_memory_bytes
from reference.models.llama import LlamaForwardModel
from sim.base.limits import MAX_POOL_BLOCKS
from sim.scheduling.plan import ScheduledSeq, StepPlan

BACKENDS = ("torch", "torch_batched", "numba", "triton")
# NOTE: the CPU default pool holds 64 requests of 512 tokens (a CPU pool sized for a class demo); SmolLM2 in float32
# needs 45 KiB of K/V per token, so this is 1.4 GiB. The GPU default is 0.9 of free memory after the weights.
CPU_DEFAULT_TOKENS = 64 * 512
GPU_MEMORY_FRACTION = 0.9


def default_device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"unknown device {device!r} (allowed: cpu, cuda, cuda:N)") from err


def default_backend(backend: str | None, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
    """The attention backend: given, or "triton" on CUDA; on a CPU "numba" (the compiled decode kernel,
    reference.attention.cpu_numba) for float32 and bfloat16 when numba is installed, else "torch_batched".

    NOTE: "torch" (the per-sequence oracle in reference.attention.torch_ref) stays selectable for tests and
    for reading, but on CPU its Python loops were ~41% of a decode step; Triton on CPU only interprets."""
    if backend is None:
        from reference.attention import cpu_numba

        if device.type == "cuda":
            backend = "triton"
        else:
            backend = "numba" if dtype in cpu_numba.CACHE_DTYPES and cpu_numba.available() else "torch_batched"
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r} (allowed: {', '.join(BACKENDS)})")
    return backend


DTYPE_NAMES = {"auto": None, "float32": torch.float32, "float": torch.float32, "float16": torch.float16,
               "half": torch.float16, "bfloat16": torch.bfloat16}  # vLLM's spellings of `dtype`


def default_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    """The model's dtype: a torch dtype, one of vLLM's names (DTYPE_NAMES; "auto" = the default), or None.
    NOTE: float32 on CPU keeps greedy output equal to HF's float32 run; bfloat16 is what GPUs serve in."""
    if isinstance(dtype, str):
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype {dtype!r} (allowed: {', '.join(DTYPE_NAMES)}, or a torch dtype)")
        dtype = DTYPE_NAMES[dtype]
    if dtype is not None and dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype {dtype} is not served (allowed: float32, float16, bfloat16)")
    return dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)


def default_token_budget(device: torch.device) -> int:
    """vLLM's default max_num_batched_tokens for its offline `LLM` class (vllm/engine/arg_utils.py,
    get_batch_defaults): 4096 on a CPU; on a GPU 16384 with 70 GiB of memory or more (A100s excepted), else 8192."""
    if device.type != "cuda":
        return 4096
    props = torch.cuda.get_device_properties(device)
    big = props.total_memory >= 160 * 2**30 or (props.total_memory >= 70 * 2**30 and "a100" not in props.name.lower())
    return 16384 if big else 8192


def use_one_cpu_thread(device: torch.device) -> None:
    """One torch thread on a CPU unless OMP_NUM_THREADS / MKL_NUM_THREADS says otherwise. This is process-wide, as
    torch.set_num_threads is.

    NOTE: not because one thread is faster: on an idle 2-core box two threads ran the bench workload faster (see
    the 2-thread rows of figures/peer_vllm.csv, where OMP_NUM_THREADS=2 is set). One is the default because this
    engine's processes usually share the cores (the test suite runs two workers; the benchmarks alternate
    systems), where OpenMP threads that outnumber the free cores spin and stall each other. Set
    OMP_NUM_THREADS to the free cores for a machine of one's own."""
    if device.type == "cpu" and not (os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS")):
        torch.set_num_threads(1)


def num_gpu_blocks_for(config, block_size: int, dtype: torch.dtype, device: torch.device,
                       num_gpu_blocks: int | None, kv_budget_bytes: int | None,
                       gpu_memory_utilization: float | None = None, kv_dtype: str = "auto") -> int:
    """The KV pool size in blocks: given, or from a byte budget, or the device's default: on a GPU,
    `gpu_memory_utilization` of its free memory (0.9 by default). As in vLLM, a block count or a byte budget
    overrides gpu_memory_utilization, and vLLM's CPU build ignores that keyword: so does this engine on the CPU.
    A given count or budget past `max_pool_blocks` is a ValueError saying what is allowed."""
    if num_gpu_blocks is not None and kv_budget_bytes is not None:
        raise ValueError("give at most one of num_gpu_blocks and kv_budget_bytes (kv_cache_memory_bytes)")
    per_block = kv_bytes_per_block(config.num_layers, block_size, config.num_kv_heads, config.head_dim, dtype,
                                   kv_dtype)  # an int8 kv_dtype: more blocks in the same bytes
    limit, most = max_pool_blocks(per_block, device)
    if num_gpu_blocks is not None:
        if num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be >= 1, got {num_gpu_blocks}")
        if num_gpu_blocks > limit:
            raise ValueError(f"num_gpu_blocks {num_gpu_blocks:,} is more than {most} (allowed: 1 .. {limit:,})")
        return num_gpu_blocks
    shape = dict(num_layers=config.num_layers, block_size=block_size, num_kv_heads=config.num_kv_heads,
                 head_dim=config.head_dim, dtype=dtype, kv_dtype=kv_dtype)
    if kv_budget_bytes is not None:
        if kv_budget_bytes > limit * per_block:
            raise ValueError(f"kv_budget_bytes (kv_cache_memory_bytes) {kv_budget_bytes:,} is more than {most} "
                             f"(allowed: at most {limit * per_block:,} bytes, {limit:,} blocks of {per_block:,})")
        return KVCache.num_blocks_for_budget(**shape, budget_bytes=kv_budget_bytes)
    if device.type == "cuda":
        # NOTE: a default is never refused: a small model on a large GPU is cut to the limit (free memory is under
        # the device's total, so only MAX_POOL_BLOCKS can cut it)
        return min(limit, KVCache.num_blocks_for_budget(**shape, device=device, fraction_of_free_memory=(
            gpu_memory_utilization or GPU_MEMORY_FRACTION)))
    return -(-CPU_DEFAULT_TOKENS // block_size)


def max_pool_blocks(per_block_bytes: int, device: torch.device | str) -> tuple[int, str]:
    """The most blocks a KV pool on `device` may hold, and what that most is (for "N is more than ..."): the
    simulator's limit on a paged pool (sim.base.limits.MAX_POOL_BLOCKS: the KV manager is the simulator's), and no more
    bytes than the device's whole memory. ValueError if one block is larger than that memory.
    NOTE: a sanity bound, not a promise that the pool fits: free memory is less than the total (and on a CPU the
    GPU and CPU pools share it); a pool between the two fails in torch's allocator."""
    device = torch.device(device)
    total = total_device_memory_bytes(device)
    memory = f"the {device.type} memory of {total / 2**30:.1f} GiB"
    if per_block_bytes > total:
        raise ValueError(f"one KV block takes {per_block_bytes:,} bytes, more than {memory} "
                         "(allowed: a smaller block_size)")
    if total // per_block_bytes < MAX_POOL_BLOCKS:
        return total // per_block_bytes, f"{memory} holds at {per_block_bytes:,} bytes a block"
    return MAX_POOL_BLOCKS, "the largest paged pool (sim.base.limits.MAX_POOL_BLOCKS)"


class StepLogits(NamedTuple):
    """What one plan's forward pass gives the engine."""

    logits: torch.Tensor | None  # [num_fed, vocab] float32 on the model's device, one row per fed entry (its last
    # new token); None when nothing is fed
    rows: list[int | None]  # per entry of plan.entries: the logits row it samples from, or None
    all_rows: dict[int, torch.Tensor]  # entry index -> [num_new_tokens, vocab]: every fed row, for the entries asked


class ModelExecutor:
    """Runs plans for one model over one KV cache."""

    def __init__(self, model: LlamaForwardModel, kv_cache: KVCache, backend: str,
                 group_tables: Callable[[int], list[list[int | None]]] | None = None,
                 tier_copies: Callable[[], list] | None = None) -> None:
        """group_tables: seq_id -> the sequence's block table in every KV cache group (the KV contract's
        `group_tables`, which every manager answers); read only when the cache's layout has more than one group (the
        plan's block tables are group 0's)."""
        if kv_cache.layout.num_groups > 1 and group_tables is None:
            raise ValueError(f"a KV cache of {kv_cache.layout.num_groups} groups needs each sequence's group tables")
        self.model = model
        self.kv_cache = kv_cache
        self.backend = backend
        self.group_tables = group_tables if kv_cache.layout.num_groups > 1 else None
        # the KV manager's take_tier_copies (the prefix cache's CPU offload tier), read once a step; None: no tier
        self.tier_copies = tier_copies

    def execute(self, plan: StepPlan, tokens_to_feed: Callable[[ScheduledSeq], list[int]],
                wants_all_rows: Callable[[ScheduledSeq], bool] | None = None) -> StepLogits:
        """Do the plan's block moves and its forward pass: the logits at every fed entry's last new token and the
        row each entry samples from (StepLogits), and for the fed entries for which `wants_all_rows(entry)` is true,
        the logits of every token they feed (all_rows; float32, on the model's device).

        NOTE: the model projects either each sequence's last row or every row of the batch (`all_logits`), so a step
        with an entry in all_rows projects every fed row, other requests' prompt chunks included ([num_tokens, vocab]
        floats); vLLM projects only the rows of the request that asked. Steps without such an entry pay nothing.
        """
        cache = self.kv_cache
        cache.swap_out(plan.blocks_to_swap_out)
        if self.tier_copies is not None:  # after swap-outs, before anything writes a device block (sim/kv/offload.py)
            cache.apply_tier_copies(self.tier_copies())
        cache.swap_in(plan.blocks_to_swap_in)
        cache.copy_blocks(plan.blocks_to_copy)

        entries = plan.entries
        fed = [i for i, e in enumerate(entries) if e.num_new_tokens > 0]
        if not fed:
            return StepLogits(None, [], {})
        # NOTE: ForwardBatch classifies by shape, not by plan list: a prefill that feeds 1 token over a cached
        # prefix (a prefix-cache hit up to the last prompt token) runs as a decode. Stable-partition so that
        # every prefill-shaped entry comes first, as build() requires.
        is_decode = {i: ForwardBatch.is_decode(entries[i].num_new_tokens, entries[i].num_computed_tokens) for i in fed}
        order = [i for i in fed if not is_decode[i]] + [i for i in fed if is_decode[i]]
        row_of = {entry_index: row for row, entry_index in enumerate(order)}
        seqs = [(tokens_to_feed(entries[i]), entries[i].num_computed_tokens, entries[i].block_table) for i in order]
        # group 0's table is the plan's own; the others come from the KV manager (after this step's allocations)
        extra = None if self.group_tables is None else [self.group_tables(entries[i].seq_id)[1:] for i in order]
        batch = ForwardBatch.build(seqs, cache.block_size, self.model.device, extra)
        wanted = [i for i in order if wants_all_rows is not None and wants_all_rows(entries[i])]
        # NOTE: the logits stay on the device; only tokens (and asked-for log-probs) come back
        if not wanted:
            logits = self.model.forward(batch.input_ids, batch.positions, batch, cache, self.backend)
            return StepLogits(logits.float(), _sample_rows(plan, row_of), {})
        every = self.model.forward(batch.input_ids, batch.positions, batch, cache, self.backend, all_logits=True)
        start, first_row = 0, {}
        for i, (tokens, _, _) in zip(order, seqs):
            first_row[i] = start
            start += len(tokens)
        all_rows = {i: every[first_row[i]:first_row[i] + entries[i].num_new_tokens].float() for i in wanted}
        return StepLogits(every[batch.logits_indices].float(), _sample_rows(plan, row_of), all_rows)


def _sample_rows(plan: StepPlan, row_of: dict[int, int]) -> list[int | None]:
    """The logits row each entry samples from: its own, or (sample-only) its group's fed entry's; None when it
    samples nothing."""
    rows: list[int | None] = []
    group_row: dict[int, int] = {}  # request_id -> row of its latest fed prefill entry
    for i, entry in enumerate(plan.entries):
        if not entry.sample:
            rows.append(None)
        elif entry.num_new_tokens > 0:
            rows.append(row_of[i])
            group_row[entry.request_id] = row_of[i]
        elif entry.request_id in group_row:
            rows.append(group_row[entry.request_id])
        else:
            raise RuntimeError(
                f"sample-only entry of seq {entry.seq_id}: expected its request {entry.request_id}'s fed prefill "
                "entry before it in plan.prefills, found none"
            )
    return rows
