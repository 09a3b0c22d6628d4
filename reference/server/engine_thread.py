"""The thread that owns the engine: requests in through a queue, `step()` while anything is unfinished, outputs out.

The engine serves one thread at a time (`LLMEngine._one_thread`), so ONE thread calls it: the HTTP handlers hand this
thread commands (add a request, abort one) through a queue, and it runs `llm.step()` while anything is unfinished,
handing each RequestOutput to the sink of its request. Requests from many clients are therefore batched continuously,
as the scheduler admits them. It reads the engine only through its public calls (`add_request`, `abort`, `step`,
`is_unfinished`, `snapshot`, `forget_records`): after each step it takes a snapshot for /metrics and, while the pool
page keeps them, the pool's picture.

    handlers --("add", prompt, params, sink)--> commands --> [engine thread] --> llm.step() --> sink(output)
                                                                                 \\--> metrics, pool history
"""
from __future__ import annotations

import queue
import threading
from collections import deque
from concurrent.futures import Future
from typing import Callable

from reference.engine.outputs import RequestOutput
from reference.server.metrics import ServerMetrics

POOL_STEPS = 300  # the steps the pool page can scrub back through
KEEP_RECORDS = 1000  # the engine's step log and finished metrics keep their last KEEP_RECORDS (a server runs long)

Sink = Callable[[RequestOutput | BaseException], None]


class ShuttingDown(RuntimeError):
    """What an open request gets when the server stops (Ctrl-C, SIGTERM): it was aborted, its blocks freed."""


class EngineLoop:
    """The thread that owns the LLM: commands in through a queue, `step()` while anything is unfinished, each
    RequestOutput out to its request's sink (a callable, called on this thread)."""

    def __init__(self, llm, metrics: ServerMetrics, on_finished: Callable[[RequestOutput], None] | None = None) -> None:
        self.llm = llm
        self.metrics = metrics
        self.on_finished = on_finished  # called with each finished request's output, on this thread
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.sinks: dict[str, Sink] = {}
        self.pool_history: deque[dict] = deque(maxlen=POOL_STEPS)  # the pool page's steps (snapshot_json)
        self._watchers: list[Callable[[dict], None]] = []  # the pool page's open event streams
        self._watch_lock = threading.Lock()
        self._last_step = -1  # the latest step recorded for the pool page
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.metrics.observe_engine(llm.snapshot())

    def start(self) -> None:
        self._thread.start()

    def stop_soon(self) -> None:
        """Ask the thread to end after the step in progress, aborting whatever is unfinished (each sink gets a
        ShuttingDown). Returns at once: callable from the event loop."""
        self._stop.set()
        self.commands.put(("wake",))

    def stop(self, timeout: float) -> None:
        """stop_soon, then wait up to `timeout` seconds for the thread (a step in progress ends first)."""
        self.stop_soon()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def add(self, prompt, params, sink: Sink, priority: int = 0) -> Future:
        """Queue a request (from any thread); the future gets its id, or the engine's TypeError / ValueError."""
        done: Future = Future()
        self.commands.put(("add", prompt, params, sink, priority, done))
        return done

    def abort(self, request_id: str) -> None:
        self.commands.put(("abort", request_id))

    def watch(self, callback: Callable[[dict], None]) -> Callable[[], None]:
        """Call `callback(step)` (on the engine thread) with the pool after every step from now on; returns the
        unwatch."""
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
                        self.metrics.request_ended(request_id, "error")
                        self.sinks.pop(request_id)(exc)
                self.metrics.observe_engine(llm.snapshot())  # /metrics without the aborted requests' blocks
                continue
            self._after_step(outputs)
        stopping = ShuttingDown("the server is shutting down: the request was aborted")
        for request_id in list(self.sinks):
            llm.abort(request_id)
            self.metrics.request_ended(request_id, "abort")
            self.sinks.pop(request_id)(stopping)
        while True:  # requests that arrived as it stopped are never queued
            try:
                command = self.commands.get_nowait()
            except queue.Empty:
                break
            if command[0] == "add":
                command[-1].set_exception(stopping)
        self.metrics.observe_engine(llm.snapshot())

    def _after_step(self, outputs: list[RequestOutput]) -> None:
        snap = self.llm.snapshot(pool=True)
        self.metrics.observe_engine(snap)
        self._record_pool(snap)
        for out in outputs:
            self.metrics.observe_output(out)
            sink = self.sinks.get(out.request_id)
            if out.finished:
                self.sinks.pop(out.request_id, None)
                if self.on_finished is not None:
                    self.on_finished(out)
            if sink is not None:
                sink(out)
        if snap.last_step is not None and snap.last_step.step % KEEP_RECORDS == KEEP_RECORDS - 1:
            self.llm.forget_records(KEEP_RECORDS)  # every KEEP_RECORDS steps: the engine holds at most twice that

    def _do(self, command: tuple) -> None:
        if command[0] == "add":
            _, prompt, params, sink, priority, done = command
            try:
                request_id = self.llm.add_request(prompt, params, priority=priority)
            except (TypeError, ValueError) as exc:
                done.set_exception(exc)
                return
            self.sinks[request_id] = sink
            self.metrics.request_added(request_id, params)
            done.set_result(request_id)
        elif command[0] == "abort":  # ("wake",) does nothing: it only ends a wait
            if self.sinks.pop(command[1], None) is not None:
                self.llm.abort(command[1])
                self.metrics.request_ended(command[1], "abort")
                self.metrics.observe_engine(self.llm.snapshot())

    def _record_pool(self, snap) -> None:
        """The pool after the step just executed (if one was: an empty plan executes nothing), for the pool page."""
        from sim.views.pool_page import snapshot_json

        if snap.pool is None or snap.last_step.step <= self._last_step:
            return
        self._last_step = snap.last_step.step
        step = snapshot_json(snap.pool)
        step["kv_used_blocks"] = snap.num_blocks - snap.num_free_blocks  # the engine's own count
        self.pool_history.append(step)
        with self._watch_lock:
            watchers = list(self._watchers)
        for callback in watchers:
            callback(step)
