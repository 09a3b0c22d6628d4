"""`python -m reference serve`: an OpenAI-compatible HTTP server on the engine (vLLM's `vllm serve`, in small).

    POST /v1/completions         prompt (text, or a list of token ids), max_tokens, temperature, top_p, top_k, n,
                                 stop, seed, logprobs, echo-free; "stream": true sends server-sent events
    POST /v1/chat/completions    messages, rendered with the model's chat template (LLM.render_chat); the same
                                 sampling fields, logprobs as a bool with top_logprobs
    GET  /v1/models              the one model served
    GET  /health                 200 while the engine loop runs
    GET  /metrics                Prometheus text: requests running / waiting / swapped, KV blocks used / free,
                                 prefix-cache hit rate, preemptions, finished requests, TTFT / ITL / E2E histograms
    GET  /pool                   a live page of the block pool (sim/pool_page.py): the blocks coloured by
                                 request, shared ones with their reference counts, block tables, queues, the
                                 memory shares over time, preemptions; a slider over the last POOL_STEPS steps
    GET  /pool/history           those steps' snapshots (sim.viewer's, as JSON); /pool/events: each new one (SSE)

The ASGI stack is FastAPI on uvicorn: the stack vLLM's own server uses, kept by a large community, with request
models (pydantic) whose errors name the field. The engine is one-thread-only (`LLMEngine._one_thread`), so ONE
thread owns it (`EngineLoop`): handlers hand it commands (add a request, abort one) through a queue, and it runs
`step()` while anything is unfinished, pushing each RequestOutput to the asyncio queue of its request. Requests from
many clients are therefore batched continuously, as the scheduler admits them. A client that disconnects is
aborted: its blocks return to the pool at once. Bad requests get OpenAI's error object (HTTP 400, a message naming
the field, `param`), an unknown model 404; never a 500 with a traceback.
"""
from __future__ import annotations

import asyncio
import json
import math
import queue
import re
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from reference.outputs import RequestMetrics, RequestOutput, settled_text
from sim.pool_page import pool_html, snapshot_json

# vLLM's histogram buckets (vllm/engine/metrics.py), seconds
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)  # fmt: skip
POOL_STEPS = 300  # the steps the pool page can scrub back through
KEEP_RECORDS = 1000  # the engine's step log and finished metrics are cut to their last KEEP_RECORDS (a server runs long)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)  # fmt: skip


