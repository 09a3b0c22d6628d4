"""vLLM v1's scheduler shape (sim/scheduler.py, mode "v1"), narrated: a token budget per step, running requests
first, chunked prefill mixing prompt chunks with decodes, and the pluggable preemption victim."""
from __future__ import annotations

import pytest

from sim.plan import StepOutcome
from sim.scheduler import Scheduler, SchedulerConfig
from tests.sim.scheduler_driver import all_blocks_free, drive, paged, req, step


def entries(plan) -> list[tuple[int, int, int, bool]]:
    """(request, num_computed_tokens, num_new_tokens, sample) of every entry, prefills then decodes."""
    return [(e.request_id, e.num_computed_tokens, e.num_new_tokens, e.sample) for e in plan.prefills + plan.decodes]


def test_a_long_prompt_is_chunked_while_a_running_request_decodes():
    sched = Scheduler(paged(32), SchedulerConfig(max_num_batched_tokens=16))
    sched.add_request(req(0, 6, 10))
    step(sched)  # request 0's prompt (6 tokens), sampling its first token
    sched.add_request(req(1, 40, 4))
    # each step: request 0 decodes first (1 token of the budget), request 1 gets the other 15 of its prompt
    plans = [step(sched)[0] for _ in range(3)]
    assert [entries(p) for p in plans] == [
        [(1, 0, 15, False), (0, 6, 1, True)],
        [(1, 15, 15, False), (0, 7, 1, True)],
        [(1, 30, 10, True), (0, 8, 1, True)],  # the last chunk samples request 1's first token
    ]
    assert all(p.num_batched_tokens <= 16 for p in plans)
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
    with pytest.raises(ValueError, match=r"prompt_len 17 is over max_num_batched_tokens \(allowed: <= 16"):
        sched.add_request(req(9, 17, 2))
    for rid in range(3):
        sched.add_request(req(rid, 4, 8))
    step(sched)  # three prompts of 4
    sched.add_request(req(3, 14, 2))  # 14 + the 3 decodes = 17 > 16: not this step (no overtaking, no chunk)
    plan, _ = step(sched)
    assert [e.request_id for e in plan.prefills] == [] and sched.waiting_request_ids() == [3]
    sched.abort(2)  # one decode fewer: 14 + 2 = 16 fits
    plan, _ = step(sched)
    assert entries(plan)[0] == (3, 0, 14, True)
    drive(sched)
    assert all_blocks_free(sched.kv)


def two_victims(victim) -> Scheduler:
    """Requests with prompts of 4, 12 and 8 tokens grow in a pool of 12 blocks of 4 until memory runs out while
    request 0 needs a block: who goes depends on the victim policy."""
    sched = Scheduler(paged(12), SchedulerConfig(victim=victim))
    for rid, prompt_len in enumerate((4, 12, 8)):
        sched.add_request(req(rid, prompt_len, 20))
    for _ in range(100):
        if step(sched)[0].preempted:
            break
    return sched


def test_the_victim_policy_chooses_who_is_preempted():
    latest = two_victims("latest_arrival")
    assert latest.waiting_request_ids() == [2]  # vLLM's default: the newest request goes
    fewest = two_victims("fewest_computed")
    assert fewest.waiting_request_ids() == [0]  # the cheapest to recompute goes: request 0 (fewest tokens), itself
    for sched in (latest, fewest):
        drive(sched)
        assert all_blocks_free(sched.kv)


def test_a_victim_policy_is_any_function_of_the_candidates():
    seen = []

    def longest_prompt(candidates):
        seen.append([g.request_id for g in candidates])
        return max(candidates, key=lambda g: g.request.prompt_len)

    sched = two_victims(longest_prompt)
    assert sched.waiting_request_ids() == [1] and seen == [[1, 2, 0]]  # not yet scheduled this step, then itself
    with pytest.raises(ValueError, match="expected one of the candidates"):
        two_victims(lambda candidates: "somebody else")


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
