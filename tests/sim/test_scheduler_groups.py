"""The scheduler's sequence groups (sim/scheduler.py): parallel sampling and beam search compute the prompt once
(the leader), their siblings sample from its logits and are forked from it, forks and frees follow the
executor's beam choices, and prefix sharing reports cached tokens."""
from __future__ import annotations

import pytest

from sim.kv import make_kv_manager
from sim.plan import StepOutcome
from sim.request import Request
from sim.scheduler import Scheduler, SchedulerConfig
from tests.sim.scheduler_driver import all_blocks_free, drive, paged, req, step


@pytest.mark.parametrize("mode", ["v0", "v1"])
def test_parallel_sampling_shares_the_prompt_and_frees_it(mode):
    kv = paged(32)
    sched = Scheduler(kv, SchedulerConfig(mode=mode))
    sched.add_request(req(0, 6, 5, n=3))
    leader, *siblings = sched.seq_ids(0)
    plan, _ = step(sched)
    # one prompt computation by the leader; the two siblings only sample from its logits (no table yet) ...
    assert [(e.num_computed_tokens, e.num_new_tokens) for e in plan.prefills] == [(0, 6), (6, 0), (6, 0)]
    assert plan.num_batched_tokens == 6 and [e.block_table for e in plan.prefills[1:]] == [[], []]
    # ... and when the step is reported they are forked from it: all three point at the same 2 blocks
    tables = [kv.block_table(i) for i in sched.seq_ids(0)]
    assert tables[0] == tables[1] == tables[2] and len({b for t in tables for b in t}) == 2 < 3 * 2
    plan, _ = step(sched)
    # first write into the shared, half-full last block: two copies, the third owner writes in place
    assert len(plan.blocks_to_copy) == 2 and len(plan.decodes) == 3
    tables = [kv.block_table(i) for i in sched.seq_ids(0)]
    assert len({t[0] for t in tables}) == 1 and len({t[1] for t in tables}) == 3  # prompt head still shared
    drive(sched)
    assert all_blocks_free(kv)


def test_beam_search_forks_and_frees_per_beam_parents():
    kv = paged(32)
    sched = Scheduler(kv, SchedulerConfig(mode="v0"))
    sched.add_request(req(0, 6, 6, beam_width=4))
    s0, s1, s2, s3 = sched.seq_ids(0)
    plan = sched.schedule()
    result = sched.finish_step(plan, StepOutcome(beam_parents={0: [s0, s0, s1, s0]}))
    # s2 and s3 are unlisted: freed first. s0 keeps its id at its first place and is forked at its 2nd and 3rd;
    # new ids come from the scheduler's own counter, in the order of beam_parents
    assert result.new_beam_seq_ids == {0: [s0, s3 + 1, s1, s3 + 2]}
    assert sched.seq_ids(0) == [s0, s3 + 1, s1, s3 + 2]
    head, last = kv.block_table(s0)
    assert kv.allocator.ref_count(head) == 4 and kv.allocator.ref_count(last) == 4  # all beams share the prompt
    kv.check_invariants()
    plan = sched.schedule()  # every beam writes into the shared last block: 3 copies, the 4th writes in place
    assert len(plan.blocks_to_copy) == 3
    result = sched.finish_step(plan, StepOutcome(beam_parents={0: [s1, s1, s1, s1]}))
    assert result.new_beam_seq_ids[0] == [s1, s3 + 3, s3 + 4, s3 + 5]
    assert kv.allocator.ref_count(kv.block_table(s1)[-1]) == 4
    kv.check_invariants()
    drive(sched)
    assert sched.is_finished(0) and all_blocks_free(kv)


def test_beam_search_frees_dropped_beams_before_forking():
    # Contiguous (oracle) forks reserve a new run; the pool holds exactly two: the fork only fits because the
    # dropped beam was freed first. Its copies (parent's filled blocks) go out with the next plan.
    kv = make_kv_manager("oracle", 14, block_size=1, allocator="first_fit")
    sched = Scheduler(kv, SchedulerConfig(mode="v0"))
    sched.add_request(req(0, 4, 4, beam_width=2))  # two runs of 7 reserved at admission: the whole pool
    s0, s1 = sched.seq_ids(0)
    result = sched.finish_step(sched.schedule(), StepOutcome(beam_parents={0: [s0, s0]}))
    # s1 was forked into its reserved run (a copy of the prompt, now moot) and dropped; the child reuses the run
    child = result.new_beam_seq_ids[0][1]
    plan = sched.schedule()
    assert plan.blocks_to_copy == list(zip(range(0, 4), kv.block_table(child)[:4]))  # the moot copy is gone
    kv.check_invariants()


