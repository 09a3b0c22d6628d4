"""The CPU offload tier of the prefix cache (sim/kv/offload.py, in the paged manager): evicted cached blocks go to CPU
memory and come back on a hit.

- a hypothesis property over random workloads: the K/V memory model of test_scheduler_properties (`Contents`),
  extended with the tier's copies executed as the engine executes them, shows that attention always reads each
  sequence's own tokens (the tier never changes K/V contents), and that every block of both tiers balances at the end;
- LRU order in the tier, hit accounting per tier, the transfer cost the loop charges, bad input.
"""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import sim
from sim.base.request import Request
from sim.base.specs import get_model
from sim.clock.cost import RooflineCostModel
from sim.clock.loop import Simulator
from sim.kv import NewSequence, make_kv_manager
from sim.kv.offload import CpuOffloadTier, TierCopy
from sim.scheduling.plan import StepOutcome
from sim.scheduling.scheduler import Scheduler, SchedulerConfig
from tests.sim.test_scheduler_properties import Contents, check_state, draw_config, workloads

BLOCK_SIZE = 4


class TierContents(Contents):
    """`Contents` plus the tier's CPU blocks: the manager's tier copies run after the swap-outs and before the
    swap-ins, in the order logged, as reference/engine/executor.py runs them."""

    def __init__(self, block_size: int):
        super().__init__(block_size)
        self.tier: dict[int, list] = {}

    def execute_with_tier(self, plan, tier_copies: list[TierCopy]) -> None:
        empty = [None] * self.bs
        swap_in, plan.blocks_to_swap_in = plan.blocks_to_swap_in, []
        swap_out, plan.blocks_to_swap_out = plan.blocks_to_swap_out, []
        for gpu, cpu in swap_out:
            self.cpu[cpu] = list(self.gpu.get(gpu, empty))
        for copy in tier_copies:
            if copy.to_cpu:
                self.tier[copy.dst] = list(self.gpu.get(copy.src, empty))
            else:
                self.gpu[copy.dst] = list(self.tier[copy.src])
        for cpu, gpu in swap_in:
            self.gpu[gpu] = list(self.cpu[cpu])
        self.execute(plan)  # the copy-on-write copies, the writes of fed tokens, and the check of what attention reads
        plan.blocks_to_swap_in, plan.blocks_to_swap_out = swap_in, swap_out


@settings(max_examples=150, deadline=None)
@given(data=st.data(), requests=workloads(), tier_blocks=st.integers(1, 12), pool=st.integers(12, 24))
def test_the_tier_never_changes_what_attention_reads(data, requests, tier_blocks, pool):
    mode = data.draw(st.sampled_from(["v1", "v0"]))
    swap = data.draw(st.booleans())
    config = draw_config(data.draw, mode, "swap" if swap else "recompute")
    kv = make_kv_manager(
        "paged",
        pool * BLOCK_SIZE,
        block_size=BLOCK_SIZE,
        max_seq_len=64,
        enable_prefix_caching=True,
        num_cpu_blocks=32 if swap else 0,
        num_offload_blocks=tier_blocks,
    )
    sched = Scheduler(kv, config)
    memory, added = TierContents(BLOCK_SIZE), []
    # every request arrives twice, the second copy after the first finished: its prompt may come back from the tier
    for rounds in (
        requests,
        [
            Request(
                r.request_id + 100,
                0.0,
                r.prompt_len,
                r.output_len,
                n=r.n,
                beam_width=r.beam_width,
                prompt_token_ids=r.prompt_token_ids,
            )
            for r in requests
        ],
    ):
        for request in rounds:
            try:
                sched.add_request(request)
            except ValueError:
                continue
            added.append(request.request_id)
            memory.add(sched, request)
        steps = 0
        while sched.has_unfinished():
            plan = sched.schedule()
            memory.execute_with_tier(plan, kv.take_tier_copies())
            finished = {
                e.seq_id
                for e in plan.entries
                if e.sample and sched.num_generated(e.seq_id) + 1 >= sched.request(e.request_id).output_len
            }
            beams = {
                rid: [e.seq_id for e in plan.entries if e.request_id == rid and e.sample]
                for rid in plan.request_ids()
                if sched.request(rid).beam_width > 1
            }
            beams = {rid: ids for rid, ids in beams.items() if ids and not set(ids) & finished}
            memory.sampled(sched, plan)
            result = sched.finish_step(plan, StepOutcome(finished, beams))
            memory.beams(beams, result.new_beam_seq_ids)
            check_state(sched, added)
            steps += 1
            assert steps < 5_000, "no progress"
    assert kv.num_free_blocks == kv.num_blocks, "every request finished: no GPU block may stay allocated"
    assert kv.cpu_allocator is None or kv.cpu_allocator.num_free_blocks == kv.cpu_allocator.num_blocks
    kv.offload.check_invariants()  # every tier block free or cached once, none pinned
    stats = kv.prefix_cache_stats()
    assert stats.cpu_hit_blocks <= stats.hit_blocks and stats.reloaded_blocks <= stats.cpu_hit_blocks
    event(f"reloaded: {stats.reloaded_blocks > 0}, offloaded: {stats.offloaded_blocks > 0}")
    assert kv.offload.num_cached_blocks <= tier_blocks


