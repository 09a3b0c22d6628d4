"""The scheduler's sequence groups (sim/scheduling/scheduler.py): parallel sampling and beam search compute the prompt once
(the leader), their siblings sample from its logits and are forked from it, forks and frees follow the
executor's beam choices, and prefix sharing reports cached tokens."""

from __future__ import annotations

import pytest

from sim.base.request import Request
from sim.kv import make_kv_manager
from sim.scheduling.plan import StepOutcome
from sim.scheduling.scheduler import Scheduler, SchedulerConfig
from tests.sim.scheduler_driver import all_blocks_free, drive, paged, req, step


@pytest.mark.parametrize("mode", ["v0", "v1"])
def test_parallel_sampling_shares_the_prompt_and_frees_it(mode):
    """Deliberate change: siblings are no longer admitted with the leader; they are forked from it when the step
    that computes its last prompt token is reported (paged: they share its blocks from then on)."""
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
    assert kv.block_table(s0) == [0, 1, 2, 3] and kv.block_table(child) == [7, 8, 9, 10]
    plan = sched.schedule()
    assert plan.blocks_to_copy == [(0, 7), (1, 8), (2, 9), (3, 10)]  # once: the moot copy into s1's run is gone
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


def test_a_recompute_finds_its_prompt_in_the_prefix_cache():
    """Deliberate change: a request preempted by recompute is re-admitted with its prompt's token ids, so the
    blocks of its prompt that are still cached are not computed again."""
    kv = paged(5, enable_prefix_caching=True)
    sched = Scheduler(kv, SchedulerConfig(mode="v0"))
    sched.add_request(req(0, 4, 6, prompt_token_ids=list(range(4))))  # A: block 0
    sched.add_request(req(1, 8, 8, prompt_token_ids=list(range(100, 108))))  # B: blocks 1 and 2
    (b,) = sched.seq_ids(1)
    for _ in range(5):  # the prompts, then 4 decodes: A opens block 3, B block 4; the pool is full
        plan, _ = step(sched)
        assert not plan.preempted
    assert kv.block_table(b) == [1, 2, 4] and kv.num_free_blocks == 0
    # A needs a block for its 9th token: B, the latest arrival, is preempted. Its blocks are freed (tail first),
    # A takes block 4, and B's two prompt blocks stay cached while free. A then finishes.
    plan, done = step(sched)
    assert plan.preempted == [1] and done == [0] and sched.num_generated(b) == 5
    # B comes back: its 8 prompt tokens are found in blocks 1 and 2; only its 5 generated tokens are recomputed
    plan, _ = step(sched)
    (entry,) = plan.prefills
    assert (entry.seq_id, entry.num_computed_tokens, entry.num_new_tokens, entry.sample) == (b, 8, 5, True)
    assert entry.block_table[:2] == [1, 2]
    stats = kv.prefix_cache_stats()
    assert (stats.hit_blocks, stats.hit_tokens) == (2, 8)
    drive(sched)
    assert sched.num_generated(b) == 8 and all_blocks_free(kv)


def test_the_copies_of_one_plan_can_be_applied_at_once():
    """An executor applies blocks_to_copy with every source read before any write (reference/engine/kv_cache.py's
    copy_blocks, like vLLM's copy kernel). Under a contiguous policy, beam search (k = 2, prompt of 4): in the
    prompt's step s1 samples from the leader's logits and is forked into its reserved run (copies 0..3 -> 7..10,
    pending); if the executor keeps s1 twice, the leader s0 is dropped (its run 0..6 freed) and s1 forked into
    it, copying 7..10 -> 0..3, which would read what the first copy writes. sim.scheduling.sequence.queue_copies routes it
    from 0..3 instead: onto itself, so it is dropped (the freed run still holds the prompt's K/V)."""
    kv = make_kv_manager("oracle", 14, block_size=1, allocator="first_fit")
    sched = Scheduler(kv, SchedulerConfig(mode="v0"))
    sched.add_request(req(0, 4, 4, beam_width=2))
    s0, s1 = sched.seq_ids(0)
    result = sched.finish_step(sched.schedule(), StepOutcome(beam_parents={0: [s1, s1]}))
    child = result.new_beam_seq_ids[0][1]
    assert kv.block_table(s1) == [7, 8, 9, 10] and kv.block_table(child) == [0, 1, 2, 3]
    plan = sched.schedule()
    assert plan.blocks_to_copy == [(0, 7), (1, 8), (2, 9), (3, 10)]
    content = {b: ("prompt", b) for b in range(4)}  # the K/V the prompt's step wrote into the leader's run
    content.update({dst: content.get(src) for src, dst in plan.blocks_to_copy})  # every source read first
    for beam in (s1, child):  # each beam must hold the prompt's K/V
        assert [content.get(b) for b in kv.block_table(beam)[:4]] == [("prompt", i) for i in range(4)]


