"""The reference engine: vLLM's offline `LLM` API over the SIMULATOR's own scheduler and KV manager.

The project's central claim, made concrete (docs/ARCHITECTURE.md): "the simulator is the engine with a
simulated clock". This engine builds `sim.scheduling.scheduler.Scheduler` over `sim.kv.make_kv_manager(...)`, exactly
the objects the simulator drives, and executes their plans on a real model (vLLM's LLMEngine loop):

    plan    = scheduler.schedule()                 # who runs, block tables, swaps, copies (sim/)
    logits  = executor.execute(plan)               # the same moves on real K/V tensors, one forward pass
    tokens  = sample(logits) / beam selection      # decides what the simulator reads from its workload:
    result  = scheduler.finish_step(plan, outcome) #   which sequences finished, which beams survive

A v1 plan mixes prompt chunks and decodes: a chunk attends to the earlier chunks of its prompt through the
block table, and only an entry that reaches the end of its sequence (`entry.sample`) samples a token.

Two classes, as vLLM's `LLM` over its `LLMEngine`. `LLMEngine` (this file) is the engine proper, and reads top to
bottom in the order a request meets it: a checked request queued (`_enqueue`: the scheduler's queue), aborts, one
iteration (`step`), what the engine makes of a step's logits (prompt log-probs, sampling, verify entries), and last
the step's record. Beside it: what it keeps per request and the outputs it makes of it (reference/engine/request_state.py),
the stop rules (reference/engine/stops.py), a beam step (reference/engine/beam.py), its two guards (reference/engine/threads.py). `LLM` (reference/engine/llm.py) builds one from settings (the model,
the pool, the KV manager, the scheduler, the executor) and adds vLLM's offline API on top of `step`: `generate`,
`chat`, `beam_search`, and `add_request` with every check of a request's input.

Request ids are vLLM's strings at the engine's surface (add_request, abort, RequestOutput.request_id) and the
simulator's ints below it (the scheduler, the KV manager's sequences, step_log): reference/engine/request_ids.py maps one
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
- one thread at a time: a second thread calling in while one runs gets a RuntimeError at once (`OneThread`).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from reference.engine import executor as ex
from reference.engine.beam import BeamSearchState, step_beams
from reference.engine.outputs import EngineSnapshot, EngineStats, RequestMetrics, RequestOutput, StepRecord
from reference.engine.prompt_logprobs import PromptLogprobs
from reference.engine.request_ids import RequestIds
from reference.engine.request_state import CheckedRequest, Params, RequestState, SampleState, request_output
from reference.engine.sampling import BeamSearchParams, RowContext, sample, sample_generator
from reference.engine.speculative import PROMPT_LOOKUP_MAX, PROMPT_LOOKUP_MIN, accept_greedy, propose_ngram
from reference.engine.stops import check_stop, stop_ids
from reference.engine.threads import OneThread, held_interrupts
from sim.base.request import Request
from sim.scheduling.plan import ScheduledSeq, StepOutcome, StepPlan
from sim.scheduling.scheduler import Scheduler

__all__ = ["CheckedRequest", "LLMEngine", "Params"]


class LLMEngine:
    """The engine proper: the scheduler's plans executed on a real model, one `step` at a time, with the requests'
    tokens, sampling and outputs. Built by `LLM` (reference/engine/llm.py) from settings; usable alone over any scheduler
    and executor (a test builds one from parts).

    One thread at a time: while a thread is inside step(), abort() or a call of `LLM` (generate(), chat(),
    beam_search(), add_request()), the same call from another thread raises RuntimeError at once (nothing changed,
    and the running call completes as if alone); it never waits. Use one engine per thread, or call it from one
    thread."""

    def __init__(self, scheduler: Scheduler, executor: ex.ModelExecutor, config, tokenizer=None, *,
                 seed: int = 0, prompt_lookup_max: int = PROMPT_LOOKUP_MAX,
                 prompt_lookup_min: int = PROMPT_LOOKUP_MIN) -> None:
        self.scheduler, self.kv_manager, self.executor = scheduler, scheduler.kv, executor
        self.config, self.tokenizer = config, tokenizer  # the model's config (eos ids, vocabulary); its tokenizer
        self._max_token_chars: int | None = None  # the vocabulary's longest token, in characters (when first asked)
        self.stats = EngineStats()
        self.step_log: list[StepRecord] = []
        self.arrivals: dict[int, tuple[float, int, int]] = {}  # scheduler id -> (arrival s, prompt len, max tokens)
        self.finished_metrics: list[RequestMetrics] = []  # every finished request's, in finishing order
        self._requests: dict[int, RequestState] = {}  # by scheduler id: the requests not finished
        self._ids = RequestIds()  # public str id <-> scheduler int id, for every request ever queued
        self._rng = np.random.default_rng(seed)  # seeds for requests that bring none
        self._start = time.perf_counter()
        self.started_at = time.time()  # the wall clock (epoch seconds) when the engine's clock (metrics, logs) read 0
        self._one_thread = OneThread()  # `with self._one_thread("step()"):` one thread at a time (reference/engine/threads.py)
        # speculative decoding: each sequence's draft tokens proposed for the step being planned (draft_len), by
        # matching its last n tokens, n from prompt_lookup_max down to prompt_lookup_min (reference/engine/speculative.py)
        self._drafts: dict[int, list[int]] = {}
        self._prompt_lookup = (prompt_lookup_max, prompt_lookup_min)

    # --- requests in: a request that passed LLM's checks joins the scheduler's queue ------------------------
    def _enqueue(self, checked: CheckedRequest, name: str | None = None) -> str:
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
                          skip_reading_prefix_cache=prompt_logprobs is not None,  # as vLLM: every position computed
                          priority=checked.priority)
        why = self.scheduler.check_request(request)  # worded here, in the caller's name for the request
        if why is not None:
            raise ValueError(f"{name or f'request {public!r}'}: {why}")
        self.scheduler.add_request(request)
        self.arrivals[rid] = (arrival, len(ids), max_tokens)  # for the timeline (reference/engine/timeline.py)
        try:
            self._ids.add(public, rid)
            eos = () if params.ignore_eos else self.config.eos_token_ids
            state = RequestState(public, checked.prompt, ids, params, max_tokens, {},
                                  metrics=RequestMetrics(arrival))
            if prompt_logprobs is not None:
                state.prompt_logprobs = PromptLogprobs(ids, prompt_logprobs)
            if beam:
                state.beam = BeamSearchState(params.beam_width, max_tokens, eos, params.length_penalty, len(ids))
            seed = None if beam or params.greedy else (params.seed if params.seed is not None
                                                       else int(self._rng.integers(2**62)))
            for i, seq_id in enumerate(self.scheduler.seq_ids(rid)):
                state.seqs[seq_id] = SampleState(i, [], generator=None if seed is None else sample_generator(seed, i),
                                          logprobs=None if beam or params.logprobs is None else [])
            self._requests[rid] = state
        except BaseException:  # an interrupt right here: the scheduler must not keep a request the engine lacks
            self.scheduler.abort(rid)
            if self._ids.next_scheduler_id == rid:  # the scheduler remembers rid, aborted: never hand it out again
                self._ids.add(public, rid)
            raise
        return public

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

    def is_unfinished(self, request_id: str | int) -> bool:
        """Whether the engine still holds this request (waiting, running or swapped): False once it finished or
        was aborted (by abort(), or by a failed step that touched it), and for an id it was never given."""
        rid = self._ids.scheduler_id(request_id)
        return rid is not None and rid in self._requests

    def snapshot(self, pool: bool = False) -> EngineSnapshot:
        """The queues, the pool's counts, the running totals and the latest step's record, copied (EngineSnapshot): what
        a reader outside the engine (the HTTP server's /metrics) may look at. `pool`: also draw the pool after that
        step as sim.views.viewer does (block owners and tables; its cost grows with the pool, so only when asked). A call of
        the engine's: one thread at a time, as step()."""
        from dataclasses import replace

        with self._one_thread("snapshot()"):
            kv, scheduler = self.kv_manager, self.scheduler
            last = self.step_log[-1] if self.step_log else None
            view = None
            if pool and last is not None:
                from sim.views.viewer import snapshot

                view = snapshot(scheduler, step=last.step, time=last.start_s + last.step_time_s,
                                num_prefills=len(last.prefills), num_decodes=len(last.decodes), preempted=last.preempted,
                                finished=last.finished_request_ids, short=scheduler.num_waiting > 0)
            return EngineSnapshot(scheduler.num_running, scheduler.num_waiting, scheduler.num_swapped, kv.num_blocks,
                                  kv.num_free_blocks, scheduler.num_preemptions, replace(kv.prefix_cache_stats()),
                                  replace(self.stats, finish_reasons=dict(self.stats.finish_reasons)),
                                  None if last is None else replace(last), view)

    def forget_records(self, keep: int) -> None:
        """Keep only the last `keep` step records (step_log) and finished requests' metrics (finished_metrics): an
        engine that serves for days would otherwise hold one record per step it ever ran. Totals (stats) stay whole."""
        with self._one_thread("forget_records()"):
            for records in (self.step_log, self.finished_metrics):
                del records[:max(0, len(records) - keep)]

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

    def _step(self) -> list[RequestOutput]:
        plan = None
        try:
            with torch.inference_mode():
                start = time.perf_counter()
                self._drafts.clear()  # (proposed afresh while schedule() plans verify entries: draft_len)
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
                outcome, pending = self._sample(plan, logits, rows, all_rows)
                with held_interrupts():
                    result = self.scheduler.finish_step(plan, outcome)
                for rid, beams in pending.items():  # the surviving beams under their (possibly new) seq ids
                    # NOTE: a search of width 1 reports no beam_parents (its one beam always goes on): same seq id
                    ids = result.new_beam_seq_ids.get(rid) or list(self._requests[rid].seqs)
                    self._requests[rid].seqs = {i: SampleState(n, b.token_ids, b.cum_logprob) for n, (i, b) in
                                                enumerate(zip(ids, beams))}
                self._time_step(plan, result.finished_request_ids, start - self._start,
                                time.perf_counter() - self._start)
                outputs = [request_output(self._requests[rid], self.scheduler.is_finished(rid), self._decode)
                           for rid in plan.request_ids()]
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

    def draft_len(self, request_id: int, seq_id: int) -> int:
        """The scheduler's question before it plans a verify entry (Scheduler(draft_len=...)): how many draft tokens
        the n-gram draft proposes for this sequence now (reference/engine/speculative.py), kept for `_tokens_to_feed`. 0 for
        a request that is not plain greedy (a temperature, penalties, log-probs, min_tokens, beams)."""
        state = self._requests[request_id]
        p = state.params
        if state.beam is not None or not p.greedy or p.has_penalties or p.min_tokens or p.logprobs is not None:
            return 0
        k = self.scheduler.config.num_speculative_tokens
        self._drafts[seq_id] = propose_ngram(state.prompt_token_ids + state.seqs[seq_id].token_ids, k,
                                             *self._prompt_lookup)
        return len(self._drafts[seq_id])

    def _tokens_to_feed(self, entry: ScheduledSeq) -> list[int]:
        """prompt + generated, [num_computed : num_computed + num_new]; after recompute that includes generated
        tokens. A sampling entry's range must end at the newest token, a chunk's before it: the scheduler and
        the engine agree on lengths. A verify entry then feeds its draft tokens."""
        state = self._requests[entry.request_id]
        tokens = state.prompt_token_ids + state.seqs[entry.seq_id].token_ids
        end = entry.num_computed_tokens + entry.num_new_tokens - entry.num_draft_tokens
        if end > len(tokens) or entry.sample != (end == len(tokens)):
            raise RuntimeError(f"seq {entry.seq_id}: expected the step to feed up to its {len(tokens)}th token "
                               f"{'and sample' if entry.sample else 'at most, without sampling'}, found "
                               f"num_computed {entry.num_computed_tokens} + num_new {entry.num_new_tokens}")
        if state.num_cached_tokens is None:
            state.num_cached_tokens = entry.num_computed_tokens  # the first admission's prefix-cache hits
            self.stats.num_cached_tokens += entry.num_computed_tokens
        if entry.num_draft_tokens:
            return tokens[entry.num_computed_tokens:end] + self._drafts[entry.seq_id][:entry.num_draft_tokens]
        return tokens[entry.num_computed_tokens:end]

    # --- prompt log-probs (what the engine makes of a step's logits, first) ---------------------------------
    def _wants_all_rows(self, entry: ScheduledSeq) -> bool:
        """Whether the executor must hand back the logits of every token this fed entry computes: its request asks
        for prompt log-probs and the entry reaches a prompt position not collected yet."""
        if entry.num_draft_tokens:  # a verify entry: the target's logits at its last token and at every draft
            return True
        collected = self._requests[entry.request_id].prompt_logprobs
        return collected is not None and collected.wants(entry.num_computed_tokens, entry.num_new_tokens)

    def _collect_prompt_logprobs(self, plan: StepPlan, all_rows: dict[int, torch.Tensor]) -> None:
        """File each asked-for entry's rows under its request's prompt positions (reference/engine/prompt_logprobs.py)."""
        entries = plan.entries
        decode = None if self.tokenizer is None else (lambda token: self._decode([token], False))
        for i, logits in all_rows.items():
            entry = entries[i]
            if not entry.num_draft_tokens:  # (a verify entry's rows are its own: _sample_verified)
                self._requests[entry.request_id].prompt_logprobs.add(entry.num_computed_tokens, logits, decode)

    # --- sampling -------------------------------------------------------------------------------------------
    def _sample(self, plan: StepPlan, logits: torch.Tensor, rows: list[int],
                all_rows: dict[int, torch.Tensor] | None = None) -> tuple[StepOutcome, dict]:
        """One token per sampling entry, one beam step per beam request, 1 + the accepted drafts per verify entry: the
        outcome for the scheduler, and the surviving beams (request_id -> list[Beam]) of every beam search that goes
        on. `all_rows`: entry index -> its logits at every fed token (a verify entry's, among others)."""
        outcome, pending = StepOutcome(), {}
        plain: list[tuple[ScheduledSeq, int]] = []
        beam_rows: dict[int, dict[int, int]] = {}  # request_id -> seq_id -> logits row
        for i, (entry, row) in enumerate(zip(plan.entries, rows)):
            if not entry.sample:  # a prompt chunk that stops short of the end: its logits are not needed
                continue
            if entry.num_draft_tokens:
                self._sample_verified(entry, all_rows[i], outcome)
                continue
            if self._requests[entry.request_id].beam is None:
                plain.append((entry, row))
            else:
                beam_rows.setdefault(entry.request_id, {})[entry.seq_id] = row
        if plain:
            self._sample_plain(plain, logits, outcome)
        for rid, row_of in beam_rows.items():
            survivors, finish_reason = step_beams(rid, self._requests[rid], row_of, logits, outcome)
            if finish_reason is not None:
                self._count_finish(finish_reason)
            if survivors:
                pending[rid] = survivors
        return outcome, pending

    def _sample_plain(self, plain: list[tuple[ScheduledSeq, int]], logits: torch.Tensor, outcome: StepOutcome) -> None:
        states = [self._requests[e.request_id] for e, _ in plain]
        seqs = [state.seqs[e.seq_id] for state, (e, _) in zip(states, plain)]
        params = [st.params for st in states]
        contexts = None
        if any(p.has_penalties or p.min_tokens for p in params):
            contexts = [RowContext(st.prompt_token_ids, seq.token_ids, stop_ids(st.params, self.config.eos_token_ids))
                        for st, seq in zip(states, seqs)]
        tokens, logprobs, top = sample(logits[[r for _, r in plain]], params, [s.generator for s in seqs], contexts)
        for (entry, _), state, seq, token, logprob, best in zip(plain, states, seqs, tokens, logprobs, top):
            seq.token_ids.append(token)
            if logprob is not None:
                seq.cum_logprob += logprob
            if best is not None:
                seq.logprobs.append(best)
            check_stop(state, seq, token, self.config.eos_token_ids, self._decode)
            if seq.finish_reason is not None:
                outcome.finished_seq_ids.add(entry.seq_id)
                self._count_finish(seq.finish_reason)

    def _sample_verified(self, entry: ScheduledSeq, logits: torch.Tensor, outcome: StepOutcome) -> None:
        """A verify entry (greedy): the target's argmax at its last token and at each draft, [1 + drafts, vocab] logits
        in; the accepted drafts and the target's next token appended one by one under the stop rules (a stop among
        them ends the sequence there), the accepted count reported for the scheduler's rollback."""
        state = self._requests[entry.request_id]
        seq = state.seqs[entry.seq_id]
        drafts = self._drafts.pop(entry.seq_id)[:entry.num_draft_tokens]
        kept = accept_greedy(drafts, logits.max(dim=-1).indices.tolist())  # (the first maximum, as sample()'s)
        appended = 0
        for token in kept:
            seq.token_ids.append(token)
            appended += 1
            check_stop(state, seq, token, self.config.eos_token_ids, self._decode)
            if seq.finish_reason is not None:
                outcome.finished_seq_ids.add(entry.seq_id)
                self._count_finish(seq.finish_reason)
                break
        outcome.num_accepted[entry.seq_id] = appended - 1
        self.stats.num_draft_tokens += entry.num_draft_tokens
        self.stats.num_accepted_tokens += appended - 1
        self.stats.num_generated_tokens += appended - 1  # (add_step counts the step's one token per sampling entry)

    def _count_finish(self, reason: str) -> None:
        self.stats.finish_reasons[reason] = self.stats.finish_reasons.get(reason, 0) + 1

    # --- outputs and records --------------------------------------------------------------------------------
    def _decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "" if self.tokenizer is None else self.tokenizer.decode(token_ids,
                                                                       skip_special_tokens=skip_special_tokens)

    def _time_step(self, plan: StepPlan, finished: list[int], start_s: float, end_s: float) -> None:
        """The step's times in its requests' metrics: scheduled at its start (the first time), a token step at its end
        for those that sampled, a preemption for those it preempted, finished at its end."""
        requests = self._requests
        for rid in plan.request_ids():
            metrics = requests[rid].metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = start_s
        for rid in dict.fromkeys(e.request_id for e in plan.entries if e.sample):
            requests[rid].metrics.token_step(end_s)
        for rid in plan.preempted:
            if rid in requests:
                requests[rid].metrics.num_preemptions += 1
        for rid in finished:
            requests[rid].metrics.finished_time = end_s
            self.finished_metrics.append(requests[rid].metrics)

    def _record(self, plan: StepPlan, finished: list[int], seconds: float, start_s: float = 0.0) -> None:
        self.stats.add_step(plan, finished, seconds, self.scheduler.num_preemptions)
        memory = self.kv_manager.breakdown(waiting=self.scheduler.num_waiting > 0)
        self.step_log.append(StepRecord.from_plan(self.stats.num_steps - 1, plan, finished,
                                                  self.kv_manager.num_free_blocks, memory, seconds, start_s,
                                                  self.scheduler.num_waiting, self.kv_manager.block_size))


