"""The held-out validation suite: the traces `python -m reference validate-sim` serves (the calibration never saw
them), and the simulator run that stands for the engine on a trace.

One trace per shape (`SUITE`): long prompts near the token budget, decode-heavy with ~25 sequences at once, mixed
lengths, bursty (gamma) arrivals, chunked prefill under a 256-token budget, parallel sampling (n = 2 and 4), beam
search (width 4), a shared system prompt with prefix caching, and a small pool that preempts by recompute and by
swap; and the ShareGPT-shaped trace the online mode serves over HTTP (`served_requests`). `simulate` runs sim.run with an engine's own pool and scheduler settings; `simulate_case` with the settings
the engine would take for a suite case, without building one. reference/validation/validate_sim.py compares the simulator with
the engine on these traces; reference/validation/calibrate.py's stability check simulates them under several fits.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sim.base.request import Request

MODEL = "smollm2-135m"  # the sim.base.specs entry of the engine's model
CPU_TOKEN_BUDGET = 4096  # the engine's max_num_batched_tokens on a CPU (reference.engine.executor.default_token_budget)
DEFAULT_BLOCKS = 512  # KV blocks of the engine (and the simulated pool), unless a case or --num-gpu-blocks says


@dataclass(frozen=True, slots=True)
class Case:
    """A held-out trace and the engine settings it runs under: `count` requests of sim.workloads.workload's uniform lengths
    (`prompts`, `outputs`: inclusive ranges) with `workload`'s other arguments (arrivals, n, beam width, a shared
    prefix), CPU-sized."""

    name: str
    workload: dict
    engine: dict = field(default_factory=dict)
    count: int = 32
    prompts: tuple[int, int] = (8, 256)
    outputs: tuple[int, int] = (8, 96)


SUITE = (
    # prompts near the CPU engine's 4,096-token budget, few tokens out: the prompt's attention dominates
    Case("long-prompts", {"rate": 0.3}, count=12, prompts=(700, 3000), outputs=(8, 40)),
    # short prompts, long outputs, arrivals fast enough for ~25 sequences decoding at once
    Case("decode-heavy", {"rate": 2.5}, count=28, prompts=(16, 96), outputs=(120, 260)),
    Case("mixed", {"rate": 0.8}, prompts=(8, 900), outputs=(8, 120)),
    Case("bursty", {"rate": 0.8, "arrival": "gamma", "burstiness": 0.25}),
    Case("chunked-256", {"rate": 1.0}, {"max_num_batched_tokens": 256}),
    # parallel sampling and beam search: siblings share the prompt's blocks, decode together, fork copy-on-write
    Case("sampling-n2", {"rate": 0.8, "n": 2}, count=20, prompts=(16, 400), outputs=(16, 80)),
    Case("sampling-n4", {"rate": 0.5, "n": 4}, count=14, prompts=(16, 400), outputs=(16, 80)),
    Case("beam-4", {"rate": 0.4, "beam_width": 4}, count=12, prompts=(16, 300), outputs=(16, 48)),
    # one 512-token system prompt before every request, cached after the first
    Case("shared-prefix", {"rate": 1.0, "prefix_len": 512}, {"enable_prefix_caching": True}, count=24,
         prompts=(16, 200), outputs=(16, 80)),
    # a pool of 40 blocks (640 tokens) for ~1,000 tokens of demand: preempted and recomputed, or swapped to CPU
    Case("preemption", {"rate": 1.5}, {"num_gpu_blocks": 40}),
    Case("preemption-swap", {"rate": 1.5}, {"num_gpu_blocks": 40, "preemption": "swap", "num_cpu_blocks": 256}),
)
VOCAB_SIZE = 49152  # SmolLM2's (sim.base.specs "smollm2-135m"); synthetic ids are mapped into [FIRST_ID, VOCAB_SIZE)
FIRST_ID = 100  # past SmolLM2's special tokens (ids < 17)


def case_requests(case: Case, *, quick: bool, seed: int) -> list[Request]:
    """The case's requests: uniform prompt and output lengths, arrivals shifted to start at 0. A shared prefix's
    synthetic ids (sim.workloads.workload) are mapped into the model's vocabulary, the same map for the engine and the
    simulator. `quick`: 6 short requests with the same sampling, prefix and arrivals."""
    from sim.workloads.workload import generate_requests

    workload = dict(case.workload)
    count, prompts, outputs = case.count, case.prompts, case.outputs
    if quick:
        count, prompts, outputs = 6, (8, min(prompts[1], 96)), (4, min(outputs[1], 16))
        if workload.get("prefix_len"):
            workload["prefix_len"] = 48
    requests = generate_requests("uniform", count, prompt_len_range=prompts, output_len_range=outputs,
                                 max_seq_len=8192, seed=seed, **workload)
    first = min(r.arrival_time for r in requests)
    span = VOCAB_SIZE - FIRST_ID
    return [Request(r.request_id, r.arrival_time - first, r.prompt_len, r.output_len, r.n, r.beam_width, r.prefix_id,
                    r.prefix_len, None if r.prompt_token_ids is None else [FIRST_ID + t % span for t in r.prompt_token_ids])
            for r in requests]


def simulate(requests: list[Request], llm, cost_model, block_size: int, watermark: float = 0.0):
    """sim.run over the same requests, pool and scheduler settings as `llm`, priced by `cost_model`."""
    cfg, kv = llm.scheduler.config, llm.scheduler.kv
    return _simulate(requests, cost_model, block_size=block_size, num_gpu_blocks=kv.num_blocks,
                     num_cpu_blocks=kv.num_cpu_blocks, max_num_batched_tokens=cfg.max_num_batched_tokens,
                     max_num_seqs=cfg.max_num_seqs, enable_chunked_prefill=cfg.enable_chunked_prefill,
                     preemption=cfg.preemption, victim=cfg.victim, watermark=watermark,
                     enable_prefix_caching=kv.enable_prefix_caching)


def simulate_case(case: Case, requests: list[Request], cost_model, block_size: int = 16):
    """sim.run over a suite case as the engine would serve it, without an engine (its CPU defaults: the 4,096-token
    budget, chunked prefill, 256 sequences, recompute; calibrate's stability check uses it)."""
    engine = {"num_gpu_blocks": DEFAULT_BLOCKS, "max_num_batched_tokens": CPU_TOKEN_BUDGET, **case.engine}
    chunked = engine.pop("enable_chunked_prefill", None)
    if chunked is False and "max_num_batched_tokens" not in case.engine:
        engine["max_num_batched_tokens"] = max(CPU_TOKEN_BUDGET, 8192)  # the engine: room for a whole context
    return _simulate(requests, cost_model, block_size=block_size, enable_chunked_prefill=chunked, **engine)


def _simulate(requests: list[Request], cost_model, *, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int = 0,
              **settings):
    from sim.api import run
    from sim.base.specs import get_model

    # swap space in GiB that holds exactly num_cpu_blocks blocks (sim.run sizes it by bytes; +0.5 against rounding)
    if num_cpu_blocks:
        block_bytes = block_size * get_model(MODEL).kv_bytes_per_token
        settings["swap_space_gib"] = (num_cpu_blocks + 0.5) * block_bytes / 2**30
    return run(requests=requests, model=MODEL, kv_slots=num_gpu_blocks * block_size, block_size=block_size,
               scheduler="v1", cost_model=cost_model, **settings)


# --online without --trace: ShareGPT-shaped lengths (sim.workloads.workload's log-normals, the paper's shape) cut to 1,024 tokens,
# Poisson arrivals at 0.4 req/s for ~5 minutes: near the capacity of the engine at one thread on a 2-core machine (the
# committed run says how many were in flight at once)
SERVED_NAME = "served-sharegpt"
SERVED_WORKLOAD = {"dataset": "sharegpt", "num_requests": 120, "rate": 0.4, "max_seq_len": 1024}
SERVED_ENGINE = {"num_gpu_blocks": 1024}


def served_requests(seed: int) -> list[Request]:
    """The default trace of validate-sim's online mode (written under --traces-dir with the results)."""
    from sim.workloads.workload import generate_requests

    return generate_requests(seed=seed, **SERVED_WORKLOAD)
