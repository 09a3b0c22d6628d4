"""Lab: prefix-cache economics, what vLLM's automatic prefix caching saves on a stream of requests (notebook 11).

The student replays requests one at a time through a cache of `num_blocks` blocks and says, per request, how many
prompt tokens were found in the cache (their prefill is saved), and the hit rate so far. The semantics are the
project's paged pool with prefix caching (sim/kv/paged.py over sim/kv/blocks.py): FULL blocks named by a hash chained
with their parent's, a lookup that never covers a prompt's last token, the generated tokens' blocks cached too, and
LRU eviction of freed cached blocks, a request's tail freed first.

The oracle is that pool itself (`ProjectPrefixCache`): each request is admitted, grown by its generated tokens and
freed through `PagedKVManager`, exactly as the scheduler does for a lone sequence; its `get_computed_tokens`,
`prefix_cache_stats` and the allocator's cached blocks are the expected answers (_prefix_economics_oracle.py, shared
with the random traces of _prefix_economics_machines.py; notebook 11 imports it, `conversation_trace` and `replay`
from this module).
"""
from __future__ import annotations

from typing import Any, Callable

from ..referee import NO_RULES
from ..registry import Exercise, MachineCheck
from ..report import Story
from ._prefix_economics_oracle import ProjectPrefixCache, Request, conversation_trace  # noqa: F401  (notebook 11)


def replay(cache: Any, trace: list[Request]) -> float:
    """Serve every request of `trace` through `cache` (the student's class or ProjectPrefixCache); the hit rate."""
    for token_ids, num_prompt_tokens in trace:
        cache.serve(token_ids, num_prompt_tokens)
    return cache.hit_rate


class Both:
    """The student's cache and the project's, driven by one story: every answer is compared as it comes."""

    def __init__(self, make: Callable[..., Any], t: Story, num_blocks: int, block_size: int) -> None:
        self.student, self.project, self.t = make(num_blocks, block_size), ProjectPrefixCache(num_blocks, block_size), t
        self.served = 0

    def lookup(self, token_ids: list[int], num_prompt_tokens: int, why: str = "") -> None:
        found = self.t.do(self.student, "lookup", token_ids, num_prompt_tokens)
        self.t.expect(f"lookup({token_ids}, {num_prompt_tokens}){why}", found,
                      self.project.lookup(token_ids, num_prompt_tokens))

    def serve(self, token_ids: list[int], num_prompt_tokens: int, why: str = "") -> None:
        self.served += 1
        found = self.t.do(self.student, "serve", token_ids, num_prompt_tokens)
        self.t.expect(f"serve of request {self.served}{why}", found, self.project.serve(token_ids, num_prompt_tokens))
        self.t.expect(f"num_cached_blocks after request {self.served}", self.student.num_cached_blocks,
                      self.project.num_cached_blocks)
        self.t.expect(f"hit_rate after request {self.served}", self.student.hit_rate, self.project.hit_rate)


# --- narrated examples ------------------------------------------------------------------------------


