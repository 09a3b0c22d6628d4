"""VAttentionKVManager (sim/kv/vattention.py): the KV state machine on small pools (and broken variants it catches),
the accounting narrated, page sizes in bytes and their errors, forks that copy, decode runs, the scheduler's
invariants, and whole runs through sim.run and the command line."""

from __future__ import annotations

import copy

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import sim
from sim.base.specs import get_model
from sim.drivers.cli import main
from sim.fast.runs import kv_runs
from sim.fast.vattention import VAttentionRuns
from sim.kv import MemoryBreakdown, NewSequence, pool_blocks_for
from sim.kv.vattention import VAttentionKVManager, page_tokens
from sim.scheduling.scheduler import Scheduler
from sim.testing import make_kv_manager_test
from tests.sim.test_scheduler_properties import draw_config, draw_mode, workloads
from tests.sim.test_scheduler_properties import test_scheduler_invariants_hold_after_every_step as _invariants

# --- the KV state machine: small pools, so memory runs out often ------------------------------------------------
TestVAttention = make_kv_manager_test(lambda: VAttentionKVManager(8, 4, max_seq_len=32))
TestVAttention = pytest.mark.slow(TestVAttention)  # hundreds of programs: `make test` only (tests/conftest.py)
TestVAttentionOneTokenPages = make_kv_manager_test(lambda: VAttentionKVManager(24, 1, max_seq_len=24), max_examples=300)
TestVAttentionOneTokenPages = pytest.mark.slow(
    TestVAttentionOneTokenPages
)  # hundreds of programs: `make test` only (tests/conftest.py)
TestVAttentionWatermark = make_kv_manager_test(
    lambda: VAttentionKVManager(12, 2, watermark=0.2, max_seq_len=20), max_examples=200
)
TestVAttentionWatermark = pytest.mark.slow(
    TestVAttentionWatermark
)  # hundreds of programs: `make test` only (tests/conftest.py)


class _RunsIgnoreSiblings(VAttentionRuns):
    """Broken on purpose: a decode run forgets that a sequence maps a page for each sibling not forked yet."""

    def max_decode_steps(self, seq_groups, limit, waiting=False):
        from sim.fast.vattention import run_capacity

        seqs = [(self.kv.num_tokens(i), 1) for ids in seq_groups for i in ids]
        return min(limit, run_capacity(seqs, self.kv.block_size, self.kv.num_free_blocks)) if seqs else limit


class _GrowthForgetsSiblings(VAttentionKVManager):
    """Broken on purpose: a growing leader maps no pages for its siblings (and its own invariant check is off, so
    only the contract's checks can see it)."""

    def _map(self, seq, k):
        siblings, seq.siblings = seq.siblings, ([] if seq.pages else seq.siblings)
        super()._map(seq, k)
        seq.siblings = siblings

    def check_invariants(self):
        pass


@pytest.mark.parametrize(
    "make_test",
    [
        lambda: make_kv_manager_test(
            lambda: VAttentionKVManager(12, 2, max_seq_len=24), max_examples=300, runs=_RunsIgnoreSiblings
        ),
        lambda: make_kv_manager_test(lambda: _GrowthForgetsSiblings(8, 4, max_seq_len=32), max_examples=300),
    ],
    ids=["run-ignores-siblings", "growth-forgets-siblings"],
)
def test_the_machine_catches_broken_vattention(make_test):
    test_case = make_test()
    test_case.settings = settings(test_case.settings, phases=[Phase.generate], report_multiple_bugs=False)
    with pytest.raises(AssertionError):
        test_case("runTest").runTest()


# --- the accounting ---------------------------------------------------------------------------------------------
def test_a_sequence_maps_pages_as_it_grows_and_wastes_only_its_last_page_tail():
    kv = VAttentionKVManager(8, 64, max_seq_len=2048)  # 8 physical pages of 64 tokens
    # admitted with a 50-token prompt, final length 100: one page mapped, 14 of its slots will be filled later
    kv.allocate_slots([0], [50], [NewSequence(50, 100)])
    assert kv.block_table(0) == [0]
    assert kv.breakdown() == MemoryBreakdown(50, 14, 0, 0, 7 * 64)
    # token 64 maps the second page: slots 65..99 are reservation, 100..127 past the final length
    kv.allocate_slots([0], [15])
    assert kv.block_table(0) == [0, 1]
    assert kv.breakdown() == MemoryBreakdown(65, 35, 28, 0, 6 * 64)
    kv.allocate_slots([0], [35])
    assert kv.breakdown() == MemoryBreakdown(100, 0, 28, 0, 6 * 64)
    # its virtual range holds 2048 tokens; the 1920 unmapped ones cost nothing: the pool still adds up to 512 slots
    assert len(kv.virtual_range(0)) == 2048 and kv.breakdown().total == 512
    assert kv.slot_segments() == [(0, 0, 64, 0), (0, 64, 100, 0), (0, 100, 128, 2)]
    # while a request waits, free slots it cannot use are external waste (the contract's rule), nothing else
    assert kv.breakdown(waiting=True) == MemoryBreakdown(100, 0, 28, 6 * 64, 0)
    kv.free(0)
    assert kv.breakdown() == MemoryBreakdown(0, 0, 0, 0, 512) and kv.num_free_blocks == 8
    kv.check_invariants()


