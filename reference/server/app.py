"""The routes: a FastAPI app serving one LLM under one name, with vLLM's routes and OpenAI's objects.

Each generation request is checked (reference/server/requests.py: every vLLM field honoured or refused), rendered
and tokenized on a worker thread, then handed to the engine's thread (engine_thread.py) one engine request per
prompt; its outputs come back through an asyncio queue and go out whole or as a stream (streams.py). A client that
disconnects is aborted: its blocks return to the pool at once. While the server stops, every open response gets an
error and new requests a 503 (OpenStreams; run.py stops it).
"""
from __future__ import annotations

import asyncio
import re
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from reference.engine.outputs import RequestOutput
from reference.server import requests as rq
from reference.server.engine_thread import POOL_STEPS, EngineLoop, ShuttingDown
from reference.server.metrics import ServerMetrics
from reference.server.requests import APIError
from reference.server.streams import OpenStreams, Renderer, engine_error, error_frames, frame, put_latest

STOP_WAIT_S = 30.0  # at shutdown, how long the engine's thread may take to finish its step and abort what is open
KEEP_ALIVE_S = 15.0  # the pool page's event stream sends a comment this often while nothing happens


def make_app(llm, model_name: str, on_finished: Callable[[RequestOutput], None] | None = None) -> FastAPI:
    """The FastAPI app serving `llm` under `model_name`; its EngineLoop starts and stops with the app (lifespan).
    `on_finished(output)`: called on the engine's thread with every finished request's output (its `metrics`: the
    engine's own latencies; validate-sim's online mode sets it). `app.state.begin_shutdown(why)` ends every open
    response at once (run.py calls it when the server stops)."""
    streams = OpenStreams()
    metrics = ServerMetrics(model_name, llm.max_model_len, llm.config_info())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = EngineLoop(llm, metrics, on_finished)
        engine.start()
        app.state.engine = engine
        try:
            yield
        finally:
            begin_shutdown("the server is shutting down")
            await asyncio.to_thread(engine.stop, STOP_WAIT_S)

    def begin_shutdown(why: str) -> None:  # on the event loop's thread
        if streams.closing is None:
            streams.close_all(why)
            engine = getattr(app.state, "engine", None)
            if engine is not None:
                engine.stop_soon()

    app = FastAPI(title="paged-attention lab", lifespan=lifespan)
    app.state.begin_shutdown, app.state.streams, app.state.metrics = begin_shutdown, streams, metrics
    created = int(time.time())
    _add_error_handlers(app)

    def check_model(body: dict) -> None:
        if body.get("model") not in (None, model_name):
            raise APIError(404, f"the model {body['model']!r} does not exist (this server serves {model_name!r})",
                           "model", "model_not_found")

    def check_open() -> EngineLoop:
        engine = getattr(app.state, "engine", None)
        if streams.closing is not None or engine is None or not engine.alive:
            raise APIError(503, streams.closing or "the engine loop is not running", kind="service_unavailable")
        return engine

    # --- the server itself ----------------------------------------------------------------------------------------
    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        check_open()
        return Response(status_code=200)

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping():  # vLLM's (SageMaker's) name for /health
        check_open()
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        from importlib.metadata import version as installed

        return {"version": installed("paged-attention-lab")}

    def model_card() -> dict:
        return {"id": model_name, "object": "model", "created": created, "owned_by": "paged-attention-lab",
                "root": model_name, "parent": None, "max_model_len": llm.max_model_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != model_name:
            raise APIError(404, f"the model {model_id!r} does not exist (this server serves {model_name!r})",
                           "model", "model_not_found")
        return model_card()

    @app.api_route("/metrics", methods=["GET", "HEAD"])  # HEAD: aiperf asks it first, and vLLM's answers 200
    async def prometheus():
        return PlainTextResponse(metrics.text(), media_type="text/plain; version=0.0.4")

    # --- the pool page --------------------------------------------------------------------------------------------
    @app.get("/pool")
    async def pool_page():
        from sim.views.pool_page import pool_html

        return HTMLResponse(pool_html(model_name, POOL_STEPS, list(app.state.engine.pool_history)))

    @app.get("/pool/history")
    async def pool_history():
        return JSONResponse(list(app.state.engine.pool_history))

    @app.get("/pool/events")
    async def pool_events():
        engine = check_open()
        aio = asyncio.get_running_loop()
        steps: asyncio.Queue = asyncio.Queue(maxsize=POOL_STEPS)

        def push(step: dict) -> None:  # on the engine thread; a reader that falls behind loses the oldest
            _call_soon(aio, put_latest, steps, step)

        async def events():
            unwatch = engine.watch(push)
            streams.add(steps)
            try:
                yield ": the pool, step by step\n\n"
                while True:
                    try:
                        step = await asyncio.wait_for(steps.get(), timeout=KEEP_ALIVE_S)
                    except asyncio.TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    if isinstance(step, ShuttingDown):
                        for chunk in error_frames(engine_error(step)):
                            yield chunk
                        return
                    yield frame(step)
            finally:
                unwatch()
                streams.discard(steps)

        return StreamingResponse(events(), media_type="text/event-stream")

    # --- the tokenizer ----------------------------------------------------------------------------------------------
    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await json_body(request)
        chat = isinstance(body, dict) and "messages" in body
        body = rq.check_body(body, "TokenizeChatRequest" if chat else "TokenizeCompletionRequest",
                             ("messages",) if chat else ("prompt",))
        check_model(body)
        if chat:
            _, ids = await chat_prompt(body)
        else:
            ids = await to_thread(llm.tokenize, body["prompt"], body.get("add_special_tokens", True), where="prompt")
        strs = llm.get_tokenizer().convert_ids_to_tokens(ids) if body.get("return_token_strs") else None
        return {"count": len(ids), "max_model_len": llm.max_model_len, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = rq.check_body(await json_body(request), "DetokenizeRequest", ("tokens",))
        check_model(body)
        vocab, ids = llm.config.vocab_size, body["tokens"]
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids):
            raise APIError(400, f"tokens must be a list of token ids in 0 .. {vocab - 1}", "tokens")
        return {"prompt": await asyncio.to_thread(llm.get_tokenizer().decode, ids)}

    async def to_thread(fn, *args, where: str = "prompt", **kwargs):
        """`fn` on a worker thread (tokenizing and rendering stay off the event loop); its TypeError / ValueError
        as a 400 naming `where`."""
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except (TypeError, ValueError) as exc:
            raise APIError(400, str(exc), where) from None

    async def chat_prompt(body: dict) -> tuple[str, list[int]]:
        """The conversation rendered with the chat template, and its token ids (vLLM's default for chat: without
        the tokenizer's own special tokens, which the template writes)."""
        text = await to_thread(rq.render_conversation, llm, body["messages"], body.get("add_generation_prompt", True),
                               bool(body.get("continue_final_message")), where="messages")
        ids = await to_thread(llm.tokenize, text, body.get("add_special_tokens", False), "the rendered conversation",
                              where="messages")
        return text, ids

    # --- generation ---------------------------------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(request: Request):
        body = rq.check_body(await json_body(request), "CompletionRequest", ("prompt",))
        check_model(body)
        prompts = rq.completion_prompts(body)
        logprobs = body.get("logprobs")
        if logprobs is not None and not 0 <= logprobs <= 20:
            raise APIError(400, f"logprobs must be an integer from 0 to 20, got {logprobs}", "logprobs")
        rule = rq.truncation(body, llm.max_model_len)
        if rule is not None or body.get("add_special_tokens") is False:  # tokenized here; else by the engine
            special = body.get("add_special_tokens", True)
            prompts = [rq.truncate(p if isinstance(p, list) else await to_thread(llm.tokenize, p, special), rule)
                       for p in prompts]
        params = rq.sampling_params(body, logprobs=logprobs, default_max_tokens=16, max_model_len=llm.max_model_len)
        return await generate(request, body, prompts, params, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = rq.check_body(await json_body(request), "ChatCompletionRequest", ("messages",))
        check_model(body)
        top = body.get("top_logprobs")
        if top is not None and not 0 <= top <= 20:
            raise APIError(400, f"top_logprobs must be an integer from 0 to 20, got {top}", "top_logprobs")
        if top and not body.get("logprobs"):  # as OpenAI and vLLM
            raise APIError(400, "top_logprobs needs logprobs: true (allowed: leave top_logprobs out)", "top_logprobs")
        rule = rq.truncation(body, llm.max_model_len)
        text, ids = await chat_prompt(body)
        field = "max_tokens"
        if body.get("max_completion_tokens") is not None:
            body, field = {**body, "max_tokens": body["max_completion_tokens"]}, "max_completion_tokens"
        # OpenAI's default is the context left: the engine cuts max_tokens there
        params = rq.sampling_params(body, logprobs=(top or 0) if body.get("logprobs") else None,
                                    default_max_tokens=llm.max_model_len, max_model_len=llm.max_model_len,
                                    max_tokens_field=field)
        return await generate(request, body, [rq.truncate(ids, rule)], params, chat=True, prompt_text=text)

    async def generate(request: Request, body: dict, prompts: list, params, chat: bool, prompt_text=None):
        engine = check_open()
        aio = asyncio.get_running_loop()
        outputs: asyncio.Queue = asyncio.Queue()
        streams.add(outputs)
        ids: list[str] = []
        try:
            for p, prompt in enumerate(prompts):
                ids.append(await add(engine, aio, outputs, p, prompt, params, body, chat))
        except BaseException:
            _end(engine, streams, outputs, ids)
            raise
        response_id = ("chatcmpl-" if chat else "cmpl-") + (body.get("request_id") or uuid.uuid4().hex[:16]) + \
            f"-{ids[0]}"
        render = Renderer(response_id, model_name, chat, params.n, body, len(prompts), prompt_text,
                          prompts[0] if chat else None)
        if body.get("stream"):
            return StreamingResponse(stream(engine, outputs, ids, render), media_type="text/event-stream")
        try:
            return JSONResponse(render.whole(await whole(request, outputs, len(ids))))
        finally:
            _end(engine, streams, outputs, ids)

    async def add(engine: EngineLoop, aio, outputs: asyncio.Queue, p: int, prompt, params, body: dict, chat: bool):
        """Queue prompt p on the engine's thread; its id. Its outputs arrive in `outputs` as (p, item)."""
        def sink(item) -> None:  # called on the engine thread
            _call_soon(aio, outputs.put_nowait, (p, item))

        try:
            return await asyncio.wrap_future(engine.add(prompt, params, sink, body.get("priority") or 0))
        except ShuttingDown as exc:
            raise engine_error(exc) from None
        except (TypeError, ValueError) as exc:
            message = str(exc)
            if chat and body.get("max_tokens") is None and re.search(r"need \d+ (?:blocks|pages)", message):
                message += (f"; max_tokens was not given, so it is the context left (up to {llm.max_model_len} "
                            "tokens in all), more than this server's KV pool holds (allowed: a smaller max_tokens)")
                raise APIError(400, message, "max_tokens") from None
            where = "messages" if chat else "prompt"
            raise APIError(400, message, rq.field_of(message, where)) from None

    async def stream(engine: EngineLoop, outputs: asyncio.Queue, ids: list[str], render: Renderer):
        finals: list[RequestOutput | None] = [None] * len(ids)
        try:
            for chunk in render.first():
                yield chunk
            while None in finals:
                item = await outputs.get()
                if not isinstance(item, tuple):  # the server stops: OpenStreams.close_all
                    item = (0, item)
                p, out = item
                if isinstance(out, BaseException):
                    for chunk in error_frames(engine_error(out)):
                        yield chunk
                    return
                for chunk in render.step(p, out):
                    yield chunk
                if out.finished:
                    finals[p] = out
            for chunk in render.last(finals):
                yield chunk
        finally:
            _end(engine, streams, outputs, ids)  # a no-op once finished; else the client went away: free the blocks

    return app


async def whole(request: Request, outputs: asyncio.Queue, count: int) -> list[RequestOutput]:
    """The finished outputs of `count` prompts, in prompt order; an APIError if one fails or the client leaves."""
    finals: list[RequestOutput | None] = [None] * count
    waiter = asyncio.ensure_future(outputs.get())
    checked = time.monotonic()
    try:
        while None in finals:
            done, _ = await asyncio.wait({waiter}, timeout=0.25)
            # NOTE: every 0.25 s, outputs or not: a running request gets one every step, and a client that gave up must
            # still be noticed
            if time.monotonic() - checked >= 0.25:
                checked = time.monotonic()
                if await request.is_disconnected():
                    raise APIError(499, "the client closed the request", kind="client_closed_request")
            if not done:
                continue
            item = waiter.result()
            p, out = item if isinstance(item, tuple) else (0, item)
            if isinstance(out, BaseException):
                raise engine_error(out)
            if out.finished:
                finals[p] = out
            if None in finals:
                waiter = asyncio.ensure_future(outputs.get())
        return finals
    finally:
        if not waiter.done():
            waiter.cancel()


def _end(engine: EngineLoop, streams: OpenStreams, outputs: asyncio.Queue, ids: list[str]) -> None:
    """A response is over: abort its requests (a no-op for finished ones: their blocks are back already) and forget
    its queue."""
    for request_id in ids:
        engine.abort(request_id)
    streams.discard(outputs)


def _call_soon(aio: asyncio.AbstractEventLoop, fn, *args) -> None:
    """`fn(*args)` on the event loop's thread, from the engine's; nothing once that loop has closed (no one reads)."""
    try:
        aio.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass


async def json_body(request: Request) -> Any:
    try:
        return await request.json()
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python's parser goes
        raise APIError(400, "the request body is not valid JSON") from None
    except ClientDisconnect:
        raise APIError(499, "the client closed the request", kind="client_closed_request") from None


def _add_error_handlers(app: FastAPI) -> None:
    """Every error is OpenAI's error object, never a traceback."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        name = ".".join(str(part) for part in first["loc"] if part != "body") or None
        return JSONResponse(APIError(400, f"{name or 'the request'}: {first['msg']}", name).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):  # an unknown path, a wrong method
        kind = {404: "not_found_error", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request_error")
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse(APIError(exc.status_code, message, kind=kind).body(), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):  # never a traceback to the client
        error = APIError(500, f"{type(exc).__name__}: {exc}", kind="internal_server_error")
        return JSONResponse(error.body(), status_code=500)
