"""vLLM v1's scheduler shape (sim/scheduling/scheduler.py, mode "v1"), narrated: a token budget per step, running requests
first, chunked prefill mixing prompt chunks with decodes (or whole prompts waiting for room without it), the
pluggable preemption victim, siblings forked when their prompt is computed, and a budget charged after
prefix-cache hits."""

from __future__ import annotations

import copy

import pytest

from sim.scheduling.plan import StepOutcome
from sim.scheduling.scheduler import Scheduler, SchedulerConfig
from tests.sim.scheduler_driver import all_blocks_free, drive, paged, req, step


def entries(plan) -> list[tuple[int, int, int, bool]]:
    """(request, num_computed_tokens, num_new_tokens, sample) of every entry, prefills then decodes."""
    return [(e.request_id, e.num_computed_tokens, e.num_new_tokens, e.sample) for e in plan.entries]


@pytest.mark.parametrize("budget, chunks", [(16, (15, 15, 10)), (17, (16, 16, 8))])
def test_a_long_prompt_is_chunked_while_a_running_request_decodes(budget, chunks):
    """A 40-token prompt under a budget of 16 (17) is fed in chunks of 15, 15, 10 (16, 16, 8): request 0, running,
    decodes first in each step and takes 1 token of the budget; only the last chunk samples."""
    sched = Scheduler(paged(32), SchedulerConfig(max_num_batched_tokens=budget))
    sched.add_request(req(0, 6, 10))
    step(sched)  # request 0's prompt (6 tokens), sampling its first token
    sched.add_request(req(1, 40, 4))
    plans = [step(sched)[0] for _ in range(3)]
    a, b, c = chunks
    assert [entries(p) for p in plans] == [
        [(1, 0, a, False), (0, 6, 1, True)],
        [(1, a, b, False), (0, 7, 1, True)],
        [(1, a + b, c, True), (0, 8, 1, True)],  # the last chunk samples request 1's first token
    ]
    assert [p.num_batched_tokens for p in plans] == [budget, budget, c + 1]
    assert sched.num_generated(sched.seq_ids(1)[0]) == 1
    plan, _ = step(sched)
    assert entries(plan) == [(0, 9, 1, True), (1, 40, 1, True)]  # both decode now, in arrival order
    drive(sched)
    assert all_blocks_free(sched.kv)


def test_the_budget_goes_to_running_requests_first_then_to_waiting_ones():
    sched = Scheduler(paged(64), SchedulerConfig(max_num_batched_tokens=8))
    for rid, prompt_len in enumerate((5, 5, 5)):
        sched.add_request(req(rid, prompt_len, 6))
    plan, _ = step(sched)
    assert entries(plan) == [(0, 0, 5, True), (1, 0, 3, False)]  # request 2 gets nothing: the budget is spent
    plan, _ = step(sched)
    # running first: request 0 decodes, request 1 finishes its prompt; the 3 tokens left go to request 2
    assert entries(plan) == [(1, 3, 2, True), (2, 0, 5, True), (0, 5, 1, True)]
    assert sched.waiting_request_ids() == []


def test_without_chunking_a_prompt_waits_for_a_step_with_room():
    config = SchedulerConfig(max_num_batched_tokens=16, enable_chunked_prefill=False)
    sched = Scheduler(paged(32), config)
    with pytest.raises(ValueError, match=r"prompt_len 17 is over max_num_batched_tokens \(allowed: <= 16") as err:
        sched.add_request(req(9, 17, 2))
    assert "\n" not in str(err.value) and sched.num_waiting == 0  # one line; nothing queued
    for rid in range(3):
        sched.add_request(req(rid, 4, 8))
    step(sched)  # three prompts of 4
    sched.add_request(req(3, 14, 2))  # 14 + the 3 decodes = 17 > 16: not this step (no overtaking, no chunk)
    plan, _ = step(sched)
    assert entries(plan) == [(0, 4, 1, True), (1, 4, 1, True), (2, 4, 1, True)] and sched.waiting_request_ids() == [3]
    sched.abort(2)  # one decode fewer: 14 + 2 = 16 fits
    plan, _ = step(sched)
    assert entries(plan) == [(3, 0, 14, True), (0, 5, 1, True), (1, 5, 1, True)] and plan.num_batched_tokens == 16
    drive(sched)
    assert all_blocks_free(sched.kv)


def two_victims(victim):
    """Requests with prompts of 4, 12 and 8 tokens, output 20, grow in a pool of 12 blocks of 4 until memory runs
    out in step 9, when request 0 (12 tokens computed) needs a block for its 13th; request 1 has 20 computed and
    request 2 16. Who goes depends on the victim policy. Returns the scheduler and the plan that preempted."""
    sched = Scheduler(paged(12), SchedulerConfig(victim=victim))
    for rid, prompt_len in enumerate((4, 12, 8)):
        sched.add_request(req(rid, prompt_len, 20))
    for _ in range(100):
        plan, _ = step(sched)
        if plan.preempted:
            return sched, plan
    raise AssertionError("expected a preemption")


