"""Lab 8, correct but different: a Counter of preemptions, the victim picked by sorting (not min/max)."""

from collections import Counter


def cost(group):
    return (group.num_computed_tokens, -group.arrival_order)


class MyVictimPolicy:
    def __init__(self, max_preemptions):
        self.max_preemptions = max_preemptions
        self.times = Counter()

    def is_protected(self, request_id):
        return self.times[request_id] >= self.max_preemptions

    def victim(self, candidates):
        open_ = sorted((g for g in candidates if not self.is_protected(g.request_id)), key=cost)
        chosen = open_[0] if open_ else sorted(candidates, key=lambda g: g.arrival_order)[-1]
        self.times[chosen.request_id] += 1
        return chosen