class APIError(Exception):
    """An OpenAI-style error: HTTP status, message, the field it is about, and the error type."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


@dataclass(slots=True)
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    num: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.num += 1

    def lines(self, name: str, what: str) -> list[str]:
        counts = self.counts or [0] * len(self.buckets)
        out = [f"# HELP {name} {what}", f"# TYPE {name} histogram"]
        out += [f'{name}_bucket{{le="{b:g}"}} {c}' for b, c in zip(self.buckets, counts)]
        return out + [f'{name}_bucket{{le="+Inf"}} {self.num}', f"{name}_sum {self.total:.6f}", f"{name}_count {self.num}"]


class EngineLoop:
    """The thread that owns the LLM: commands in through a queue, `step()` while anything is unfinished, each
    RequestOutput out to its request's sink (a callable, called on this thread). `snapshot` is a dict of the pool
    and the queues after the latest step, replaced whole (readers on other threads never see half an update)."""

    def __init__(self, llm, on_finished: Callable[[RequestOutput], None] | None = None) -> None:
        self.llm = llm
        self.on_finished = on_finished  # called with each finished request's output, on this thread
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.sinks: dict[str, Callable[[RequestOutput | BaseException], None]] = {}
        self.histograms = {"ttft": Histogram(TTFT_BUCKETS), "itl": Histogram(ITL_BUCKETS),
                           "e2e": Histogram(E2E_BUCKETS)}  # fmt: skip
        self.num_finished = 0
        self.snapshot: dict[str, float] = {}
        self.pool_history: deque[dict] = deque(maxlen=POOL_STEPS)  # the pool page's steps (snapshot_json)
        self._watchers: list[Callable[[dict], None]] = []  # the pool page's open event streams
        self._watch_lock = threading.Lock()
        self._num_recorded = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._take_snapshot()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort whatever is unfinished (each sink gets an error) and end the thread."""
        self._stop.set()
        self.commands.put(("wake",))
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def add(self, prompt, params, sink: Callable[[RequestOutput | BaseException], None]) -> Future:
        """Queue a request (from any thread); the future gets its id, or the engine's TypeError / ValueError."""
        done: Future = Future()
        self.commands.put(("add", prompt, params, sink, done))
        return done

    def abort(self, request_id: str) -> None:
        self.commands.put(("abort", request_id))

    def watch(self, callback: Callable[[dict], None]) -> Callable[[], None]:
        """Call `callback(snapshot)` (on the engine thread) after every step from now on; returns the unwatch."""
        with self._watch_lock:
            self._watchers.append(callback)

        def unwatch() -> None:
            with self._watch_lock:
                if callback in self._watchers:
                    self._watchers.remove(callback)

        return unwatch

    # --- the thread ------------------------------------------------------------------------------------------
    def _run(self) -> None:
        llm = self.llm
        while not self._stop.is_set():
            # idle: wait for a command; busy: take whatever arrived since the last step, then step
            command = self.commands.get() if not llm.has_unfinished_requests() else None
            while True:
                if command is not None:
                    self._do(command)
                try:
                    command = self.commands.get_nowait()
                except queue.Empty:
                    break
            if self._stop.is_set() or not llm.has_unfinished_requests():
                continue
            try:
                outputs = llm.step()
            except Exception as exc:  # noqa: BLE001  (the step aborted what it touched: those requests fail)
                for request_id in list(self.sinks):
                    if not llm.is_unfinished(request_id):  # the others stay queued and later steps serve them
                        self.sinks.pop(request_id)(exc)
                self._take_snapshot()  # /metrics and the pool page without the aborted requests' blocks
                continue
            self._record_pool()
            for out in outputs:
                sink = self.sinks.get(out.request_id)
                if out.finished:
                    self.sinks.pop(out.request_id, None)
                    self._observe(out.metrics)
                    if self.on_finished is not None:
                        self.on_finished(out)
                if sink is not None:
                    sink(out)
            self._take_snapshot()
        for request_id in list(self.sinks):
            llm.abort(request_id)
            self.sinks.pop(request_id)(RuntimeError("the server is shutting down"))
        self._take_snapshot()

    def _do(self, command: tuple) -> None:
        if command[0] == "add":
            _, prompt, params, sink, done = command
            try:
                request_id = self.llm.add_request(prompt, params)
            except (TypeError, ValueError) as exc:
                done.set_exception(exc)
                return
            self.sinks[request_id] = sink
            done.set_result(request_id)
        elif command[0] == "abort":  # ("wake",) does nothing: it only ends a wait
            if self.sinks.pop(command[1], None) is not None:
                self.llm.abort(command[1])
                self._take_snapshot()

    def _observe(self, metrics: RequestMetrics | None) -> None:
        self.num_finished += 1
        if metrics is None:
            return
        for name, value in (("ttft", metrics.ttft), ("itl", metrics.itl_mean), ("e2e", metrics.e2e_latency)):
            if value is not None:
                self.histograms[name].observe(value)

    def _record_pool(self) -> None:
        """The pool after the step just executed (if one was: an empty plan executes nothing), for the pool page; and
        the engine's own records cut to their last KEEP_RECORDS."""
        from sim.viewer import snapshot

        llm = self.llm
        if not llm.step_log or llm.step_log[-1].step < self._num_recorded:
            return
        rec = llm.step_log[-1]
        self._num_recorded = rec.step + 1
        snap = snapshot_json(snapshot(llm.scheduler, step=rec.step, time=rec.start_s + rec.step_time_s,
                                      num_prefills=len(rec.prefills), num_decodes=len(rec.decodes),
                                      preempted=rec.preempted, finished=rec.finished_request_ids,
                                      short=llm.scheduler.num_waiting > 0))  # fmt: skip
        snap["kv_used_blocks"] = llm.kv_manager.num_blocks - llm.kv_manager.num_free_blocks  # the engine's own count
        self.pool_history.append(snap)
        with self._watch_lock:
            watchers = list(self._watchers)
        for callback in watchers:
            callback(snap)
        for records in (llm.step_log, llm.finished_metrics):
            if len(records) > 2 * KEEP_RECORDS:
                del records[:-KEEP_RECORDS]

    def _take_snapshot(self) -> None:
        llm = self.llm
        kv, scheduler = llm.kv_manager, llm.scheduler
        stats = kv.prefix_cache_stats()
        self.snapshot = {
            "running": scheduler.num_running, "waiting": scheduler.num_waiting, "swapped": scheduler.num_swapped,
            "kv_blocks_total": kv.num_blocks, "kv_blocks_free": kv.num_free_blocks,
            "kv_blocks_used": kv.num_blocks - kv.num_free_blocks,
            "prefix_hits": stats.hit_tokens, "prefix_queries": stats.queried_tokens,
            "preemptions": scheduler.num_preemptions, "finished": self.num_finished, "steps": llm.stats.num_steps,
            "generated_tokens": llm.stats.num_generated_tokens,
        }  # fmt: skip

    def prometheus(self) -> str:
        s = self.snapshot
        rate = s["prefix_hits"] / s["prefix_queries"] if s["prefix_queries"] else 0.0
        gauges = [
            ("num_requests_running", "requests in the running batch", s["running"]),
            ("num_requests_waiting", "requests queued for admission", s["waiting"]),
            ("num_requests_swapped", "requests swapped out to CPU memory", s["swapped"]),
            ("kv_cache_blocks_used", "KV blocks held by requests (or cached and shared)", s["kv_blocks_used"]),
            ("kv_cache_blocks_free", "KV blocks free (freed cached blocks included)", s["kv_blocks_free"]),
            ("kv_cache_blocks_total", "KV blocks in the pool", s["kv_blocks_total"]),
            ("kv_cache_usage_perc", "share of the KV blocks in use", s["kv_blocks_used"] / s["kv_blocks_total"]),
            ("prefix_cache_hit_rate", "prefix-cache hits / queries (tokens), since start", rate),
        ]
        counters = [
            ("num_preemptions_total", "preemptions since start", s["preemptions"]),
            ("request_success_total", "requests finished since start", s["finished"]),
            ("generation_tokens_total", "tokens generated since start", s["generated_tokens"]),
            ("engine_steps_total", "engine steps since start", s["steps"]),
        ]
        lines = []
        for name, what, value in gauges:
            lines += [f"# HELP lab:{name} {what}", f"# TYPE lab:{name} gauge", f"lab:{name} {value:g}"]
        for name, what, value in counters:
            lines += [f"# HELP lab:{name} {what}", f"# TYPE lab:{name} counter", f"lab:{name} {value:g}"]
        for name, what in (("ttft", "time to first token (s)"), ("itl", "mean inter-token latency per request (s)"),
                           ("e2e", "end-to-end request latency (s)")):  # fmt: skip
            metric = {"ttft": "time_to_first_token_seconds", "itl": "inter_token_latency_seconds",
                      "e2e": "e2e_request_latency_seconds"}[name]  # fmt: skip
            lines += self.histograms[name].lines(f"lab:{metric}", what)
        return "\n".join(lines) + "\n"