@pytest.mark.parametrize("policy", ["paged", "oracle"])
def test_siblings_are_forked_from_the_leader_when_its_prompt_is_computed(policy):
    """Deliberate change: a group's prompt is computed once, by its leader, under every policy. Before, the Orca
    baselines fed the prompt to each sequence; now their siblings' runs are reserved at the leader's admission
    and filled by copies in the plan after the fork."""
    # n = 3 samples of one 10-token prompt (final length 14), under v1 with a budget of 4: the leader computes
    # the prompt in chunks of 4, 4, 2; the siblings sample from its logits in the last chunk's step
    kv = make_kv_manager(policy, 256, block_size=4 if policy == "paged" else 1, max_seq_len=64)
    sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=4))
    sched.add_request(Request(0, 0.0, prompt_len=10, output_len=5, n=3))
    leader, *siblings = sched.seq_ids(0)
    chunks, free = [], []
    for _ in range(3):
        chunks.append(step(sched)[0])
        free.append(kv.num_free_blocks)
    assert [[(e.seq_id, e.num_computed_tokens, e.num_new_tokens, e.sample) for e in p.prefills] for p in chunks] == [
        [(leader, 0, 4, False)],
        [(leader, 4, 4, False)],
        [(leader, 8, 2, True), (siblings[0], 10, 0, True), (siblings[1], 10, 0, True)],
    ]
    assert all(sib not in [e.seq_id for e in p.prefills] for p in chunks[:2] for sib in siblings)
    if policy == "paged":
        # paged: the leader's table grows chunk by chunk (1, 2, 3 blocks of 64); the fork shares them, allocating none
        assert free == [63, 62, 61]
        assert all(kv.block_table(s) == kv.block_table(leader) == [0, 1, 2] for s in siblings)
        assert [kv.allocator.ref_count(b) for b in (0, 1, 2)] == [3, 3, 3]
        plan, _ = step(sched)  # the first decodes write into the shared half-full last block: 2 copies
        assert len(plan.blocks_to_copy) == 2 and len(plan.decodes) == 3
    else:
        # Orca: three runs of 14 slots (16 from the buddy allocator) reserved at the leader's first chunk:
        # the leader's at 0, its siblings' at 16 and 32. The fork allocates nothing; it fills them by copies
        assert free == [256 - 48] * 3
        assert [kv.block_table(s) for s in (leader, *siblings)] == [list(range(o, o + 10)) for o in (0, 16, 32)]
        plan, _ = step(sched)  # the copies lead the next plan, before its decodes write token 10 into each run
        assert plan.blocks_to_copy == [(i, o + i) for o in (16, 32) for i in range(10)]
        assert len(plan.decodes) == 3 and kv.num_free_blocks == 256 - 48
    drive(sched)
    assert all_blocks_free(kv)


def test_beams_under_a_small_budget_sample_only_together():
    """v1, budget 5, 3 beams of an 8-token prompt beside request 0, which grows until it preempts them (by
    recompute) again and again. The leader's prompt chunks, and later each beam's recompute chunks (prompt +
    generated tokens, computed by every beam alone), stop short of the end; a beam samples only in a step where
    all three do."""
    kv = paged(16)
    sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=5))
    sched.add_request(req(0, 8, 40))  # grows to 12 blocks
    sched.add_request(req(1, 8, 12, beam_width=3))  # arrives last: the victim when memory runs out
    beams = sched.seq_ids(1)
    fed_without_sampling = sampled = preempted = 0
    for _ in range(1000):
        if not sched.has_unfinished():
            break
        plan, _ = step(sched)
        preempted += plan.preempted == [1]
        mine = [e for e in plan.entries if e.request_id == 1]
        if any(e.sample for e in mine):
            assert sorted(e.seq_id for e in mine) == sorted(sched.seq_ids(1)) and all(e.sample for e in mine)
            sampled += 1
        elif mine:
            fed_without_sampling += 1
            assert all(e.num_new_tokens for e in mine)
    assert not sched.has_unfinished() and preempted >= 2 and fed_without_sampling >= 10 and sampled == 12
    assert sched.seq_ids(1) == beams and all(sched.num_generated(i) == 12 for i in beams)
    assert all_blocks_free(kv)
