"""The oracle of lab `prefix_economics`: the project's paged pool with prefix caching, serving one request at a
time (`ProjectPrefixCache`), and multi-turn chat traces to serve (`conversation_trace`).

A request is `(token_ids, num_prompt_tokens)`: the prompt, then the generated tokens that get K/V. The narrated
examples (prefix_economics.py), the random traces (_prefix_economics_machines.py) and notebook 11 share these. The
module's name starts with "_", so the lab loader does not take it for a lab.
"""
from __future__ import annotations

from ...kv.base import NewSequence
from ...kv.paged import PagedKVManager
from ...workloads.conversation import generate_conversations

Request = tuple[list[int], int]  # (token_ids: the prompt, then the generated tokens that get K/V; num_prompt_tokens)


class ProjectPrefixCache:
    """The project's paged pool with prefix caching, serving one request at a time (the lab's oracle)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.kv = PagedKVManager(num_blocks, block_size, enable_prefix_caching=True)
        self.next_id = 0

    def lookup(self, token_ids: list[int], num_prompt_tokens: int) -> int:
        return self.kv.get_computed_tokens(token_ids, num_prompt_tokens)

    def serve(self, token_ids: list[int], num_prompt_tokens: int) -> int:
        """Admit the prompt (its hits first), compute the generated tokens, free the sequence; the hits, in tokens."""
        seq_id, self.next_id = self.next_id, self.next_id + 1
        hits = self.lookup(token_ids, num_prompt_tokens)
        spec = NewSequence(num_prompt_tokens, len(token_ids), token_ids, hits)
        if self.kv.allocate_slots([seq_id], [num_prompt_tokens - hits], [spec]) is None:
            raise ValueError(f"a request of {len(token_ids)} tokens does not fit {self.kv.num_blocks} blocks")
        if len(token_ids) > num_prompt_tokens:  # the generated tokens' K/V, whose full blocks are cached too
            if self.kv.allocate_slots([seq_id], [len(token_ids) - num_prompt_tokens]) is None:
                raise ValueError(f"a request of {len(token_ids)} tokens does not fit {self.kv.num_blocks} blocks")
        self.kv.free(seq_id)
        return hits

    @property
    def num_cached_blocks(self) -> int:
        return sum(self.kv.allocator.is_cached(b) for b in range(self.kv.num_blocks))

    @property
    def hit_rate(self) -> float:
        stats = self.kv.prefix_cache_stats()
        return stats.hit_tokens / stats.queried_tokens if stats.queried_tokens else 0.0


def conversation_trace(num_requests: int, seed: int = 0, max_seq_len: int = 1024) -> list[Request]:
    """Multi-turn chat requests in arrival order (sim.workloads.conversation): each turn's prompt repeats its session's history.
    A request's tokens with K/V are its prompt and all its reply but the last token (never fed back)."""
    requests = generate_conversations(num_requests, rate=1.0, max_seq_len=max_seq_len, seed=seed)
    return [(r.prompt_token_ids + r.output_token_ids[: r.output_len - 1], r.prompt_len) for r in requests]
