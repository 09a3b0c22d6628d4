"""The scheduler's sequence groups (sim/scheduler.py): parallel sampling and beam search share the prompt's
blocks, forks and frees follow the executor's beam choices, and prefix sharing reports cached tokens."""
from __future__ import annotations

import pytest

from sim.kv import make_kv_manager
from sim.plan import StepOutcome
from sim.request import Request
from sim.scheduler import Scheduler, SchedulerConfig
from tests.sim.scheduler_driver import all_blocks_free, drive, paged, req, step


def test_parallel_sampling_shares_the_prompt_and_frees_it():
    kv = paged(32)
    sched = Scheduler(kv)
    sched.add_request(req(0, 6, 5, n=3))
    plan, _ = step(sched)
    # one prompt computation; the two siblings only sample from its logits
    assert [(e.num_computed_tokens, e.num_new_tokens) for e in plan.prefills] == [(0, 6), (6, 0), (6, 0)]
    assert plan.num_batched_tokens == 6
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
    sched = Scheduler(kv)
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
    sched = Scheduler(kv)
    sched.add_request(req(0, 4, 4, beam_width=2))
    s0, s1 = sched.seq_ids(0)
    result = sched.finish_step(sched.schedule(), StepOutcome(beam_parents={0: [s0, s0]}))
    child = result.new_beam_seq_ids[0][1]
    plan = sched.schedule()
    assert plan.blocks_to_copy == list(zip(range(0, 4), kv.block_table(child)[:4]))
    kv.check_invariants()


def test_prefix_sharing_reports_cached_tokens():
    kv = paged(32, enable_prefix_caching=True)
    sched = Scheduler(kv)
    prefix = list(range(100, 108))  # two full blocks of 4
    sched.add_request(req(0, 10, 3, prompt_token_ids=prefix + [1, 2]))
    sched.add_request(req(1, 10, 3, prompt_token_ids=prefix + [3, 4]))
    plan, _ = step(sched)
    assert [(e.num_computed_tokens, e.num_new_tokens) for e in plan.prefills] == [(0, 10), (8, 2)]
    assert plan.prefills[0].block_table[:2] == plan.prefills[1].block_table[:2]
    drive(sched)
    assert all_blocks_free(kv)




@pytest.mark.parametrize("policy", ["paged", "oracle"])
def test_siblings_sample_only_where_they_share_the_prompt_blocks(policy):
    # n = 3 samples of one 10-token prompt.
    kv = make_kv_manager(policy, 256, block_size=4 if policy == "paged" else 1, max_seq_len=64)
    sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=64))
    sched.add_request(Request(0, 0.0, prompt_len=10, output_len=5, n=3))
    plan = sched.schedule()
    first, *siblings = plan.prefills
    assert (first.num_computed_tokens, first.num_new_tokens) == (0, 10)
    if policy == "paged":
        # paged: all three point at the same 3 prompt blocks; the prompt is computed once, siblings only sample
        assert all(s.block_table == first.block_table for s in siblings)
        assert [(s.num_computed_tokens, s.num_new_tokens) for s in siblings] == [(10, 0), (10, 0)]
        assert plan.num_batched_tokens == 10
    else:
        # Orca: each sequence has its own reservation, so each must be fed the prompt to hold its K/V
        assert all(set(s.block_table).isdisjoint(first.block_table) for s in siblings)
        assert [(s.num_computed_tokens, s.num_new_tokens) for s in siblings] == [(0, 10), (0, 10)]
        assert plan.num_batched_tokens == 30
