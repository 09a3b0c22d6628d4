"""The reference engine: vLLM's offline `LLM` API over the SIMULATOR's own scheduler and KV manager.

The project's central claim, made concrete (docs/ARCHITECTURE.md): "the simulator is the engine with a
simulated clock". This engine builds `sim.scheduler.Scheduler` over `sim.kv.make_kv_manager(...)`, exactly
the objects the simulator drives, and executes their plans on a real model (vLLM's LLMEngine loop):

    plan    = scheduler.schedule()                 # who runs, block tables, swaps, copies (sim/)
    logits  = executor.execute(plan)               # the same moves on real K/V tensors, one forward pass
    tokens  = sample(logits) / beam selection      # decides what the simulator reads from its workload:
    result  = scheduler.finish_step(plan, outcome) #   which sequences finished, which beams survive

A v1 plan mixes prompt chunks and decodes: a chunk attends to the earlier chunks of its prompt through the
block table, and only an entry that reaches the end of its sequence (`entry.sample`) samples a token.

Request ids are vLLM's strings at the engine's surface (add_request, abort, RequestOutput.request_id) and the
simulator's ints below it (the scheduler, the KV manager's sequences, step_log): reference/request_ids.py maps one
to the other, and `scheduler_request_id` tells a caller which int the scheduler knows a request by.

The simulator decides outcomes from true lengths; here they come from sampled tokens. NOTE: the engine cannot
know a request's true output length, so each `Request` says output_len = max_tokens; the contiguous policies
(oracle, pow2) therefore reserve as if every request ran to max_tokens, and `max` reserves max_model_len.

Bad input and failures:
- every input is checked before anything is queued: `generate([...])` and `beam_search([...])` queue all their
  prompts or none (TypeError for a wrong type, ValueError for a wrong value, with what is allowed);
- a step that raises (an exception in the executor or the sampler, KeyboardInterrupt) aborts the requests it
  touched (`Scheduler.abandon_step`: their blocks return to the pool), counts itself in
  `stats.num_failed_steps` and re-raises; the engine stays usable and the other requests stay queued.
  `generate()` / `beam_search()` interrupted or failing abort every request they queued before re-raising;
- one thread at a time: a second thread calling in while one runs gets a RuntimeError at once (`_one_thread`).
"""
from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from reference import executor as ex
from reference.beam import BeamSearchState
from reference.cpu_allocator import keep_freed_memory
from reference.engine_offline import OfflineAPI
from reference.engine_outcomes import EngineOutcomes
from reference.kv_cache import KVCache, kv_bytes_per_block
from reference.models.llama import LlamaForwardModel
from reference.outputs import EngineStats, RequestOutput, StepRecord
from reference.prompt_logprobs import PromptLogprobs
from reference.prompts import prompt_parts
from reference.request_ids import RequestIds
from reference.sampling import BeamSearchParams, SamplingParams, check_bool, check_int, check_real, sample_generator
from reference.kv_groups import kv_layout, model_spec
from sim.kv import check_model, has_swap_space, make_kv_manager
from sim.plan import ScheduledSeq, StepOutcome, StepPlan
from sim.request import Request
from sim.scheduler import Scheduler, SchedulerConfig

Params = SamplingParams | BeamSearchParams


@dataclass(slots=True)
class _Seq:
    index: int  # position among the request's samples / beams
    token_ids: list[int]  # generated so far
    cum_logprob: float = 0.0
    finish_reason: str | None = None
    generator: torch.Generator | None = None  # None: greedy (or a beam)
    logprobs: list[dict] | None = None  # per token {id: (logprob, rank)}, when the params ask for them
    stop_reason: int | str | None = None
    stop_token: bool = False  # stopped by an end-of-sequence or stop token: its text is left out of the text
    text_len: int = 0  # characters of the text decoded so far (stop strings: only new text is searched)
    text_end: int | None = None  # a stop string cut the text here


