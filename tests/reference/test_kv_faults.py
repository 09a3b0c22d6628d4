"""A fault at every KV call never wedges the engine, leaks a block or changes an untouched request's tokens.

reference/validation/fault_injection.py repeats a run of a tiny engine once per point: each call the scheduler makes into
the KV manager (raised before the call, or just after it returned) and each call the manager makes into its own
parts (raised before it), with an exception or KeyboardInterrupt. Here: every point of the paged configuration
with swap (n > 1, beams, preemption), and a seeded sample of the points of every other configuration the engine
runs (prefix caching, a chunked budget, contiguous, vAttention, radix, hybrid). `make kv-faults` runs every point
of all of them.
"""

from __future__ import annotations

import os
import random
import signal
import threading

import pytest

from reference import LLM, SamplingParams
from reference.models import random_model
from reference.validation import fault_injection as fi

EXHAUSTIVE = ("paged, swap",)
SAMPLE = 120  # points per other configuration: about 3 s each


@pytest.fixture(scope="module")
def references():
    return {}


def failures(name: str, sample: int | None, refs: dict) -> list[fi.Result]:
    config = fi.CONFIGS[name]
    ref = refs.setdefault(name, fi.reference(config))
    todo = fi.points(ref)
    if sample is not None:
        todo = sorted(random.Random(7).sample(todo, min(sample, len(todo))), key=lambda p: p.index)
    assert todo
    results = [fi.inject(config, ref, p) for p in todo]
    return [r for r in results if r.outcome != "survived"]


@pytest.mark.slow
@pytest.mark.parametrize("name", EXHAUSTIVE)
def test_every_point(name, references):
    bad = failures(name, None, references)
    assert not bad, [(r.outcome, r.point, r.detail) for r in bad[:5]]


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in fi.CONFIGS if n not in EXHAUSTIVE])
def test_sampled_points(name, references):
    bad = failures(name, SAMPLE, references)
    assert not bad, [(r.outcome, r.point, r.detail) for r in bad[:5]]


def test_the_harness_sees_a_leak():
    """The verdicts are not vacuous: a manager whose free() forgets the sequence before giving its blocks back
    leaks when the fault strikes in between."""
    config = fi.CONFIGS["paged, recompute"]
    ref = fi.reference(config)
    frees = [p for p in fi.points(ref) if p.target == "allocator.free" and p.when == "before"]
    from sim.kv.paged import PagedKVManager

    real_free = PagedKVManager.free

    def leaky_free(self, seq_id):  # the order this project's free() had before: forget first, then give back
        seq = self._seqs.pop(seq_id)
        self.allocator.free(reversed(seq.block_table))

    PagedKVManager.free = leaky_free
    try:
        outcome = fi.inject(config, ref, frees[0]).outcome
    finally:
        PagedKVManager.free = real_free
    assert outcome == "leaked"


def test_a_real_ctrl_c_inside_a_kv_call_is_held_until_the_scheduler_is_done():
    """SIGINT delivered while the KV manager allocates: the allocation completes, KeyboardInterrupt comes as
    schedule() returns, the step is abandoned whole and the pool is consistent and, once drained, empty."""
    llm = LLM.from_loaded(
        random_model(seed=5, tie_word_embeddings=False), block_size=4, max_model_len=64, num_gpu_blocks=24
    )
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    for prompt in ([5, 6, 7, 8, 9], [10, 11, 12]):
        llm.add_request(prompt, params)
    kv, seen = llm.kv_manager, []
    real = kv.allocate_slots

    def allocate_slots(*args, **kwargs):
        if not seen:
            os.kill(os.getpid(), signal.SIGINT)  # delivered at the next bytecode, inside the KV manager
        result = real(*args, **kwargs)
        seen.append(result)
        return result

    kv.allocate_slots = allocate_slots
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # a test runner's worker may ignore SIGINT
    try:
        with pytest.raises(KeyboardInterrupt):
            llm.step()
    finally:
        signal.signal(signal.SIGINT, before)
    assert len(seen) == 2  # both admissions ran to the end before the interrupt was let through
    kv.check_invariants()
    assert llm.stats.num_failed_steps == 1 and not llm.has_unfinished_requests()
    assert kv.num_free_blocks == kv.num_blocks


def test_a_cleanup_that_fails_becomes_a_note_on_the_step_s_exception():
    llm = LLM.from_loaded(random_model(seed=5), block_size=4, max_model_len=64, num_gpu_blocks=24)
    llm.add_request([5, 6, 7], SamplingParams(max_tokens=2))

    def execute(*args, **kwargs):
        raise fi.Fault("the step's own failure")

    def abandon_step(plan=None):
        raise RuntimeError("a bug in the cleanup")

    llm.executor.execute, llm.scheduler.abandon_step = execute, abandon_step
    with pytest.raises(fi.Fault, match="the step's own failure") as info:
        llm.step()
    assert info.value.__notes__ == ["and the cleanup after it failed: RuntimeError: a bug in the cleanup"]
    assert llm.stats.num_failed_steps == 1
