"""The engine under memory pressure, on the real SmolLM2: preemption, abort, bad input, and the policies.

The KV pool here is a few blocks, so the shared scheduler must preempt (recompute or swap) and the
contiguous policies must queue. Whatever the memory does, greedy text must not change: a block moved,
copied or recomputed wrongly would change it. At the end every block is back in the pool.
"""

from __future__ import annotations

import pytest

from reference import LLM, BeamSearchParams, SamplingParams
from reference.models import random_model

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "Paged attention stores the KV cache in",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def engine(smol, **kwargs) -> LLM:
    kwargs.setdefault("max_model_len", 128)
    return LLM.from_loaded(*smol, **kwargs)


def texts(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def unconstrained(smol):
    """Reference outputs with room for everything (block_size 4, as the constrained runs use)."""
    return texts(engine(smol, block_size=4, num_gpu_blocks=64).generate(PROMPTS, GREEDY))


def assert_pool_empty(llm: LLM) -> None:
    kv = llm.kv_manager
    assert kv.num_free_blocks == kv.num_blocks
    if getattr(kv, "cpu_allocator", None) is not None:
        assert kv.cpu_allocator.num_free_blocks == kv.num_cpu_blocks
    kv.check_invariants()


@pytest.mark.parametrize("preemption,num_cpu_blocks", [("recompute", 0), ("swap", 32)])
def test_preemption_keeps_greedy_outputs(smol, unconstrained, preemption, num_cpu_blocks):
    # Each sequence ends at ~7-10 tokens of prompt + 11 fed outputs: 5-6 blocks of 4. Four of them need
    # ~22 blocks; 14 force the latest-arrived group out while the others grow.
    llm = engine(smol, block_size=4, num_gpu_blocks=14, preemption=preemption, num_cpu_blocks=num_cpu_blocks)
    assert texts(llm.generate(PROMPTS, GREEDY)) == unconstrained
    assert llm.stats.num_preemptions > 0
    if preemption == "swap":
        assert llm.stats.num_swapped_out_blocks > 0 and llm.stats.num_swapped_in_blocks > 0
        assert any(r.blocks_to_swap_out for r in llm.step_log)
    else:  # a recomputed sequence feeds prompt + its generated tokens again, from position 0
        prompt_lens = [len(smol[1](p).input_ids) for p in PROMPTS]  # scheduler ids (step_log's) are 0, 1, 2, 3
        assert any(
            computed == 0 and new > prompt_lens[rid] for r in llm.step_log for rid, _, computed, new in r.prefills
        )
    assert_pool_empty(llm)


def test_abort_frees_blocks_while_others_run(smol, unconstrained):
    llm = engine(smol, block_size=4, num_gpu_blocks=64)
    ids = [llm.add_request(p, GREEDY) for p in PROMPTS[:3]]
    for _ in range(3):
        llm.step()
    victim = llm.scheduler.seq_ids(llm.scheduler_request_id(ids[1]))[0]
    held = len(llm.kv_manager.block_table(victim))
    free_before = llm.kv_manager.num_free_blocks
    llm.abort(ids[1])
    assert llm.kv_manager.num_free_blocks == free_before + held  # its blocks are back at once
    assert victim not in llm.kv_manager.seq_ids
    finals = {}
    while llm.has_unfinished_requests():
        finals.update({o.request_id: o for o in llm.step() if o.finished})
    assert sorted(finals) == [ids[0], ids[2]]
    assert [finals[ids[0]].outputs[0].token_ids, finals[ids[2]].outputs[0].token_ids] == [
        unconstrained[0],
        unconstrained[2],
    ]
    llm.abort(ids[1])  # aborting twice (or a finished request) does nothing
    assert_pool_empty(llm)


def test_bad_requests_are_clear_errors_and_do_not_disturb_others(smol, unconstrained, tmp_path):
    llm = engine(smol, block_size=4, num_gpu_blocks=16)
    rid = llm.add_request(PROMPTS[0], GREEDY)
    llm.step()
    with pytest.raises(ValueError, match="too long"):
        llm.add_request("word " * 200, GREEDY)  # over max_model_len = 128
    with pytest.raises(ValueError, match="blocks"):
        llm.add_request("word " * 60, SamplingParams(max_tokens=40))  # fits the context, not the 16-block pool
    with pytest.raises(ValueError, match="n must be >= 1"):
        SamplingParams(n=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="empty"):
        llm.add_request([], GREEDY)
    with pytest.raises(ValueError):  # generate() is all or nothing: the good prompt is withdrawn too
        llm.generate([PROMPTS[1], "word " * 200], GREEDY)
    assert llm.scheduler.waiting_request_ids() == []
    assert llm.scheduler.running_request_ids() == [llm.scheduler_request_id(rid)]
    while llm.has_unfinished_requests():
        outs = llm.step()
    assert outs[0].request_id == rid and outs[0].outputs[0].token_ids == unconstrained[0]
    assert_pool_empty(llm)
    with pytest.raises(ValueError, match="no-such-model"):
        LLM(str(tmp_path / "no-such-model"))
    with pytest.raises(ValueError, match="holds no block"):
        LLM.from_loaded(*smol, kv_budget_bytes=1000)
    with pytest.raises(ValueError, match="policy"):
        LLM.from_loaded(*smol, policy="buddy", num_gpu_blocks=8)


def test_every_policy_gives_the_same_text_and_paged_runs_more_at_once(smol):
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    results, concurrency = {}, {}
    for policy in ("paged", "max", "pow2", "oracle"):
        # 16 blocks of 16 = 256 slots; `max` reserves max_model_len = 128 tokens per sequence: 2 at a time.
        llm = engine(smol, policy=policy, block_size=16, num_gpu_blocks=16)
        results[policy] = texts(llm.generate(PROMPTS, params))
        concurrency[policy] = llm.stats.max_concurrent_requests
        assert_pool_empty(llm)
    assert results["max"] == results["pow2"] == results["oracle"] == results["paged"]
    assert concurrency["max"] == 2 and concurrency["paged"] == len(PROMPTS) > concurrency["max"]


def test_static_batching_gives_the_same_text(smol, unconstrained):
    llm = engine(smol, block_size=4, num_gpu_blocks=64, scheduler="static", max_num_seqs=2)
    assert texts(llm.generate(PROMPTS, GREEDY)) == unconstrained
    # request-level batching: the second pair is admitted only after the first pair has left entirely
    admitted = [r.step for r in llm.step_log if r.prefills]
    assert len(admitted) == 2 and llm.stats.max_concurrent_requests == 2


@pytest.fixture(scope="module")
def tiny():
    """A tiny random Llama (no tokenizer): cheap enough to run many memory layouts against each other."""
    return random_model(seed=5)


TINY_PROMPTS = [[5, 17, 99, 3, 42, 8, 11, 60, 7], [7, 7, 200, 31, 9], [100, 101, 102, 103, 104, 105, 106]]


def test_beams_and_samples_survive_any_memory_layout(tiny):
    """Beam search (forks, copy-on-write) and seeded n = 2 sampling give the same tokens whatever the policy
    or the pressure: contiguous forks copy whole runs, paged ones share; tight pools preempt by recompute,
    which re-admits every sequence of a group alone, or by swap, which keeps the sharing."""
    beams = BeamSearchParams(beam_width=3, max_tokens=8, ignore_eos=True)
    samples = SamplingParams(n=2, temperature=1.0, max_tokens=10, seed=3, ignore_eos=True)

    def run(**kwargs):
        llm = LLM.from_loaded(tiny, block_size=4, max_model_len=64, **kwargs)
        best = [out.sequences[0].tokens for out in llm.beam_search(TINY_PROMPTS, beams)]
        drawn = [[c.token_ids for c in out.outputs] for out in llm.generate(TINY_PROMPTS, samples)]
        assert_pool_empty(llm)
        return best, drawn, llm.stats

    expected, expected_draws, _ = run(num_gpu_blocks=64)
    for kwargs in (
        dict(policy="oracle", num_gpu_blocks=64),
        dict(policy="max", num_gpu_blocks=64),
        dict(num_gpu_blocks=14),
        dict(num_gpu_blocks=14, preemption="swap", num_cpu_blocks=32),
    ):
        best, drawn, stats = run(**kwargs)
        assert (best, drawn) == (expected, expected_draws), kwargs
        if kwargs["num_gpu_blocks"] == 14:
            assert stats.num_preemptions > 0, kwargs
