"""What the engine hands back: per-request outputs (vLLM's shapes), and its per-step log and counters.

`RequestOutput` / `CompletionOutput` mirror vllm/outputs.py and `BeamSearchSequence` /
`BeamSearchOutput` mirror vllm/beam_search.py, so code written against vLLM's offline API reads them
unchanged (a request is named by vLLM's str id). `StepRecord` and `EngineStats` are this lab's own: one record
per executed scheduler plan (what ran, what moved, how much memory is left), and running totals over the
engine's life (`EngineSnapshot` copies them with the queues and the pool at one moment, for readers such as the
HTTP server that must not reach into the engine). They are what notebooks plot and what the simulator-vs-engine
checks compare, so a StepRecord
names requests by the scheduler's int ids (`LLM.scheduler_request_id(request_id)` gives a request's).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sim.kv.base import BlockCopy, MemoryBreakdown, PrefixCacheStats
from sim.scheduling.plan import StepPlan
from sim.scheduling.step_shape import prefill_pairs, shared_context_tokens

FINISH_REASONS = ("stop", "length", "abort")


def settled_text(text: str, finished: bool, hold: int = 0) -> str:
    """The part of a completion's text that no later token changes, for streaming it: all of it once finished;
    while running, without a trailing partly decoded character (U+FFFD until its last byte arrives: "中" is three
    bytes, an emoji four, often over two tokens) and without the last `hold - 1` characters, `hold` being the
    longest stop string (a later token may complete it, and the text is then cut before it)."""
    if finished:
        return text
    text = text.rstrip("\ufffd")
    return text[: max(0, len(text) - hold + 1)] if hold else text


@dataclass(slots=True)
class Logprob:
    """One token's log-probability in a CompletionOutput's `logprobs` or a RequestOutput's `prompt_logprobs`
    (vllm/logprobs.py)."""

    logprob: float  # under the raw logits
    rank: int | None = None  # 1 = the most likely token (ties count as more likely)
    decoded_token: str | None = None


@dataclass(slots=True)
class CompletionOutput:
    index: int  # which of the request's n samples (or beams, best first)
    text: str  # the generated text so far (special tokens skipped, as vLLM does by default; see SamplingParams)
    token_ids: list[int]  # generated ids; an end-of-sequence or stop token that stopped it is included
    cumulative_logprob: float | None  # sum of the raw log-probabilities of token_ids
    logprobs: list[dict[int, Logprob]] | None = None  # per generated token, when SamplingParams.logprobs is set
    finish_reason: str | None = None  # "stop" | "length" | "abort"; None while running
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it (None: EOS or other)

    def finished(self) -> bool:  # a method, as in vLLM
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    """When things happened to one request, vLLM's RequestMetrics (vllm/sequence.py) in seconds since the engine was
    built (its own clock, not the epoch), and the latencies the simulator reports per request (sim/clock/metrics.py's
    LATENCY_METRICS, the same definitions). A token step is a step that gave the request its next token(s) (all of
    its samples or beams at once); the gaps between token steps are its inter-token latencies. None: not yet."""

    arrival_time: float  # add_request (or generate()) queued it
    first_scheduled_time: float | None = None  # the start of the first step that computed any of its tokens
    first_token_time: float | None = None  # the end of the step that gave its first token
    last_token_time: float | None = None  # the end of its latest token step
    finished_time: float | None = None  # the end of the step it finished in
    num_token_steps: int = 0
    max_token_gap: float | None = None  # the longest time between two consecutive token steps
    num_preemptions: int = 0

    @property
    def time_in_queue(self) -> float | None:  # vLLM's name for the queueing delay
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def queueing_delay(self) -> float | None:
        return self.time_in_queue

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def itl_mean(self) -> float | None:
        """(finish - first token) / (token steps - 1), once finished with two token steps or more."""
        if self.finished_time is None or self.num_token_steps < 2:
            return None
        return (self.finished_time - self.first_token_time) / (self.num_token_steps - 1)

    @property
    def itl_max(self) -> float | None:
        return None if self.finished_time is None or self.num_token_steps < 2 else self.max_token_gap

    @property
    def e2e_latency(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    def token_step(self, end: float) -> None:
        """A step ending at `end` gave the request its next token(s)."""
        if self.last_token_time is None:
            self.first_token_time = end
        else:
            gap = end - self.last_token_time
            self.max_token_gap = gap if self.max_token_gap is None else max(self.max_token_gap, gap)
        self.last_token_time = end
        self.num_token_steps += 1


@dataclass(slots=True)
class RequestOutput:
    request_id: str  # as given to add_request, or the engine's "0", "1", ... (vLLM's ids are str)
    prompt: str | None  # None when the prompt was given as token ids
    prompt_token_ids: list[int]
    # SamplingParams.prompt_logprobs set: one entry per prompt token, None for the first, then {token id: Logprob}
    # of the prompt's token and the top prompt_logprobs there (reference/engine/prompt_logprobs.py; while a prompt is
    # computed in chunks, the positions so far); else None
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache at admission
    metrics: RequestMetrics | None = None  # when it arrived, was scheduled, got tokens, finished (a copy, as of now)


@dataclass(slots=True)
class BeamSearchSequence:
    tokens: list[int]  # prompt + generated ids
    text: str  # the text of prompt + output, as vLLM's
    cum_logprob: float  # sum of the generated tokens' log-probabilities
    finish_reason: str | None  # "stop" (ended with an end-of-sequence token) or "length"
    score: float = 0.0  # cum_logprob / len(tokens, minus a final EOS) ** length_penalty: vLLM's ranking key


@dataclass(slots=True)
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]  # best first


@dataclass(slots=True)
class StepRecord:
    """One executed scheduler plan. Requests appear under the scheduler's int ids (see the module doc)."""

    step: int  # 0-based count of executed plans
    prefills: list[tuple[int, int, int, int]]  # (request_id, seq_id, num_computed_tokens, num_new_tokens)
    decodes: list[int]  # seq ids that fed one token
    preempted: list[int]  # request ids preempted while building the plan
    blocks_to_swap_out: list[BlockCopy]  # (gpu_block, cpu_block)
    blocks_to_swap_in: list[BlockCopy]  # (cpu_block, gpu_block)
    blocks_to_copy: list[BlockCopy]  # (src, dst): copy-on-write and contiguous beam forks
    finished_request_ids: list[int]
    num_running_requests: int  # requests with a sequence in this step
    num_batched_tokens: int  # tokens the forward pass ran (a shared prompt counts once)
    num_free_blocks: int  # GPU blocks free after the step
    memory: MemoryBreakdown  # the KV pool after the step, five kinds of slot (sim/kv/base.py)
    step_time_s: float  # wall time to execute the plan: copies, forward pass, sampling
    start_s: float = 0.0  # when the step began, in seconds since the engine was built (the timeline's clock)
    num_waiting: int = 0  # requests waiting for admission after the step
    sampled_request_ids: list[int] = field(default_factory=list)  # requests that got a token from this step
    # The simulator's cost-model inputs for this plan (sim.clock.cost.CostModel.step_time), so that measured steps fit it:
    # prompt tokens computed, decode entries, K/V tokens the attention reads (StepPlan.num_context_tokens), and the
    # query-key pairs of the prompt chunks' attention (sim.scheduling.step_shape.prefill_pairs).
    num_prefill_tokens: int = 0
    num_context_tokens: int = 0
    num_prefill_pairs: int = 0
    num_shared_context_tokens: int = 0  # of num_context_tokens, reads of blocks another entry reads too (shared)

    @classmethod
    def from_plan(cls, step: int, plan: StepPlan, finished: list[int], num_free_blocks: int,
                  memory: MemoryBreakdown, step_time_s: float, start_s: float = 0.0,
                  num_waiting: int = 0, block_size: int | None = None) -> StepRecord:
        return cls(
            step=step,
            prefills=[(e.request_id, e.seq_id, e.num_computed_tokens, e.num_new_tokens) for e in plan.prefills],
            decodes=[e.seq_id for e in plan.decodes], preempted=list(plan.preempted),
            blocks_to_swap_out=list(plan.blocks_to_swap_out), blocks_to_swap_in=list(plan.blocks_to_swap_in),
            blocks_to_copy=list(plan.blocks_to_copy), finished_request_ids=list(finished),
            num_running_requests=len(plan.request_ids()), num_batched_tokens=plan.num_batched_tokens,
            num_free_blocks=num_free_blocks, memory=memory, step_time_s=step_time_s, start_s=start_s,
            num_waiting=num_waiting, num_prefill_tokens=plan.num_prefill_tokens,
            num_context_tokens=plan.num_context_tokens, num_prefill_pairs=prefill_pairs(plan),
            num_shared_context_tokens=shared_context_tokens(plan, block_size) if block_size else 0,
            sampled_request_ids=list(dict.fromkeys(e.request_id for e in plan.entries if e.sample)))


