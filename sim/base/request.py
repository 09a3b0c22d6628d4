"""A request as the serving system sees it: how long its prompt is, how many tokens it will really
generate, when it arrives, and how it samples.

The simulator knows each request's true output length in advance (it comes from the workload), which
is what lets it split memory into "reserved for a token that will come" and "reserved for nothing"
exactly (sim/kv/base.py, the memory breakdown). The reference engine builds the same records from real prompts,
with `output_len` = the request's `max_tokens` (an upper bound it cannot know better).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Request:
    request_id: int
    arrival_time: float  # seconds since the start of the run
    prompt_len: int  # tokens in the prompt, including any shared prefix
    output_len: int  # true number of tokens each sequence of the request generates
    n: int = 1  # parallel samples: n sequences share the prompt (vLLM paper section 4.4)
    beam_width: int = 1  # beam search width k; n and beam_width > 1 are exclusive
    prefix_id: int | None = None  # requests with the same id share their first `prefix_len` prompt tokens
    prefix_len: int = 0  # tokens of the shared prefix (a system prompt / few-shot examples)
    prompt_token_ids: list[int] | None = None  # real or synthetic ids; needed for prefix caching
    # vLLM's Request.skip_reading_prefix_cache: never take prefix-cache hits (every prompt token is computed), while
    # its own full blocks are still cached for others. The engine sets it for SamplingParams.prompt_logprobs.
    skip_reading_prefix_cache: bool = False
    # The ids its one sequence will generate, when known in advance (a conversation's replies, sim/workloads/conversation.py):
    # the prefix cache then keeps the generated tokens' full blocks too, for the next turn whose prompt repeats them.
    output_token_ids: list[int] | None = None
    # vLLM's request priority: with SchedulerConfig(scheduling_policy="priority") the lower value is served first
    # (ties: the earlier arrival) and the higher value preempted first; FCFS ignores it
    priority: int = 0

    def __post_init__(self) -> None:
        if self.prompt_len < 1:
            raise ValueError(f"request {self.request_id}: prompt_len must be >= 1, got {self.prompt_len}")
        if self.output_len < 1:
            raise ValueError(f"request {self.request_id}: output_len must be >= 1, got {self.output_len}")
        if self.n < 1 or self.beam_width < 1:
            raise ValueError(f"request {self.request_id}: n and beam_width must be >= 1, got {self.n}, {self.beam_width}")
        if self.n > 1 and self.beam_width > 1:
            raise ValueError(f"request {self.request_id}: use either n > 1 (sampling) or beam_width > 1, not both")
        if not 0 <= self.prefix_len <= self.prompt_len:
            raise ValueError(f"request {self.request_id}: prefix_len must be in [0, prompt_len], got {self.prefix_len}")
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != self.prompt_len:
            raise ValueError(
                f"request {self.request_id}: {len(self.prompt_token_ids)} prompt_token_ids for prompt_len {self.prompt_len}"
            )
        if not (isinstance(self.priority, int) and not isinstance(self.priority, bool)):
            raise ValueError(f"request {self.request_id}: priority must be an integer, got {self.priority!r}")
        if self.output_token_ids is not None and len(self.output_token_ids) != self.output_len:
            raise ValueError(f"request {self.request_id}: {len(self.output_token_ids)} output_token_ids for output_len "
                             f"{self.output_len}")
        if self.output_token_ids is not None and self.num_seqs > 1:
            raise ValueError(f"request {self.request_id}: output_token_ids name the tokens of one sequence (allowed "
                             f"with n == 1 and beam_width == 1 only; siblings generate different tokens)")

    @property
    def num_seqs(self) -> int:
        """Sequences that run at once for this request (its sequence group)."""
        return max(self.n, self.beam_width)

    @property
    def total_len(self) -> int:
        """Tokens each sequence holds when it finishes: prompt plus output."""
        return self.prompt_len + self.output_len
