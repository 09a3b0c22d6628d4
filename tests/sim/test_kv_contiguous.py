"""Contiguous KV managers (sim/kv/contiguous.py) through the KV contract: hand-computed breakdowns for every
reservation rule x allocator, out of memory, forks into runs reserved at admission, growth limits."""

from __future__ import annotations

import pytest

from sim.fast.runs import kv_runs
from sim.kv import MemoryBreakdown, NewSequence, make_kv_manager
from sim.kv.contiguous import ContiguousKVManager, next_power_of_two
from sim.testing.kv import make_kv_manager_test

RULES = ("max", "pow2", "oracle")
ALLOCATORS = ("buddy", "first_fit")


def _state(kv: ContiguousKVManager) -> tuple:
    return (kv.breakdown(), kv.allocator.free_runs(), kv.num_free_blocks)


def admit(kv, seq_id: int, prompt_len: int, final_len: int, forks: tuple[int, ...] = (), chunk: int | None = None):
    """The first allocate_slots of a sequence: its run (and its future siblings') reserved, `chunk` tokens in
    it (default: the whole prompt)."""
    count = prompt_len if chunk is None else chunk
    return kv.allocate_slots([seq_id], [count], [NewSequence(prompt_len, final_len, fork_final_lens=forks)])


# --- breakdowns ------------------------------------------------------------------------------------
# One sequence: prompt 5, true final length 12, holding 7 tokens; 64 token slots, block_size 1.
#   max (max_seq_len 24): R = 24;             buddy hands out 32, first-fit 24
#   pow2: output 7 -> 8, R = 5 + 8 = 13;      buddy 16, first-fit 13
#   oracle: R = 12;                           buddy 16, first-fit 12
# token_states = 7, reservation = 12 - 7 = 5, internal = R - 12, external = A - R, free = 64 - A.
@pytest.mark.parametrize(
    "rule, allocator, expected",
    [
        ("max", "buddy", (7, 5, 12, 8, 32)),
        ("max", "first_fit", (7, 5, 12, 0, 40)),
        ("pow2", "buddy", (7, 5, 1, 3, 48)),
        ("pow2", "first_fit", (7, 5, 1, 0, 51)),
        ("oracle", "buddy", (7, 5, 0, 4, 48)),
        ("oracle", "first_fit", (7, 5, 0, 0, 52)),
    ],
)
def test_breakdown_one_sequence(rule, allocator, expected):
    kv = ContiguousKVManager(64, 1, reserve=rule, allocator=allocator, max_seq_len=24)
    assert admit(kv, 0, prompt_len=5, final_len=12).copies == []
    assert kv.allocate_slots([0], [2]).copies == []  # 7 tokens now
    assert kv.breakdown() == MemoryBreakdown(*expected)
    assert kv.breakdown().total == kv.num_slots == 64
    waiting = kv.breakdown(waiting=True)  # free slots a waiting request cannot use count as external
    assert (waiting.external_fragmentation, waiting.free) == (expected[3] + expected[4], 0)
    kv.check_invariants()


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_breakdown_max_power_of_two_max_seq_len(allocator):
    # max_seq_len 32 is a power of two: both allocators hand out exactly 32, so no external slack
    kv = ContiguousKVManager(64, 1, reserve="max", allocator=allocator, max_seq_len=32)
    admit(kv, 0, 5, 12)
    kv.allocate_slots([0], [2])
    assert kv.breakdown() == MemoryBreakdown(7, 5, 20, 0, 32)


@pytest.mark.parametrize(
    "rule, allocator, blocks, external",
    [("pow2", "buddy", 4, 3), ("pow2", "first_fit", 4, 3), ("oracle", "buddy", 4, 4), ("oracle", "first_fit", 3, 0)],
)
def test_breakdown_block_rounding(rule, allocator, blocks, external):
    # block_size 4: pow2 R = 13 -> 4 blocks (16 slots); oracle R = 12 -> 3 blocks, buddy rounds to 4
    kv = ContiguousKVManager(16, 4, reserve=rule, allocator=allocator)
    admit(kv, 0, 5, 12)
    kv.allocate_slots([0], [2])
    assert kv.allocator.allocated_size(0) == blocks
    b = kv.breakdown()
    assert (b.token_states, b.reservation, b.external_fragmentation) == (7, 5, external)
    assert b.free == (16 - blocks) * 4 and b.total == 64
    assert kv.block_table(0) == [0, 1]  # 7 tokens fill 2 blocks: only the used prefix is listed


def test_pow2_rounds_output_up():
    assert [next_power_of_two(n) for n in (0, 1, 2, 3, 25, 32, 33)] == [0, 1, 2, 4, 32, 32, 64]
    kv = ContiguousKVManager(128, 1, reserve="pow2", allocator="first_fit")
    admit(kv, 0, prompt_len=10, final_len=35)  # output 25 -> 32: reserves 10 + 32 = 42
    assert kv.reserved_tokens(10, 35) == 42
    assert kv.breakdown() == MemoryBreakdown(10, 25, 7, 0, 128 - 42)