def test_the_victim_policy_chooses_who_is_preempted():
    latest, plan = two_victims("latest_arrival")
    # vLLM's default: the newest request goes; requests 0 and 1 decode
    assert plan.preempted == [2] and latest.waiting_request_ids() == [2]
    assert entries(plan) == [(0, 12, 1, True), (1, 20, 1, True)]
    fewest, plan = two_victims("fewest_computed")
    # the cheapest to recompute goes: request 0 itself (12 computed tokens, fewer than 16 and 20)
    assert plan.preempted == [0] and fewest.waiting_request_ids() == [0]
    assert entries(plan) == [(1, 20, 1, True), (2, 16, 1, True)]
    for sched in (latest, fewest):
        drive(sched)
        assert all_blocks_free(sched.kv)


def test_a_victim_policy_is_any_function_of_the_candidates():
    seen = []

    def longest_prompt(candidates):
        seen.append([(g.request_id, g.num_computed_tokens) for g in candidates])
        return max(candidates, key=lambda g: g.request.prompt_len)

    sched, plan = two_victims(longest_prompt)
    # the candidates: the running requests not yet scheduled this step, in arrival order, then the one in need
    assert seen == [[(1, 20), (2, 16), (0, 12)]]
    assert plan.preempted == [1] and sched.waiting_request_ids() == [1]
    drive(sched)
    assert all_blocks_free(sched.kv)
    # a policy must return one of the candidates themselves: not a stranger, nor a lookalike copy
    for stranger in (lambda candidates: "somebody else", lambda candidates: copy.copy(candidates[0])):
        with pytest.raises(ValueError, match="expected one of the candidates"):
            two_victims(stranger)


def test_finish_step_forks_siblings_only_for_the_step_that_computes_the_prompt():
    sched = Scheduler(paged(32), SchedulerConfig(max_num_batched_tokens=4))
    sched.add_request(req(0, 6, 3, n=2))
    leader, sibling = sched.seq_ids(0)
    plan = sched.schedule()
    assert entries(plan) == [(0, 0, 4, False)]
    sched.finish_step(plan, StepOutcome())
    assert sibling not in sched.kv.seq_ids  # not forked yet: the prompt is not computed
    plan = sched.schedule()
    assert entries(plan) == [(0, 4, 2, True), (0, 6, 0, True)]
    sched.finish_step(plan, StepOutcome())
    assert sched.kv.block_table(sibling) == sched.kv.block_table(leader)
    assert sched.num_generated(leader) == sched.num_generated(sibling) == 1


@pytest.mark.parametrize("caching", [False, True])
def test_the_budget_counts_the_tokens_left_after_prefix_cache_hits(caching):
    """Deliberate change: the budget is charged for the tokens a step computes, after the prefix cache's hits (as
    vLLM v1 does), not for whole prompts. Two 10-token prompts share 8 tokens (two blocks of 4); budget 12, no
    chunking. Request 1 finds request 0's two blocks, registered when the step that computes them was
    scheduled, so it costs 2 tokens and joins at once; without the cache it costs 10 and waits a step."""
    prefix = list(range(100, 108))
    kv = paged(32, enable_prefix_caching=caching)
    sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=12, enable_chunked_prefill=False))
    sched.add_request(req(0, 10, 3, prompt_token_ids=prefix + [1, 2]))
    sched.add_request(req(1, 10, 3, prompt_token_ids=prefix + [3, 4]))
    plan, _ = step(sched)
    if caching:
        assert entries(plan) == [(0, 0, 10, True), (1, 8, 2, True)] and plan.num_batched_tokens == 12
        assert plan.prefills[0].block_table[:2] == plan.prefills[1].block_table[:2]  # the shared prefix blocks
    else:
        assert entries(plan) == [(0, 0, 10, True)] and sched.waiting_request_ids() == [1]
        plan, _ = step(sched)
        assert entries(plan) == [(1, 0, 10, True), (0, 10, 1, True)] and plan.num_batched_tokens == 11
    drive(sched)
    assert all_blocks_free(kv)


def test_a_request_skipping_the_prefix_cache_computes_its_whole_prompt():
    """Request.skip_reading_prefix_cache (vLLM's, set for prompt log-probs): request 1 shares request 0's two cached
    blocks but computes all 10 tokens, while request 2, reading the cache again, finds request 1's own third block
    (its prompt's first 12 tokens) as well as the shared ones."""
    prefix = list(range(100, 108))
    kv = paged(32, enable_prefix_caching=True)
    sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=64))
    sched.add_request(req(0, 10, 3, prompt_token_ids=prefix + [1, 2]))
    plan, _ = step(sched)
    sched.add_request(req(1, 13, 3, prompt_token_ids=prefix + [3, 4, 5, 6, 7], skip_reading_prefix_cache=True))
    plan, _ = step(sched)
    assert (1, 0, 13, True) in entries(plan)  # computed from position 0: no hit
    sched.add_request(req(2, 13, 3, prompt_token_ids=prefix + [3, 4, 5, 6, 7]))
    plan, _ = step(sched)
    assert (2, 12, 1, True) in entries(plan)  # 12 tokens found: request 1's blocks were cached
    drive(sched)
    assert all_blocks_free(kv)
