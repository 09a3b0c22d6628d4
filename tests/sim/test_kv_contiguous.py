"""Contiguous KV managers (sim/kv/contiguous.py): hand-computed breakdowns for every reservation
rule x allocator, out of memory, fork and growth limits."""
from __future__ import annotations

import pytest

from sim.kv import MemoryBreakdown, make_kv_manager
from sim.kv.contiguous import ContiguousKVManager, next_power_of_two
from sim.testing.kv import make_kv_manager_test

RULES = ("max", "pow2", "oracle")
ALLOCATORS = ("buddy", "first_fit")


def _state(kv: ContiguousKVManager) -> tuple:
    return (kv.breakdown(), kv.allocator.free_runs(), kv.num_free_blocks)


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
    assert kv.admit([0], prompt_len=5, final_lens=[12]) == 0
    assert kv.append_slots(0, 2) == []  # 7 tokens now
    assert kv.breakdown() == MemoryBreakdown(*expected)
    assert kv.breakdown().total == kv.num_slots == 64
    waiting = kv.breakdown(waiting=True)  # free slots a waiting request cannot use count as external
    assert (waiting.external_fragmentation, waiting.free) == (expected[3] + expected[4], 0)
    kv.check_invariants()


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_breakdown_max_power_of_two_max_seq_len(allocator):
    # max_seq_len 32 is a power of two: both allocators hand out exactly 32, so no external slack
    kv = ContiguousKVManager(64, 1, reserve="max", allocator=allocator, max_seq_len=32)
    kv.admit([0], 5, [12])
    kv.append_slots(0, 2)
    assert kv.breakdown() == MemoryBreakdown(7, 5, 20, 0, 32)


@pytest.mark.parametrize(
    "rule, allocator, blocks, external",
    [("pow2", "buddy", 4, 3), ("pow2", "first_fit", 4, 3), ("oracle", "buddy", 4, 4), ("oracle", "first_fit", 3, 0)],
)
def test_breakdown_block_rounding(rule, allocator, blocks, external):
    # block_size 4: pow2 R = 13 -> 4 blocks (16 slots); oracle R = 12 -> 3 blocks, buddy rounds to 4
    kv = ContiguousKVManager(16, 4, reserve=rule, allocator=allocator)
    kv.admit([0], 5, [12])
    kv.append_slots(0, 2)
    assert kv.allocator.allocated_size(0) == blocks
    b = kv.breakdown()
    assert (b.token_states, b.reservation, b.external_fragmentation) == (7, 5, external)
    assert b.free == (16 - blocks) * 4 and b.total == 64
    assert kv.block_table(0) == [0, 1]  # 7 tokens fill 2 blocks: only the used prefix is listed


def test_pow2_rounds_output_up():
    assert [next_power_of_two(n) for n in (0, 1, 2, 3, 25, 32, 33)] == [0, 1, 2, 4, 32, 32, 64]
    kv = ContiguousKVManager(128, 1, reserve="pow2", allocator="first_fit")
    kv.admit([0], prompt_len=10, final_lens=[35])  # output 25 -> 32: reserves 10 + 32 = 42
    assert kv.reserved_tokens(10, 35) == 42
    assert kv.breakdown() == MemoryBreakdown(10, 25, 7, 0, 128 - 42)


def test_group_reserves_one_run_per_sequence():
    # Orca shares nothing: n = 3 samples of a 4-token prompt each reserve (and hold) the prompt
    kv = ContiguousKVManager(64, 1, reserve="oracle", allocator="first_fit")
    assert kv.admit([7, 8, 9], 4, [6, 10, 8]) == 0
    assert [kv.block_table(s) for s in (7, 8, 9)] == [[0, 1, 2, 3], [6, 7, 8, 9], [16, 17, 18, 19]]
    assert kv.breakdown() == MemoryBreakdown(12, 12, 0, 0, 40)
    kv.free(8)
    assert kv.breakdown() == MemoryBreakdown(8, 6, 0, 0, 50)
    kv.check_invariants()


