"""Lab 6, correct but different: chunk sizes computed with numpy, so the plan holds numpy integers
({0: np.int64(1)}): whole numbers all the same."""

import numpy as np


class MyTokenBudget:
    def __init__(self, block_size, max_num_batched_tokens, max_num_seqs):
        self.block_size = block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs

    def num_new_blocks(self, num_computed_tokens, num_new_tokens):
        bs = self.block_size
        return int(np.ceil((num_computed_tokens + num_new_tokens) / bs) - np.ceil(num_computed_tokens / bs))

    def schedule(self, requests, num_free_blocks):
        budget, free, plan = self.max_num_batched_tokens, num_free_blocks, {}
        missing = np.array([r.num_tokens - r.num_computed_tokens for r in requests], dtype=np.int64)
        running = [i for i, r in enumerate(requests) if r.status == "running"]
        waiting = [i for i, r in enumerate(requests) if r.status == "waiting"]
        for i in running:
            tokens = np.minimum(missing[i], budget)
            if tokens <= 0:
                break
            free -= self.num_new_blocks(requests[i].num_computed_tokens, int(tokens))
            plan[requests[i].request_id] = tokens
            budget -= tokens
        n = len(running)
        for i in waiting:
            tokens = np.minimum(missing[i], budget)
            blocks = self.num_new_blocks(requests[i].num_computed_tokens, int(tokens))
            if tokens <= 0 or n >= self.max_num_seqs or blocks > free:
                break
            plan[requests[i].request_id] = tokens
            budget, free, n = budget - tokens, free - blocks, n + 1
        return plan