# --- requests: OpenAI's fields, checked, into SamplingParams ------------------------------------------------------
_SAMPLING_FIELDS = ("n", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
                    "max_tokens", "min_tokens", "presence_penalty", "frequency_penalty", "repetition_penalty")  # fmt: skip


def sampling_params(body: dict, *, logprobs: int | None, default_max_tokens: int):
    """SamplingParams from a request body's fields (OpenAI's defaults: temperature 1, max_tokens 16 for completions);
    an APIError 400 naming the field for a wrong type or value (the engine's own checks, in its words)."""
    from reference.sampling import SamplingParams

    given = {name: body[name] for name in _SAMPLING_FIELDS if body.get(name) is not None}
    given.setdefault("max_tokens", default_max_tokens)
    if logprobs is not None:
        given["logprobs"] = logprobs
    try:
        return SamplingParams(**given)
    except (TypeError, ValueError) as exc:
        raise APIError(400, str(exc), field_of(str(exc))) from None


def field_of(message: str, default: str | None = None) -> str | None:
    """The request field an engine message is about: the one it starts with ("stop_token_ids must ...", never
    "stop"), or names after "SamplingParams: " (add_request's checks); else `default`."""
    names = "|".join(sorted((*_SAMPLING_FIELDS, "logprobs"), key=len, reverse=True))
    found = re.match(rf"(?:.*SamplingParams: )?({names})\b", message)
    return found.group(1) if found else default