# --- out of memory ---------------------------------------------------------------------------------
@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_out_of_memory_changes_nothing(allocator):
    kv = ContiguousKVManager(40, 1, reserve="oracle", allocator=allocator)
    assert kv.admit([0, 1], 4, [16, 16]) == 0  # 32 of 40 slots
    before = _state(kv)
    # two more sequences of 8: the first would fit, the second not -> all or nothing
    assert not kv.can_admit(4, [8, 8])
    assert kv.admit([2, 3], 4, [8, 8]) is None
    assert _state(kv) == before
    assert kv.fork(0, 5, 16) is None
    assert _state(kv) == before
    kv.check_invariants()


def test_can_admit_sees_layout_not_just_free_count():
    # buddy over 24 slots = regions 16 + 8. Two sequences of 9 ask 18 <= 24 free slots, but each
    # needs a block of 16 and only one exists.
    kv = ContiguousKVManager(24, 1, reserve="oracle", allocator="buddy")
    assert kv.can_admit(4, [9, 4])  # 16 + 4
    assert not kv.can_admit(4, [9, 9])
    assert kv.admit([0, 1], 4, [9, 9]) is None
    assert kv.allocator.free_runs() == [(0, 16), (16, 8)]


# --- growth and fork -------------------------------------------------------------------------------
@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_append_beyond_reservation_is_refused(allocator):
    kv = ContiguousKVManager(16, 1, reserve="oracle", allocator=allocator)
    kv.admit([0], 5, [6])
    assert kv.append_slots(0) == []  # the 6th token fills the reservation
    before = _state(kv)
    assert not kv.can_append(0)
    assert kv.append_slots(0) is None  # a contiguous run cannot grow
    assert _state(kv) == before and kv.num_tokens(0) == 6


def test_max_may_grow_past_final_len_within_reservation():
    # the engine's final_len is only max_tokens; tokens past it come out of internal fragmentation
    kv = ContiguousKVManager(16, 1, reserve="max", allocator="buddy", max_seq_len=8)
    kv.admit([0], 5, [6])
    assert kv.append_slots(0, 2) == []
    assert kv.breakdown() == MemoryBreakdown(7, 0, 1, 0, 8)
    assert kv.append_slots(0, 2) is None  # 9 > max_seq_len 8


def test_fork_copies_the_parents_filled_blocks():
    kv = ContiguousKVManager(16, 4, reserve="oracle", allocator="first_fit")
    kv.admit([0], 5, [12])  # 3 blocks: 0, 1, 2
    kv.append_slots(0, 2)  # 7 tokens in blocks 0 and 1
    # fork: the child reserves its own run (final 14 -> 4 blocks: 3..6) and gets the parent's
    # two filled blocks copied into its first two
    assert kv.fork(0, 1, 14) == [(0, 3), (1, 4)]
    assert kv.block_table(1) == [3, 4] and kv.num_tokens(1) == 7
    assert kv.breakdown() == MemoryBreakdown(14, 12, 0, 2, 64 - 28)  # external: block rounding 14 -> 16
    kv.check_invariants()


# --- protocol odds and ends ------------------------------------------------------------------------
def test_no_swap_space():
    kv = ContiguousKVManager(16, 1, reserve="oracle", allocator="buddy")
    kv.admit([0], 4, [8])
    assert not kv.can_swap_out([0]) and kv.swap_out([0]) is None
    assert not kv.can_swap_in([0]) and kv.swap_in([0]) is None and not kv.is_swapped(0)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="reserve"):
        ContiguousKVManager(16, 1, reserve="paged")
    with pytest.raises(ValueError, match="allocator"):
        ContiguousKVManager(16, 1, allocator="best_fit")
    kv = ContiguousKVManager(64, 1, reserve="max", max_seq_len=32)
    with pytest.raises(ValueError, match="max_seq_len"):
        kv.can_admit(5, [40])
    with pytest.raises(ValueError, match="final_len"):
        kv.admit([0], 5, [4])
    kv.admit([0], 5, [10])
    with pytest.raises(ValueError, match="already live"):
        kv.admit([0], 5, [10])
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
