"""Solution to lab 8: a preemption victim policy with a guard against starvation
(notebooks/exercises/08_victim_policy.ipynb).

The fewest computed tokens go first (the cheapest to compute again), ties to the latest arrival. But under
recompute a preempted request comes back with nothing computed, so that rule alone picks it again and again; a
request preempted `max_preemptions` times is therefore protected while any candidate is below the count. When
all are at it, the latest arrival goes, as in vLLM, which lets the oldest request always progress.
"""
from __future__ import annotations


class MyVictimPolicy:
    def __init__(self, max_preemptions: int):
        self.max_preemptions = max_preemptions
        self.num_preempted = {}  # request_id -> times this policy chose it (each choice is preempted)

    def is_protected(self, request_id: int) -> bool:
        """Has this policy already preempted the request max_preemptions times?"""
        return self.num_preempted.get(request_id, 0) >= self.max_preemptions

    def victim(self, candidates: list) -> object:
        """The candidate to preempt (one of `candidates`, running requests as SequenceGroups)."""
        below = [g for g in candidates if not self.is_protected(g.request_id)]
        if below:
            chosen = min(below, key=lambda g: (g.num_computed_tokens, -g.arrival_order))
        else:
            chosen = max(candidates, key=lambda g: g.arrival_order)
        self.num_preempted[chosen.request_id] = self.num_preempted.get(chosen.request_id, 0) + 1
        return chosen