def test_prefix_sharing_reports_cached_tokens():
    kv = paged(32, enable_prefix_caching=True)
    sched = Scheduler(kv, SchedulerConfig(mode="v0"))
    prefix = list(range(100, 108))  # two full blocks of 4
    sched.add_request(req(0, 10, 3, prompt_token_ids=prefix + [1, 2]))
    sched.add_request(req(1, 10, 3, prompt_token_ids=prefix + [3, 4]))
    plan, _ = step(sched)
    assert [(e.num_computed_tokens, e.num_new_tokens) for e in plan.prefills] == [(0, 10), (8, 2)]
    assert plan.prefills[0].block_table[:2] == plan.prefills[1].block_table[:2]
    drive(sched)
    assert all_blocks_free(kv)




@pytest.mark.parametrize("policy", ["paged", "oracle"])
def test_siblings_are_forked_from_the_leader_when_its_prompt_is_computed(policy):
    # n = 3 samples of one 10-token prompt, under v1 with a budget of 4: the leader computes the prompt in chunks
    kv = make_kv_manager(policy, 256, block_size=4 if policy == "paged" else 1, max_seq_len=64)
    sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=4))
    sched.add_request(Request(0, 0.0, prompt_len=10, output_len=5, n=3))
    leader, *siblings = sched.seq_ids(0)
    chunks = [step(sched)[0] for _ in range(3)]
    assert [[(e.seq_id, e.num_computed_tokens, e.num_new_tokens, e.sample) for e in p.prefills] for p in chunks] == [
        [(leader, 0, 4, False)], [(leader, 4, 4, False)],
        [(leader, 8, 2, True), (siblings[0], 10, 0, True), (siblings[1], 10, 0, True)]]  # fmt: skip
    if policy == "paged":
        # paged: the siblings now point at the leader's 3 prompt blocks; nothing to copy
        assert all(kv.block_table(s) == kv.block_table(leader) for s in siblings)
        plan, _ = step(sched)  # the first decodes write into the shared half-full last block: 2 copies
        assert len(plan.blocks_to_copy) == 2 and len(plan.decodes) == 3
    else:
        # Orca: each sibling has its own run, reserved at admission; the prompt's K/V is copied into it before the
        # next step writes there (the copies lead the next plan)
        assert all(set(kv.block_table(s)).isdisjoint(kv.block_table(leader)) for s in siblings)
        plan, _ = step(sched)
        assert len(plan.blocks_to_copy) == 2 * 10
        assert {dst for _, dst in plan.blocks_to_copy} == {b for s in siblings for b in kv.block_table(s)[:10]}
    drive(sched)
    assert all_blocks_free(kv)


def test_beams_under_a_small_budget_sample_only_together():
    """v1, budget 5, 3 beams: after a preemption by recompute each beam has prompt + generated tokens to compute;
    chunks stop one token short of the end until all three can take their last token in one step."""
    kv = paged(16)
    sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=5))
    sched.add_request(req(0, 8, 40))  # grows to 12 blocks
    sched.add_request(req(1, 8, 12, beam_width=3))  # arrives last: the victim when memory runs out
    for _ in range(100):
        if step(sched)[0].preempted:
            break
    assert sched.waiting_request_ids() == [1]
    sampled_steps, chunked = [], False
    for _ in range(500):
        if not sched.has_unfinished():
            break
        plan, _ = step(sched)
        beams = [e for e in plan.prefills + plan.decodes if e.request_id == 1]
        chunked |= any(not e.sample for e in beams)
        if any(e.sample for e in beams):
            assert len(beams) == 3 and all(e.sample for e in beams), "the beams sample together or not at all"
            sampled_steps.append(len(beams))
    assert chunked and sampled_steps and all_blocks_free(kv)
    while sched.has_unfinished():
        plan, _ = step(sched)
        beams = [e for e in plan.prefills + plan.decodes if e.request_id == 0]
        if any(e.sample for e in beams):
            assert len(beams) == 3 and all(e.sample for e in beams), "the beams sample together or not at all"
            sampled_steps.append(len(beams))
    assert sampled_steps and all_blocks_free(kv)
