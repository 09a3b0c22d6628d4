"""HybridKVManager (sim/kv/hybrid.py): the KV state machine on small pools with small windows (and broken variants it
catches), blocks leaving the window narrated, the breakdown, decode runs, the scheduler's invariants with a model of
what every group's slots hold, KV cache groups and pool sizes from Gemma 3's specs, and whole runs against the same
model served as all-full attention by `paged`."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import sim
import tests.sim.test_scheduler_properties as props
from sim.base.specs import ModelSpec, get_model
from sim.clock.cost import RooflineCostModel
from sim.drivers.cli import main
from sim.fast.hybrid import HybridRuns
from sim.fast.runs import kv_runs
from sim.kv import MemoryBreakdown, NewSequence, make_kv_manager
from sim.kv.hybrid import HybridKVManager, kv_cache_groups, pool_blocks
from sim.scheduling.scheduler import Scheduler
from sim.testing import make_kv_manager_test
from tests.sim.test_scheduler_properties import test_scheduler_invariants_hold_after_every_step as _invariants


def _bounds(full: int, sliding: int, window: int):
    """Token-state slots of a sequence of n tokens: n per full group; per sliding group at least the window (its
    latest query reads that many), at most n."""
    return lambda n: (full * n + sliding * min(n, window), (full + sliding) * n)


# --- the KV state machine: small pools and windows, so blocks leave the window and memory runs out often ----------
TestHybrid = make_kv_manager_test(
    lambda: HybridKVManager(20, 2, (None, 5, 5), max_seq_len=24), max_examples=300, token_bounds=_bounds(1, 2, 5)
)
TestHybrid = pytest.mark.slow(TestHybrid)  # hundreds of programs: `make test` only (tests/conftest.py)
TestHybridWindowBelowBlock = make_kv_manager_test(
    lambda: HybridKVManager(14, 4, (None, None, 3), max_seq_len=28), max_examples=200, token_bounds=_bounds(2, 1, 3)
)
TestHybridWindowBelowBlock = pytest.mark.slow(
    TestHybridWindowBelowBlock
)  # hundreds of programs: `make test` only (tests/conftest.py)
TestHybridWatermark = make_kv_manager_test(
    lambda: HybridKVManager(24, 2, (None, 4), watermark=0.2, max_seq_len=20),
    max_examples=150,
    token_bounds=_bounds(1, 1, 4),
)
TestHybridWatermark = pytest.mark.slow(
    TestHybridWatermark
)  # hundreds of programs: `make test` only (tests/conftest.py)


class _FreesInsideTheWindow(HybridKVManager):
    """Broken on purpose: a sliding group frees the block the window still starts in (its own invariants agree, so
    only the contract's checks can see it)."""

    def live_from(self, window, first_query):
        return 0 if window is None else max(0, first_query - window + 1 + self.block_size)


class _RunsIgnoreFrees(HybridRuns):
    """Broken on purpose: a decode run counts the blocks it opens but not those the window frees (as a paged pool)."""

    def max_decode_steps(self, seq_groups, limit, waiting=False):
        from sim.fast.paged import run_capacity

        seq_ids = [i for ids in seq_groups for i in ids]
        if not seq_ids or not super().max_decode_steps(seq_groups, 1, waiting):
            return min(limit, super().max_decode_steps(seq_groups, limit, waiting))
        tokens = [self.kv.num_tokens(i) for i in seq_ids]
        return min(limit, run_capacity(tokens, self.kv.block_size, self.kv.num_free_blocks // len(self.kv.windows)))


class _RunsIgnoreWaiting(HybridRuns):
    """Broken on purpose: a decode run asked with `waiting` goes on past a step that frees blocks (a request waiting
    for memory might fit after it)."""

    def max_decode_steps(self, seq_groups, limit, waiting=False):
        return super().max_decode_steps(seq_groups, limit)


@pytest.mark.parametrize(
    "broken, runs",
    [(_FreesInsideTheWindow, kv_runs), (HybridKVManager, _RunsIgnoreFrees), (HybridKVManager, _RunsIgnoreWaiting)],
    ids=["frees-in-window", "run-no-frees", "run-ignores-waiting"],
)
def test_the_machine_catches_broken_hybrid_managers(broken, runs):
    test_case = make_kv_manager_test(
        lambda: broken(20, 2, (None, 5, 5), max_seq_len=24), max_examples=300, token_bounds=_bounds(1, 2, 5), runs=runs
    )
    test_case.settings = settings(test_case.settings, phases=[Phase.generate], report_multiple_bugs=False)
    with pytest.raises(AssertionError):
        test_case("runTest").runTest()


# --- narrated examples ------------------------------------------------------------------------------------------
def test_a_sliding_group_frees_a_block_when_the_window_passes_its_last_position():
    kv = HybridKVManager(16, 4, (None, 6))  # block_size 4, window 6
    assert kv.allocate_slots([0], [9], [NewSequence(9, 12)]) is not None  # prefill positions 0..8: 3 blocks each
    assert kv.num_free_blocks == 10 and kv.group_tables(0) == [[0, 1, 2], [3, 4, 5]]
    kv.allocate_slots([0], [1])  # query 9 reads 4..9: block 0 (0..3) is out of the window, back to the pool
    assert kv.group_tables(0) == [[0, 1, 2], [None, 4, 5]] and kv.num_free_blocks == 11
    # sliding group: block 4 holds 4..7, all read by query 9; block 5 holds t8 t9 and 2 slots up to final 12
    assert kv.breakdown() == MemoryBreakdown(
        token_states=10 + 6, reservation=2 + 2, internal_fragmentation=0, external_fragmentation=0, free=44
    )
    kv.allocate_slots([0], [1])  # query 10 reads 5..10: position 4 is dead, its block still holds 5..7
    assert kv.group_tables(0)[1] == [None, 4, 5]
    assert kv.breakdown().internal_fragmentation == 1 and kv.breakdown().token_states == 11 + 6
    kv.allocate_slots([0], [1])  # query 11 reads 6..11: two dead slots
    assert kv.breakdown().internal_fragmentation == 2
    kv.check_invariants()
    kv.free(0)
    assert kv.num_free_blocks == 16 and kv.breakdown().free == 64


def test_the_breakdown_counts_every_slot_once_and_sums_to_the_pool():
    kv = HybridKVManager(30, 4, (None, 3, 3))
    kv.allocate_slots([0, 1], [10, 3], [NewSequence(10, 13), NewSequence(3, 20)])
    kv.allocate_slots([0, 1], [1, 1])
    b = kv.breakdown()
    assert b.total == kv.num_slots == 120 and min(b.counts()) >= 0
    # seq 0 (11 tokens, query 10 reads 8..10): full 11 + each sliding group 3; seq 1 (4 tokens, query 3 reads 1..3):
    # full 4 + each sliding group 3, its position 0 dead (internal fragmentation)
    assert b.token_states == 11 + 2 * 3 + 4 + 2 * 3 and b.internal_fragmentation == 2 * 1 + 2 * 0 + 0
    assert sum(hi - lo for _, lo, hi, _ in kv.slot_segments()) == b.total - b.free
    kv.check_invariants()


def test_a_fork_shares_every_group_and_copies_the_shared_last_block_on_write():
    kv = HybridKVManager(20, 4, (None, 4))
    kv.allocate_slots([0], [6], [NewSequence(6, 12)])
    assert kv.fork(0, 1, 10) == []  # both sequences point at blocks 0, 1 (full) and 2, 3 (sliding)
    token_states = kv.breakdown().token_states
    assert token_states == 6 + 6  # shared blocks count once
    allocation = kv.allocate_slots([1], [1])  # query 6 reads 3..6: the child drops nothing (block 2 holds 3)
    assert sorted(allocation.copies) == [(1, 4), (3, 5)]  # both groups' partly filled last block, copy-on-write
    kv.allocate_slots([0], [2])  # the parent writes its own blocks 1 and 3 in place: the copies made them exclusive
    kv.allocate_slots([0], [1])  # query 8 reads 5..8: block 2 (0..3) leaves the parent's window, the child keeps it
    assert kv.group_tables(0) == [[0, 1, 6], [None, 3, 7]] and kv.group_tables(1) == [[0, 4], [2, 5]]
    kv.check_invariants()


def test_a_decode_run_equals_stepping_after_a_long_chunk_and_with_shared_blocks():
    kv = HybridKVManager(40, 2, (None, 3, 3), max_seq_len=64)
    kv.allocate_slots([0, 1], [12, 2], [NewSequence(12, 40), NewSequence(2, 40)])  # seq 0's first decode will free
    kv.fork(1, 2, 40)  # 5 blocks per sliding group at once (a long chunk); seq 2 shares seq 1's blocks
    kv.allocate_slots([2], [1])  # seq 2's first token opens blocks of its own; positions 0, 1 stay shared
    ids, k = [0, 1, 2], kv_runs(kv).max_decode_steps([[0, 1, 2]], 30)
    stepped = copy.deepcopy(kv)
    expected = [stepped.allocate_slots(ids, [1, 1, 1]) and stepped.breakdown().counts() for _ in range(k)]
    assert 0 < k < 30 and stepped.allocate_slots(ids, [1, 1, 1]) is None  # the run ends where memory does
    assert kv_runs(kv).advance_decodes([ids], k) == expected
    assert all(kv.group_tables(i) == stepped.group_tables(i) for i in ids)
    kv.check_invariants()


def test_out_of_memory_changes_nothing_and_refuses_with_the_frees_counted():
    kv = HybridKVManager(6, 2, (None, 2))
    kv.allocate_slots([0], [5], [NewSequence(5, 9)])  # 3 blocks per group: the pool is full
    assert kv.num_free_blocks == 0
    assert kv.allocate_slots([0], [1]) is not None  # position 5 fills block 2; query 5 reads 4, 5: 2 blocks freed
    before = kv.group_tables(0), kv.breakdown()
    assert kv.can_allocate_slots([0], [3]) is False and kv.allocate_slots([0], [3]) is None
    assert (kv.group_tables(0), kv.breakdown()) == before
    assert kv.check_request(4, 5, 1) is None  # 3 pages in each of 2 groups, as if prefilled in one chunk
    assert (
        kv.check_request(4, 9, 1) == "1 sequence(s) of final length 9 need 10 pages over 2 KV cache groups "
        "(allowed: <= 6 of 6)"
    )


# --- KV cache groups, pool sizes and bad configurations from the specs ---------------------------------------------
def test_gemma3_groups_follow_vllm_and_the_pool_has_the_bytes_of_the_paged_one():
    assert kv_cache_groups(get_model("gemma3-270m")) == (3, (None, 512, 512, 512, 512, 512))  # 3 full + 15 sliding
    assert kv_cache_groups(get_model("gemma3-27b")) == (10, (None,) + (1024,) * 6)  # 52 sliding: 8 padding layers
    model = get_model("gemma3-27b")  # a page: 16 tokens x 10 layers; the paged pool's block: 16 tokens x 62 layers
    assert pool_blocks(model, 45_856, 16) == 45_856 * 62 // 160
    kv = make_kv_manager("hybrid", 45_856, block_size=16, max_seq_len=model.max_seq_len, model=model)
    page_bytes = 16 * 10 * model.kv_bytes_per_token // 62
    assert kv.num_blocks * page_bytes <= 45_856 * model.kv_bytes_per_token < (kv.num_blocks + 1) * page_bytes


@pytest.mark.parametrize(
    "make, expected",
    [
        (
            lambda: make_kv_manager("hybrid", 1000, model=get_model("opt-13b")),
            "policy 'hybrid' needs a model that interleaves full and sliding-window attention, and opt-13b has 40 full",
        ),
        (lambda: make_kv_manager("hybrid", 1000), "policy 'hybrid' needs the model"),
        (
            lambda: ModelSpec("m", 6, 64, 1, 1, 64, 64, 10, 1, 512, sliding_window=512, sliding_window_pattern=6),
            "ModelSpec m: sliding_window 512 must be from 1 to less than the context of 512 tokens",
        ),
        (
            lambda: ModelSpec("m", 6, 64, 1, 1, 64, 64, 10, 1, 512, sliding_window=64),
            "ModelSpec m: give sliding_window and sliding_window_pattern together",
        ),
        (
            lambda: HybridKVManager(8, 4, (None, 64), max_seq_len=64),
            "windows: every sliding window must be from 1 to less",
        ),
        (lambda: HybridKVManager(8, 4, (16, None)), "windows: expected one per KV cache group, a full-attention group"),
    ],
)
def test_bad_configurations_get_one_line(make, expected):
    with pytest.raises(ValueError, match="^" + expected.replace("(", r"\(").replace(")", r"\)")) as err:
        make()
    assert "\n" not in str(err.value)


def test_the_roofline_reads_only_the_window_of_sliding_layers():
    model = get_model("gemma3-27b")
    cost = RooflineCostModel(model, "h100", block_size=16)
    all_full = RooflineCostModel(
        dataclasses.replace(model, sliding_window=None, sliding_window_pattern=None), "h100", block_size=16
    )
    for args in ((0, 8, 8 * 1000), (1500, 0, 1500), (0, 8, 8 * 1200)):  # inside the window everything is read
        assert cost.step_time(*args) == pytest.approx(all_full.step_time(*args), rel=1e-12) or args[2] > 8 * 1024
    assert cost.step_time(0, 8, 8 * 1200) < all_full.step_time(0, 8, 8 * 1200)
    long, longer = cost.step_time(0, 8, 8 * 60_000), cost.step_time(0, 8, 8 * 120_000)
    full_only = cost._full_read_s * 8 * 60_000
    assert longer - long == pytest.approx(full_only, rel=1e-9)  # past the window only the 10 full layers read more


# --- the scheduler's invariants, with what every group's slots hold ------------------------------------------------
class _GroupContents(props.Contents):
    """props.Contents (the full group, through the plan's block tables), plus every sliding group through the
    manager's group tables: each fed entry's queries must read their own tokens from the whole window."""

    kv: HybridKVManager | None = None  # the manager of the example being run (set by hybrid_systems)

    def execute(self, plan, accepted: dict[int, int] | None = None, sched: Scheduler | None = None) -> None:
        super().execute(plan, accepted, sched)  # copies (of any group's pages), then the full group's writes and reads
        fed, kv, bs = [e for e in plan.entries if e.num_new_tokens], self.kv, self.bs
        for g, window in enumerate(kv.windows):
            if window is None:
                continue
            for e in fed:  # (a verify entry's drafts as the base class writes them: accepted or not)
                table = kv.group_tables(e.seq_id)[g]
                for p in range(e.num_computed_tokens, e.num_computed_tokens + e.num_new_tokens):
                    self.gpu.setdefault(table[p // bs], [None] * bs)[p % bs] = self.label(e, p, accepted, sched)
            for e in fed:  # its queries read up to its last sampled token (the drafts after it are being verified)
                table = kv.group_tables(e.seq_id)[g]
                end = e.num_computed_tokens + e.num_new_tokens - e.num_draft_tokens
                lo = max(0, e.num_computed_tokens - window + 1)
                read = [None if table[p // bs] is None else self.gpu[table[p // bs]][p % bs] for p in range(lo, end)]
                assert read == self.history[e.seq_id][lo:end], f"seq {e.seq_id} reads K/V that is not its own"


@st.composite
def hybrid_systems(draw, manager=HybridKVManager):
    config = props.draw_config(draw, props.draw_mode(draw))
    windows = (None,) + (draw(st.integers(1, 40)),) * draw(st.integers(1, 2))
    kv = manager(
        draw(st.integers(30, 70)),
        props.BLOCK_SIZE,
        windows,
        watermark=draw(st.sampled_from([0.0, 0.05])),
        max_seq_len=64,
    )
    _GroupContents.kv = kv
    return Scheduler(kv, config)


_RUNS = dict(
    requests=props.workloads(),
    gaps=st.lists(st.integers(0, 3), min_size=10, max_size=10),
    seed=st.integers(0, 2**32 - 1),
)


def _run_invariants(sched, requests, gaps, seed) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(props, "Contents", _GroupContents)
        _invariants.hypothesis.inner_test(sched, requests, gaps, seed)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(sched=hybrid_systems(), **_RUNS)
def test_scheduler_invariants_hold_with_hybrid(sched, requests, gaps, seed):
    """The whole check of test_scheduler_properties (budgets, tables, queues, the full group's slots), and every
    sliding group's queries reading their own K/V over the whole window, on hybrid pools."""
    _run_invariants(sched, requests, gaps, seed)


def test_the_scheduler_invariants_catch_a_group_that_frees_inside_the_window():
    @settings(max_examples=150, deadline=None, derandomize=True, database=None, phases=[Phase.generate])
    @given(sched=hybrid_systems(_FreesInsideTheWindow), **_RUNS)
    def run(sched, requests, gaps, seed):
        _run_invariants(sched, requests, gaps, seed)

    with pytest.raises(AssertionError, match="reads K/V that is not its own"):
        run()


# --- whole runs: hybrid against the same model as all-full attention, in the same bytes ------------------------------
def test_hybrid_batches_more_long_requests_than_all_full_paged_in_the_same_bytes():
    common = dict(
        model="gemma3-270m",
        kv_slots=40_000,
        workload="fixed",
        prompt_len=6000,
        output_len=500,
        num_requests=40,
        rate=100.0,
    )
    paged, hybrid = (sim.run(policy=p, **common).summary for p in ("paged", "hybrid"))
    stepped = sim.run(policy="hybrid", jump=False, validate=True, **common).summary
    assert paged["num_finished"] == hybrid["num_finished"] == 40
    assert hybrid["num_kv_slots"] == pool_blocks(get_model("gemma3-270m"), 40_000, 16) * 16  # 6 groups: 6x the slots
    assert hybrid["mean_batch_size"] > 2.5 * paged["mean_batch_size"]
    assert hybrid["throughput_req_per_s"] > 2 * paged["throughput_req_per_s"]
    assert hybrid["num_preemptions"] < paged["num_preemptions"]
    for name in ("num_preemptions", "num_steps", "mean_batch_size"):
        assert hybrid[name] == stepped[name], name


def test_the_command_line_runs_hybrid_and_refuses_bad_combinations_in_one_line(capsys):
    assert main(["run", "--model", "gemma3-270m", "--policy", "hybrid", "--num-requests", "5", "--json"]) == 0
    assert '"policy": "hybrid"' in capsys.readouterr().out
    for argv, expected in (
        (["--policy", "hybrid"], "error: policy 'hybrid' needs a model that interleaves full and sliding-window"),
        (
            ["--model", "gemma3-270m", "--policy", "hybrid", "--preemption", "swap"],
            "error: --preemption swap: needs CPU swap space",
        ),
        (
            ["--model", "gemma3-270m", "--policy", "hybrid", "--prefix-caching", "on", "--prefix-len", "8"],
            "error: --prefix-caching on: --policy hybrid has no prefix cache",
        ),
    ):
        assert main(["run", *argv, "--num-requests", "5"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(expected) and err.count("\n") == 1, err