def test_requests_get_distinct_virtual_ranges_and_reuse_released_ones():
    kv = VAttentionKVManager(8, 4, max_seq_len=16)
    for seq_id in range(3):
        kv.allocate_slots([seq_id], [1], [NewSequence(1, 4)])
    assert [kv.virtual_range(i) for i in range(3)] == [range(0, 16), range(16, 32), range(32, 48)]
    kv.free(1)
    kv.allocate_slots([7], [1], [NewSequence(1, 4)])
    assert kv.virtual_range(7) == range(16, 32)  # the lowest released request slot
    kv.check_invariants()


def test_out_of_memory_changes_nothing_and_the_watermark_holds_admissions():
    kv = VAttentionKVManager(10, 4, watermark=0.2, max_seq_len=64)  # 2 pages kept free at admission
    assert kv.allocate_slots([0], [32], [NewSequence(32, 40)]) is not None  # 8 pages, 2 left
    assert not kv.can_allocate_slots([1], [1], [NewSequence(1, 4)])  # would leave 1 < 2 free
    assert kv.allocate_slots([1], [1], [NewSequence(1, 4)]) is None
    assert kv.allocate_slots([0], [8]).copies == []  # growth may use the watermark's pages
    before = (kv.block_table(0), kv.num_free_blocks, kv.breakdown())
    assert kv.allocate_slots([0], [1]) is None  # the next page: none left
    assert (kv.block_table(0), kv.num_free_blocks, kv.breakdown()) == before
    assert (
        kv.check_request(1, 41, 1) == "1 sequence(s) of final length 41 need 11 pages of 4 tokens (allowed: <= 8 of 10)"
    )
    assert "virtual range" in kv.check_request(1, 65, 1)


# --- forks copy -------------------------------------------------------------------------------------------------
def test_a_fork_copies_the_parents_pages_into_pages_of_its_own():
    kv = VAttentionKVManager(8, 4, max_seq_len=32)
    kv.allocate_slots([0], [10], [NewSequence(10, 12)])  # pages [0, 1, 2]
    # a beam fork (not declared at admission): fresh pages, and the executor copies page i into page i
    assert kv.fork(0, 1, 12) == [(0, 3), (1, 4), (2, 5)]
    assert kv.block_table(1) == [3, 4, 5] and kv.num_tokens(1) == 10
    # nothing is shared: both write their next token in place, no copy-on-write
    assert kv.allocate_slots([0, 1], [1, 1]).copies == []
    assert kv.breakdown() == MemoryBreakdown(22, 2, 0, 0, 2 * 4)
    # a third copy needs 3 pages, 2 are free: refused, nothing changed
    assert kv.fork(0, 2, 12) is None and kv.seq_ids == [0, 1] and kv.num_free_blocks == 2
    kv.check_invariants()


def test_declared_siblings_map_pages_beside_their_leader_so_their_fork_never_fails():
    kv = VAttentionKVManager(6, 4, max_seq_len=32)
    # n = 3 with a 6-token prompt computed in chunks: each chunk maps a page for the leader and one per sibling
    kv.allocate_slots([0], [3], [NewSequence(6, 9, fork_final_lens=(7, 12))])
    assert kv.block_table(0) == [0] and kv.num_free_blocks == 3  # pages 1 and 2 are the siblings'
    assert kv.breakdown() == MemoryBreakdown(3, 1 + 4 + 4, 0, 0, 12)
    kv.allocate_slots([0], [3])
    assert kv.block_table(0) == [0, 3] and kv.num_free_blocks == 0
    # the siblings' pages: reservation up to their final lengths 7 and 12, the rest internal fragmentation
    assert kv.breakdown() == MemoryBreakdown(6, 2 + 7 + 8, 0 + 1 + 0, 0, 0)
    assert kv.fork(0, 1, 12) == [(0, 2), (3, 5)]  # the pool is full, but the pages were mapped for it
    assert kv.fork(0, 2, 7) == [(0, 1), (3, 4)]
    # each child holds the parent's 6 tokens (the copies land before the next step reads them)
    assert kv.breakdown() == MemoryBreakdown(18, 2 + 2 + 1, 0 + 0 + 1, 0, 0)
    kv.check_invariants()


