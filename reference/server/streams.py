"""Responses out: OpenAI's objects for the engine's RequestOutputs, whole or as server-sent events, and the open
streams' registry that lets a shutdown end every one at once.

A completion request may carry several prompts (one engine request each) and n samples per prompt: its choices are
numbered as vLLM numbers them, prompt * n + sample. A stream sends, per step with new tokens, one chunk per choice
with the text no later token changes (`settled_text`), then a usage chunk (stream_options.include_usage) and
`data: [DONE]`. A stream that cannot finish (the engine failed, the server stops) sends OpenAI's error object as an
event, then `data: [DONE]`, so a client always sees where and why it ended.
"""
from __future__ import annotations

import asyncio
import json
import math
import time

from reference.engine.outputs import RequestOutput, settled_text
from reference.server.requests import APIError

DONE = "data: [DONE]\n\n"


def frame(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def error_frames(error: APIError) -> list[str]:
    """How a stream ends when it cannot finish: the error as an event, then [DONE] (as vLLM's streams end)."""
    return [frame(error.body()), DONE]


def engine_error(exc: BaseException) -> APIError:
    """The APIError for what an engine sink delivered instead of an output: the server stopping (503), or a failed
    step that aborted the request (500)."""
    from reference.server.engine_thread import ShuttingDown

    if isinstance(exc, ShuttingDown):
        return APIError(503, str(exc), kind="service_unavailable")
    return APIError(500, f"the engine failed: {type(exc).__name__}: {exc}", kind="internal_server_error")


class OpenStreams:
    """The queues of every open response (streamed or not) and of the pool page's event streams, so that a shutdown
    can end each at once: `close_all` puts an error in every one (on the event loop's thread), and `closing` turns
    new requests away (503)."""

    def __init__(self) -> None:
        self.closing: str | None = None  # why the server is stopping, once it is
        self._queues: set[asyncio.Queue] = set()

    def add(self, q: asyncio.Queue) -> None:
        self._queues.add(q)

    def discard(self, q: asyncio.Queue) -> None:
        self._queues.discard(q)

    def close_all(self, why: str) -> None:
        from reference.server.engine_thread import ShuttingDown

        self.closing = why
        for q in list(self._queues):
            put_latest(q, ShuttingDown(why))


def put_latest(q: asyncio.Queue, item) -> None:
    """Put `item` in `q`; a full queue loses its oldest item first (a reader that falls behind sees the latest)."""
    if q.full():
        q.get_nowait()
    q.put_nowait(item)


class Renderer:
    """OpenAI's response objects for one request's prompts: the whole response, or the chunks of a stream."""

    def __init__(self, response_id: str, model: str, chat: bool, n: int, body: dict, num_prompts: int = 1,
                 prompt_text: str | None = None, prompt_ids: list[int] | None = None) -> None:
        self.id, self.model, self.chat, self.n = response_id, model, chat, n
        self.created = int(time.time())
        self.prompt_text, self.prompt_ids = prompt_text, prompt_ids  # chat: the rendered conversation, its ids
        count = n * num_prompts
        self.sent_text, self.sent_tokens = [0] * count, [0] * count  # characters and tokens sent, per choice
        stop = body.get("stop") or []
        self.hold = max(map(len, [stop] if isinstance(stop, str) else stop), default=0)  # settled_text's hold
        options = body.get("stream_options") or {}
        self.include_usage = bool(options.get("include_usage"))
        self.continuous_usage = self.include_usage and bool(options.get("continuous_usage_stats"))  # as vLLM
        self.top_logprobs = body.get("top_logprobs") or 0
        self.as_token_ids = bool(body.get("return_tokens_as_token_ids"))
        self.token_ids = bool(body.get("return_token_ids"))
        self.with_prompt_text = bool(body.get("return_prompt_text"))
        self.interval = body.get("stream_interval") or 1

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _token(self, token_id: int, lp) -> str:
        return f"token_id:{token_id}" if self.as_token_ids else (lp.decoded_token or "")

    def _logprobs(self, completion, start: int) -> dict | None:
        if completion.logprobs is None:
            return None
        ids, rows = completion.token_ids[start:], completion.logprobs[start:]
        if self.chat:
            content = []
            for token_id, row in zip(ids, rows):
                top = sorted(row.items(), key=lambda item: item[1].rank or 0)[: self.top_logprobs]
                content.append({**self._chat_token(token_id, row[token_id]),
                                "top_logprobs": [self._chat_token(t, lp) for t, lp in top]})
            return {"content": content}
        return {"tokens": [self._token(t, row[t]) for t, row in zip(ids, rows)],
                "token_logprobs": [_finite(row[t].logprob) for t, row in zip(ids, rows)],
                "top_logprobs": [{self._token(t, lp): _finite(lp.logprob) for t, lp in row.items()} for row in rows],
                "text_offset": []}

    def _chat_token(self, token_id: int, lp) -> dict:
        token = self._token(token_id, lp)
        return {"token": token, "logprob": _finite(lp.logprob), "bytes": list(token.encode())}

    @staticmethod
    def usage(outs: list[RequestOutput]) -> dict:
        prompt = sum(len(o.prompt_token_ids) for o in outs)
        completion = sum(len(c.token_ids) for o in outs for c in o.outputs)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    # --- the whole response ---------------------------------------------------------------------------------------
    def whole(self, outs: list[RequestOutput]) -> dict:
        choices = []
        for p, out in enumerate(outs):
            for c in out.outputs:
                choice = {"index": p * self.n + c.index, "logprobs": self._logprobs(c, 0),
                          "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
                if self.chat:
                    choice["message"] = {"role": "assistant", "content": c.text}
                else:
                    choice["text"] = c.text
                    if self.token_ids:
                        choice["prompt_token_ids"] = out.prompt_token_ids
                if self.token_ids:
                    choice["token_ids"] = c.token_ids
                choices.append(choice)
        response = {**self._head(False), "choices": choices, "usage": self.usage(outs)}
        if self.chat and self.token_ids:
            response["prompt_token_ids"] = outs[0].prompt_token_ids
        if self.chat and self.with_prompt_text:
            response["prompt_text"] = self.prompt_text
        return response

    # --- a stream -------------------------------------------------------------------------------------------------
    def first(self) -> list[str]:
        """A chat stream opens with the assistant's role (and, when asked, the prompt's ids and text)."""
        if not self.chat:
            return []
        chunk = {**self._head(True), "choices": [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            for i in range(self.n)]}
        if self.token_ids:
            chunk["prompt_token_ids"] = self.prompt_ids
        if self.with_prompt_text:
            chunk["prompt_text"] = self.prompt_text
        return [frame(chunk)]

    def step(self, p: int, out: RequestOutput) -> list[str]:
        """The chunks of prompt p's output after a step: one per choice with new tokens (held while fewer than
        stream_interval, except the first and the last)."""
        frames = []
        for c in out.outputs:
            i = p * self.n + c.index
            if c.index >= self.n:
                continue
            done, sent = c.finish_reason is not None, self.sent_tokens[i]
            if len(c.token_ids) <= sent and not done:
                continue
            if not done and sent and len(c.token_ids) - sent < self.interval:
                continue  # NOTE: stream_interval: not yet enough new tokens for a chunk
            # NOTE: only text no later token changes (a character still decoding, a stop string's possible start)
            text = settled_text(c.text, done, self.hold)
            delta = text[self.sent_text[i]:]
            choice = {"index": i, "logprobs": self._logprobs(c, sent), "finish_reason": c.finish_reason,
                      "stop_reason": c.stop_reason}
            if self.chat:
                choice["delta"] = {"content": delta} if delta or not done else {}
            else:
                choice["text"] = delta
                if self.token_ids and not sent:
                    choice["prompt_token_ids"] = out.prompt_token_ids
            if self.token_ids:
                choice["token_ids"] = c.token_ids[sent:]
            self.sent_text[i] = max(self.sent_text[i], len(text))
            self.sent_tokens[i] = len(c.token_ids)
            chunk = {**self._head(True), "choices": [choice]}
            if self.continuous_usage:
                prompt = len(out.prompt_token_ids)
                chunk["usage"] = {"prompt_tokens": prompt, "completion_tokens": len(c.token_ids),
                                  "total_tokens": prompt + len(c.token_ids)}
            frames.append(frame(chunk))
        return frames

    def last(self, outs: list[RequestOutput]) -> list[str]:
        frames = [frame({**self._head(True), "choices": [], "usage": self.usage(outs)})] if self.include_usage else []
        return frames + [DONE]


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