def test_group_reserves_one_run_per_sequence_and_forks_copy_the_prompt():
    """Deliberate change: the siblings' runs are reserved at the leader's admission (fork_final_lens) and filled by
    copies when they are forked; before, every sequence of the group was admitted and fed the prompt itself."""
    # Orca shares nothing: n = 3 samples of a 4-token prompt each reserve a run at admission (the leader's and,
    # waiting for their fork, its siblings'); only the leader computes the prompt
    kv = ContiguousKVManager(64, 1, reserve="oracle", allocator="first_fit")
    assert admit(kv, 7, 4, 6, forks=(10, 8)).copies == []
    assert kv.block_table(7) == [0, 1, 2, 3]
    assert kv.breakdown() == MemoryBreakdown(4, 2 + 10 + 8, 0, 0, 40)  # the siblings' runs: all reservation
    # once the prompt is computed, each sibling takes its run and the prompt's K/V is copied into it
    assert kv.fork(7, 8, 10) == [(0, 6), (1, 7), (2, 8), (3, 9)]
    assert kv.fork(7, 9, 8) == [(0, 16), (1, 17), (2, 18), (3, 19)]
    assert [kv.block_table(s) for s in (7, 8, 9)] == [[0, 1, 2, 3], [6, 7, 8, 9], [16, 17, 18, 19]]
    assert kv.breakdown() == MemoryBreakdown(12, 12, 0, 0, 40)
    kv.free(8)
    assert kv.breakdown() == MemoryBreakdown(8, 6, 0, 0, 50)
    kv.check_invariants()


def test_freeing_a_leader_before_its_fork_frees_the_reserved_runs():
    kv = ContiguousKVManager(64, 1, reserve="oracle", allocator="first_fit")
    admit(kv, 0, 10, 12, forks=(12, 12), chunk=4)  # preempted or aborted in the middle of its prompt
    assert kv.num_free_blocks == 64 - 36
    kv.free(0)
    assert kv.num_free_blocks == 64
    kv.check_invariants()


# --- out of memory ---------------------------------------------------------------------------------
@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_out_of_memory_changes_nothing(allocator):
    kv = ContiguousKVManager(40, 1, reserve="oracle", allocator=allocator)
    admit(kv, 0, 4, 16, forks=(16,))  # 32 of 40 slots
    kv.fork(0, 1, 16)
    before = _state(kv)
    # a leader of 8 with one sibling of 8: the first run would fit, the second not -> all or nothing
    new = [NewSequence(4, 8, fork_final_lens=(8,))]
    assert not kv.can_allocate_slots([2], [4], new)
    assert kv.allocate_slots([2], [4], new) is None
    assert _state(kv) == before
    assert kv.fork(0, 5, 16) is None
    assert _state(kv) == before
    kv.check_invariants()


def test_can_admit_sees_layout_not_just_free_count():
    # buddy over 24 slots = regions 16 + 8. Two sequences of 9 ask 18 <= 24 free slots, but each
    # needs a block of 16 and only one exists.
    kv = ContiguousKVManager(24, 1, reserve="oracle", allocator="buddy")
    assert kv.can_allocate_slots([0], [4], [NewSequence(4, 9, fork_final_lens=(4,))])  # 16 + 4
    assert not kv.can_allocate_slots([0], [4], [NewSequence(4, 9, fork_final_lens=(9,))])
    assert admit(kv, 0, 4, 9, forks=(9,)) is None
    assert kv.allocator.free_runs() == [(0, 16), (16, 8)]
    assert "do not fit the pool of 24 slots even when empty" in kv.check_request(4, 9, 2)


# --- growth and fork -------------------------------------------------------------------------------
@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_append_beyond_reservation_is_refused(allocator):
    kv = ContiguousKVManager(16, 1, reserve="oracle", allocator=allocator)
    admit(kv, 0, 5, 6)
    assert kv.allocate_slots([0], [1]).copies == []  # the 6th token fills the reservation
    before = _state(kv)
    assert not kv.can_allocate_slots([0], [1])
    assert kv.allocate_slots([0], [1]) is None  # a contiguous run cannot grow
    assert kv_runs(kv).max_decode_steps([[0]], 10) == 0
    assert _state(kv) == before and kv.num_tokens(0) == 6


def test_max_may_grow_past_final_len_within_reservation():
    # the engine's final_len is only max_tokens; tokens past it come out of internal fragmentation
    kv = ContiguousKVManager(16, 1, reserve="max", allocator="buddy", max_seq_len=8)
    admit(kv, 0, 5, 6)
    assert kv.allocate_slots([0], [2]).copies == []
    assert kv.breakdown() == MemoryBreakdown(7, 0, 1, 0, 8)
    assert kv.allocate_slots([0], [2]) is None  # 9 > max_seq_len 8