@dataclass(slots=True)
class EngineStats:
    num_steps: int = 0  # executed plans
    num_preemptions: int = 0  # groups preempted (recompute or swap), as the scheduler counts them
    max_concurrent_requests: int = 0  # most requests with a sequence in one step
    max_concurrent_seqs: int = 0  # most sequences sampling in one step
    num_generated_tokens: int = 0  # tokens sampled (every sequence, every step)
    num_prefill_tokens: int = 0  # tokens fed by prefills, recomputation included
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at admission
    num_swapped_out_blocks: int = 0
    num_swapped_in_blocks: int = 0
    num_copied_blocks: int = 0
    num_finished_requests: int = 0
    num_aborted_requests: int = 0  # by abort(), by an interrupted generate(), or by a failed step
    num_failed_steps: int = 0  # steps that raised; each aborted the requests it touched (LLM.step)
    busy_time_s: float = 0.0  # sum of step_time_s
    finish_reasons: dict[str, int] = field(default_factory=dict)  # finished samples (and beam requests) per reason
    # speculative decoding (reference/engine/speculative.py): draft tokens verified, and of them accepted (each accepted one
    # is a generated token too: a verify step samples 1 + its accepted drafts)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def add_step(self, plan: StepPlan, finished: list[int], step_time_s: float, num_preemptions: int) -> None:
        """Count one executed plan. `num_preemptions` is the scheduler's running total."""
        self.num_steps += 1
        self.num_preemptions = num_preemptions
        self.max_concurrent_requests = max(self.max_concurrent_requests, len(plan.request_ids()))
        self.max_concurrent_seqs = max(self.max_concurrent_seqs, plan.num_seqs)
        self.num_generated_tokens += sum(e.sample for e in plan.entries)
        self.num_prefill_tokens += sum(e.num_new_tokens for e in plan.prefills)
        self.num_swapped_out_blocks += len(plan.blocks_to_swap_out)
        self.num_swapped_in_blocks += len(plan.blocks_to_swap_in)
        self.num_copied_blocks += len(plan.blocks_to_copy)
        self.num_finished_requests += len(finished)
        self.busy_time_s += step_time_s


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """The engine between two steps, copied (`LLMEngine.snapshot()`): what a server's /metrics and its pool page read.
    Nothing in it is shared with the engine, so a reader on another thread sees one moment, whole."""

    num_running: int  # requests with a sequence in the running batch
    num_waiting: int  # requests queued for admission (preempted by recompute included)
    num_swapped: int  # requests preempted by swapping, their blocks in CPU memory
    num_blocks: int  # the KV pool (GPU blocks)
    num_free_blocks: int  # of which free (freed cached blocks included)
    num_preemptions: int  # since the engine was built, as the scheduler counts them
    prefix_cache: PrefixCacheStats  # the prefix cache's lookups so far (all zeros without one)
    stats: EngineStats  # the running totals
    last_step: StepRecord | None  # the latest executed plan's record (None before the first)
    pool: object | None = None  # with snapshot(pool=True): sim.views.viewer.Snapshot of the pool after that step