def repeat_hits_all_but_last_block(make, t: Story) -> None:
    """a repeated prompt hits its full blocks, except the one holding its last token (its logits must be computed)"""
    c = Both(make, t, 8, 4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    c.serve(prompt, 8, ": an empty cache finds nothing")
    t.say("blocks [1 2 3 4] and [5 6 7 8] are cached; a lookup covers only the first 7 tokens")
    c.serve(prompt, 8, ": the first block only")
    c.lookup(prompt + [9], 9, ": 9 tokens, the first 8 may hit")


def hash_chains_the_parent(make, t: Story) -> None:
    """a block's hash chains its parent's: the same tokens after a different prefix (or none) are a miss"""
    c = Both(make, t, 8, 4)
    c.serve([1, 2, 3, 4, 5, 6, 7, 8, 9], 9)
    c.lookup([5, 6, 7, 8, 9], 5, ": [5 6 7 8] is cached, but after [1 2 3 4]")
    c.lookup([1, 2, 3, 4, 0, 0, 0, 0, 9], 9, ": the first block still hits")


def replies_are_cached_too(make, t: Story) -> None:
    """a conversation's next turn finds its previous reply: the generated tokens' full blocks are cached as well"""
    c = Both(make, t, 8, 4)
    t.say("turn 1: prompt [1 2 3], reply [4 5 6 7 8 9] (its last token is never fed back, so 8 tokens get K/V)")
    c.serve([1, 2, 3, 4, 5, 6, 7, 8], 3)
    t.say("turn 2: the history [1..9] and a new message [10 11]")
    c.serve([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], 11, ": both blocks of turn 1 hit")


def lru_evicts_the_tail_first(make, t: Story) -> None:
    """when the cache is full, the least recently freed blocks go first, and a request frees its tail first"""
    c = Both(make, t, 3, 2)
    c.serve([1, 2, 3, 4, 5], 5)
    t.say("3 blocks of 2 slots: [1 2] and [3 4] cached, freed tail first, so [3 4] is the least recently freed")
    c.serve([7, 7, 7, 7], 4)
    t.say("that request took the free uncached block and evicted [3 4]; [1 2] survived")
    c.lookup([1, 2, 3, 4, 5], 5, ": only the head block is left")


def hits_are_taken_before_evicting(make, t: Story) -> None:
    """a request takes its hits before it evicts anything: a block it is about to reuse is never the victim"""
    c = Both(make, t, 4, 2)
    c.serve([1, 2, 3, 4], 4)
    c.serve([9, 9, 9], 3)
    t.say("cached, least recently freed first: [3 4], [1 2], [9 9]; one uncached block free")
    c.serve([1, 2, 3, 4, 5, 6, 7], 7, ": [1 2] and [3 4] hit, and the one block short evicts [9 9], not them")
    c.lookup([9, 9, 9], 3, ": [9 9] was evicted")


def a_prefix_computed_twice_keeps_both_copies(make, t: Story) -> None:
    """a block computed twice is cached twice: evicting the older copy leaves the newer one to hit"""
    c = Both(make, t, 4, 2)
    c.serve([1, 2, 3, 4], 4)
    c.serve([1, 2, 3, 4], 4, ": [1 2] hits; [3 4] holds the last prompt token, so it is computed again")
    t.say("two copies of [3 4] are cached now, the older one least recently freed")
    c.serve([7, 8, 9, 10], 1, ": two blocks, one of them by evicting the older copy of [3 4]")
    c.lookup([1, 2, 3, 4, 5], 5, ": [1 2] and the newer copy of [3 4] still hit")


EXAMPLES = (repeat_hits_all_but_last_block, hash_chains_the_parent, replies_are_cached_too, lru_evicts_the_tail_first,
            hits_are_taken_before_evicting, a_prefix_computed_twice_keeps_both_copies)


def _lazy(**options: Any) -> Callable[[Callable[..., Any], int, int], type]:
    """A machine builder imported only when a check runs (hypothesis is a dev dependency)."""

    def build(make: Callable[..., Any], max_examples: int, steps: int) -> type:
        from ._prefix_economics_machines import trace_test

        return trace_test(make, max_examples, steps, **options)

    return build


EXERCISE = Exercise(
    "prefix-cache economics: prompt tokens found in an LRU cache of hashed full blocks (vLLM's automatic prefix "
    "caching)",
    "YourClass(num_blocks, block_size)", "MyPrefixCacheEconomics",
    (4, 2), {"lookup": ([1, 2, 3], 3), "serve": ([1, 2, 3], 3), "num_cached_blocks": None, "hit_rate": None},
    ("lookup", "serve", "num_cached_blocks", "hit_rate"), NO_RULES, EXAMPLES,
    (
        MachineCheck("model", "random traces: {n} request streams that share, repeat and extend prefixes, against the "
                     "project's paged pool", _lazy(), 4.0, "visible"),
        MachineCheck("rule", "conversations: {n} multi-turn chat traces (sim.workloads.conversation) in tight caches",
                     _lazy(conversations=True), 3.0, "hidden"),
        MachineCheck("long", "long traces: {n} streams of 60 requests in bigger caches", _lazy(big=True), 2.0,
                     "hidden", scale=2, steps=60),
    ),
    "11_prefix_economics", "prefix_economics",
)
