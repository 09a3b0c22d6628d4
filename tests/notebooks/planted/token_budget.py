"""One scheduler step under a token budget, with one rule broken (tests/notebooks/test_grader.py grades each)."""

from __future__ import annotations


def skips_ahead(base):
    class SkipsAhead(base):
        def schedule(self, requests, num_free_blocks):  # a waiting request without blocks is passed over
            plan = {}
            budget, free = self.max_num_batched_tokens, num_free_blocks
            num_seqs = sum(r.status == "running" for r in requests)
            for r in sorted(requests, key=lambda r: r.status != "running"):
                tokens = min(r.num_tokens - r.num_computed_tokens, budget)
                blocks = self.num_new_blocks(r.num_computed_tokens, tokens)
                if tokens == 0 or blocks > free or (r.status == "waiting" and num_seqs == self.max_num_seqs):
                    continue
                plan[r.request_id] = tokens
                budget, free = budget - tokens, free - blocks
                num_seqs += r.status == "waiting"
            return plan

    return SkipsAhead


def max_num_seqs_counts_only_admitted(base):
    class CountsOnlyAdmitted(base):
        def schedule(self, requests, num_free_blocks):  # max_num_seqs checked against the newly admitted only
            saved = self.max_num_seqs
            self.max_num_seqs = saved + sum(r.status == "running" for r in requests)
            try:
                return super().schedule(requests, num_free_blocks)
            finally:
                self.max_num_seqs = saved

    return CountsOnlyAdmitted


def decode_takes_a_block(base):
    class DecodeTakesABlock(base):
        def schedule(self, requests, num_free_blocks):  # blocks counted as ceil(tokens / block_size), as if the
            # request's last block were always full: every decode seems to open a block
            bs = self.block_size
            budget, free, plan = self.max_num_batched_tokens, num_free_blocks, {}
            num_seqs = sum(r.status == "running" for r in requests)
            for r in sorted(requests, key=lambda r: r.status != "running"):
                tokens = min(r.num_tokens - r.num_computed_tokens, budget)
                blocks = -(-tokens // bs)
                if r.status == "waiting" and (tokens == 0 or num_seqs == self.max_num_seqs or blocks > free):
                    break
                if tokens == 0:
                    continue
                plan[r.request_id] = tokens
                budget, free = budget - tokens, free - blocks
                num_seqs += r.status == "waiting"
            return plan

    return DecodeTakesABlock


def budget_for_waiting_only(base):
    class BudgetForWaitingOnly(base):
        def schedule(self, requests, num_free_blocks):  # the decodes are not charged to the budget
            plan = super().schedule([r for r in requests if r.status == "running"], num_free_blocks)
            rest = super().schedule([r for r in requests if r.status == "waiting"], num_free_blocks)
            return {**plan, **rest}

    return BudgetForWaitingOnly


PLANTED = [
    (
        "skips-ahead",
        skips_ahead,
        (),
        [
            "schedule(the 3 requests above, 3) -> {0: 1, 2: 2}",
            "the plan (r2 would fit in 1 block, but it may not overtake r1): expected {0: 1}, found {0: 1, 2: 2}",
        ],
    ),
    (
        "max-num-seqs-counts-only-admitted",
        max_num_seqs_counts_only_admitted,
        (),
        [
            "the plan (max_num_seqs 2: r0 runs, r1 joins it, r2 must wait): expected {0: 1, 1: 2}, "
            "found {0: 1, 1: 2, 2: 2}"
        ],
    ),
    (
        "decode-takes-a-block",
        decode_takes_a_block,
        ("model",),  # passes every example: only the random runs catch it
        ["random runs:", "sim's Scheduler plans", "(waiting, misses", "tokens, found 0 (in sim's plan it opens"],
    ),
    (
        "budget-for-waiting-only",
        budget_for_waiting_only,
        (),
        [
            "the plan (budget 8: two decodes, then 6 of r2's 20 prompt tokens): expected {0: 1, 1: 1, 2: 6}, "
            "found {0: 1, 1: 1, 2: 8}"
        ],
    ),
]
