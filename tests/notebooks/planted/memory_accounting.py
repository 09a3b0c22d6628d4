"""The memory-accounting lab's solution with one rule broken (tests/notebooks/test_grader.py grades each)."""

from __future__ import annotations

NAMES = ("token_states", "reservation", "internal_fragmentation", "external_fragmentation", "free")


def counts_shared_blocks_per_owner(base):
    class CountsSharedBlocksPerOwner(base):
        def paged(self, block_size, num_blocks, seqs, waiting=False):  # adds up each owner's blocks: shared ones again
            total = dict.fromkeys(NAMES, 0)
            for table, num_tokens, final_len in seqs:
                one = base.paged(self, block_size, len(table), [(table, num_tokens, final_len)])
                total = {name: total[name] + one[name] for name in NAMES}
            idle = (num_blocks - sum(len(table) for table, _, _ in seqs)) * block_size
            total["external_fragmentation" if waiting else "free"] = idle
            return total

    return CountsSharedBlocksPerOwner


def last_owner_reach_wins(base):
    class LastOwnerReachWins(base):
        def paged(self, block_size, num_blocks, seqs, waiting=False):  # a shared block reaches as far as its LAST
            fill = {}  # owner in the list says, not its furthest one
            for table, num_tokens, final_len in seqs:
                for i, block in enumerate(table):
                    filled = min(block_size, num_tokens - i * block_size)
                    fill[block] = (filled, max(filled, min(block_size, final_len - i * block_size)))
            free = (num_blocks - len(fill)) * block_size
            counts = (
                sum(f for f, _ in fill.values()),
                sum(r - f for f, r in fill.values()),
                sum(block_size - r for _, r in fill.values()),
                free if waiting else 0,
                0 if waiting else free,
            )
            return dict(zip(NAMES, counts))

    return LastOwnerReachWins


def ignores_waiting(base):
    class IgnoresWaiting(base):
        def paged(self, block_size, num_blocks, seqs, waiting=False):  # free slots stay free while a request waits
            return base.paged(self, block_size, num_blocks, seqs, False)

    return IgnoresWaiting


def _contiguous(num_slots, seqs, waiting, reserved_of):
    """A contiguous breakdown over a buddy allocator, with the reservation rule `reserved_of(prompt, final)`."""
    tokens = reservation = internal = external = used = 0
    for prompt_len, num_tokens, final_len in seqs:
        reserved = reserved_of(prompt_len, final_len)
        run = 1 << (reserved - 1).bit_length()
        tokens, reservation = tokens + num_tokens, reservation + final_len - num_tokens
        internal, external, used = internal + reserved - final_len, external + run - reserved, used + run
    free = num_slots - used
    return dict(zip(NAMES, (tokens, reservation, internal, external + free * waiting, free * (not waiting))))


def pow2_rounds_the_whole_length(base):
    class Pow2RoundsTheWholeLength(base):
        def contiguous(self, num_slots, reserve, max_seq_len, seqs, waiting=False):
            if reserve != "pow2":
                return base.contiguous(self, num_slots, reserve, max_seq_len, seqs, waiting)
            # rounds prompt + output up to a power of two (7 + 25 -> 32), not the output alone (7 + 32)
            return _contiguous(num_slots, seqs, waiting, lambda p, f: 1 << (f - 1).bit_length())

    return Pow2RoundsTheWholeLength


def pow2_empty_output_reserves_two(base):
    class Pow2EmptyOutputReservesTwo(base):
        def contiguous(self, num_slots, reserve, max_seq_len, seqs, waiting=False):
            if reserve != "pow2":
                return base.contiguous(self, num_slots, reserve, max_seq_len, seqs, waiting)
            # 1 << (output - 1).bit_length() without the special case: an output of 0 "rounds up" to 2 slots
            return _contiguous(num_slots, seqs, waiting, lambda p, f: p + (1 << (f - p - 1).bit_length()))

    return Pow2EmptyOutputReservesTwo


def max_forgets_the_buddy_rounding(base):
    class MaxForgetsTheBuddyRounding(base):
        def contiguous(self, num_slots, reserve, max_seq_len, seqs, waiting=False):
            if reserve != "max":
                return base.contiguous(self, num_slots, reserve, max_seq_len, seqs, waiting)
            # the run IS max_seq_len slots: right only while max_seq_len is a power of two (48 takes a run of 64)
            tokens = sum(n for _, n, _ in seqs)
            reservation = sum(f - n for _, n, f in seqs)
            internal = sum(max_seq_len - f for _, _, f in seqs)
            free = num_slots - len(seqs) * max_seq_len
            return dict(zip(NAMES, (tokens, reservation, internal, free * waiting, free * (not waiting))))

    return MaxForgetsTheBuddyRounding


PLANTED = [
    (
        "counts-shared-blocks-per-owner",
        counts_shared_blocks_per_owner,
        (),
        ["a block shared by a fork counts once", "token_states: expected 6, found 12"],
    ),
    (
        "last-owner-reach-wins",
        last_owner_reach_wins,
        ("model",),
        ["random pool states", "fork seq", "reservation: expected"],
    ),
    (
        "ignores-waiting",
        ignores_waiting,
        (),
        [
            "free slots count as external fragmentation",
            "external_fragmentation: expected 8, found 0; free: expected 0, found 8",
        ],
    ),
    (
        "pow2-rounds-the-whole-length",
        pow2_rounds_the_whole_length,
        (),
        ["pow2 rounds only the output up", "internal_fragmentation: expected 7, found 0"],
    ),
    (
        "pow2-empty-output-reserves-two",
        pow2_empty_output_reserves_two,
        ("model",),
        ["random pool states", "rule 'pow2'", "internal_fragmentation: expected"],
    ),
    (
        "max-forgets-the-buddy-rounding",
        max_forgets_the_buddy_rounding,
        (),
        [
            "external_fragmentation: expected 16, found 0; free: expected 64, found 80",
            "under max too, the buddy allocator rounds the reserved run of max_seq_len slots up to a power of two",
        ],
    ),
    (
        "max-forgets-the-buddy-rounding-in-programs",
        max_forgets_the_buddy_rounding,
        ("model",),
        ["random pool states", "rule 'max'", "max_seq_len", "external_fragmentation: expected"],
    ),
]
