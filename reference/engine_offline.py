"""vLLM's offline API over the engine's streaming one: `generate`, `chat`, `beam_search`, `get_tokenizer`.

A mixin of `LLM` (reference/engine.py): everything here queues requests with the engine's `_check` / `_enqueue`
and drives `step()` until they finish, so it adds no state of its own. As vLLM's `LLM.generate`, the requests
are numbered by the engine's counter: str ids "0", "1", ... across every call on one LLM.
"""
from __future__ import annotations

from reference.outputs import BeamSearchOutput, BeamSearchSequence, RequestOutput
from reference.prompts import chat_messages, prompt_list
from reference.sampling import BeamSearchParams, SamplingParams, check_bool

Params = SamplingParams | BeamSearchParams


class OfflineAPI:
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
                try:
                    ids.append(self._enqueue(c))
                except ValueError as exc:  # "request '3': <why>": name the prompt, the id was never the caller's
                    message = str(exc)
                    reason = message.split(": ", 1)[-1] if message.startswith("request ") else message
                    raise ValueError(f"{where.format(i)}: {reason}") from None
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
