"""The central claim (docs/ARCHITECTURE.md): the simulator is the engine with a simulated clock.

Given the same trace and the same block budget, the simulator's executor (sim.clock.loop.Simulator, which decides
outcomes from the trace's true lengths) and the reference engine (reference.LLM, which runs a model and
samples tokens) make the same allocation and preemption decisions, step for step: the same sequences compute
the same prompt chunks and decode, with the same block tables, the same requests are preempted, the same
blocks move (swap, copy), and the same number of blocks is free after every step.

How the decisions are observed: the calls that change the scheduler are wrapped (an instance attribute over the
method, the same wrapper on each side) to record every one: the requests added (`add_request`), every plan handed
out (empty ones included) with the free blocks after the executor reports back (the engine's `schedule` and
`finish_step`; the simulator's loop's own `schedule` and `finish_step`, which go through its decode epochs), and
every fast-forwarded run of k plain decode steps as the k plans stepping would have made (the fast plane's
`sim.fast.runs.advance`, `DecodeEpochs.advance` and `DecodeEpochs.preempt`: a decode epoch's step that preempts
gives its victims in that step's plan). The wrappers only record: every call goes through untouched.

Arrivals may be staggered: the simulator adds a request when its arrival time comes, between steps. The engine
then replays the simulator's calls in the same order: it adds each request right where the simulator added it,
and runs one step per simulated step. The simulator runs with its fast-forward ON (decode epochs where the pool is
paged, else run by run): a run of k steps that the simulator applied at once must equal k steps of the engine.

Speculative decoding runs the engine first and hands its draft proposals and acceptances to the simulator (the
run depends on the model there); the CPU offload tier is compared copy by copy.

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
from sim.base.request import Request
from sim.clock.cost import RooflineCostModel
from sim.fast import runs as fast_runs
from sim.fast.epoch import EpochStep
from sim.fast.loop import FastSimulator
from sim.kv import allocates_blocks_on_demand, make_kv_manager
from sim.scheduling.scheduler import Scheduler, SchedulerConfig

BLOCK_SIZE = 4
NUM_GPU_BLOCKS = 32  # 128 token slots for 12 requests of up to 59 tokens each: paged must preempt
NUM_CPU_BLOCKS = 64  # swap space: room for every swapped group
MAX_NUM_SEQS = 8
BUDGET = {"v0": 64, "v1": 16}  # v0: < the sum of prompts (several prefill steps); v1: prompts of 5-40 chunk
MAX_MODEL_LEN = 64  # the `max` policy reserves this: 16 blocks, so 2 requests at a time in the pool


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One torch thread: on a 2-core machine small ops run faster without OpenMP hand-offs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def trace(num_requests: int = 12, seed: int = 7, n: int = 1, gap: float = 0.0) -> list[Request]:
    """Requests arriving `gap` seconds apart (0: all at t = 0): prompts 5-40 tokens, outputs 3-20 tokens,
    seeded token ids; every third request samples `n` sequences that share its prompt."""
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(num_requests):
        prompt_len, output_len = int(rng.integers(5, 41)), int(rng.integers(3, 21))
        ids = rng.integers(17, 256, size=prompt_len).tolist()  # tiny vocabulary (256), no SmolLM2 special ids
        requests.append(Request(i, i * gap, prompt_len, output_len, n=n if i % 3 == 0 else 1, prompt_token_ids=ids))
    return requests


def entry(e) -> tuple:
    return (e.request_id, e.seq_id, e.num_computed_tokens, e.num_new_tokens, list(e.block_table), e.sample)


def record_calls(scheduler: Scheduler, simulator: FastSimulator | None = None) -> list[tuple]:
    """Record every call that changes `scheduler` (see the module docstring): ("add", request_id) and ("step", record)
    items, a fast-forwarded run giving one ("step", record) per step. `simulator`: the loop that drives it (its own
    schedule / finish_step and its fast plane are recorded; run it with `run_recorded`), else the engine's calls."""
    calls: list[tuple] = []
    target = scheduler if simulator is None else simulator
    add_request, schedule, finish_step = scheduler.add_request, target.schedule, target.finish_step
    current: list[dict] = []  # the record of the plan in flight (arrivals may be recorded while it runs)
    preempted: list[int] = []  # requests an epoch preempted for its next step (the next run's only step)
    kv = scheduler.kv

    def recording_add_request(request):
        add_request(request)
        calls.append(("add", request.request_id))

    def recording_schedule():
        plan = schedule()
        decodes = [entry(e) for e in plan.decodes]
        if isinstance(plan, EpochStep):  # a v1 step whose decodes a decode epoch took: its members, in plan order
            listed, epochs = set(plan.request_ids()), simulator.epochs
            decodes = [
                (rid, sid, epochs.num_computed_tokens(sid), 1, kv.block_table(sid), True)
                for rid in scheduler.running_request_ids()
                if rid not in listed
                for sid in scheduler.seq_ids(rid)
            ] + decodes
        calls.append(
            (
                "step",
                {
                    "prefills": [entry(e) for e in plan.prefills],
                    "decodes": decodes,
                    "preempted": list(plan.preempted),
                    "blocks_to_swap_out": list(plan.blocks_to_swap_out),
                    "blocks_to_swap_in": list(plan.blocks_to_swap_in),
                    "blocks_to_copy": list(plan.blocks_to_copy),
                    "empty": plan.is_empty,
                },
            )
        )
        current[:] = [calls[-1][1]]
        return plan

    def recording_finish_step(plan, outcome):
        result = finish_step(plan, outcome)
        current[0]["num_free_blocks"] = kv.num_free_blocks
        current[0]["finished"] = sorted(result.finished_request_ids)
        return result

    def capturing_tables(body, before):
        """Run `body()` (a run); the tables of `before`'s sequences at its end, read before its finishes free them."""
        tables, finish_sampled = {}, scheduler.finish_sampled

        def capture(groups):
            groups = list(groups)
            tables.update({s.seq_id: kv.block_table(s.seq_id) for g in groups for s in g.live})
            return finish_sampled(groups)

        scheduler.finish_sampled = capture
        try:
            counts, finished = body()
        finally:
            del scheduler.finish_sampled  # the class's method again
        for _, sid, _ in before:
            if sid not in tables:
                tables[sid] = kv.block_table(sid)
        return record_run(before, tables, counts, finished)

    def recording_advance(sched, decodes, num_steps, allowed=None):
        before = [(s.request_id, s.seq_id, s.num_computed_tokens) for s in decodes.seqs]
        return capturing_tables(lambda: advance(sched, decodes, num_steps, allowed), before)

    def recording_epoch_advance(max_steps):
        # a decode epoch's run (paged): every running group is a member when one is asked (run_shape joined the
        # admitted ones first); their counts through the epoch (the scheduler holds those at their joining)
        before = [
            (rid, sid, epochs.num_computed_tokens(sid))
            for rid in scheduler.running_request_ids()
            for sid in scheduler.seq_ids(rid)
        ]
        return capturing_tables(lambda: epoch_advance(max_steps), before)

    def recording_epoch_preempt():
        # a step of an epoch that preempts: recorded with the run of that one step, or alone (an empty plan, as
        # stepping makes) if no member is left to step
        result = epoch_preempt()
        if result and epochs.is_open:
            preempted[:] = result
        elif result:
            calls.append(
                (
                    "step",
                    {
                        "prefills": [],
                        "decodes": [],
                        "preempted": list(result),
                        "blocks_to_swap_out": [],
                        "blocks_to_swap_in": [],
                        "blocks_to_copy": [],
                        "empty": True,
                        "num_free_blocks": kv.num_free_blocks,
                        "finished": [],
                    },
                )
            )
        return result

    def record_run(before, tables, counts, finished):
        """A run of k plain decode steps as the k step records stepping would have made."""
        bs = kv.block_size
        for j, step_counts in enumerate(counts):
            last = j == len(counts) - 1
            decodes = [(rid, sid, n + j, 1, tables[sid][: -(-(n + j + 1) // bs)], True) for rid, sid, n in before]
            victims, preempted[:] = list(preempted), []
            calls.append(
                (
                    "step",
                    {
                        "prefills": [],
                        "decodes": decodes,
                        "preempted": victims,
                        "blocks_to_swap_out": [],
                        "blocks_to_swap_in": [],
                        "blocks_to_copy": [],
                        "empty": False,
                        "run": True,
                        "num_free_blocks": kv.num_free_blocks if last else step_counts[4] // bs,
                        "finished": sorted(finished) if last else [],
                    },
                )
            )
        return counts, finished

    scheduler.add_request = recording_add_request
    target.schedule, target.finish_step = recording_schedule, recording_finish_step
    if simulator is not None:
        advance = fast_runs.advance
        simulator.recording_advance = recording_advance  # (run_recorded puts it in the fast plane's place)
        epochs = simulator.epochs
        if epochs is not None:
            epoch_advance, epoch_preempt = epochs.advance, epochs.preempt
            epochs.advance, epochs.preempt = recording_epoch_advance, recording_epoch_preempt
    return calls


def run_recorded(simulator: FastSimulator) -> None:
    """Run a simulator whose calls record_calls records: its runs of plain decode steps through the recorder too."""
    real = fast_runs.advance
    fast_runs.advance = simulator.recording_advance
    try:
        simulator.run()
    finally:
        fast_runs.advance = real


def config(mode: str, preemption: str, scheduling_policy: str = "fcfs") -> dict:
    return dict(
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=BUDGET[mode],
        mode=mode,
        preemption=preemption,
        scheduling_policy=scheduling_policy,
    )


def simulate(
    requests: list[Request], policy: str, preemption: str, mode: str, model=None, scheduling_policy: str = "fcfs"
) -> list[tuple]:
    """The simulator's executor, fast-forward on, over the same scheduler configuration as the engine below.
    `model`: the sim.base.specs.ModelSpec a policy that groups layers needs (hybrid)."""
    kv = make_kv_manager(
        policy,
        NUM_GPU_BLOCKS * BLOCK_SIZE,
        block_size=BLOCK_SIZE,
        max_seq_len=MAX_MODEL_LEN,
        num_cpu_blocks=NUM_CPU_BLOCKS if preemption == "swap" else 0,
        model=model,
    )
    scheduler = Scheduler(kv, SchedulerConfig(**config(mode, preemption, scheduling_policy)))
    # The cost model only moves the clock (and so decides where staggered arrivals fall between steps).
    # Paged runs go through decode epochs (DecodeEpochs.advance), the others run by run (sim.fast.runs.advance).
    simulator = FastSimulator(scheduler, RooflineCostModel("opt-13b", "a100-40gb"), requests, block_bytes=1)
    calls = record_calls(scheduler, simulator)
    run_recorded(simulator)
    return calls


def serve(
    model,
    requests: list[Request],
    sim_calls: list[tuple],
    policy: str,
    preemption: str,
    mode: str,
    tokenizer=None,
    scheduling_policy: str = "fcfs",
) -> tuple[list[tuple], LLM]:
    """The engine replays the simulator's calls: token ids in, max_tokens = the true output length, EOS ignored."""
    cfg = config(mode, preemption)
    llm = LLM.from_loaded(
        model,
        tokenizer,
        policy=policy,
        block_size=BLOCK_SIZE,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        num_cpu_blocks=NUM_CPU_BLOCKS if preemption == "swap" else 0,
        preemption=preemption,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        scheduler=mode,
        max_model_len=MAX_MODEL_LEN,
        scheduling_policy=scheduling_policy,
    )
    calls = record_calls(llm.scheduler)
    by_id = {r.request_id: r for r in requests}
    for kind, what in sim_calls:
        if kind == "add":
            r = by_id[what]
            params = SamplingParams(temperature=0.0, max_tokens=r.output_len, n=r.n, ignore_eos=True)
            public = llm.add_request(
                r.prompt_token_ids, params, request_id=r.request_id, priority=r.priority
            )  # an int id: str() of it
            # the scheduler numbers requests in the order they come, as the simulator's arrivals are numbered
            assert public == str(r.request_id) and llm.scheduler_request_id(public) == r.request_id
        else:
            llm.step()
    while llm.has_unfinished_requests():  # nothing should be left: then this adds steps that fail the comparison
        llm.step()
    return calls, llm


def steps(calls: list[tuple]) -> list[dict]:
    """The step records without idle polls: an empty plan that preempts nothing decides nothing (the simulator
    asks once more after the last request finishes, then goes idle; the engine's idle steps do the same)."""
    return [
        {k: v for k, v in r.items() if k != "run"}
        for kind, r in calls
        if kind == "step" and (not r["empty"] or r["preempted"])
    ]


def assert_same_decisions(sim: list[tuple], engine: list[tuple]) -> None:
    assert [c for c in sim if c[0] == "add"] == [c for c in engine if c[0] == "add"]
    sim_steps, engine_steps = steps(sim), steps(engine)
    assert len(sim_steps) == len(engine_steps), (
        f"expected {len(sim_steps)} scheduler steps (simulator), found {len(engine_steps)} (engine)"
    )
    for step, (s, e) in enumerate(zip(sim_steps, engine_steps)):
        assert s == e, f"step {step}: simulator {s} != engine {e}"


def check_step_log(llm: LLM, calls: list[tuple]) -> None:
    """The engine's own log says what the recorded plans say (it logs executed, i.e. non-empty, plans)."""
    executed = [r for kind, r in calls if kind == "step" and not r["empty"]]
    assert len(llm.step_log) == len(executed)
    for step, (logged, plan) in enumerate(zip(llm.step_log, executed)):
        assert logged.prefills == [p[:4] for p in plan["prefills"]], f"step {step}"
        assert logged.decodes == [d[1] for d in plan["decodes"]], f"step {step}"
        assert logged.preempted == plan["preempted"], f"step {step}"
        assert logged.blocks_to_copy == plan["blocks_to_copy"], f"step {step}"
        assert logged.num_free_blocks == plan["num_free_blocks"], f"step {step}"
        assert sorted(logged.finished_request_ids) == plan["finished"], f"step {step}"


def preempted_while_chunking(calls: list[tuple]) -> int:
    """How often a request was preempted right after a step that fed it a prompt chunk without sampling."""
    last_chunk: dict[int, bool] = {}
    count = 0
    for kind, r in calls:
        if kind != "step":
            continue
        count += sum(last_chunk.get(rid, False) for rid in r["preempted"])
        for e in r["prefills"] + r["decodes"]:
            last_chunk[e[0]] = not e[5]
    return count


@pytest.fixture(scope="module")
def tiny():
    return random_model(seed=0)


CASES = {  # (mode, policy, preemption, n, seconds between arrivals)
    "v0-paged-recompute": ("v0", "paged", "recompute", 1, 0.0),
    "v0-paged-swap": ("v0", "paged", "swap", 1, 0.0),
    "v0-paged-recompute-n2": ("v0", "paged", "recompute", 2, 0.0),
    "v0-paged-swap-n2": ("v0", "paged", "swap", 2, 0.0),
    "v0-max": ("v0", "max", "recompute", 1, 0.0),
    "v0-pow2-staggered": ("v0", "pow2", "recompute", 1, 0.05),
    "v0-oracle-n2": ("v0", "oracle", "recompute", 2, 0.0),
    "v1-paged-recompute": ("v1", "paged", "recompute", 1, 0.0),
    "v1-paged-recompute-staggered": ("v1", "paged", "recompute", 1, 0.05),
    "v1-paged-swap-staggered": ("v1", "paged", "swap", 1, 0.03),
    "v1-paged-recompute-n2-staggered": ("v1", "paged", "recompute", 2, 0.05),
    "v1-oracle-n2-staggered": ("v1", "oracle", "recompute", 2, 0.05),
    "v1-radix-staggered": ("v1", "radix", "recompute", 1, 0.05),
    "v1-radix-n2": ("v1", "radix", "recompute", 2, 0.0),
    "v1-vattention-staggered": ("v1", "vattention", "recompute", 1, 0.05),
    "v0-vattention-n2": ("v0", "vattention", "recompute", 2, 0.0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_and_simulator_decide_alike(tiny, case):
    mode, policy, preemption, n, gap = CASES[case]
    requests = trace(n=n, gap=gap)
    sim = simulate(requests, policy, preemption, mode)
    engine, llm = serve(tiny, requests, sim, policy, preemption, mode)
    assert_same_decisions(sim, engine)
    check_step_log(llm, engine)
    # the run really exercised what it claims
    sim_steps = steps(sim)
    assert any(r.get("run") for kind, r in sim if kind == "step"), "expected the fast-forward to jump somewhere"
    if mode == "v1":
        assert any(not e[5] for r in sim_steps for e in r["prefills"]), "expected prompts served in chunks"
        assert any(r["prefills"] and r["decodes"] for r in sim_steps), "expected steps mixing chunks and decodes"
    else:
        assert not any(r["prefills"] and r["decodes"] for r in sim_steps), "v0 steps are prefill-only or decode-only"
    if gap:
        adds = [i for i, (kind, _) in enumerate(sim) if kind == "add"]
        assert adds[-1] > adds[0] + 1, "expected arrivals spread between steps"
    if allocates_blocks_on_demand(policy):
        assert llm.stats.num_preemptions > 0, "expected the small pool to force preemption"
        swapped = sum(len(r["blocks_to_swap_out"]) for r in sim_steps)
        assert (swapped > 0) == (preemption == "swap")
        copied = sum(len(r["blocks_to_copy"]) for r in sim_steps)
        assert (copied > 0) == (n > 1)
    else:  # contiguous reservations are made whole at admission: never a preemption
        assert llm.stats.num_preemptions == 0
        if n > 1:  # siblings are forked into their own runs: the prompt's blocks are copied
            assert sum(len(r["blocks_to_copy"]) for r in sim_steps) > 0
    if policy == "max":  # each sequence reserves MAX_MODEL_LEN tokens, whatever its length
        assert llm.stats.max_concurrent_requests == NUM_GPU_BLOCKS // (MAX_MODEL_LEN // BLOCK_SIZE)
    # every request ran to exactly its planned length
    assert llm.stats.num_finished_requests == len(requests)
    assert llm.stats.finish_reasons == {"length": sum(r.num_seqs for r in requests)}


@pytest.mark.parametrize("mode", ["v0", "v1"])
def test_priority_scheduling_decides_alike(tiny, mode):
    """LLM(scheduling_policy="priority") with add_request(priority=...) and the simulator under the same policy make
    the same decisions step for step; and the priorities matter: FCFS on the same trace decides otherwise."""
    requests = trace(gap=0.02)
    for r in requests:
        r.priority = 0 if r.request_id % 3 == 2 else 1  # a third in the better class, arriving among the others
    sim = simulate(requests, "paged", "recompute", mode, scheduling_policy="priority")
    engine, llm = serve(tiny, requests, sim, "paged", "recompute", mode, scheduling_policy="priority")
    assert_same_decisions(sim, engine)
    check_step_log(llm, engine)
    assert llm.stats.num_preemptions > 0 and llm.stats.num_finished_requests == len(requests)
    assert steps(simulate(requests, "paged", "recompute", mode)) != steps(sim)


class ReplayedAcceptance:
    """The simulator's acceptance model replaying the engine's: the accepted drafts of each verify entry, in plan order
    (the same order on both sides while their plans agree)."""

    def __init__(self, counts: list[tuple[int, int]]) -> None:
        self.counts = list(counts)  # (drafts, accepted) per verify entry

    def accepted(self, num_drafts: int) -> int:
        drafts, accepted = self.counts.pop(0)
        assert drafts == num_drafts, f"the simulator verifies {num_drafts} drafts where the engine verified {drafts}"
        return accepted


@pytest.mark.parametrize("mode", ["v0", "v1"])
def test_speculative_decoding_decides_alike(tiny, mode):
    """Speculative decoding (k = 3) with the engine's n-gram draft, and the simulator given the engine's proposals and
    acceptances (its draft_len hook and acceptance model replay them): the same verify entries (lookahead blocks in the
    tables), rollbacks, preemptions and free blocks, step for step. The engine runs first here: its drafts and what
    the model accepts decide the run. The prompts repeat a short motif, so that the lookup finds drafts."""
    k, rng = 3, np.random.default_rng(11)
    requests = []
    for i in range(10):
        motif = rng.integers(17, 256, size=int(rng.integers(2, 5))).tolist()
        ids = (motif * 20)[: int(rng.integers(8, 36))]
        requests.append(Request(i, 0.0, len(ids), int(rng.integers(6, 24)), prompt_token_ids=ids))
    cfg = config(mode, "recompute")
    llm = LLM.from_loaded(
        tiny,
        block_size=BLOCK_SIZE,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        scheduler=mode,
        max_model_len=MAX_MODEL_LEN,
        num_speculative_tokens=k,
    )
    engine = record_calls(llm.scheduler)
    offered, verified = (
        {},
        [],
    )  # (seq id, computed tokens) -> drafts the engine had; (drafts, accepted) per verify entry
    sched, finish_step = llm.scheduler, llm.scheduler.finish_step
    # NOTE: the engine's answers to the scheduler's draft_len question, recorded where the scheduler keeps the hook (an
    # offer counts even where the entry is then preempted instead: it needed the drafts' block)
    ask = sched._draft_len

    def recording_draft_len(request_id, seq_id):
        offered[seq_id, sched.num_computed_tokens(seq_id)] = answer = ask(request_id, seq_id)
        return answer

    def recording_finish_step(plan, outcome):
        verified.extend(
            (e.num_draft_tokens, outcome.num_accepted[e.seq_id]) for e in plan.entries if e.num_draft_tokens
        )
        return finish_step(plan, outcome)

    sched._draft_len, sched.finish_step = recording_draft_len, recording_finish_step
    for r in requests:
        llm.add_request(
            r.prompt_token_ids,
            SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True),
            request_id=r.request_id,
        )
    while llm.has_unfinished_requests():
        llm.step()
    kv = make_kv_manager("paged", NUM_GPU_BLOCKS * BLOCK_SIZE, block_size=BLOCK_SIZE, max_seq_len=MAX_MODEL_LEN)
    scheduler = Scheduler(
        kv,
        SchedulerConfig(**cfg, num_speculative_tokens=k),
        draft_len=lambda rid, sid: offered.get((sid, scheduler.num_computed_tokens(sid)), 0),
    )
    simulator = FastSimulator(
        scheduler,
        RooflineCostModel("opt-13b", "a100-40gb"),
        requests,
        block_bytes=1,
        acceptance=ReplayedAcceptance(verified),
    )
    sim = record_calls(scheduler, simulator)
    run_recorded(simulator)
    assert_same_decisions(sim, engine)
    check_step_log(llm, engine)
    assert len(verified) > 20 and sum(a for _, a in verified) > 0, "expected verify steps that keep some drafts"
    assert llm.stats.num_preemptions > 0 and llm.stats.num_finished_requests == len(requests)


@pytest.mark.parametrize("mode", ["v0", "v1"])
def test_the_cpu_offload_tier_decides_alike(tiny, mode):
    """Prefix caching with a CPU offload tier (sim/kv/offload.py in both): requests on three shared documents arrive
    over time in a pool too small to keep the documents cached, so cached blocks are evicted to the tier and reloaded
    from it. The simulator and the engine make the same decisions (prefix hits in num_computed_tokens, tables,
    preemptions, free blocks) and the same tier copies, in the same order."""
    rng = np.random.default_rng(5)
    docs = [rng.integers(17, 256, size=24).tolist() for _ in range(3)]
    requests = []
    for i in range(15):
        ids = docs[int(rng.integers(0, 3))] + rng.integers(17, 256, size=int(rng.integers(2, 12))).tolist()
        requests.append(Request(i, i * 0.03, len(ids), int(rng.integers(3, 12)), prompt_token_ids=ids))
    tiers = {}
    kv = make_kv_manager(
        "paged",
        NUM_GPU_BLOCKS * BLOCK_SIZE,
        block_size=BLOCK_SIZE,
        max_seq_len=MAX_MODEL_LEN,
        enable_prefix_caching=True,
        num_offload_blocks=32,
    )
    scheduler = Scheduler(kv, SchedulerConfig(**config(mode, "recompute")))
    simulator = FastSimulator(scheduler, RooflineCostModel("opt-13b", "a100-40gb"), requests, block_bytes=1)
    sim = record_calls(scheduler, simulator)
    tiers["sim"] = record_tier_copies(kv)
    run_recorded(simulator)
    # NOTE: the simulator takes the copies when it prices a step: offloads made by a last run of decode steps (their
    # new blocks evicting cached ones) are still in the manager's log when the run ends; the engine takes every step's
    kv.take_tier_copies()  # (recorded by the wrapper)
    cfg = config(mode, "recompute")
    llm = LLM.from_loaded(
        tiny,
        block_size=BLOCK_SIZE,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        scheduler=mode,
        max_model_len=MAX_MODEL_LEN,
        enable_prefix_caching=True,
        num_offload_blocks=32,
    )
    engine = record_calls(llm.scheduler)
    tiers["engine"] = record_tier_copies(llm.executor, "tier_copies")  # (the executor takes them once a step)
    by_id = {r.request_id: r for r in requests}
    for kind, what in sim:
        if kind == "add":
            r = by_id[what]
            llm.add_request(
                r.prompt_token_ids,
                SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True),
                request_id=r.request_id,
            )
        else:
            llm.step()
    while llm.has_unfinished_requests():
        llm.step()
    assert_same_decisions(sim, engine)
    assert tiers["sim"] == tiers["engine"]
    stats = llm.kv_manager.prefix_cache_stats()
    assert stats.offloaded_blocks > 0 and stats.cpu_hit_blocks > 0, "expected evictions to the tier and hits in it"
    assert stats == kv.prefix_cache_stats()


def record_tier_copies(owner, name: str = "take_tier_copies") -> list:
    """Every tier copy the KV manager hands its executor, in order, through `owner.name` (the wrapper only records)."""
    copies, take = [], getattr(owner, name)

    def recording_take():
        taken = take()
        copies.extend(taken)
        return taken

    setattr(owner, name, recording_take)
    return copies


def test_a_priority_is_refused_without_priority_scheduling(tiny):
    llm = LLM.from_loaded(tiny, block_size=BLOCK_SIZE, num_gpu_blocks=NUM_GPU_BLOCKS, max_model_len=MAX_MODEL_LEN)
    with pytest.raises(ValueError, match="the prompt's priority: got 1, but priority scheduling is not enabled"):
        llm.add_request([20, 21, 22], SamplingParams(max_tokens=2), priority=1)
    with pytest.raises(ValueError, match=r"priority: got 1 priorities for 2 prompts"):
        llm.generate([[20, 21], [22, 23]], SamplingParams(max_tokens=2), priority=[0])
    with pytest.raises(ValueError, match=r"scheduling_policy: got 'lifo' \(allowed: fcfs, priority\)"):
        LLM.from_loaded(tiny, scheduling_policy="lifo")
    assert not llm.has_unfinished_requests()
    ranked = LLM.from_loaded(
        tiny,
        block_size=BLOCK_SIZE,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        max_model_len=MAX_MODEL_LEN,
        scheduling_policy="priority",
        max_num_seqs=1,
    )
    outs = ranked.generate(
        [[20, 21], [22, 23], [24, 25]], SamplingParams(max_tokens=3, ignore_eos=True), priority=[2, 1, 0]
    )
    finished = sorted(outs, key=lambda o: o.metrics.finished_time)
    assert [o.request_id for o in finished] == ["2", "1", "0"]  # one at a time, the best class first


@pytest.mark.parametrize("n, gap", [(1, 0.0), (2, 0.05)])
def test_a_hybrid_model_decides_alike(n, gap):
    """A tiny Gemma 3 (every third layer full, the others sliding over 8 tokens) under the hybrid KV manager: the
    simulator with the model's spec and the engine with the model's real KV cache groups decide alike, and the run
    frees sliding-window blocks, preempts and forks on the way."""
    from reference.engine.kv_groups import model_spec
    from reference.models.loader import TINY_GEMMA3_CONFIG

    gemma = random_model(TINY_GEMMA3_CONFIG, seed=0)
    requests = trace(n=n, gap=gap)
    sim = simulate(requests, "hybrid", "recompute", "v1", model=model_spec(TINY_GEMMA3_CONFIG, torch.float32))
    engine, llm = serve(gemma, requests, sim, "hybrid", "recompute", "v1")
    assert_same_decisions(sim, engine)
    check_step_log(llm, engine)
    assert llm.kv_cache.layout.num_groups == 3 and llm.stats.num_preemptions > 0
    assert llm.stats.num_finished_requests == len(requests)
    if n > 1:
        assert any(r["blocks_to_copy"] for r in steps(sim)), "expected forked siblings to copy a shared block"


def test_preemption_while_chunking_is_covered(tiny):
    """The staggered v1 recompute case preempts a request in the middle of its prompt chunks (and both sides
    agree on it, by the test above)."""
    mode, policy, preemption, n, gap = CASES["v1-paged-recompute-staggered"]
    assert preempted_while_chunking(simulate(trace(n=n, gap=gap), policy, preemption, mode)) > 0


def test_real_model_decides_alike():
    """The same with SmolLM2 itself (6 requests, staggered, chunked, to stay quick): the weights change the
    tokens, not the plans."""
    model, tokenizer, _ = load_model("smollm2")
    requests = trace(6, seed=3, gap=0.05)
    sim = simulate(requests, "paged", "recompute", "v1")
    engine, llm = serve(model, requests, sim, "paged", "recompute", "v1", tokenizer)
    assert_same_decisions(sim, engine)
    check_step_log(llm, engine)