@dataclass(slots=True)
class _RequestState:
    request_id: str  # the public id (the engine's dicts key it by the scheduler's int)
    prompt: str | None
    prompt_token_ids: list[int]
    params: Params
    max_tokens: int  # params.max_tokens, cut to what the model context leaves
    seqs: dict[int, _Seq]  # scheduler seq id -> state: samples, or the current beams
    beam: BeamSearchState | None = None
    num_cached_tokens: int | None = None  # set at the first admission
    prompt_logprobs: PromptLogprobs | None = None  # SamplingParams.prompt_logprobs set: collected as computed


@dataclass(slots=True)
class _Checked:
    """One request as add_request would queue it, every check passed (nothing queued yet)."""

    prompt: str | None  # the text, None when given as token ids
    prompt_token_ids: list[int]
    params: Params
    max_tokens: int  # params.max_tokens, cut to what the model context leaves
    request_id: str | None  # None: the engine's next id



@contextmanager
def held_interrupts() -> Iterator[None]:
    """Hold Ctrl-C back while the scheduler changes its queues and the KV manager (a few microseconds to
    milliseconds): a SIGINT arriving then is delivered as the block ends, so a KeyboardInterrupt never lands
    between a KV call's return and the scheduler recording it. The scheduler still undoes a step that raises
    anywhere (Scheduler.abandon_step); this only keeps an interrupt out of the KV manager's own statements.
    Only in the main thread (the only one Python delivers signals to) and over a Python-level SIGINT handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):  # SIG_IGN, SIG_DFL or a handler set outside Python: nothing to hold
        yield
        return
    held: list = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        if held:
            handler(*held[0])  # the default handler raises KeyboardInterrupt here

class LLM(EngineOutcomes, OfflineAPI):
    """`LLM(model).generate(prompts, params)`, `beam_search`, and the streaming add_request/step API.

    One thread at a time: while a thread is inside generate(), chat(), beam_search(), step(), add_request() or
    abort(), the same call from another thread raises RuntimeError at once (nothing changed, and the running call
    completes as if alone); it never waits. Use one LLM per thread, or call it from one thread."""

    def __init__(self, model: str | LlamaForwardModel = "smollm2", *, policy: str = "paged", block_size: int = 16,
                 num_gpu_blocks: int | None = None, kv_budget_bytes: int | None = None, num_cpu_blocks: int = 0,
                 preemption: str = "recompute", max_num_seqs: int = 256, max_num_batched_tokens: int | None = None,
                 enable_prefix_caching: bool = False, scheduler: str = "v1", backend: str | None = None,
                 device: str | None = None, dtype: torch.dtype | str | None = None, seed: int = 0,
                 max_model_len: int | None = None, tokenizer=None, enable_chunked_prefill: bool | None = None,
                 watermark: float = 0.0, victim: str = "latest_arrival", gpu_memory_utilization: float | None = None,
                 kv_cache_memory_bytes: int | None = None, swap_space: float | None = None, enforce_eager: bool = False,
                 tensor_parallel_size: int = 1, trust_remote_code: bool = False) -> None:
        # vLLM's keywords (the last line): kv_cache_memory_bytes is kv_budget_bytes, swap_space (GiB) sizes
        # num_cpu_blocks, gpu_memory_utilization the GPU pool; the others change nothing (check_vllm_only_options).
        ex.check_vllm_only_options(tensor_parallel_size, enforce_eager, trust_remote_code)
        if kv_cache_memory_bytes is not None:
            if kv_budget_bytes is not None:
                raise ValueError("give kv_budget_bytes or kv_cache_memory_bytes (the same budget), not both")
            kv_budget_bytes = kv_cache_memory_bytes
        if gpu_memory_utilization is not None:
            gpu_memory_utilization = check_real("gpu_memory_utilization", gpu_memory_utilization)
            if not 0.0 < gpu_memory_utilization <= 1.0:
                raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        block_size, max_num_seqs = check_int("block_size", block_size, 1), check_int("max_num_seqs", max_num_seqs, 1)
        num_cpu_blocks, seed = check_int("num_cpu_blocks", num_cpu_blocks, 0), check_int("seed", seed, 0)
        num_gpu_blocks, kv_budget_bytes, max_num_batched_tokens, max_model_len = (
            None if v is None else check_int(name, v, 1) for name, v in (
                ("num_gpu_blocks", num_gpu_blocks), ("kv_budget_bytes", kv_budget_bytes),
                ("max_num_batched_tokens", max_num_batched_tokens), ("max_model_len", max_model_len)))
        watermark = check_real("watermark", watermark)
        enable_prefix_caching = check_bool("enable_prefix_caching", enable_prefix_caching)
        if enable_chunked_prefill is not None:
            enable_chunked_prefill = check_bool("enable_chunked_prefill", enable_chunked_prefill)
        if isinstance(model, LlamaForwardModel):  # already loaded (tests, notebooks): see from_loaded
            self.model, self.tokenizer = model, tokenizer
            self.device, self.dtype = model.device, model.dtype
            if (device is not None and ex.default_device(device) != self.device) or (
                    dtype not in (None, "auto") and ex.default_dtype(dtype, self.device) != self.dtype):
                raise ValueError(f"the loaded model lives on {self.device} in {self.dtype}; "
                                 "give device/dtype to load_model, not to LLM")
        else:
            from reference.models import load_model

            self.device = ex.default_device(device)
            self.dtype = ex.default_dtype(dtype, self.device)  # also vLLM's names: "float32", "bfloat16", "auto"
            self.model, self.tokenizer, _ = load_model(model, dtype=self.dtype, device=self.device)
        ex.use_one_cpu_thread(self.device)
        if self.device.type == "cpu":
            keep_freed_memory()  # glibc keeps the steps' freed tensors instead of page-faulting them back
        self.config = self.model.config
        self.backend = ex.default_backend(backend, self.device, self.dtype)
        context = self.config.max_position_embeddings
        self.max_model_len = max_model_len or context
        if not 2 <= self.max_model_len <= context:
            raise ValueError(f"max_model_len must be in [2, {context}] (the model context), got {max_model_len}")
        num_blocks = ex.num_gpu_blocks_for(self.config, block_size, self.dtype, self.device, num_gpu_blocks,
                                           kv_budget_bytes, gpu_memory_utilization)
        num_cpu_blocks = self._cpu_pool_blocks(block_size, num_cpu_blocks, swap_space)
        self.block_size = block_size
        # the model as the KV managers see it: hybrid groups its full and sliding-window layers (Gemma 3)
        spec = model_spec(self.config, self.dtype, model if isinstance(model, str) else "the loaded model")
        check_model(policy, spec)
        self.kv_manager = make_kv_manager(policy, num_blocks * block_size, block_size=block_size,
                                          max_seq_len=self.max_model_len, enable_prefix_caching=enable_prefix_caching,
                                          num_cpu_blocks=num_cpu_blocks, watermark=watermark, model=spec)  # fmt: skip
        if enable_prefix_caching and not self.kv_manager.enable_prefix_caching:
            raise ValueError(f"policy {policy!r} has no prefix cache (allowed with enable_prefix_caching: paged)")
        if num_cpu_blocks and not self.kv_manager.num_cpu_blocks:
            raise ValueError(f"policy {policy!r} has no swap space (allowed with num_cpu_blocks > 0: paged)")
        if preemption == "swap" and not num_cpu_blocks:  # the scheduler would recompute every time, silently
            if not has_swap_space(policy):
                raise ValueError(f"preemption='swap' needs CPU swap space, and policy {policy!r} has none: it "
                                 "preempts by recompute only (allowed: preemption='recompute', or policy 'paged')")
            raise ValueError("preemption='swap' needs num_cpu_blocks > 0 (or swap_space of at least one block) to "
                             "swap to (allowed without CPU blocks: preemption='recompute')")
        self.enable_prefix_caching = enable_prefix_caching
        chunked = scheduler == "v1" and enable_chunked_prefill is not False
        # vLLM's defaults for its offline LLM class: 4096 tokens per step on a CPU, 8192 on a GPU (16384 on one of
        # 70 GiB or more), with chunked prefill; without it, room for a whole context
        batched = max_num_batched_tokens or max(ex.default_token_budget(self.device),
                                                0 if chunked else self.max_model_len)
        self.scheduler = Scheduler(self.kv_manager, SchedulerConfig(max_num_seqs, batched, scheduler, preemption,
                                                                    enable_chunked_prefill, victim))  # fmt: skip
        # one tensor per layer, or (hybrid) one per place in a KV cache group, of the manager's pages: the same bytes
        layout = kv_layout(self.config, self.kv_manager)
        self.kv_cache = KVCache(layout.num_tensors, self.kv_manager.num_blocks, block_size, self.config.num_kv_heads,
                                self.config.head_dim, self.dtype, self.device, num_cpu_blocks=num_cpu_blocks,
                                layout=layout)
        self.executor = ex.ModelExecutor(self.model, self.kv_cache, self.backend,
                                         getattr(self.kv_manager, "group_tables", None))
        self.stats = EngineStats()
        self.step_log: list[StepRecord] = []
        self.arrivals: dict[int, tuple[float, int, int]] = {}  # scheduler id -> (arrival s, prompt len, max tokens)
        self._requests: dict[int, _RequestState] = {}  # by scheduler id: the requests not finished
        self._ids = RequestIds()  # public str id <-> scheduler int id, for every request ever queued
        self._rng = np.random.default_rng(seed)  # seeds for requests that bring none
        self._start = time.perf_counter()
        # one thread at a time (_one_thread): reentrant, so generate() may call step() and abort() in its thread
        self._lock = threading.RLock()
        self._running: str | None = None  # the outermost call holding the lock, for the refusal's message

    def _cpu_pool_blocks(self, block_size: int, num_cpu_blocks: int, swap_space: float | None) -> int:
        """The CPU swap pool in blocks: num_cpu_blocks, or what swap_space (GiB, vLLM's keyword) holds; ValueError
        past what the host can hold (executor.max_pool_blocks)."""
        if swap_space is None and num_cpu_blocks == 0:
            return 0
        per_block = kv_bytes_per_block(self.config.num_layers, block_size, self.config.num_kv_heads,
                                       self.config.head_dim, self.dtype)
        limit, most = ex.max_pool_blocks(per_block, "cpu")
        if swap_space is None:
            if num_cpu_blocks > limit:
                raise ValueError(f"num_cpu_blocks {num_cpu_blocks:,} is more than {most} (allowed: 0 .. {limit:,})")
            return num_cpu_blocks
        if num_cpu_blocks:
            raise ValueError("give num_cpu_blocks or swap_space (GiB of CPU swap), not both")
        swap_space = check_real("swap_space", swap_space)
        if swap_space < 0:
            raise ValueError(f"swap_space must be >= 0 (GiB), got {swap_space}")
        if swap_space > limit * per_block / 2**30:
            raise ValueError(f"swap_space {swap_space:g} GiB is more than {most} (allowed: 0 .. "
                             f"{limit * per_block / 2**30:.4g} GiB, {limit:,} blocks of {per_block:,} bytes)")
        return int(swap_space * 2**30) // per_block

    @classmethod
    def from_loaded(cls, model: LlamaForwardModel, tokenizer=None, config=None, **kwargs) -> LLM:
        """An engine over an already-loaded model: `LLM.from_loaded(*load_model("smollm2"), policy="max")`.
        Loading SmolLM2 takes seconds; building an engine around it takes milliseconds."""
        if config is not None and config != model.config:
            raise ValueError("config must be the model's own config (model.config)")
        return cls(model, tokenizer=tokenizer, **kwargs)

    # --- requests in ------------------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int] | dict, params: Params | None = None,
                    request_id: str | int | None = None) -> str:
        """Queue one request; returns its id, a str as in vLLM. prompt: text, token ids, or a dict {"prompt": text}
        / {"prompt_token_ids": ids}. request_id: a str this engine has never been given (vLLM's
        `llm_engine.add_request(request_id: str, ...)`); an int is accepted too and converted with str() (7 is "7":
        scripts written for this engine's former int ids keep working); None: the engine's next id, from the
        counter that numbers generate()'s requests "0", "1", ... (one a caller already took is skipped).
        TypeError / ValueError (nothing changed) for a bad input, an id already given, or a request that can never
        be served. The scheduler knows the request by an int: `scheduler_request_id(request_id)`."""
        with self._one_thread("add_request()"):
            return self._enqueue(self._check(prompt, params, request_id, "the prompt"))

    def _check(self, prompt, params: Params | None, request_id, where: str) -> _Checked:
        """Every check add_request makes before the scheduler's own (budget, max_num_seqs, pool size). Changes
        nothing."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, (SamplingParams, BeamSearchParams)):
            raise TypeError(f"params must be SamplingParams or BeamSearchParams, got {type(params).__name__}")
        text, ids = prompt_parts(prompt, where)
        if ids is None:
            ids = self._tokenize(text)
        elif any(not 0 <= t < self.config.vocab_size for t in ids):
            bad = next(t for t in ids if not 0 <= t < self.config.vocab_size)
            raise ValueError(f"{where}: token id {bad} is outside the vocabulary "
                             f"(allowed: 0 .. {self.config.vocab_size - 1})")
        if not ids:
            raise ValueError(f"{where} is empty (allowed: at least one token)")
        stop_ids = [] if isinstance(params, BeamSearchParams) else params.stop_token_ids
        if any(t >= self.config.vocab_size for t in stop_ids):  # SamplingParams made them ints >= 0
            bad = next(t for t in stop_ids if t >= self.config.vocab_size)
            raise ValueError(f"{where}'s SamplingParams: stop_token_ids holds {bad}, outside the vocabulary "
                             f"(allowed: token ids 0 .. {self.config.vocab_size - 1})")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"{where} has {len(ids)} tokens, too long for a context of {self.max_model_len} "
                             f"(allowed: at most {self.max_model_len - 1} prompt tokens)")
        request_id = self._ids.check_new(request_id)
        return _Checked(text, ids, params, min(params.max_tokens, self.max_model_len - len(ids)), request_id)

    def _enqueue(self, checked: _Checked) -> str:
        """Queue a checked request; its public id. Only the scheduler's own checks can still refuse it (ValueError,
        nothing changed; the message names the public id)."""
        ids, params, max_tokens = checked.prompt_token_ids, checked.params, checked.max_tokens
        public = self._ids.next_public() if checked.request_id is None else checked.request_id
        rid = self._ids.next_scheduler_id
        beam = isinstance(params, BeamSearchParams)
        prompt_logprobs = None if beam else params.prompt_logprobs
        try:
            arrival = time.perf_counter() - self._start
            self.scheduler.add_request(Request(
                rid, arrival, len(ids), max_tokens,
                n=1 if beam else params.n, beam_width=params.beam_width if beam else 1,
                # ids only for a pool that caches prefixes: enable_prefix_caching, or a policy whose cache is the
                # policy (radix), which must see them even when the flag is off
                prompt_token_ids=ids if self.kv_manager.enable_prefix_caching else None,
                skip_reading_prefix_cache=prompt_logprobs is not None))  # as vLLM: every prompt position computed
        except ValueError as exc:  # "request 3: <why>": the scheduler's int, which the caller never saw
            message = str(exc)
            if message.startswith(f"request {rid}: "):
                raise ValueError(f"request {public!r}: {message.split(': ', 1)[1]}") from None
            raise
        self.arrivals[rid] = (arrival, len(ids), max_tokens)  # for the timeline (reference/timeline.py)
        try:
            self._ids.add(public, rid)
            eos = () if params.ignore_eos else self.config.eos_token_ids
            state = _RequestState(public, checked.prompt, ids, params, max_tokens, {})
            if prompt_logprobs is not None:
                state.prompt_logprobs = PromptLogprobs(ids, prompt_logprobs)
            if beam:
                state.beam = BeamSearchState(params.beam_width, max_tokens, eos, params.length_penalty, len(ids))
            seed = None if beam or params.greedy else (params.seed if params.seed is not None
                                                       else int(self._rng.integers(2**62)))
            for i, seq_id in enumerate(self.scheduler.seq_ids(rid)):
                state.seqs[seq_id] = _Seq(i, [], generator=None if seed is None else sample_generator(seed, i),
                                          logprobs=None if beam or params.logprobs is None else [])
            self._requests[rid] = state
        except BaseException:  # an interrupt right here: the scheduler must not keep a request the engine lacks
            self.scheduler.abort(rid)
            if self._ids.next_scheduler_id == rid:  # the scheduler remembers rid, aborted: never hand it out again
                self._ids.add(public, rid)
            raise
        return public

    def _tokenize(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: give prompts as lists of token ids")
        return list(self.tokenizer(text).input_ids)

    def abort(self, request_id: str | int | list | tuple) -> None:
        """Stop a request wherever it is; its blocks return to the pool at once. request_id: its public id (an int
        converted with str(), as add_request does), or a list of them (vLLM's LLMEngine.abort_request takes a list).
        An unknown or finished request is ignored (vLLM's abort is idempotent too); a bad type is a TypeError."""
        with self._one_thread("abort()"):
            self._abort(request_id)

    def _abort(self, request_id: str | int | list | tuple) -> None:
        for public in request_id if isinstance(request_id, (list, tuple)) else [request_id]:
            rid = self._ids.scheduler_id(public)
            if rid is None or self._requests.pop(rid, None) is None:
                continue
            self.scheduler.abort(rid)
            self.stats.num_aborted_requests += 1

    def scheduler_request_id(self, request_id: str | int) -> int:
        """The int the scheduler knows a request by (`llm.scheduler`, `llm.step_log`, the KV manager's sequences via
        `llm.scheduler.seq_ids`), from its public id; KeyError if this engine was never given that id."""
        rid = self._ids.scheduler_id(request_id)
        if rid is None:
            raise KeyError(f"unknown request_id {request_id!r}")
        return rid

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # --- one iteration ----------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduler plan; the outputs of the requests that advanced (finished ones are final).

        A step that raises (the executor or the sampler failed, KeyboardInterrupt) aborts every request it touched
        (a sequence in the plan, swapped out or copied into by it): their blocks return to the pool and their
        RequestOutput is never delivered as finished (an abort: has_unfinished_requests() no longer counts them).
        The exception is re-raised after that, and counted in stats.num_failed_steps; the other requests stay
        queued and later steps serve them as if nothing had happened. With prefix caching, the blocks the failed
        plan was to write leave the prefix cache (Scheduler.abandon_step), so no later prompt reuses K/V that was
        never computed."""
        with self._one_thread("step()"):
            return self._step()

    @contextmanager
    def _one_thread(self, call: str) -> Iterator[None]:
        """Run `call` (e.g. "generate()") as the only call into this engine. The thread already inside may enter
        again (generate() steps and aborts); another thread gets a RuntimeError at once, nothing changed.
        NOTE: a refusal, not a wait: waiting behind another thread's whole generate() would look like a hang, and
        the engine's state (the scheduler's queues, the requests' tokens) is not safe to share between steps of
        two callers anyway. The cost: about 1 us a call on one CPU core, against milliseconds a step."""
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(f"this LLM is already running {self._running or 'a call'} in another thread; "
                               "use one LLM per thread or call it from one thread")
        outer = self._running
        self._running = outer or call
        try:
            yield
        finally:
            self._running = outer
            self._lock.release()

    def _step(self) -> list[RequestOutput]:
        plan = None
        try:
            with torch.inference_mode():
                start = time.perf_counter()
                with held_interrupts():
                    plan = self.scheduler.schedule()
                if plan.is_empty:
                    self.scheduler.finish_step(plan, StepOutcome())
                    if self.scheduler.has_unfinished() and not self.scheduler.num_running + self.scheduler.num_swapped:
                        raise RuntimeError(f"expected the scheduler to admit one of the {self.scheduler.num_waiting} "
                                           "waiting requests into an idle engine, found an empty plan")
                    return []
                logits, rows, all_rows = self.executor.execute(plan, self._tokens_to_feed, self._wants_all_rows)
                self._collect_prompt_logprobs(plan, all_rows)
                outcome, pending = self._sample(plan, logits, rows)
                with held_interrupts():
                    result = self.scheduler.finish_step(plan, outcome)
                for rid, beams in pending.items():  # the surviving beams under their (possibly new) seq ids
                    # NOTE: a search of width 1 reports no beam_parents (its one beam always goes on): same seq id
                    ids = result.new_beam_seq_ids.get(rid) or list(self._requests[rid].seqs)
                    self._requests[rid].seqs = {i: _Seq(n, b.token_ids, b.cum_logprob) for n, (i, b) in
                                                enumerate(zip(ids, beams))}
                outputs = [self._output(rid) for rid in plan.request_ids()]
                for rid in result.finished_request_ids:
                    del self._requests[rid]
                self._record(plan, result.finished_request_ids, time.perf_counter() - start, start - self._start)
        except BaseException as exc:
            with held_interrupts():
                self._abandon_step(plan, exc)
            raise
        return outputs

    def _abandon_step(self, plan: StepPlan | None, exc: BaseException) -> None:
        """After a failed step: the scheduler aborts what the step touched (plan None: what schedule() was building
        when it raised); the engine forgets those requests. The step's own exception `exc` goes on: should the
        cleanup itself fail (a bug), that failure becomes a note on `exc`, never a replacement of it."""
        self.stats.num_failed_steps += 1
        try:
            aborted = self.scheduler.abandon_step(plan)
        except Exception as cleanup:  # noqa: BLE001 - reported on the original exception, which is re-raised
            exc.add_note(f"and the cleanup after it failed: {type(cleanup).__name__}: {cleanup}")
            return
        for rid in aborted:
            if self._requests.pop(rid, None) is not None:
                self.stats.num_aborted_requests += 1

    def _tokens_to_feed(self, entry: ScheduledSeq) -> list[int]:
        """prompt + generated, [num_computed : num_computed + num_new]; after recompute that includes generated
        tokens. A sampling entry's range must end at the newest token, a chunk's before it: the scheduler and
        the engine agree on lengths."""
        state = self._requests[entry.request_id]
        tokens = state.prompt_token_ids + state.seqs[entry.seq_id].token_ids
        end = entry.num_computed_tokens + entry.num_new_tokens
        if end > len(tokens) or entry.sample != (end == len(tokens)):
            raise RuntimeError(f"seq {entry.seq_id}: expected the step to feed up to its {len(tokens)}th token "
                               f"{'and sample' if entry.sample else 'at most, without sampling'}, found "
                               f"num_computed {entry.num_computed_tokens} + num_new {entry.num_new_tokens}")
        if state.num_cached_tokens is None:
            state.num_cached_tokens = entry.num_computed_tokens  # the first admission's prefix-cache hits
            self.stats.num_cached_tokens += entry.num_computed_tokens
        return tokens[entry.num_computed_tokens:end]
