"""The engine over a block allocator from outside (`LLM(..., block_allocator=...)`, the capstone's plug): the tokens
are the project allocator's, greedy and sampled, with beams, and under preemption by recompute or swap, because
every read goes through the block table; the KV manager's recount holds after every step and the pool is free at
the end. (The allocators: tests/sim/test_block_allocator_plug.py's, written for the tests.)"""

from __future__ import annotations

import pytest

from reference import LLM
from reference.engine.sampling import BeamSearchParams, SamplingParams
from reference.models import random_model
from tests.sim.test_block_allocator_plug import HighestFirst, StackAllocator

PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7], [4, 4, 4, 4, 4, 4, 4], [11, 12]]


def serve(model, params, allocator=None, **settings):
    llm = LLM.from_loaded(model, block_allocator=allocator, **settings)
    ids = [llm.add_request(p, params) for p in PROMPTS]
    done, steps = {}, 0
    while llm.has_unfinished_requests():
        for out in llm.step():
            if out.finished:
                done[out.request_id] = [c.token_ids for c in out.outputs]
        llm.kv_manager.check_invariants()
        steps += 1
    assert llm.kv_manager.num_free_blocks == llm.kv_manager.num_blocks
    return [done[i] for i in ids], llm.stats


@pytest.fixture(scope="module")
def model():
    return random_model(seed=5)


@pytest.mark.parametrize("allocator", [StackAllocator, HighestFirst])
@pytest.mark.parametrize(
    "params, settings",
    [
        (SamplingParams(max_tokens=16, temperature=0), {"num_gpu_blocks": 10, "block_size": 4}),
        (SamplingParams(max_tokens=12, temperature=1.0, n=3, seed=7), {"num_gpu_blocks": 40, "block_size": 2}),
        (BeamSearchParams(beam_width=3, max_tokens=8), {"num_gpu_blocks": 48, "block_size": 2}),
        (
            SamplingParams(max_tokens=16, temperature=0),
            {"num_gpu_blocks": 10, "block_size": 4, "num_cpu_blocks": 10, "preemption": "swap"},
        ),
    ],
    ids=["greedy-preempting", "sampled-n3", "beams", "swap"],
)
def test_tokens_are_the_project_allocators(model, allocator, params, settings):
    ours, ours_stats = serve(model, params, **settings)
    theirs, theirs_stats = serve(model, params, allocator, **settings)
    assert theirs == ours
    assert theirs_stats.num_preemptions == ours_stats.num_preemptions
    assert ours_stats.num_preemptions > 0 or settings["num_gpu_blocks"] > 10  # the two tight pools do preempt


def test_a_policy_that_runs_its_own_allocator_refuses_before_loading():
    with pytest.raises(ValueError, match="policy 'radix' runs its own allocator"):
        LLM("no-such-model", policy="radix", block_allocator=StackAllocator)