def _prompt(first: int, blocks: int) -> list[int]:
    return list(range(first, first + blocks * BLOCK_SIZE + 1))  # `blocks` full blocks and one token more


def _admit(kv, seq_id: int, ids: list[int]) -> int:
    """Admit a sequence for its prompt (its lookup first, as the scheduler does); returns the cached tokens."""
    cached = kv.get_computed_tokens(ids, len(ids))
    assert kv.allocate_slots([seq_id], [len(ids) - cached], [NewSequence(len(ids), len(ids) + 1, ids, cached)])
    return cached


def test_an_evicted_prefix_comes_back_from_the_tier_and_counts_as_cached():
    kv = make_kv_manager(
        "paged", 4 * BLOCK_SIZE, block_size=BLOCK_SIZE, enable_prefix_caching=True, num_offload_blocks=8
    )
    a, b = _prompt(100, 3), _prompt(500, 3)
    _admit(kv, 1, a)
    kv.free(1)  # a's 3 full blocks stay cached on the GPU, in the free queue
    assert _admit(kv, 2, b) == 0  # b takes all 4 blocks: a's 3 cached ones are evicted -> offloaded
    offloads = kv.take_tier_copies()
    assert [c.to_cpu for c in offloads] == [True] * 3 and len(set(c.dst for c in offloads)) == 3
    kv.free(2)
    assert kv.get_computed_tokens(a, len(a)) == 3 * BLOCK_SIZE  # a misses on the GPU but hits the tier: all cached
    assert _admit(kv, 3, a) == 3 * BLOCK_SIZE
    copies = kv.take_tier_copies()
    reloads = [c for c in copies if not c.to_cpu]
    assert [c.dst for c in reloads] == kv.block_table(3)[:3]  # each reloaded block lands where the table says
    stats = kv.prefix_cache_stats()
    assert (stats.hit_tokens, stats.cpu_hit_tokens, stats.cpu_hit_blocks, stats.reloaded_blocks) == (12, 12, 3, 3)
    assert stats.queried_tokens == 3 * len(a)
    kv.check_invariants()
    kv.free(3)
    assert kv.num_free_blocks == kv.num_blocks


def test_a_gpu_hit_is_not_a_tier_hit_and_copies_nothing():
    kv = make_kv_manager(
        "paged", 8 * BLOCK_SIZE, block_size=BLOCK_SIZE, enable_prefix_caching=True, num_offload_blocks=8
    )
    a = _prompt(100, 3)
    _admit(kv, 1, a)
    kv.free(1)
    assert _admit(kv, 2, a) == 3 * BLOCK_SIZE
    stats = kv.prefix_cache_stats()
    assert (stats.hit_tokens, stats.cpu_hit_tokens, stats.offloaded_blocks) == (12, 0, 0)
    assert kv.take_tier_copies() == []


def test_the_tier_evicts_its_least_recently_used_block():
    tier = CpuOffloadTier(2)
    tier.offload(7, 0xA)  # GPU block 7 (hash A) -> CPU block 0
    tier.offload(8, 0xB)  # -> CPU block 1
    assert tier.lru_order() == [0xA, 0xB]
    tier.pin(0xA)  # a hit on A: A becomes the most recently used
    tier.reload(0xA, 3)
    tier.unpin_all()
    assert tier.lru_order() == [0xB, 0xA]
    tier.offload(9, 0xC)  # full: B, the least recently used, is dropped and its CPU block reused
    assert tier.lru_order() == [0xA, 0xC] and tier.cached_block(0xC) == 1 and tier.stats.dropped_blocks == 1
    tier.offload(4, 0xA)  # already here: touched, nothing copied
    assert tier.lru_order() == [0xC, 0xA]
    assert tier.take_copies() == [
        TierCopy(True, 7, 0),
        TierCopy(True, 8, 1),
        TierCopy(False, 0, 3),
        TierCopy(True, 9, 1),
    ]
    tier.check_invariants()


