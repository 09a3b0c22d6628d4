"""Solution to lab 6: one scheduler step under a token budget (notebooks/exercises/06_token_budget.ipynb).

vLLM v1's `Scheduler.schedule` (vllm/v1/core/sched/scheduler.py): a step feeds at most max_num_batched_tokens
tokens. Running requests come first, in order, each given what it misses (1 token for a decode, the rest of a
prompt for a chunked prefill) cut to what is left of the budget; then waiting requests, first come first served,
each prompt cut the same way. A request is scheduled only if the blocks its new tokens open are free; the first
waiting request that cannot be admitted (no blocks, max_num_seqs reached, no budget left) ends the step.
"""
from __future__ import annotations


class MyTokenBudget:
    def __init__(self, block_size: int, max_num_batched_tokens: int, max_num_seqs: int):
        self.block_size = block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs

    def num_new_blocks(self, num_computed_tokens: int, num_new_tokens: int) -> int:
        """Blocks a request holding `num_computed_tokens` tokens must add to hold `num_new_tokens` more:
        ceil((computed + new) / block_size) - ceil(computed / block_size)."""
        bs = self.block_size
        return -(-(num_computed_tokens + num_new_tokens) // bs) - -(-num_computed_tokens // bs)

    def schedule(self, requests: list, num_free_blocks: int) -> dict[int, int]:
        """The plan {request_id: tokens this step} for `requests` (RequestStates in arrival order)."""
        budget, free, plan = self.max_num_batched_tokens, num_free_blocks, {}
        running = [r for r in requests if r.status == "running"]
        for r in running:
            tokens = min(r.num_tokens - r.num_computed_tokens, budget)
            if tokens == 0:
                break  # the budget is spent: the others wait for the next step, keeping their blocks
            free -= self.num_new_blocks(r.num_computed_tokens, tokens)  # the lab's states always have room
            plan[r.request_id] = tokens
            budget -= tokens
        num_seqs = len(running)
        for r in (r for r in requests if r.status == "waiting"):
            tokens = min(r.num_tokens - r.num_computed_tokens, budget)
            blocks = self.num_new_blocks(r.num_computed_tokens, tokens)
            if tokens == 0 or num_seqs == self.max_num_seqs or blocks > free:
                break  # FCFS: nobody behind it overtakes
            plan[r.request_id] = tokens
            budget, free, num_seqs = budget - tokens, free - blocks, num_seqs + 1
        return plan
