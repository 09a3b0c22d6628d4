"""Lab 6, correct but different: the planning as module-level functions (math.ceil for blocks), one loop over the
requests in arrival order, the plan built with a dict comprehension's cousin: a list of pairs."""

import math

STATUSES = tuple(sorted({"running", "waiting"}))  # a constant computed by calls


def blocks_for(tokens, block_size):
    return math.ceil(tokens / block_size)


class MyTokenBudget:
    def __init__(self, block_size, max_num_batched_tokens, max_num_seqs):
        self.block_size, self.max_num_seqs = block_size, max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens

    def num_new_blocks(self, num_computed_tokens, num_new_tokens):
        return blocks_for(num_computed_tokens + num_new_tokens, self.block_size) - blocks_for(
            num_computed_tokens, self.block_size
        )

    def schedule(self, requests, num_free_blocks):
        assert all(r.status in STATUSES for r in requests)
        pairs, budget, free = [], self.max_num_batched_tokens, num_free_blocks
        seqs = sum(r.status == "running" for r in requests)
        stopped = {"running": False, "waiting": False}
        for status in ("running", "waiting"):
            for r in requests:
                if r.status != status or stopped[status]:
                    continue
                tokens = min(r.num_tokens - r.num_computed_tokens, budget)
                need = self.num_new_blocks(r.num_computed_tokens, tokens)
                if tokens == 0 or (status == "waiting" and (seqs == self.max_num_seqs or need > free)):
                    stopped[status] = True
                    continue
                pairs.append((r.request_id, tokens))
                budget, free = budget - tokens, free - need
                seqs += status == "waiting"
        return dict(pairs)
