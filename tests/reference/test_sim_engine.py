"""The central claim (DESIGN.md): the simulator is the engine with a simulated clock.

Given the same offline trace and the same block budget, the simulator's executor (sim.loop.Simulator, which
decides outcomes from the trace's true lengths) and the reference engine (reference.LLM, which runs a model and
samples tokens) make the same allocation and preemption decisions, step for step: the same sequences prefill
and decode, with the same block tables, the same requests are preempted, the same blocks move (swap, copy),
and the same number of blocks is free after every step.

How the decisions are observed: the engine keeps `LLM.step_log` (one StepRecord per executed plan), which
has no block tables; the simulator keeps per-step counts only. So on BOTH sides the scheduler's `schedule`
and `finish_step` are wrapped (an instance attribute over the method, the same wrapper on each side) to record
every plan it hands out, empty ones included, and the free blocks after the executor reports back. The
wrapper only records: the plan object is passed through untouched. The engine's own step_log is then also
checked against the engine's recorded plans.

The engine runs the tiny random Llama: with ignore_eos and max_tokens = the trace's output length, a request
finishes at the same step whatever tokens the weights produce, so the decisions cannot depend on them
(one case runs the real SmolLM2 to show it).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from reference import LLM, SamplingParams
from reference.models import load_model, random_model
from sim.cost import RooflineCostModel
from sim.kv import make_kv_manager
from sim.loop import Simulator
from sim.request import Request
from sim.scheduler import Scheduler, SchedulerConfig

BLOCK_SIZE = 4
NUM_GPU_BLOCKS = 32  # 128 token slots for 12 requests of up to 59 tokens each: paged must preempt
NUM_CPU_BLOCKS = 64  # swap space: room for every swapped group
MAX_NUM_SEQS = 8
MAX_NUM_BATCHED_TOKENS = 64  # < the sum of prompts: admission takes several prefill steps
MAX_MODEL_LEN = 64  # the `max` policy reserves this: 16 blocks, so 2 requests at a time in the pool


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One torch thread: on a 2-core machine small ops run faster without OpenMP hand-offs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def offline_trace(num_requests: int = 12, seed: int = 7, n: int = 1) -> list[Request]:
    """Requests all arriving at t = 0: prompts 5-40 tokens, outputs 3-20 tokens, seeded token ids; every third
    request samples `n` sequences that share its prompt blocks."""
    rng = np.random.default_rng(seed)
    trace = []
    for i in range(num_requests):
        prompt_len, output_len = int(rng.integers(5, 41)), int(rng.integers(3, 21))
        ids = rng.integers(17, 256, size=prompt_len).tolist()  # tiny vocabulary (256), no SmolLM2 special ids
        trace.append(Request(i, 0.0, prompt_len, output_len, n=n if i % 3 == 0 else 1, prompt_token_ids=ids))
    return trace


def record_plans(scheduler: Scheduler) -> list[dict]:
    """Record every plan `scheduler` hands out, and its free blocks after finish_step (see the module docstring)."""
    records: list[dict] = []
    schedule, finish_step = scheduler.schedule, scheduler.finish_step

    def recording_schedule():
        plan = schedule()
        records.append({
            "prefills": [(s.request_id, s.seq_id, s.num_computed_tokens, s.num_new_tokens, list(s.block_table))
                         for s in plan.prefills],
            "decodes": [(s.request_id, s.seq_id, list(s.block_table)) for s in plan.decodes],
            "preempted": list(plan.preempted), "blocks_to_swap_out": list(plan.blocks_to_swap_out),
            "blocks_to_swap_in": list(plan.blocks_to_swap_in), "blocks_to_copy": list(plan.blocks_to_copy),
            "empty": plan.is_empty,
        })  # fmt: skip
        return plan

    def recording_finish_step(plan, outcome):
        result = finish_step(plan, outcome)
        records[-1]["num_free_blocks"] = scheduler.kv.num_free_blocks
        records[-1]["finished"] = sorted(result.finished_request_ids)
        return result

    scheduler.schedule, scheduler.finish_step = recording_schedule, recording_finish_step
    return records


def simulate(trace: list[Request], policy: str, preemption: str) -> list[dict]:
    """The simulator's executor over the same scheduler configuration as the engine below."""
    num_cpu = NUM_CPU_BLOCKS if preemption == "swap" else 0
    kv = make_kv_manager(policy, NUM_GPU_BLOCKS * BLOCK_SIZE, block_size=BLOCK_SIZE, max_seq_len=MAX_MODEL_LEN,
                         num_cpu_blocks=num_cpu)  # fmt: skip
    scheduler = Scheduler(kv, SchedulerConfig(MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, "continuous", preemption))
    records = record_plans(scheduler)
    # jump=False: the loop's decode-run jump applies runs without calling schedule(), so plans would go unseen
    # (tests/sim/test_jump.py shows jumping gives the same result). The cost model only moves the clock.
    Simulator(scheduler, RooflineCostModel("opt-13b", "a100-40gb"), trace, block_bytes=1, jump=False).run()
    return records