_UNSERVED = {"echo": (False,), "best_of": (None, 1), "logit_bias": (None, {})}  # OpenAI fields this server lacks


def refuse_unserved(body: dict) -> None:
    """A field this server does not implement, set to anything but its no-op value: 400, never silently ignored."""
    for name, no_ops in _UNSERVED.items():
        if name in body and not any(body[name] == v and type(body[name]) is type(v) for v in no_ops):
            allowed = " or ".join("null" if v is None else json.dumps(v) for v in no_ops)
            raise APIError(400, f"{name} is not supported by this server, got {json.dumps(body[name])[:80]} "
                                f"(allowed: {allowed}, or leave it out)", name)  # fmt: skip


def check_body(body: Any, required: tuple[str, ...], types: dict[str, tuple]) -> dict:
    """The body must be a JSON object with `required` and the types given; APIError 400 naming the field."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    for name in required:
        if name not in body:
            raise APIError(400, f"{name} is required", name)
    for name, allowed in types.items():
        value = body.get(name)
        if value is not None and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
            names = " or ".join(t.__name__ for t in allowed)
            raise APIError(400, f"{name} must be {names}, got {type(value).__name__}", name)
    return body


_COMMON_TYPES = {"model": (str,), "stream": (bool,), "n": (int,), "max_tokens": (int,), "temperature": (int, float),
                 "top_p": (int, float), "top_k": (int,), "seed": (int,), "stop": (str, list), "user": (str,),
                 "stream_options": (dict,)}  # fmt: skip


# --- the app ----------------------------------------------------------------------------------------------------
def make_app(llm, model_name: str, on_finished: Callable[[RequestOutput], None] | None = None):
    """The FastAPI app serving `llm` under `model_name`; its EngineLoop starts and stops with the app (lifespan).
    `on_finished(output)`: called on the engine's thread with every finished request's output (its `metrics`: the
    engine's own latencies; validate-sim's online mode sets it)."""
    from contextlib import asynccontextmanager

    loop_holder: dict[str, EngineLoop] = {}

    @asynccontextmanager
    async def lifespan(app):
        engine = EngineLoop(llm, on_finished)
        engine.start()
        loop_holder["engine"] = app.state.engine = engine
        try:
            yield
        finally:
            engine.stop()

    app = FastAPI(title="paged-attention lab", lifespan=lifespan)
    created = int(time.time())

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
                            headers=getattr(exc, "headers", None))  # fmt: skip

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):  # never a traceback to the client
        error = APIError(500, f"{type(exc).__name__}: {exc}", kind="internal_server_error")
        return JSONResponse(error.body(), status_code=500)

    async def json_body(request: Request) -> Any:
        try:
            return await request.json()
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python's parser goes
            raise APIError(400, "the request body is not valid JSON") from None
        except ClientDisconnect:
            raise APIError(499, "the client closed the request", kind="client_closed_request") from None

    def check_model(body: dict) -> None:
        if body.get("model") not in (None, model_name):
            raise APIError(404, f"the model {body['model']!r} does not exist (this server serves {model_name!r})",
                           "model", "model_not_found")  # fmt: skip

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        engine = loop_holder.get("engine")
        if engine is None or not engine.alive:
            raise APIError(503, "the engine loop is not running", kind="service_unavailable")
        return PlainTextResponse("")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "paged-attention-lab",
                                            "max_model_len": llm.max_model_len}]}  # fmt: skip

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(loop_holder["engine"].prometheus(), media_type="text/plain; version=0.0.4")

    @app.get("/pool")
    async def pool_page():
        return HTMLResponse(pool_html(model_name, POOL_STEPS, list(loop_holder["engine"].pool_history)))

    @app.get("/pool/history")
    async def pool_history():
        return JSONResponse(list(loop_holder["engine"].pool_history))

    @app.get("/pool/events")
    async def pool_events(request: Request):
        engine: EngineLoop = loop_holder["engine"]
        aio = asyncio.get_running_loop()
        steps: asyncio.Queue = asyncio.Queue(maxsize=POOL_STEPS)

        def push(snap: dict) -> None:  # on the engine thread; a reader that falls behind loses the oldest
            def put() -> None:
                if steps.full():
                    steps.get_nowait()
                steps.put_nowait(snap)

            aio.call_soon_threadsafe(put)

        async def events():
            unwatch = engine.watch(push)
            try:
                yield ": the pool, step by step\n\n"
                while True:
                    try:
                        snap = await asyncio.wait_for(steps.get(), timeout=15)
                    except asyncio.TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    yield f"data: {json.dumps(snap)}\n\n"
            finally:
                unwatch()

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = check_body(await json_body(request), ("prompt",), {**_COMMON_TYPES, "prompt": (str, list),
                                                                  "logprobs": (int,)})  # fmt: skip
        check_model(body)
        refuse_unserved(body)
        prompt = body["prompt"]
        if isinstance(prompt, list):
            if len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]  # a batch of one
            if isinstance(prompt, list) and not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                raise APIError(400, "prompt must be a string, or one list of token ids (a batch of several prompts "
                               "is not served: send one request per prompt)", "prompt")  # fmt: skip
        logprobs = body.get("logprobs")
        if logprobs is not None and not 0 <= logprobs <= 20:
            raise APIError(400, f"logprobs must be an integer from 0 to 20, got {logprobs}", "logprobs")
        params = sampling_params(body, logprobs=logprobs, default_max_tokens=16)
        return await serve(request, body, prompt, params, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = check_body(await json_body(request), ("messages",), {**_COMMON_TYPES, "messages": (list,),
                                                                    "logprobs": (bool,), "top_logprobs": (int,),
                                                                    "max_completion_tokens": (int,)})  # fmt: skip
        check_model(body)
        refuse_unserved(body)
        messages = body["messages"]
        if messages and all(isinstance(m, (list, tuple)) for m in messages):  # render_chat's batch of conversations
            raise APIError(400, "messages must be one conversation, a list of message objects (a batch of "
                                "conversations is not served: send one request per conversation)", "messages")  # fmt: skip
        try:
            prompt = llm.render_chat(messages)[0]
        except (TypeError, ValueError) as exc:
            raise APIError(400, str(exc), "messages") from None
        top = body.get("top_logprobs")
        if top is not None and not 0 <= top <= 20:
            raise APIError(400, f"top_logprobs must be an integer from 0 to 20, got {top}", "top_logprobs")
        if top is not None and not body.get("logprobs"):  # as OpenAI and vLLM
            raise APIError(400, "top_logprobs needs logprobs: true (allowed: leave top_logprobs out)", "top_logprobs")
        if body.get("max_completion_tokens") is not None:
            body = {**body, "max_tokens": body["max_completion_tokens"]}
        # OpenAI's default is the context left: the engine cuts max_tokens there (no tokenizing here, on the event loop)
        params = sampling_params(body, logprobs=(top or 0) if body.get("logprobs") else None,
                                 default_max_tokens=llm.max_model_len)  # fmt: skip
        return await serve(request, body, prompt, params, chat=True)

    async def serve(request: Request, body: dict, prompt, params, chat: bool):
        engine: EngineLoop = loop_holder["engine"]
        aio = asyncio.get_running_loop()
        outputs: asyncio.Queue = asyncio.Queue()

        def sink(item) -> None:  # called on the engine thread
            aio.call_soon_threadsafe(outputs.put_nowait, item)

        try:
            request_id = await asyncio.wrap_future(engine.add(prompt, params, sink))
        except (TypeError, ValueError) as exc:
            message = str(exc)
            if chat and body.get("max_tokens") is None and re.search(r"need \d+ (?:blocks|pages)", message):
                message += (f"; max_tokens was not given, so it is the context left (up to {llm.max_model_len} "
                            "tokens in all), more than this server's KV pool holds (allowed: a smaller max_tokens)")
                raise APIError(400, message, "max_tokens") from None
            raise APIError(400, message, field_of(message, "messages" if chat else "prompt")) from None
        response_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16] + f"-{request_id}"
        render = ChunkRenderer(response_id, model_name, chat, params.n, body)
        if body.get("stream"):
            async def events():
                try:
                    for chunk in render.first():
                        yield chunk
                    while True:
                        item = await outputs.get()
                        if isinstance(item, BaseException):
                            yield render.error(item)
                            return
                        for chunk in render.step(item):
                            yield chunk
                        if item.finished:
                            for chunk in render.last(item):
                                yield chunk
                            return
                finally:
                    engine.abort(request_id)  # a no-op once finished; else the client went away: free its blocks

            return StreamingResponse(events(), media_type="text/event-stream")
        waiter = asyncio.ensure_future(outputs.get())
        checked = time.monotonic()
        try:
            while True:
                done, _ = await asyncio.wait({waiter}, timeout=0.25)
                # NOTE: every 0.25 s, outputs or not: a running request gets one every step, and a client that gave
                # up must still be noticed
                if time.monotonic() - checked >= 0.25:
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        raise APIError(499, "the client closed the request", kind="client_closed_request")
                if not done:
                    continue
                item = waiter.result()
                if isinstance(item, BaseException):
                    raise APIError(500, f"the engine failed: {type(item).__name__}: {item}",
                                   kind="internal_server_error")  # fmt: skip
                if item.finished:
                    return JSONResponse(render.whole(item))
                waiter = asyncio.ensure_future(outputs.get())
        finally:
            if not waiter.done():
                waiter.cancel()
            engine.abort(request_id)  # a no-op once finished; else the handler was cancelled: free its blocks

    return app


class ChunkRenderer:
    """OpenAI's response objects for one request: the whole response, or server-sent event chunks of new text."""

    def __init__(self, response_id: str, model: str, chat: bool, n: int, body: dict) -> None:
        self.id, self.model, self.chat, self.n = response_id, model, chat, n
        self.created = int(time.time())
        self.sent_text = [0] * n  # characters already sent, per choice
        stop = body.get("stop") or []
        self.hold = max(map(len, [stop] if isinstance(stop, str) else stop), default=0)  # settled_text's hold
        self.sent_logprobs = [0] * n
        options = body.get("stream_options") or {}
        self.include_usage = bool(options.get("include_usage"))
        self.top_logprobs = body.get("top_logprobs") or 0

    def _frame(self, payload: dict) -> str:
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _logprobs(self, completion, start: int) -> dict | None:
        entries = completion.logprobs
        if entries is None:
            return None
        ids = completion.token_ids[start:]
        rows = entries[start:]
        if self.chat:
            content = []
            for token_id, row in zip(ids, rows):
                own = row[token_id]
                top = sorted(row.values(), key=lambda lp: lp.rank or 0)[: self.top_logprobs]
                content.append({"token": own.decoded_token, "logprob": _finite(own.logprob),
                                "bytes": list((own.decoded_token or "").encode()),
                                "top_logprobs": [{"token": lp.decoded_token, "logprob": _finite(lp.logprob),
                                                  "bytes": list((lp.decoded_token or "").encode())} for lp in top]})
            return {"content": content}
        tokens = [row[t].decoded_token for t, row in zip(ids, rows)]
        return {"tokens": tokens, "token_logprobs": [_finite(row[t].logprob) for t, row in zip(ids, rows)],
                "top_logprobs": [{lp.decoded_token: _finite(lp.logprob) for lp in row.values()} for row in rows],
                "text_offset": []}  # fmt: skip

    def _usage(self, out: RequestOutput) -> dict:
        completion = sum(len(c.token_ids) for c in out.outputs)
        prompt = len(out.prompt_token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def whole(self, out: RequestOutput) -> dict:
        choices = []
        for c in out.outputs:
            choice = {"index": c.index, "logprobs": self._logprobs(c, 0), "finish_reason": c.finish_reason}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": c.text}
            else:
                choice["text"] = c.text
            choices.append(choice)
        return {**self._head(False), "choices": choices, "usage": self._usage(out)}

    def first(self) -> list[str]:
        if not self.chat:
            return []
        return [self._frame({**self._head(True), "choices": [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            for i in range(self.n)]})]  # fmt: skip

    def step(self, out: RequestOutput) -> list[str]:
        frames = []
        for c in out.outputs:
            i = c.index
            if i >= self.n:
                continue
            # NOTE: only text no later token changes (a character still decoding, a stop string's possible start)
            text = settled_text(c.text, c.finish_reason is not None, self.hold)
            delta = text[self.sent_text[i]:]
            logprobs = self._logprobs(c, self.sent_logprobs[i]) if c.logprobs is not None else None
            if not delta and c.finish_reason is None and len(c.token_ids) <= self.sent_logprobs[i]:
                continue  # NOTE: as vLLM, a chunk per step with new tokens, its text empty while held back
            self.sent_text[i] = max(self.sent_text[i], len(text))
            self.sent_logprobs[i] = len(c.token_ids)
            choice = {"index": i, "logprobs": logprobs, "finish_reason": c.finish_reason}
            if self.chat:
                choice["delta"] = {"content": delta} if delta or c.finish_reason is None else {}
            else:
                choice["text"] = delta
            frames.append(self._frame({**self._head(True), "choices": [choice]}))
        return frames

    def last(self, out: RequestOutput) -> list[str]:
        frames = []
        if self.include_usage:
            frames.append(self._frame({**self._head(True), "choices": [], "usage": self._usage(out)}))
        return frames + ["data: [DONE]\n\n"]

    def error(self, exc: BaseException) -> str:
        return self._frame(APIError(500, f"{type(exc).__name__}: {exc}", kind="internal_server_error").body())


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def serve_in_thread(llm, model_name: str, host: str = "127.0.0.1", port: int = 0, on_finished=None):
    """The server on a thread of this process (a free port by default), started: (the uvicorn.Server, its base URL).
    `server.should_exit = True` stops it. For tests, notebooks and tools that drive the server from where they are;
    `on_finished` as make_app's."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(make_app(llm, model_name, on_finished), host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="server", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    return server, f"http://{host}:{server.servers[0].sockets[0].getsockname()[1]}"


def run_server(llm, model_name: str, host: str, port: int) -> None:
    """Serve until Ctrl-C or SIGTERM (uvicorn's handlers): open requests are aborted, their blocks freed."""
    import uvicorn

    # NOTE: open streams (a completion, the pool page's events) get 10 s to end after Ctrl-C / SIGTERM, then close
    uvicorn.run(make_app(llm, model_name), host=host, port=port, log_level="info", timeout_graceful_shutdown=10)
