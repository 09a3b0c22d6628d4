"""What the engine makes of a step's logits: the tokens sampled (or the beams re-chosen), the outcome reported to
the scheduler, the RequestOutputs, and the step's record.

A mixin of `LLM` (reference/engine.py), which owns the state it reads: `self._requests` (request id -> its
prompt, params and sequences), `self.config` (end-of-sequence ids), `self.tokenizer`, `self.scheduler`,
`self.kv_manager`, `self.stats` and `self.step_log`.
"""
from __future__ import annotations

import torch

from reference.beam import Beam
from reference.outputs import CompletionOutput, RequestOutput, StepRecord
from reference.sampling import sample
from sim.plan import ScheduledSeq, StepOutcome, StepPlan


class EngineOutcomes:
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
        tokens, logprobs = sample(logits[[r for _, r in plain]], [st.params for st in states],
                                  [s.generator for s in seqs])
        for (entry, _), state, seq, token, logprob in zip(plain, states, seqs, tokens, logprobs):
            seq.token_ids.append(token)
            seq.cum_logprob += logprob
            if not state.params.ignore_eos and token in self.config.eos_token_ids:
                seq.finish_reason = "stop"
            elif len(seq.token_ids) >= state.max_tokens:
                seq.finish_reason = "length"
            if seq.finish_reason is not None:
                outcome.finished_seq_ids.add(entry.seq_id)
                self._count_finish(seq.finish_reason)

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
    def _decode(self, token_ids: list[int]) -> str:
        return "" if self.tokenizer is None else self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _output(self, request_id: int) -> RequestOutput:
        state = self._requests[request_id]
        if state.beam is not None and state.beam.done:  # the finished hypotheses, best first
            outputs = [CompletionOutput(i, self._decode(h.token_ids), h.token_ids, h.cum_logprob, h.finish_reason)
                       for i, h in enumerate(state.beam.hypotheses)]
        else:
            seqs = sorted(state.seqs.values(), key=lambda s: s.index)
            outputs = [CompletionOutput(s.index, self._decode(s.token_ids), list(s.token_ids), s.cum_logprob,
                                        s.finish_reason) for s in seqs]
        finished = self.scheduler.is_finished(request_id)
        return RequestOutput(request_id, state.prompt, list(state.prompt_token_ids), outputs, finished,
                             state.num_cached_tokens or 0)

    def _record(self, plan: StepPlan, finished: list[int], seconds: float) -> None:
        self.stats.add_step(plan, finished, seconds, self.scheduler.num_preemptions)
        memory = self.kv_manager.breakdown(waiting=self.scheduler.num_waiting > 0)
        self.step_log.append(StepRecord.from_plan(self.stats.num_steps - 1, plan, finished,
                                                  self.kv_manager.num_free_blocks, memory, seconds))
