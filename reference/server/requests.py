"""Requests in: every field of vLLM's request models honoured or refused, checked, and turned into the engine's input.

vLLM's server parses a body with pydantic models (`CompletionRequest`, `ChatCompletionRequest`, the tokenizer's);
this server answers every field those models have, as `FIELDS` says field by field:

    honoured    the server does what vLLM does with it (a test shows it)
    refused     a value that asks for something gets HTTP 400 naming the field (`param`); the values that ask for
                nothing (vLLM's default, null) are accepted, so a client that always sends the default still works
    no effect   every value already holds here (`user` is a label vLLM ignores too; with tools refused, "at most one
                tool call" holds)

A field no vLLM model has is passed over, as vLLM passes over it (its models allow extra fields); the table is
checked against vLLM's own field lists (tests/reference/data/vllm_request_fields.json, written by
tools/vllm_request_fields.py from an installed vLLM), so a field vLLM adds fails a test until the table names it.

Errors are OpenAI's error object (`APIError.body()`): a message naming the field and what is allowed, `param` the
field, HTTP 400 (404 for an unknown model); never a 500 with a traceback.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

HONOURED, REFUSED, NO_EFFECT = "honoured", "refused", "no effect"


class APIError(Exception):
    """An OpenAI-style error: HTTP status, message, the field it is about, and the error type."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclass(frozen=True, slots=True)
class Rule:
    """What the server does with one request field."""

    kind: str  # HONOURED, REFUSED or NO_EFFECT
    why: str  # what it does, or why it is refused / has no effect
    no_op: tuple = (None,)  # REFUSED: the values that ask for nothing, accepted (vLLM's default, null)
    example: Any = None  # a value that asks for something (REFUSED, NO_EFFECT: the field walk of the tests sends it)

    def asks_nothing(self, value) -> bool:
        return any(value == v and type(value) is type(v) for v in self.no_op)


def _refused(why: str, example, *no_op) -> Rule:
    return Rule(REFUSED, why, no_op or (None,), example)


def _h(why: str) -> Rule:
    return Rule(HONOURED, why)


# --- the table: every field of vLLM 0.32's request models ------------------------------------------------------------
_MODEL = _h("the served model's name (--served-model-name); another name is a 404")
_SAMPLING = {name: _h("SamplingParams." + name) for name in (
    "n", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "min_tokens",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "include_stop_str_in_output", "skip_special_tokens")}
