"""The preemption victim policy with one rule broken (tests/notebooks/test_grader.py grades each)."""

from __future__ import annotations


def most_computed(base):
    class MostComputed(base):
        def victim(self, candidates):  # min and max swapped: throws away the most work
            chosen = max(candidates, key=lambda g: (g.num_computed_tokens, g.arrival_order))
            self.num_preempted[chosen.request_id] = self.num_preempted.get(chosen.request_id, 0) + 1
            return chosen

    return MostComputed


def never_protects(base):
    class NeverProtects(base):
        def victim(self, candidates):  # sim's fewest_computed alone: the request just recomputed goes again
            return min(candidates, key=lambda g: (g.num_computed_tokens, -g.arrival_order))

    return NeverProtects


def returns_the_id(base):
    class ReturnsTheId(base):
        def victim(self, candidates):  # the request id, not the candidate itself
            return super().victim(candidates).request_id

    return ReturnsTheId


def latest_by_position(base):
    class LatestByPosition(base):
        def victim(self, candidates):  # takes the last place in the list for the latest arrival
            below = [i for i, g in enumerate(candidates) if not self.is_protected(g.request_id)]
            if below:
                chosen = candidates[min(below, key=lambda i: (candidates[i].num_computed_tokens, -i))]
            else:
                chosen = candidates[-1]
            self.num_preempted[chosen.request_id] = self.num_preempted.get(chosen.request_id, 0) + 1
            return chosen

    return LatestByPosition


PLANTED = [
    (
        "most-computed",
        most_computed,
        (),
        [
            "victim([r0 (40 computed), r1 (8 computed), r2 (25 computed)]) -> r0",
            "the victim: expected 'r1', found 'r0'",
        ],
    ),
    (
        "never-protects",
        never_protects,
        ("model",),
        [
            "[is_protected(0), is_protected(1)] after r1 was preempted once: expected [False, True], found [False, False]",
            "starvation. A request at the cap is protected while any candidate is below it",
        ],
    ),
    (
        "returns-the-id",
        returns_the_id,
        (),
        ["returned 1: expected one of the candidates (the SequenceGroup itself, not its id)"],
    ),
    (
        "latest-by-position",
        latest_by_position,
        ("model", "rule"),  # passes the examples and the visible runs
        ["the rule:", "expected r", "(the larger arrival_order, not the later place in the list)"],
    ),
]
