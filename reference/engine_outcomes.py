"""What the engine makes of a step's logits: the tokens sampled (or the beams re-chosen), the prompt log-probs
collected, the outcome reported to the scheduler, the RequestOutputs, and the step's record.

A mixin of `LLM` (reference/engine.py), which owns the state it reads: `self._requests` (the scheduler's request
id -> its public id, prompt, params and sequences), `self.config` (end-of-sequence ids), `self.tokenizer`,
`self.scheduler`, `self.kv_manager`, `self.stats` and `self.step_log`.
"""
from __future__ import annotations

import torch

from reference.beam import Beam
from reference.outputs import CompletionOutput, Logprob, RequestOutput, StepRecord
from reference.sampling import RowContext, sample
from sim.plan import ScheduledSeq, StepOutcome, StepPlan


class EngineOutcomes:
    # --- prompt log-probs -----------------------------------------------------------------------------------
    def _wants_all_rows(self, entry: ScheduledSeq) -> bool:
        """Whether the executor must hand back the logits of every token this fed entry computes: its request asks
        for prompt log-probs and the entry reaches a prompt position not collected yet."""
        collected = self._requests[entry.request_id].prompt_logprobs
        return collected is not None and collected.wants(entry.num_computed_tokens, entry.num_new_tokens)

    def _collect_prompt_logprobs(self, plan: StepPlan, all_rows: dict[int, torch.Tensor]) -> None:
        """File each asked-for entry's rows under its request's prompt positions (reference/prompt_logprobs.py)."""
        entries = plan.prefills + plan.decodes
        decode = None if self.tokenizer is None else (lambda token: self._decode([token], False))
        for i, logits in all_rows.items():
            entry = entries[i]
            self._requests[entry.request_id].prompt_logprobs.add(entry.num_computed_tokens, logits, decode)

    # --- sampling -----------------------------------------------------------------------------------------
    def _sample(self, plan: StepPlan, logits: torch.Tensor, rows: list[int]) -> tuple[StepOutcome, dict]:
        """One token per sampling entry, one beam step per beam request: the outcome for the scheduler, and the
        surviving beams (request_id -> list[Beam]) of every beam search that goes on."""
        outcome, pending = StepOutcome(), {}
        plain: list[tuple[ScheduledSeq, int]] = []
        beam_rows: dict[int, dict[int, int]] = {}  # request_id -> seq_id -> logits row
        for entry, row in zip(plan.prefills + plan.decodes, rows):
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

    # --- outputs and records ----------------------------------------------------------------------------
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