_GENERATION = {  # fields both generation routes share
    "model": _MODEL, **_SAMPLING,
    "max_tokens": _h("output tokens at most; more than max_model_len is a 400 (as vLLM); a prompt plus max_tokens "
                     "past the context is cut to the context left (as vLLM)"),
    "stream": _h("server-sent events in OpenAI's chunk format, ended by data: [DONE]"),
    "stream_options": _h("include_usage: a last chunk with the usage; continuous_usage_stats: usage on every chunk"),
    "user": Rule(NO_EFFECT, "an end user's label for the provider's records; vLLM ignores it too", example="alice"),
    "truncate_prompt_tokens": _h("keep the prompt's last k tokens (-1: max_model_len), or its first k with "
                                 "truncation_side 'right'"),
    "truncation_side": _h("which end truncate_prompt_tokens keeps: 'left' drops the start (the default)"),
    "priority": _h("the request's place under --scheduling-policy priority, the lower first; another value than 0 "
                   "without it is a 400 (as vLLM)"),
    "request_id": _h("names the response: its id is cmpl-/chatcmpl-<request_id>-<engine id>"),
    "return_tokens_as_token_ids": _h("logprobs name tokens as 'token_id:<id>'"),
    "return_token_ids": _h("the prompt's and the output's token ids in the response (streamed: the prompt's in "
                           "the first chunk, each chunk's new ids)"),
    "stream_interval": _h("streamed: a chunk once this many new tokens are out (the first and last at once)"),
    "logit_bias": _refused("the sampler adds no bias", {"5": 1.0}, None, {}),
    "use_beam_search": _refused("beam search is served by LLM.beam_search, not over HTTP", True, False),
    "length_penalty": _refused("a beam-search setting, and beam search is not served over HTTP", 2.0, 1.0),
    "watermarking": _refused("no watermarking", True, None, False),
    "spaces_between_special_tokens": _refused("text is decoded as the tokenizer decodes it", False, True),
    "allowed_token_ids": _refused("the sampler has no allow-list", [1, 2]),
    "prompt_logprobs": _refused("prompt log-probabilities are LLM.generate's (SamplingParams.prompt_logprobs), not "
                                "served over HTTP", 1),
    "logprob_token_ids": _refused("log-probabilities of chosen tokens are not served", [1]),
    "bad_words": _refused("the sampler has no banned words", ["x"], None, []),
    "response_format": _refused("no structured output: only {'type': 'text'}, plain text, is served",
                                {"type": "json_object"}, None, {"type": "text"}),
    "structured_outputs": _refused("no structured output", {"json": {"type": "object"}}),
    "session_id": _refused("no session routing: one engine serves every request", "session-1"),
    "routed_experts_prompt_start": _refused("the model has no experts (MoE) to report", 1, 0),
    "return_token_offsets": _refused("vLLM's render endpoints only", True, None, False),
    "mm_payload": _refused("vLLM's render endpoints only; no multimodal input", "none", "tensors"),
    "return_mm_kwargs": _refused("vLLM's render endpoints only; no multimodal input", False),
    "cache_salt": _refused("the prefix cache takes no salt", "salt"),
    "kv_transfer_params": _refused("no disaggregated serving (KV transfer)", {"do_remote_prefill": True}),
    "ec_transfer_params": _refused("no disaggregated serving (encoder cache transfer)", {"do_remote_decode": True}),
    "vllm_xargs": _refused("no custom extensions", {"key": 1}),
    "repetition_detection": _refused("no repetition detection", {"max_pattern_size": 4}),
    "thinking_token_budget": _refused("the served model does not reason (no thinking budget)", 16),
}
COMPLETION_FIELDS = {
    **_GENERATION,
    "prompt": _h("a text, a list of token ids, or a list of either (one choice per prompt and sample, numbered as "
                 "vLLM numbers them: prompt * n + sample)"),
    "logprobs": _h("the top-k log-probabilities of each output token (0..20)"),
    "add_special_tokens": _h("tokenize the prompt with the tokenizer's special tokens (the default) or without"),
    "echo": _refused("the prompt is not echoed back", True, False),
    "suffix": _refused("the model has no fill-in-the-middle template", "}"),
    "prompt_embeds": _refused("prompts are text or token ids, not embeddings", "AAAAAA=="),
    **(OPENAI_ONLY := {  # OpenAI's fields that vLLM 0.32's model no longer has: refused too, never passed over
        "best_of": _refused("one sample per choice: use n", 3, None, 1),
    }),
}
CHAT_FIELDS = {
    **_GENERATION,
    "messages": _h("one conversation, rendered with the model's chat template"),
    "logprobs": _h("with top_logprobs: the log-probability of each output token and the top ones"),
    "top_logprobs": _h("how many most likely tokens to list per output token (0..20, with logprobs)"),
    "max_completion_tokens": _h("OpenAI's name for max_tokens (it wins when both are given)"),
    "add_generation_prompt": _h("open the assistant's turn after the conversation (the default)"),
    "continue_final_message": _h("render the last message open-ended so the model continues it (not with "
                                 "add_generation_prompt)"),
    "add_special_tokens": _h("tokenize the rendered prompt with the tokenizer's special tokens, or without (the "
                             "default: the chat template writes its own)"),
    "return_prompt_text": _h("the rendered prompt in the response (streamed: in the first chunk)"),
    "include_reasoning": Rule(NO_EFFECT, "the served model has no reasoning parser: there is no reasoning part to "
                              "keep or leave out", example=False),
    "parallel_tool_calls": Rule(NO_EFFECT, "tools are refused, so at most one tool call (none) always holds",
                                example=False),
    "tools": _refused("no tool calling", [{"type": "function", "function": {"name": "f"}}], None, []),
    "tool_choice": _refused("no tool calling", "auto", "none", None),
    "reasoning_effort": _refused("the served model does not reason", "low"),
    "echo": _refused("the last message is not echoed back", True, False),
    "documents": _refused("the chat template takes no documents", [{"title": "t", "text": "x"}]),
    "chat_template": _refused("the model's own chat template only (as vLLM without --trust-request-chat-template)",
                              "{{ messages }}"),
    "chat_template_kwargs": _refused("the chat template takes no extra arguments", {"x": 1}, None, {}),
    "media_io_kwargs": _refused("no multimodal input", {"image": {}}),
    "mm_processor_kwargs": _refused("no multimodal input", {"x": 1}),
}
TOKENIZE_FIELDS = {
    "model": _MODEL, "prompt": _h("the text to tokenize"),
    "add_special_tokens": _h("with the tokenizer's special tokens (the default) or without"),
    "return_token_strs": _h("also each token as the tokenizer writes it (token_strs)"),
}
TOKENIZE_CHAT_FIELDS = {
    "model": _MODEL, "messages": _h("one conversation, rendered with the model's chat template, then tokenized"),
    "add_generation_prompt": CHAT_FIELDS["add_generation_prompt"],
    "continue_final_message": CHAT_FIELDS["continue_final_message"],
    "add_special_tokens": CHAT_FIELDS["add_special_tokens"], "return_token_strs": TOKENIZE_FIELDS["return_token_strs"],
    **{name: CHAT_FIELDS[name] for name in ("chat_template", "chat_template_kwargs", "media_io_kwargs",
                                            "mm_processor_kwargs", "tools")},
}
DETOKENIZE_FIELDS = {"model": _MODEL, "tokens": _h("the token ids to decode")}
STREAM_OPTIONS_FIELDS = {
    "include_usage": _h("a last chunk, before [DONE], with the usage of the whole request"),
    "continuous_usage_stats": _h("with include_usage: every chunk carries the usage so far"),
}
# the request kinds as vLLM names its models (the data file's), each with its fields
FIELDS = {"CompletionRequest": COMPLETION_FIELDS, "ChatCompletionRequest": CHAT_FIELDS,
          "TokenizeCompletionRequest": TOKENIZE_FIELDS, "TokenizeChatRequest": TOKENIZE_CHAT_FIELDS,
          "DetokenizeRequest": DETOKENIZE_FIELDS, "StreamOptions": STREAM_OPTIONS_FIELDS}