def test_a_pinned_block_is_never_dropped_before_its_reload():
    tier = CpuOffloadTier(1)
    tier.offload(5, 0xA)
    tier.pin(0xA)
    tier.offload(6, 0xB)  # every block pinned: B is not kept (as without a tier)
    assert tier.lru_order() == [0xA] and tier.cached_block(0xB) is None
    tier.reload(0xA, 2)
    tier.unpin_all()
    tier.check_invariants()


def test_the_loop_charges_a_reload_as_a_swap_of_its_blocks():
    """Three requests: A, then B (evicting A's cached prefix from a 4-block pool), then A's prompt again. With a
    pool big enough the third hits A's blocks on the GPU; with the small pool and a tier it reloads them: its step
    costs exactly the cost model's swap_time for 3 blocks more, and every other step the same."""
    model = "smollm2-135m"
    cost = RooflineCostModel(model, "a100-40gb")
    block_bytes = BLOCK_SIZE * get_model(model).kv_bytes_per_token
    a, b = _prompt(100, 3), _prompt(500, 3)

    def durations(num_blocks: int, tier: int) -> list[float]:
        kv = make_kv_manager(
            "paged", num_blocks * BLOCK_SIZE, block_size=BLOCK_SIZE, enable_prefix_caching=True, num_offload_blocks=tier
        )
        requests = [
            Request(0, 0.0, len(a), 1, prompt_token_ids=a),
            Request(1, 1.0, len(b), 1, prompt_token_ids=b),
            Request(2, 2.0, len(a), 1, prompt_token_ids=a),
        ]
        steps = Simulator(Scheduler(kv, SchedulerConfig()), cost, requests, block_bytes=block_bytes).run().steps
        assert kv.prefix_cache_stats().hit_tokens == 3 * BLOCK_SIZE
        return list(steps.columns["duration"])

    gpu_hit, tier_hit = durations(16, 0), durations(4, 8)
    assert gpu_hit[:2] == tier_hit[:2]
    # NOTE: approx only for the float rounding of (step + swap) - step
    assert tier_hit[2] - gpu_hit[2] == pytest.approx(cost.swap_time(3 * block_bytes, 3), rel=1e-9)


def test_the_summary_gives_hit_rates_per_tier_and_the_default_has_none():
    kw = dict(model="opt-13b", gpu="a100-40gb", workload="conversation", rate=2.0, duration=10.0, kv_slots=3000)
    plain = sim.run(**kw).summary
    assert "prefix_cache_hit_rate_cpu_tokens" not in plain and "cpu_offload_gib" not in plain
    s = sim.run(**kw, cpu_offload_gib=2.0).summary
    assert s["num_offload_blocks"] == int(2 * 2**30 // (16 * get_model("opt-13b").kv_bytes_per_token))
    gpu, cpu = s["prefix_cache_hit_rate_gpu_tokens"], s["prefix_cache_hit_rate_cpu_tokens"]
    assert cpu > 0 and gpu + cpu == pytest.approx(s["prefix_cache_hit_rate_tokens"])
    assert s["reload_time_s"] > 0 and s["reloaded_blocks"] > 0 and s["enable_prefix_caching"] is True


def test_bad_input_is_refused_in_one_line():
    with pytest.raises(ValueError, match="needs enable_prefix_caching=True"):
        make_kv_manager("paged", 64, block_size=4, num_offload_blocks=2)
    with pytest.raises(ValueError, match=r"policy 'radix' has no CPU offload tier: .* \(allowed: paged\)"):
        make_kv_manager("radix", 64, block_size=4, num_offload_blocks=2)
    with pytest.raises(ValueError, match="policy 'vattention' has no CPU offload tier: it has no prefix cache"):
        make_kv_manager("vattention", 64, block_size=4, num_offload_blocks=2)
    with pytest.raises(ValueError, match="num_offload_blocks must be >= 0"):
        make_kv_manager("paged", 64, block_size=4, enable_prefix_caching=True, num_offload_blocks=-1)
    with pytest.raises(ValueError, match="num_blocks must be >= 1"):
        CpuOffloadTier(0)
