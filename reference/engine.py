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

`LLM` reads top to bottom in the order a request meets it: construction; the offline API (`generate`, `chat`,
`beam_search`: queue every prompt, then step until they finish); requests in (`add_request`: checks, then the
scheduler's queue); one iteration (`step`); what the engine makes of a step's logits (prompt log-probs, sampling
and stop rules, beam steps); and last the outputs and the step's record.

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
from reference.beam import Beam, BeamSearchState
from reference.cpu_allocator import keep_freed_memory
from reference.kv_cache import KVCache, kv_bytes_per_block
from reference.models.llama import LlamaForwardModel
from reference.outputs import (BeamSearchOutput, BeamSearchSequence, CompletionOutput, EngineStats, Logprob,
                               RequestOutput, StepRecord)
from reference.prompt_logprobs import PromptLogprobs
from reference.prompts import chat_messages, prompt_list, prompt_parts
from reference.request_ids import RequestIds
from reference.sampling import (BeamSearchParams, RowContext, SamplingParams, check_bool, check_int, check_real, sample,
                                sample_generator)
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


class LLM:
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

    # --- the offline API: vLLM's generate / chat / beam_search over the streaming API below -----------------
    # Each queues its requests with `_check` / `_enqueue` and drives `step()` until they finish, so it adds no state
    # of its own. As vLLM's LLM.generate, the requests are numbered by the engine's counter: str ids "0", "1", ...
    # across every call on one LLM.
    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None, *,
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """One finished RequestOutput per prompt, in prompt order.

        prompts: str | list[int] (ONE prompt as token ids) | {"prompt": str} | {"prompt_token_ids": list[int]}, or
        a list (tuple) of those; numpy integer arrays count as token ids (a 2-D array: one prompt per row).
        params (or `sampling_params=`, vLLM's name): one SamplingParams for all prompts, or a list with one per
        prompt. Each RequestOutput.request_id is the engine's next id, as vLLM numbers them: "0", "1", ... counted
        across every call on this LLM (and add_request(request_id=None)).
        All or none: every prompt and params is checked before any request is queued (TypeError for a wrong
        type, ValueError for a wrong value). If a step fails or the call is interrupted (KeyboardInterrupt),
        every request it queued is aborted before the exception goes on; the engine stays usable."""
        if sampling_params is not None:
            if params is not None:
                raise TypeError("give the SamplingParams once: as the second argument or as sampling_params=")
            params = sampling_params
        prompts = prompt_list(prompts)
        if isinstance(params, (list, tuple)):
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts (allowed: 1 or equal)")
            params = list(params)
        else:
            params = [params if params is not None else SamplingParams()] * len(prompts)
        for i, p in enumerate(params):
            if isinstance(p, BeamSearchParams):
                raise TypeError("generate() takes SamplingParams; use beam_search() for BeamSearchParams")
            if not isinstance(p, SamplingParams):
                raise TypeError(f"params{f'[{i}]' if len(params) > 1 else ''} must be SamplingParams, "
                                f"got {type(p).__name__}")
        return self._run(prompts, params, check_bool("use_tqdm", use_tqdm), "generate()")

    def chat(self, messages, sampling_params: SamplingParams | list[SamplingParams] | None = None, *,
             use_tqdm: bool = False, add_generation_prompt: bool = True) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation (a list of {"role": ..., "content": ...} dicts) or a list of them,
        rendered with the tokenizer's chat template (the assistant's turn opened when add_generation_prompt),
        then generated as generate() does. A RequestOutput's prompt is the rendered text. A message's content is
        a str, or OpenAI's list of parts, of which this engine serves the text ones (`chat_messages`). A message the
        template cannot take is a TypeError / ValueError naming it (messages[i], or messages[c][i] in a list of
        conversations), before anything is queued."""
        add_generation_prompt = check_bool("add_generation_prompt", add_generation_prompt)
        conversations = chat_messages(messages)
        if self.tokenizer is None or getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError("this model has no chat template: use generate() with plain prompts")
        import jinja2  # transformers renders chat templates with it

        with self._one_thread("chat()"):
            texts = []
            for c, conversation in enumerate(conversations):
                try:
                    texts.append(self.tokenizer.apply_chat_template(
                        conversation, add_generation_prompt=add_generation_prompt, tokenize=False))
                except jinja2.TemplateError as exc:  # the template's own rule (raise_exception): one line naming it
                    where = "messages" if len(conversations) == 1 else f"messages[{c}]"
                    raise ValueError(f"{where}: the chat template refuses the conversation: "
                                     f"{' '.join(str(exc).split())}") from None
            return self.generate(texts, sampling_params, use_tqdm=use_tqdm)

    def get_tokenizer(self):
        """The model's tokenizer (a transformers tokenizer), or None for a model given without one."""
        return self.tokenizer

    def beam_search(self, prompts, params: BeamSearchParams) -> list[BeamSearchOutput]:
        """The best `beam_width` sequences of each prompt, by vLLM's beam search rules (see beam.py): each
        sequence's `tokens` and `text` hold the prompt and the output, as vLLM's do; `score` is vLLM's (the length
        penalty over prompt + output). prompts as for generate(); all or none, and an interruption aborts what it
        queued, as for generate(). beam_width 1 keeps one beam and every sequence that ended with EOS."""
        if not isinstance(params, BeamSearchParams):
            raise TypeError(f"beam_search() takes BeamSearchParams, got {type(params).__name__}")
        eos = () if params.ignore_eos else tuple(self.config.eos_token_ids)
        prompts, results = prompt_list(prompts), []
        for out in self._run(prompts, [params] * len(prompts), False, "beam_search()"):
            seqs = []
            for c in out.outputs:
                tokens = out.prompt_token_ids + c.token_ids
                length = len(tokens) - (1 if c.token_ids and c.token_ids[-1] in eos else 0)
                seqs.append(BeamSearchSequence(tokens, self._decode(tokens), c.cumulative_logprob, c.finish_reason,
                                               c.cumulative_logprob / max(length, 1) ** params.length_penalty))
            results.append(BeamSearchOutput(seqs))
        return results

    def _run(self, prompts: list, params: list[Params], use_tqdm: bool, call: str) -> list[RequestOutput]:
        """As the one caller of the engine (`call`, e.g. "generate()": another thread meanwhile gets a RuntimeError),
        check every prompt, queue them all (all or none), step until they are done; on any exception or
        interruption while stepping, abort the ones still queued and re-raise."""
        with self._one_thread(call):
            return self._run_alone(prompts, params, use_tqdm)

    def _run_alone(self, prompts: list, params: list[Params], use_tqdm: bool) -> list[RequestOutput]:
        where = "the prompt" if len(prompts) == 1 else "prompt {}"
        checked = [self._check(prompt, p, None, where.format(i)) for i, (prompt, p) in enumerate(zip(prompts, params))]
        ids: list[str] = []
        rng_state = self._rng.bit_generator.state
        try:
            for i, c in enumerate(checked):
                ids.append(self._enqueue(c, where.format(i)))  # a refusal names the prompt: the ids are the engine's
        except BaseException:  # the scheduler refused one (it can never be served), or an interrupt: none stays
            for rid in map(self.scheduler_request_id, ids):
                self._requests.pop(rid, None)
                self.scheduler.abort(rid)
            self._rng.bit_generator.state = rng_state  # the seeds drawn for them are not used up either
            raise
        wanted, finals = set(ids), {}
        bar = None
        try:
            if use_tqdm:
                from tqdm import tqdm

                bar = tqdm(total=len(ids), desc="requests", unit="req")
            while len(finals) < len(wanted):
                for out in self.step():
                    if out.finished and out.request_id in wanted:
                        finals[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
        except BaseException:
            for rid in ids:
                self.abort(rid)  # finished ones and those the failed step aborted are gone already: no-op
            raise
        finally:
            if bar is not None:
                bar.close()
        return [finals[rid] for rid in ids]

    # --- requests in ----------------------------------------------------------------------------------------
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

    def _enqueue(self, checked: _Checked, name: str | None = None) -> str:
        """Queue a checked request; its public id. Only the scheduler's own checks can still refuse it: a ValueError
        (nothing changed) that names the request as `name` ("prompt 1", from generate()), else by its public id."""
        ids, params, max_tokens = checked.prompt_token_ids, checked.params, checked.max_tokens
        public = self._ids.next_public() if checked.request_id is None else checked.request_id
        rid = self._ids.next_scheduler_id
        beam = isinstance(params, BeamSearchParams)
        prompt_logprobs = None if beam else params.prompt_logprobs
        arrival = time.perf_counter() - self._start
        request = Request(rid, arrival, len(ids), max_tokens, n=1 if beam else params.n,
                          beam_width=params.beam_width if beam else 1,
                          # ids only for a pool that caches prefixes: enable_prefix_caching, or a policy whose cache
                          # is the policy (radix), which must see them even when the flag is off
                          prompt_token_ids=ids if self.kv_manager.enable_prefix_caching else None,
                          skip_reading_prefix_cache=prompt_logprobs is not None)  # as vLLM: every position computed
        why = self.scheduler.check_request(request)  # worded here, in the caller's name for the request
        if why is not None:
            raise ValueError(f"{name or f'request {public!r}'}: {why}")
        self.scheduler.add_request(request)
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

    # --- one iteration --------------------------------------------------------------------------------------
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

    # --- prompt log-probs (what the engine makes of a step's logits, first) ---------------------------------
    def _wants_all_rows(self, entry: ScheduledSeq) -> bool:
        """Whether the executor must hand back the logits of every token this fed entry computes: its request asks
        for prompt log-probs and the entry reaches a prompt position not collected yet."""
        collected = self._requests[entry.request_id].prompt_logprobs
        return collected is not None and collected.wants(entry.num_computed_tokens, entry.num_new_tokens)

    def _collect_prompt_logprobs(self, plan: StepPlan, all_rows: dict[int, torch.Tensor]) -> None:
        """File each asked-for entry's rows under its request's prompt positions (reference/prompt_logprobs.py)."""
        entries = plan.entries
        decode = None if self.tokenizer is None else (lambda token: self._decode([token], False))
        for i, logits in all_rows.items():
            entry = entries[i]
            self._requests[entry.request_id].prompt_logprobs.add(entry.num_computed_tokens, logits, decode)

    # --- sampling -------------------------------------------------------------------------------------------
    def _sample(self, plan: StepPlan, logits: torch.Tensor, rows: list[int]) -> tuple[StepOutcome, dict]:
        """One token per sampling entry, one beam step per beam request: the outcome for the scheduler, and the
        surviving beams (request_id -> list[Beam]) of every beam search that goes on."""
        outcome, pending = StepOutcome(), {}
        plain: list[tuple[ScheduledSeq, int]] = []
        beam_rows: dict[int, dict[int, int]] = {}  # request_id -> seq_id -> logits row
        for entry, row in zip(plan.entries, rows):
            if not entry.sample:  # a prompt chunk that stops short of the end: its logits are not needed
                continue
            if self._requests[entry.request_id].beam is None:
                plain.append((entry, row))
            else:
                beam_rows.setdefault(entry.request_id, {})[entry.seq_id] = row
        if plain:
            self._sample_plain(plain, logits, outcome)
        for rid, row_of in beam_rows.items():
            survivors = self._step_beams(rid, row_of, logits, outcome)
            if survivors:
                pending[rid] = survivors
        return outcome, pending

    def _sample_plain(self, plain: list[tuple[ScheduledSeq, int]], logits: torch.Tensor, outcome: StepOutcome) -> None:
        states = [self._requests[e.request_id] for e, _ in plain]
        seqs = [state.seqs[e.seq_id] for state, (e, _) in zip(states, plain)]
        params = [st.params for st in states]
        contexts = None
        if any(p.has_penalties or p.min_tokens for p in params):
            contexts = [RowContext(st.prompt_token_ids, seq.token_ids, self._stop_ids(st.params))
                        for st, seq in zip(states, seqs)]  # fmt: skip
        tokens, logprobs, top = sample(logits[[r for _, r in plain]], params, [s.generator for s in seqs], contexts)
        for (entry, _), state, seq, token, logprob, best in zip(plain, states, seqs, tokens, logprobs, top):
            seq.token_ids.append(token)
            if logprob is not None:
                seq.cum_logprob += logprob
            if best is not None:
                seq.logprobs.append(best)
            self._check_stop(state, seq, token)
            if seq.finish_reason is not None:
                outcome.finished_seq_ids.add(entry.seq_id)
                self._count_finish(seq.finish_reason)

    def _stop_ids(self, params) -> tuple[int, ...]:
        eos = () if params.ignore_eos else tuple(self.config.eos_token_ids)
        return eos + tuple(params.stop_token_ids)

    def _check_stop(self, state, seq, token: int) -> None:
        """vLLM v1's stop rules: no stop before min_tokens; an end-of-sequence id (unless ignore_eos) or a stop id
        stops ("stop", stop_reason = the id); a stop string in the new text stops and cuts the text (checked from
        min_tokens + 1 tokens on, as vLLM's detokenizer); else max_tokens ends it ("length")."""
        p, n = state.params, len(seq.token_ids)
        if n >= p.min_tokens:
            if not p.ignore_eos and token in self.config.eos_token_ids:
                seq.finish_reason, seq.stop_token = "stop", True
            elif token in p.stop_token_ids:
                seq.finish_reason, seq.stop_token, seq.stop_reason = "stop", True, token
        if p.stop and n > p.min_tokens and not seq.stop_token:
            text = self._decode(seq.token_ids, p.skip_special_tokens)
            hit = find_stop_string(text, len(text) - seq.text_len, p.stop, p.include_stop_str_in_output)
            seq.text_len = len(text)
            if hit is not None:
                seq.finish_reason, (seq.stop_reason, seq.text_end) = "stop", hit
        if seq.finish_reason is None and n >= state.max_tokens:
            seq.finish_reason = "length"

    def _step_beams(self, rid: int, row_of: dict[int, int], logits: torch.Tensor, outcome: StepOutcome) -> list[Beam]:
        state = self._requests[rid]
        if set(row_of) != set(state.seqs):
            raise RuntimeError(f"request {rid}: expected all beams {sorted(state.seqs)} in the step, "
                               f"found {sorted(row_of)}")
        order = sorted(state.seqs, key=lambda i: state.seqs[i].index)  # beam order, best first
        beams = [Beam(i, state.seqs[i].token_ids, state.seqs[i].cum_logprob) for i in order]
        step = state.beam.step(beams, torch.log_softmax(logits[[row_of[i] for i in order]], dim=-1).cpu())
        if step.done:
            outcome.finished_seq_ids.update(order)
            self._count_finish(state.beam.hypotheses[0].finish_reason if state.beam.hypotheses else "length")
        elif state.beam.width > 1:  # the scheduler re-chooses beams; a single beam simply goes on (a plain group)
            outcome.beam_parents[rid] = step.parents
        return step.beams

    def _count_finish(self, reason: str) -> None:
        self.stats.finish_reasons[reason] = self.stats.finish_reasons.get(reason, 0) + 1

    # --- outputs and records --------------------------------------------------------------------------------
    def _decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "" if self.tokenizer is None else self.tokenizer.decode(token_ids,
                                                                       skip_special_tokens=skip_special_tokens)

    def _completion(self, seq, params) -> CompletionOutput:
        """A sample's CompletionOutput, its text cut as vLLM cuts it (a stop token's or stop string's text is left
        out unless include_stop_str_in_output)."""
        ids = list(seq.token_ids)  # (beams in progress have BeamSearchParams: vLLM's defaults)
        skip = getattr(params, "skip_special_tokens", True)
        keep_stop = getattr(params, "include_stop_str_in_output", False)
        text = self._decode(ids[:-1] if seq.stop_token and not keep_stop else ids, skip)
        if seq.text_end is not None and seq.text_end >= 0:
            text = text[:seq.text_end]
        # decoded_token shows special tokens as they are (vLLM converts ids to tokens for logprobs)
        logprobs = None if seq.logprobs is None else [
            {t: Logprob(lp, rank, self._decode([t], False)) for t, (lp, rank) in step.items()} for step in seq.logprobs]
        # vLLM: no cumulative_logprob for a sample that asked for no logprobs (beams always score theirs)
        cumulative = seq.cum_logprob if getattr(params, "logprobs", 0) is not None else None
        return CompletionOutput(seq.index, text, ids, cumulative, logprobs, seq.finish_reason, seq.stop_reason)

    def _output(self, request_id: int) -> RequestOutput:
        """The RequestOutput of the request the scheduler knows as `request_id`, under its public id."""
        state = self._requests[request_id]
        if state.beam is not None and state.beam.done:  # the finished hypotheses, best first
            outputs = [CompletionOutput(i, self._decode(h.token_ids), h.token_ids, h.cum_logprob, None, h.finish_reason)
                       for i, h in enumerate(state.beam.hypotheses)]
        else:
            seqs = sorted(state.seqs.values(), key=lambda s: s.index)
            outputs = [self._completion(s, state.params) for s in seqs]
        finished = self.scheduler.is_finished(request_id)
        prompt_logprobs = None if state.prompt_logprobs is None else list(state.prompt_logprobs.entries)
        return RequestOutput(state.request_id, state.prompt, list(state.prompt_token_ids), prompt_logprobs, outputs,
                             finished, state.num_cached_tokens or 0)

    def _record(self, plan: StepPlan, finished: list[int], seconds: float, start_s: float = 0.0) -> None:
        self.stats.add_step(plan, finished, seconds, self.scheduler.num_preemptions)
        memory = self.kv_manager.breakdown(waiting=self.scheduler.num_waiting > 0)
        self.step_log.append(StepRecord.from_plan(self.stats.num_steps - 1, plan, finished,
                                                  self.kv_manager.num_free_blocks, memory, seconds, start_s,
                                                  self.scheduler.num_waiting, self.kv_manager.block_size))


def find_stop_string(text: str, new_chars: int, stop: list[str], include: bool) -> tuple[str, int] | None:
    """vLLM's check_stop_strings: the first stop string (in the list's order) found in the text's newest
    `new_chars` characters (or overlapping them); (the string, where the text ends: -1 for no cut)."""
    if not new_chars:
        return None
    for s in stop:
        index = text.find(s, 1 - new_chars - len(s))
        if index == -1:
            continue
        if include:
            index += len(s)
            if index >= len(text):
                return s, -1
        return s, index
    return None