def check_fields(body: dict, fields: dict[str, Rule]) -> None:
    """A refused field set to anything but a value that asks for nothing: APIError 400 naming it."""
    for name, value in body.items():
        rule = fields.get(name)
        if rule is not None and rule.kind == REFUSED and not rule.asks_nothing(value):
            allowed = " or ".join("null" if v is None else json.dumps(v) for v in rule.no_op)
            raise APIError(400, f"{name} is not supported by this server ({rule.why}), got "
                                f"{json.dumps(value)[:80]} (allowed: {allowed}, or leave it out)", name)


# --- types -------------------------------------------------------------------------------------------------------
_INT, _NUM, _BOOL, _STR = (int,), (int, float), (bool,), (str,)
_GENERATION_TYPES = {
    "model": _STR, "stream": _BOOL, "n": _INT, "max_tokens": _INT, "temperature": _NUM, "top_p": _NUM, "top_k": _INT,
    "min_p": _NUM, "seed": _INT, "stop": (str, list), "stop_token_ids": (list,), "ignore_eos": _BOOL,
    "min_tokens": _INT, "presence_penalty": _NUM, "frequency_penalty": _NUM, "repetition_penalty": _NUM,
    "include_stop_str_in_output": _BOOL, "skip_special_tokens": _BOOL, "user": _STR, "stream_options": (dict,),
    "truncate_prompt_tokens": _INT, "truncation_side": _STR, "priority": _INT, "request_id": _STR,
    "return_tokens_as_token_ids": _BOOL, "return_token_ids": _BOOL, "stream_interval": _INT,
    "add_special_tokens": _BOOL,
}
TYPES = {
    "CompletionRequest": {**_GENERATION_TYPES, "prompt": (str, list), "logprobs": _INT},
    "ChatCompletionRequest": {**_GENERATION_TYPES, "messages": (list,), "logprobs": _BOOL, "top_logprobs": _INT,
                              "max_completion_tokens": _INT, "add_generation_prompt": _BOOL,
                              "continue_final_message": _BOOL, "return_prompt_text": _BOOL,
                              "include_reasoning": _BOOL, "parallel_tool_calls": _BOOL},
    "TokenizeCompletionRequest": {"model": _STR, "prompt": _STR, "add_special_tokens": _BOOL,
                                  "return_token_strs": _BOOL},
    "TokenizeChatRequest": {"model": _STR, "messages": (list,), "add_generation_prompt": _BOOL,
                            "continue_final_message": _BOOL, "add_special_tokens": _BOOL, "return_token_strs": _BOOL},
    "DetokenizeRequest": {"model": _STR, "tokens": (list,)},
    "StreamOptions": {"include_usage": _BOOL, "continuous_usage_stats": _BOOL},
}


