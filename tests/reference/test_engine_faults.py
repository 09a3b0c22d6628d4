"""A failed step never wedges the engine (tiny random Llama, milliseconds a run).

Faults are injected, not mocked: the executor, the sampler or the KV manager raises once, at a chosen call, an
exception or KeyboardInterrupt (Ctrl-C in a notebook), before or after the real work. After it:
- the requests the failed step touched are aborted (their blocks back in the pool), the others stay queued and
  finish with exactly the tokens of a run without the fault;
- generate() / beam_search() abort everything they queued and re-raise;
- the pool is entirely free once nothing is queued, and the next call gives what a fresh engine gives.
"""

from __future__ import annotations

import pytest

from reference import LLM, BeamSearchParams, SamplingParams
from reference.models import random_model

PROMPTS = [[(7 * i + j) % 200 + 17 for j in range(5 + 3 * i)] for i in range(6)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
BEAMS = BeamSearchParams(beam_width=2, max_tokens=8, ignore_eos=True)


class Fault(Exception):
    """The injected failure (a bug in the executor or the sampler)."""


@pytest.fixture(scope="module")
def tiny():
    """Untied embeddings: the tied tiny model mostly repeats the prompt's last token, whatever the K/V says."""
    return random_model(seed=5, tie_word_embeddings=False)


def engine(tiny, **kwargs) -> LLM:
    """K/V memory starts as NaN: a step that reads a slot nothing wrote (a copy or swap that never happened, a
    prefix-cache hit never computed) poisons that request's logits, and its tokens differ."""
    kwargs.setdefault("num_gpu_blocks", 24)
    llm = LLM.from_loaded(tiny, block_size=4, max_model_len=64, **kwargs)
    cache = llm.kv_cache
    for tensor in cache.key_caches + cache.value_caches + cache.cpu_key_caches + cache.cpu_value_caches:
        tensor.fill_(float("nan"))
    return llm


def params_of(i: int):
    """Greedy, beam search (forks, copies) and seeded n = 2 sampling (shared prompt blocks, copy-on-write)."""
    if i % 3 == 1:
        return BEAMS
    if i % 3 == 2:
        return SamplingParams(temperature=0.8, n=2, seed=i, max_tokens=10, ignore_eos=True)
    return GREEDY


def assert_pool_empty(llm: LLM) -> None:
    kv = llm.kv_manager
    assert not llm.has_unfinished_requests() and not llm._requests
    assert kv.num_free_blocks == kv.num_blocks
    if getattr(kv, "cpu_allocator", None) is not None:
        assert kv.cpu_allocator.num_free_blocks == kv.num_cpu_blocks
    kv.check_invariants()


def fail_on_call(obj, name: str, call: int, exc: BaseException, after: bool = False, seen: list | None = None):
    """Make obj.<name> raise `exc` on its `call`-th call (0-based), before the real call or (after) once it is done.
    `seen`: a list of the plans scheduled so far; its last one (the plan in flight) is kept in faulty.plan."""
    real, count = getattr(obj, name), [0]

    def faulty(*args, **kwargs):
        count[0] += 1
        hit = count[0] - 1 == call
        if hit and seen is not None:
            faulty.plan = seen[-1]
        if hit and not after:
            raise exc
        result = real(*args, **kwargs)
        if hit:
            raise exc
        return result

    faulty.plan = None
    setattr(obj, name, faulty)
    return faulty


def serve(llm: LLM, workload: list[tuple[list[int], object]] | None = None) -> tuple[dict[int, list], list]:
    """Add every request (streaming API), step until done; a step that raises is recorded and stepping goes on.
    Returns the finished requests' token ids by the scheduler's id (as the plans name them), and the exceptions
    seen."""
    workload = workload or [(prompt, params_of(i)) for i, prompt in enumerate(PROMPTS)]
    for i, (prompt, params) in enumerate(workload):
        assert llm.scheduler_request_id(llm.add_request(prompt, params)) == i
    finished, errors = {}, []
    while llm.has_unfinished_requests():
        try:
            outs = llm.step()
        except (Fault, KeyboardInterrupt) as exc:
            errors.append(exc)
            continue
        finished.update(
            {llm.scheduler_request_id(o.request_id): [c.token_ids for c in o.outputs] for o in outs if o.finished}
        )
    return finished, errors


def record_plans(llm: LLM) -> list:
    """Every plan schedule() returns, with the requests owning a block the plan copies into (seen before the step)."""
    plans, schedule = [], llm.scheduler.schedule

    def recording():
        plan = schedule()
        written = {dst for _, dst in plan.blocks_to_copy}
        owners = {
            rid
            for rid in llm.scheduler.running_request_ids()
            for s in llm.scheduler.seq_ids(rid)
            if s in llm.kv_manager.seq_ids and written & set(llm.kv_manager.block_table(s))
        }
        plans.append((plan, owners))
        return plan

    llm.scheduler.schedule = recording
    return plans


MEMORY = {
    "paged, swap": dict(preemption="swap", num_cpu_blocks=32),
    "paged, recompute": {},
    "pow2 (fork copies)": dict(policy="pow2", num_gpu_blocks=96),
}
# Three beam searches under a 3-token budget, contiguous: in one step (the 8th) the last one gets no tokens
# while the fork copies of its beams ride in the plan. A failure then must abort it too (its copies never landed).
STARVED = (
    [
        (prompt, BeamSearchParams(beam_width=2, max_tokens=m, ignore_eos=True))
        for prompt, m in [([17], 2), ([64, 129, 156, 87, 101], 6), ([190, 136, 170, 142, 145], 7)]
    ],
    dict(policy="pow2", num_gpu_blocks=96, max_num_batched_tokens=3),
)
FAULTS = {
    "executor raises first": ("executor", "execute", Fault("boom"), False),
    "Ctrl-C after the forward pass": ("executor", "execute", KeyboardInterrupt(), True),
    "sampler raises": ("llm", "_sample", Fault("boom"), False),
}


def check_faults_at_every_step(tiny, memory: dict, fault: str, workload=None) -> list[set[int]]:
    """Inject `fault` at step 0, 1, ... of a run, each time into a fresh engine; check each run. Returns, per
    step, the requests that the failed step aborted without having a sequence in it."""
    llm = engine(tiny, **memory)
    reference, errors = serve(llm, workload)
    assert not errors
    num_requests, num_steps = len(reference), llm.stats.num_steps
    where, name, exc, after = FAULTS[fault]
    outside = []
    for k in range(num_steps):
        llm = engine(tiny, **memory)
        plans = record_plans(llm)
        faulty = fail_on_call(llm.executor if where == "executor" else llm, name, k, exc, after, plans)
        finished, errors = serve(llm, workload)
        assert errors == [exc] and llm.stats.num_failed_steps == 1
        plan, owners = faulty.plan
        aborted = set(range(num_requests)) - set(finished)
        touched = set(plan.request_ids())
        assert touched | owners <= aborted <= touched | owners | set(plan.preempted), (k, aborted, touched)
        assert llm.stats.num_aborted_requests == len(aborted)
        assert finished == {rid: reference[rid] for rid in finished}, k  # the others: as if nothing had happened
        assert_pool_empty(llm)
        outside.append(aborted - touched)
    return outside


@pytest.mark.parametrize("memory", MEMORY)
@pytest.mark.parametrize("fault", FAULTS)
def test_a_failed_step_aborts_what_it_touched_and_nothing_else(tiny, memory, fault):
    """A fault at each step in turn of a run with preemption (swap or recompute), beams, forks and copies."""
    outside = check_faults_at_every_step(tiny, MEMORY[memory], fault)
    if memory == "paged, swap":  # a step that swapped a group out: that group goes too (its copy may not be done)
        assert any(outside)


def test_a_failed_step_aborts_the_owner_of_a_copy_it_carried(tiny):
    workload, memory = STARVED
    outside = check_faults_at_every_step(tiny, memory, "executor raises first", workload)
    assert outside[7] == {2}


def greedy_tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize(
    "exc,call,after", [(KeyboardInterrupt(), 2, False), (KeyboardInterrupt(), 0, True), (Fault("boom"), 3, False)]
)
def test_generate_interrupted_or_failing_cleans_up_and_the_engine_goes_on(tiny, exc, call, after):
    fresh = greedy_tokens(engine(tiny).generate(PROMPTS, GREEDY))
    llm = engine(tiny)
    fail_on_call(llm.executor, "execute", call, exc, after)
    with pytest.raises(type(exc)):
        llm.generate(PROMPTS, GREEDY)
    assert llm.stats.num_failed_steps == 1 and llm.stats.num_aborted_requests == len(PROMPTS)
    assert_pool_empty(llm)  # every request it queued is gone, touched by the failed step or not
    assert greedy_tokens(llm.generate(PROMPTS, GREEDY)) == fresh  # no "schedule() called twice"
    assert_pool_empty(llm)


def test_beam_search_interrupted_cleans_up_and_the_engine_goes_on(tiny):
    def best(llm):
        return [out.sequences[0].tokens for out in llm.beam_search(PROMPTS[:3], BEAMS)]

    fresh = best(engine(tiny))
    llm = engine(tiny)
    fail_on_call(llm.executor, "execute", 4, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        best(llm)
    assert_pool_empty(llm)
    assert best(llm) == fresh
    assert_pool_empty(llm)


def test_an_interrupt_inside_the_scheduler_is_undone(tiny):
    """Ctrl-C while schedule() admits requests (inside the 2nd admission's allocation): the request admitted before
    it in the same plan is aborted, so is the one whose allocation was interrupted (the manager may have taken
    blocks for it), the one not reached stays queued and finishes as without the interrupt."""
    fresh = greedy_tokens(engine(tiny).generate(PROMPTS[:3], GREEDY))
    llm = engine(tiny)
    ids = [llm.add_request(p, GREEDY) for p in PROMPTS[:3]]
    real, calls = llm.kv_manager.allocate_slots, []

    def allocate_slots(seq_ids, counts, new=None):
        calls.append(new is not None)
        if calls.count(True) == 2 and calls[-1]:
            raise KeyboardInterrupt
        return real(seq_ids, counts, new)

    llm.kv_manager.allocate_slots = allocate_slots
    with pytest.raises(KeyboardInterrupt):
        llm.step()
    sids = [llm.scheduler_request_id(i) for i in ids]
    assert llm.scheduler.is_finished(sids[0]) and llm.scheduler.is_finished(sids[1])
    assert llm.scheduler.waiting_request_ids() == sids[2:]
    finals = {}
    while llm.has_unfinished_requests():
        finals.update({o.request_id: o.outputs[0].token_ids for o in llm.step() if o.finished})
    assert finals == {ids[2]: fresh[2]}
    assert_pool_empty(llm)


def test_params_that_slip_past_validation_fail_one_step_not_the_engine(tiny):
    """The issue's case, top_k=2.5 reaching the sampler (now refused by SamplingParams; forced in here as a
    stand-in for any sampler bug): that request's step fails, the requests in it are aborted, the engine goes on."""
    bad = SamplingParams(temperature=0.7, max_tokens=4)
    object.__setattr__(bad, "top_k", 2.5)  # what validation would refuse
    llm = engine(tiny, max_num_seqs=1)  # one request per step: the good one is not in the failing step
    good = llm.add_request(PROMPTS[1], GREEDY)
    llm.step()  # the good request runs alone first
    bad_id = llm.add_request(PROMPTS[0], bad)
    finals, errors = {}, []
    while llm.has_unfinished_requests():
        try:
            finals.update({o.request_id: o for o in llm.step() if o.finished})
        except TypeError as exc:  # torch.topk refuses a float k
            errors.append(exc)
    assert len(errors) == 1 and bad_id not in finals
    assert finals[good].outputs[0].token_ids == greedy_tokens(engine(tiny).generate([PROMPTS[1]], GREEDY))[0]
    assert_pool_empty(llm)
    assert llm.stats.num_aborted_requests == 1 and llm.stats.num_failed_steps == 1


def test_a_step_failing_before_the_forward_pass_leaves_no_prefix_cache_entries(tiny):
    prompt = [(3 * j + 11) % 250 for j in range(13)]  # 3 full blocks of 4, registered when scheduled
    fresh = greedy_tokens(engine(tiny, enable_prefix_caching=True).generate([prompt], GREEDY))
    llm = engine(tiny, enable_prefix_caching=True)
    fail_on_call(llm.executor, "execute", 0, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        llm.generate([prompt], GREEDY)
    assert_pool_empty(llm)
    assert greedy_tokens(llm.generate([prompt], GREEDY)) == fresh
