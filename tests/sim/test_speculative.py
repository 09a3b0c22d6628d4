"""Speculative decoding: the scheduler's verify entries, the simulator's acceptance model and verify-step price.

The scheduler side is also driven by the random-workload property (tests/sim/test_scheduler_properties.py: k and every
acceptance drawn, the K/V model checks that no later step reads a rejected draft) and the KV side by the shared state
machine (sim/testing/kv.py's speculate rule, for every policy). Here: one request narrated step by step, the refusals,
and the simulator's numbers against the formulas they follow.
"""
from __future__ import annotations

import pytest

from sim.config import SchedulerConfig
from sim.kv.paged import PagedKVManager
from sim.plan import StepOutcome
from sim.request import Request
from sim.scheduler import Scheduler


def one_request(k: int, prompt_len: int = 6, output_len: int = 10) -> Scheduler:
    sched = Scheduler(PagedKVManager(16, 4), SchedulerConfig(num_speculative_tokens=k, max_num_batched_tokens=64))
    sched.add_request(Request(0, 0.0, prompt_len, output_len))
    return sched


def test_a_verify_step_feeds_the_last_token_and_k_drafts_then_keeps_the_accepted():
    sched = one_request(k=3)
    plan = sched.schedule()  # the prompt: 6 tokens, samples the first output token
    assert [e.num_new_tokens for e in plan.prefills] == [6] and plan.num_draft_tokens == 0
    sched.finish_step(plan, StepOutcome())
    plan = sched.schedule()  # a verify entry: token 6 (the sampled one) + 3 drafts in lookahead slots
    [entry] = plan.decodes
    assert (entry.num_computed_tokens, entry.num_new_tokens, entry.num_draft_tokens) == (6, 4, 3)
    assert plan.num_batched_tokens == 4 and sched.kv.num_tokens(entry.seq_id) == 10
    assert len(entry.block_table) == 3  # 10 slots: blocks of 4
    sched.finish_step(plan, StepOutcome(num_accepted={entry.seq_id: 1}))
    # one draft kept, plus the target's own token: 3 tokens sampled; the K/V holds 6 + 1 + 1 = 8 tokens, 2 blocks
    assert sched.num_generated(entry.seq_id) == 3 and sched.num_computed_tokens(entry.seq_id) == 8
    assert sched.kv.num_tokens(entry.seq_id) == 8 and len(sched.kv.block_table(entry.seq_id)) == 2
    assert sched.kv.num_free_blocks == 14


def test_drafts_never_run_past_the_output_and_the_request_ends_on_time():
    sched = one_request(k=8, output_len=5)
    sched.finish_step(sched.schedule(), StepOutcome())  # prompt, first token
    plan = sched.schedule()
    [entry] = plan.decodes
    assert entry.num_draft_tokens == 3  # 4 tokens left to sample: the last token + 3 drafts, all accepted at most
    result = sched.finish_step(plan, StepOutcome({entry.seq_id}, num_accepted={entry.seq_id: 3}))
    assert result.finished_request_ids == [0] and sched.kv.num_free_blocks == sched.kv.num_blocks


def test_a_missing_or_impossible_acceptance_is_refused_and_changes_nothing():
    sched = one_request(k=2)
    sched.finish_step(sched.schedule(), StepOutcome())
    plan = sched.schedule()
    [entry] = plan.decodes
    before = (sched.num_generated(entry.seq_id), sched.kv.num_tokens(entry.seq_id))
    for bad in ({}, {entry.seq_id: 3}, {entry.seq_id: -1}):
        with pytest.raises(ValueError, match=rf"num_accepted\[{entry.seq_id}\]: expected 0 to 2"):
            sched.finish_step(plan, StepOutcome(num_accepted=bad))
        assert (sched.num_generated(entry.seq_id), sched.kv.num_tokens(entry.seq_id)) == before


def test_speculation_off_is_the_default_and_opens_no_run_when_on():
    assert SchedulerConfig().num_speculative_tokens == 0
    sched = one_request(k=2)
    sched.finish_step(sched.schedule(), StepOutcome())
    assert sched.plain_decode_seqs() is None and sched.open_decode_epoch() is None  # no fast-forward with drafts
    plain = one_request(k=0)
    plain.finish_step(plain.schedule(), StepOutcome())
    assert plain.plain_decode_seqs() is not None


@pytest.mark.parametrize("k", [-1, 65, 1.5, True])
def test_bad_num_speculative_tokens_is_one_line(k):
    with pytest.raises(ValueError, match=r"num_speculative_tokens: got .* \(allowed: an integer from 0 \(off\) to 64\)"):
        SchedulerConfig(num_speculative_tokens=k)