def test_a_bulk_decode_run_moves_reservation_then_internal_fragmentation():
    kv = ContiguousKVManager(16, 1, reserve="max", allocator="buddy", max_seq_len=8)
    admit(kv, 0, 5, 6)  # reservation: token 5; internal: tokens 6 and 7
    assert kv_runs(kv).max_decode_steps([[0]], 10) == 3
    assert kv_runs(kv).advance_decodes([[0]], 3) == [(6, 0, 2, 0, 8), (7, 0, 1, 0, 8), (8, 0, 0, 0, 8)]
    kv.check_invariants()


def test_fork_copies_the_parents_filled_blocks():
    kv = ContiguousKVManager(16, 4, reserve="oracle", allocator="first_fit")
    admit(kv, 0, 5, 12)  # 3 blocks: 0, 1, 2
    kv.allocate_slots([0], [2])  # 7 tokens in blocks 0 and 1
    # fork (a beam): no run was reserved for it, so the child reserves its own (final 14 -> 4 blocks: 3..6) and
    # gets the parent's two filled blocks copied into its first two
    assert kv.fork(0, 1, 14) == [(0, 3), (1, 4)]
    assert kv.block_table(1) == [3, 4] and kv.num_tokens(1) == 7
    assert kv.breakdown() == MemoryBreakdown(14, 12, 0, 2, 64 - 28)  # external: block rounding 14 -> 16
    kv.check_invariants()


# --- protocol odds and ends ------------------------------------------------------------------------
def test_no_swap_space():
    kv = ContiguousKVManager(16, 1, reserve="oracle", allocator="buddy")
    admit(kv, 0, 4, 8)
    assert kv.num_cpu_blocks == 0 and kv.get_computed_tokens(list(range(4)), 4) == 0
    assert not kv.can_swap_out([0]) and kv.swap_out([0]) is None
    assert not kv.can_swap_in([0], [1]) and kv.swap_in([0]) is None and not kv.is_swapped(0)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="reserve"):
        ContiguousKVManager(16, 1, reserve="paged")
    with pytest.raises(ValueError, match="allocator"):
        ContiguousKVManager(16, 1, allocator="best_fit")
    kv = ContiguousKVManager(64, 1, reserve="max", max_seq_len=32)
    with pytest.raises(ValueError, match="max_seq_len"):
        kv.can_allocate_slots([0], [5], [NewSequence(5, 40)])
    assert "exceeds max_seq_len 32" in kv.check_request(5, 40, 1)
    with pytest.raises(ValueError, match="final_len"):
        NewSequence(5, 4)
    admit(kv, 0, 5, 10)
    with pytest.raises(ValueError, match="already"):
        admit(kv, 0, 5, 10)
    with pytest.raises(ValueError, match="prefix cache"):
        kv.allocate_slots([1], [1], [NewSequence(5, 10, list(range(5)), num_cached_tokens=4)])
    with pytest.raises(KeyError):
        kv.free(3)


@pytest.mark.parametrize("rule", RULES)
def test_make_kv_manager_builds_contiguous(rule):
    kv = make_kv_manager(rule, 64, block_size=1, allocator="first_fit", max_seq_len=32)
    assert isinstance(kv, ContiguousKVManager) and kv.policy == rule and kv.num_slots == 64


# --- the generic KV manager state machine, for every rule x allocator ------------------------------
# 20 blocks of 2 tokens (40 slots, not a power of two: buddy gets regions of 16 and 4 blocks), and
# max_seq_len 24, so a `max` reservation is 12 blocks (16 under buddy): memory runs out often.
# Marked slow: six machines of 500 examples take ~50 s of CPU on the 2-core machine, almost all of it
# inside hypothesis itself.
def _machine(rule: str, allocator: str) -> type:
    factory = lambda: ContiguousKVManager(20, 2, reserve=rule, allocator=allocator, max_seq_len=24)  # noqa: E731
    return pytest.mark.slow(make_kv_manager_test(factory, max_examples=500))


TestMaxBuddyMachine = _machine("max", "buddy")
TestMaxFirstFitMachine = _machine("max", "first_fit")
TestPow2BuddyMachine = _machine("pow2", "buddy")
TestPow2FirstFitMachine = _machine("pow2", "first_fit")
TestOracleBuddyMachine = _machine("oracle", "buddy")
TestOracleFirstFitMachine = _machine("oracle", "first_fit")


def test_pool_blocks_for_asks_each_policy_what_one_request_needs():
    from sim.kv import pool_blocks_for

    # paged: 2 sequences of final length 20 in blocks of 4 -> 2 x 5 = 10 blocks -> the next power of two, 16
    assert pool_blocks_for("paged", 10, 20, 2, block_size=4) == 16
    # max reserves max_seq_len (64 tokens = 16 blocks) whatever the request
    assert pool_blocks_for("max", 10, 20, 1, block_size=4, max_seq_len=64) == 16
    # oracle, token-granular: 3 runs of 12 -> the buddy hands out 16 each; 32 slots hold two, 64 hold three
    assert pool_blocks_for("oracle", 4, 12, 3, block_size=1) == 64
    with pytest.raises(ValueError, match="no pool serves"):
        pool_blocks_for("max", 10, 100, 1, block_size=4, max_seq_len=64)