# --- page sizes: bytes per layer per K/V buffer -----------------------------------------------------------------
@pytest.mark.parametrize(
    "model, num_gpus, page_kib, tokens",
    [
        ("opt-13b", 1, 40, 4),
        ("opt-13b", 1, 640, 64),
        ("opt-13b", 1, 2560, 256),
        ("opt-13b", 1, None, 7),
        ("opt-13b", 2, 80, 16),
        ("llama-13b", 1, 1280, 128),
        ("opt-66b", 4, 9, 2),
        ("opt-66b", 4, 2304, 512),
        ("opt-175b", 8, 3072, 1024),
        ("smollm2-135m", 1, 3, 8),
        ("smollm2-135m", 1, 96, 256),
        ("smollm2-135m", 1, None, 171),
        ("smollm2-135m", 1, 0.375, 1),
    ],
)
def test_page_bytes_become_tokens_with_the_models_per_token_bytes(model, num_gpus, page_kib, tokens):
    assert page_tokens(get_model(model), num_gpus, page_kib) == tokens


@pytest.mark.parametrize(
    "model, num_gpus, page_kib, allowed",
    [
        (
            "opt-13b",
            1,
            64,
            "a multiple of 10 KiB, one token's K or V in one layer on each of 1 GPU(s), e.g. 10 KiB = 1 "
            "token, 640 KiB = 64 tokens, 2560 KiB = 256 tokens",
        ),
        ("opt-13b", 1, 2048, "a multiple of 10 KiB"),
        ("opt-13b", 1, 5, "a multiple of 10 KiB"),
        ("opt-175b", 8, 2048, "a multiple of 3 KiB"),
        (
            "smollm2-135m",
            1,
            64,
            "a multiple of 0.375 KiB, one token's K or V in one layer on each of 1 GPU(s), e.g. "
            "3 KiB = 8 tokens, 24 KiB = 64 tokens, 96 KiB = 256 tokens",
        ),
    ],
)
def test_a_page_of_no_whole_number_of_tokens_is_refused_in_one_line(model, num_gpus, page_kib, allowed):
    with pytest.raises(ValueError) as err:
        page_tokens(get_model(model), num_gpus, page_kib)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"page_kib: {page_kib:g} KiB is not a whole number of {model}")
    assert f"(allowed: {allowed}" in message


# --- decode runs: the fast-forward equals stepping -------------------------------------------------------------
def test_a_decode_run_equals_stepping_with_siblings_and_past_final_lengths():
    kv = VAttentionKVManager(40, 4, max_seq_len=64)
    kv.allocate_slots([0], [5], [NewSequence(5, 9, fork_final_lens=(30,))])  # one sibling waits: 2 pages per page
    kv.allocate_slots([1], [8], [NewSequence(8, 10)])  # writes past its final length after 2 steps
    kv.allocate_slots([2], [1], [NewSequence(1, 40)])
    steps = kv_runs(kv).max_decode_steps([[0, 1, 2]], 100)
    stepped, expected = copy.deepcopy(kv), []
    for _ in range(steps):
        assert stepped.allocate_slots([0, 1, 2], [1, 1, 1]).copies == []
        expected.append(stepped.breakdown().counts())
    assert stepped.allocate_slots([0, 1, 2], [1, 1, 1]) is None  # the run stops exactly where memory does
    assert kv_runs(kv).advance_decodes([[0, 1, 2]], steps) == expected
    assert [kv.block_table(i) for i in range(3)] == [stepped.block_table(i) for i in range(3)]
    assert kv.breakdown() == stepped.breakdown()
    kv.check_invariants()