def serve(model, trace: list[Request], policy: str, preemption: str, tokenizer=None) -> tuple[list[dict], LLM]:
    """The engine over the same trace: token ids in, max_tokens = the true output length, EOS ignored."""
    llm = LLM.from_loaded(model, tokenizer, policy=policy, block_size=BLOCK_SIZE, num_gpu_blocks=NUM_GPU_BLOCKS,
                          num_cpu_blocks=NUM_CPU_BLOCKS if preemption == "swap" else 0, preemption=preemption,
                          max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                          max_model_len=MAX_MODEL_LEN)  # fmt: skip
    records = record_plans(llm.scheduler)
    for r in trace:
        params = SamplingParams(temperature=0.0, max_tokens=r.output_len, n=r.n, ignore_eos=True)
        assert llm.add_request(r.prompt_token_ids, params, request_id=r.request_id) == r.request_id
    while llm.has_unfinished_requests():
        llm.step()
    return records, llm


def check_step_log(llm: LLM, records: list[dict]) -> None:
    """The engine's own log says what the recorded plans say (it logs executed, i.e. non-empty, plans)."""
    executed = [r for r in records if not r["empty"]]
    assert len(llm.step_log) == len(executed)
    for step, (logged, plan) in enumerate(zip(llm.step_log, executed)):
        assert logged.prefills == [p[:4] for p in plan["prefills"]], f"step {step}"
        assert logged.decodes == [d[1] for d in plan["decodes"]], f"step {step}"
        assert logged.preempted == plan["preempted"], f"step {step}"
        assert logged.blocks_to_swap_out == plan["blocks_to_swap_out"], f"step {step}"
        assert logged.blocks_to_swap_in == plan["blocks_to_swap_in"], f"step {step}"
        assert logged.blocks_to_copy == plan["blocks_to_copy"], f"step {step}"
        assert logged.num_free_blocks == plan["num_free_blocks"], f"step {step}"
        assert sorted(logged.finished_request_ids) == plan["finished"], f"step {step}"


def decisions(records: list[dict]) -> list[dict]:
    """Drop idle polls: an empty plan that preempts nothing decides nothing (the simulator's loop asks once more
    after the last request finishes, then goes idle; the engine stops asking when nothing is unfinished)."""
    return [r for r in records if not r["empty"] or r["preempted"]]


def assert_same_decisions(sim: list[dict], engine: list[dict]) -> None:
    sim, engine = decisions(sim), decisions(engine)
    assert len(sim) == len(engine), f"expected {len(sim)} scheduler steps (simulator), found {len(engine)} (engine)"
    for step, (s, e) in enumerate(zip(sim, engine)):
        assert s == e, f"step {step}: simulator {s} != engine {e}"


@pytest.fixture(scope="module")
def tiny():
    return random_model(seed=0)


CASES = [("paged", "recompute", 1), ("paged", "swap", 1), ("paged", "recompute", 2), ("paged", "swap", 2),
         ("max", "recompute", 1), ("pow2", "recompute", 1), ("oracle", "recompute", 1)]


@pytest.mark.parametrize(("policy", "preemption", "n"), CASES)
def test_engine_and_simulator_decide_alike(tiny, policy, preemption, n):
    """n = 2: parallel samples share prompt blocks, so copy-on-write copies must agree too."""
    trace = offline_trace(n=n)
    sim = simulate(trace, policy, preemption)
    engine, llm = serve(tiny, trace, policy, preemption)
    assert_same_decisions(sim, engine)
    check_step_log(llm, engine)
    # the run really exercised what it claims: several prefill steps, and memory pressure
    assert sum(1 for r in sim if r["prefills"]) > 1
    if policy == "paged":
        assert llm.stats.num_preemptions > 0, "expected the small pool to force preemption"
        swapped = sum(len(r["blocks_to_swap_out"]) for r in sim)
        assert (swapped > 0) == (preemption == "swap")
        copied = sum(len(r["blocks_to_copy"]) for r in sim)
        assert (copied > 0) == (n > 1)
    else:
        # contiguous reservations are made whole at admission: never a preemption
        assert llm.stats.num_preemptions == 0
    if policy == "max":  # each sequence reserves MAX_MODEL_LEN tokens, whatever its length
        assert llm.stats.max_concurrent_requests == NUM_GPU_BLOCKS // (MAX_MODEL_LEN // BLOCK_SIZE)
    # every request ran to exactly its planned length
    assert llm.stats.num_finished_requests == len(trace)
    assert llm.stats.finish_reasons == {"length": sum(r.num_seqs for r in trace)}


def test_real_model_decides_alike():
    """The same with SmolLM2 itself (6 requests, to stay quick): the weights change the tokens, not the plans."""
    model, tokenizer, _ = load_model("smollm2")
    trace = offline_trace(6, seed=3)
    sim = simulate(trace, "paged", "recompute")
    engine, llm = serve(model, trace, "paged", "recompute", tokenizer)
    assert_same_decisions(sim, engine)
    check_step_log(llm, engine)