def check_body(body: Any, kind: str, required: tuple[str, ...] = ()) -> dict:
    """The body of a `kind` request (FIELDS' keys): a JSON object with `required`, each field of the right type, no
    refused field asking for something; else APIError 400 naming the field."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    for name in required:
        if name not in body:
            raise APIError(400, f"{name} is required", name)
    for name, allowed in TYPES[kind].items():
        value = body.get(name)
        if value is not None and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
            names = " or ".join({"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
                                 "list": "a list", "dict": "an object"}[t.__name__] for t in allowed)
            raise APIError(400, f"{name} must be {names}, got {type(value).__name__}", name)
    check_fields(body, FIELDS[kind])
    options = body.get("stream_options")
    if options is not None:
        if not body.get("stream"):  # as vLLM
            raise APIError(400, "stream_options needs stream: true (allowed: leave stream_options out)",
                           "stream_options")
        check_body(options, "StreamOptions")
    return body


# --- into the engine -----------------------------------------------------------------------------------------------
_SAMPLING_FIELDS = tuple(_SAMPLING) + ("max_tokens",)


def sampling_params(body: dict, *, logprobs: int | None, default_max_tokens: int, max_model_len: int,
                    max_tokens_field: str = "max_tokens"):
    """SamplingParams from a request body's fields (OpenAI's defaults: temperature 1, max_tokens 16 for completions);
    an APIError 400 naming the field for a wrong type or value (the engine's own checks, in its words)."""
    from reference.engine.sampling import SamplingParams

    given = {name: body[name] for name in _SAMPLING_FIELDS if body.get(name) is not None}
    if given.get("max_tokens", 0) > max_model_len:  # as vLLM: a request that could never get its tokens
        raise APIError(400, f"{max_tokens_field}={given['max_tokens']} cannot be greater than max_model_len="
                            f"{max_model_len} (allowed: 1 .. {max_model_len}). Please request fewer output tokens.",
                       max_tokens_field)
    given.setdefault("max_tokens", default_max_tokens)
    if logprobs is not None:
        given["logprobs"] = logprobs
    try:
        return SamplingParams(**given)
    except (TypeError, ValueError) as exc:
        name = field_of(str(exc))
        raise APIError(400, str(exc), max_tokens_field if name == "max_tokens" else name) from None


def field_of(message: str, default: str | None = None) -> str | None:
    """The request field an engine message is about: the one it starts with ("stop_token_ids must ...", never
    "stop"), or names after "SamplingParams: " / "'s " (add_request's checks); else `default`."""
    names = "|".join(sorted((*_SAMPLING_FIELDS, "logprobs", "priority"), key=len, reverse=True))
    found = re.match(rf"(?:.*SamplingParams: |.*'s )?({names})\b", message)
    return found.group(1) if found else default


def completion_prompts(body: dict) -> list[str | list[int]]:
    """The prompts of a completion request, as vLLM takes them: a text, a list of token ids, a list of texts or a list
    of lists of token ids; one engine request each. APIError 400 naming `prompt` for anything else."""
    prompt = body["prompt"]

    def ids(x) -> bool:
        return isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

    if isinstance(prompt, str) or ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and (all(isinstance(p, str) for p in prompt) or all(map(ids, prompt))):
        return list(prompt)
    raise APIError(400, "prompt must be a text, a list of token ids, or a non-empty list of texts or of lists of "
                        "token ids (not mixed)", "prompt")


def truncation(body: dict, max_model_len: int) -> tuple[int, str] | None:
    """(tokens to keep, the side they are kept from: 'left' keeps the last) from truncate_prompt_tokens, or None."""
    k, side = body.get("truncate_prompt_tokens"), body.get("truncation_side") or "left"
    if side not in ("left", "right"):
        raise APIError(400, f"truncation_side must be 'left' or 'right', got {side!r}", "truncation_side")
    if k is None:
        return None
    k = max_model_len if k == -1 else k
    if not 1 <= k <= max_model_len - 1:  # one token of context is left for the output, as vLLM's
        raise APIError(400, f"truncate_prompt_tokens={body['truncate_prompt_tokens']} (allowed: -1 for the context, "
                            f"or 1 .. {max_model_len - 1})", "truncate_prompt_tokens")
    return k, side


def truncate(ids: list[int], rule: tuple[int, str] | None) -> list[int]:
    if rule is None or len(ids) <= rule[0]:
        return ids
    k, side = rule
    return ids[-k:] if side == "left" else ids[:k]


def render_conversation(llm, messages, add_generation_prompt: bool, continue_final_message: bool) -> str:
    """The prompt text of one conversation, rendered with the model's chat template. continue_final_message: the
    last message left open so the model continues it (transformers' rule: the rendered text cut right after that
    message's text). TypeError / ValueError naming the message the template cannot take (LLM.render_chat)."""
    if messages and all(isinstance(m, (list, tuple)) for m in messages):  # render_chat's batch of conversations
        raise ValueError("messages must be one conversation, a list of message objects (a batch of conversations is "
                         "not served: send one request per conversation)")
    if not continue_final_message:
        return llm.render_chat(messages, add_generation_prompt)[0]
    if add_generation_prompt:
        raise APIError(400, "continue_final_message and add_generation_prompt cannot both be true (allowed: "
                            "add_generation_prompt: false)", "continue_final_message")
    text = llm.render_chat(messages, False)[0]
    final = messages[-1]["content"]
    if isinstance(final, list):  # OpenAI's parts: the last text one, as transformers takes it
        final = next((p.get("text", "") for p in reversed(final) if isinstance(p, dict) and "text" in p), "")
    final = final.strip()
    if not final or final not in text:
        raise APIError(400, "continue_final_message: the last message's text does not appear in the rendered "
                            "conversation (allowed: a last message with text)", "continue_final_message")
    return text[: text.rindex(final) + len(final)]