# --- the scheduler's invariants, as tests/sim/test_scheduler_properties.py checks them for the other policies -----
@st.composite
def vattention_systems(draw, manager=VAttentionKVManager):
    config = draw_config(draw, draw_mode(draw))
    page = draw(st.sampled_from([1, 4, 8]))
    kv = manager(draw(st.integers(48, 112)) // page, page, watermark=draw(st.sampled_from([0.0, 0.05])), max_seq_len=64)
    return Scheduler(kv, config)


_RUNS = dict(
    requests=workloads(), gaps=st.lists(st.integers(0, 3), min_size=10, max_size=10), seed=st.integers(0, 2**32 - 1)
)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(sched=vattention_systems(), **_RUNS)
def test_scheduler_invariants_hold_with_vattention(sched, requests, gaps, seed):
    """Budgets, block tables covering exactly the computed tokens, queues, and a model of what every slot holds
    (fork copies included): the whole check of test_scheduler_properties, on vattention pools."""
    _invariants.hypothesis.inner_test(sched, requests, gaps, seed)


class _ForkForgetsItsCopies(VAttentionKVManager):
    """Broken on purpose: a fork maps the child's pages but asks for no copy, so the child reads pages never filled."""

    def fork(self, parent_id, child_id, final_len):
        copies = super().fork(parent_id, child_id, final_len)
        return None if copies is None else []


def test_the_scheduler_invariants_catch_a_fork_that_forgets_its_copies():
    @settings(max_examples=200, deadline=None, derandomize=True, database=None, phases=[Phase.generate])
    @given(sched=vattention_systems(_ForkForgetsItsCopies), **_RUNS)
    def run(sched, requests, gaps, seed):
        _invariants.hypothesis.inner_test(sched, requests, gaps, seed)

    with pytest.raises(AssertionError, match="reads K/V that is not its own"):
        run()


# --- whole runs -------------------------------------------------------------------------------------------------
def test_sim_run_finishes_every_request_with_preemptions_forks_and_beams():
    common = dict(
        policy="vattention",
        workload="uniform",
        num_requests=40,
        rate=20.0,
        prompt_len_range=(2, 200),
        output_len_range=(1, 200),
        kv_slots=1200,
        validate=True,
        seed=3,
    )
    for extra in ({}, {"n": 2}, {"beam_width": 2, "scheduler": "v0"}):
        jumped = sim.run(**common, **extra)
        stepped = sim.run(**common, **extra, jump=False)
        s = jumped.summary
        assert s["num_finished"] == s["num_requests"] == 40 and s["num_preemptions"] > 0, extra
        assert s["block_size"] == 7 and s["page_kib"] == 70.0  # OPT-13B's default page: 7 tokens of 10 KiB
        assert s["enable_prefix_caching"] is False
        for name in ("num_preemptions", "num_steps", "mean_batch_size"):
            assert s[name] == stepped.summary[name], name
        # 1e-9: time-weighted shares, the same integer counts summed in another order (docs/ARCHITECTURE.md)
        assert s["memory"] == pytest.approx(stepped.summary["memory"], abs=1e-9)


def test_the_page_size_moves_vattention_from_paging_toward_reservation():
    """The same trace at growing pages: more of the memory in use is the tail of last pages (internal
    fragmentation); small pages keep the pool as paging does, a page of a whole context batches as Orca (Max)."""
    common = dict(workload="sharegpt", num_requests=60, rate=2.0, seed=1)
    runs = {}
    for page_kib in (40, 640, 5120, 20480):  # 4, 64, 512 and 2048 tokens of OPT-13B
        runs[page_kib] = s = sim.run(policy="vattention", page_kib=page_kib, **common).summary
        assert s["num_finished"] == 60 and s["block_size"] == page_kib // 10
    waste = [runs[kib]["memory_busy"]["internal_fragmentation"] for kib in (40, 640, 5120, 20480)]
    assert waste == sorted(waste) and len(set(waste)) == 4 and waste[-1] > 0.5
    paged = sim.run(policy="paged", block_size=4, **common).summary
    assert runs[40]["memory_busy"] == pytest.approx(paged["memory_busy"], abs=0.005)  # as 4-token blocks
    # 2048-token pages: 7 of them in OPT-13B's pool, one per request, as Max's 7 runs of 2048 slots
    assert runs[20480]["mean_batch_size"] == sim.run(policy="max", **common).summary["mean_batch_size"]


def test_a_pool_sized_for_one_request_through_the_contract():
    assert pool_blocks_for("vattention", 10, 100, block_size=64) == 2  # ceil(100 / 64) pages


def test_the_command_line_runs_vattention_and_refuses_bad_pages_in_one_line(capsys):
    assert main(["run", "--policy", "vattention", "--page-kib", "640", "--num-requests", "5", "--json"]) == 0
    assert '"page_kib": 640.0' in capsys.readouterr().out
    for argv, expected in (
        (["--policy", "vattention", "--page-kib", "64"], "error: page_kib: 64 KiB is not a whole number of opt-13b"),
        (["--page-kib", "640"], "error: --page-kib 640: applies to --policy vattention only, not --policy paged"),
        (["--policy", "vattention", "--block-size", "16"], "error: --block-size 16: --policy vattention maps pages"),
        (["--policy", "vattention", "--preemption", "swap"], "error: --preemption swap: needs CPU swap space"),
        (
            ["--policy", "vattention", "--prefix-caching", "on", "--prefix-len", "8"],
            "error: --prefix-caching on: --policy vattention has no prefix cache",
        ),
    ):
        assert main(["run", *argv, "--num-requests", "5"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(expected) and err.count("\n") == 1, err
