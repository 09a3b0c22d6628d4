"""The engine's two guards: one thread at a time (`OneThread`), and Ctrl-C held back while the scheduler changes its
queues and the KV manager (`held_interrupts`).

Neither is about paging; both keep the engine's state whole when callers misbehave: a second thread calling in
while one runs is refused at once, and an interrupt never lands between a KV call's return and the scheduler
recording it (docs/ARCHITECTURE.md, "Bad input": "Nothing wedges the engine").
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def held_interrupts() -> Iterator[None]:
    """Hold Ctrl-C back while the scheduler changes its queues and the KV manager (a few microseconds to
    milliseconds): a SIGINT arriving then is delivered as the block ends, so a KeyboardInterrupt never lands
    between a KV call's return and the scheduler recording it. The scheduler still undoes a step that raises
    anywhere (Scheduler.abandon_step); this only keeps an interrupt out of the KV manager's own statements.
    Only in the main thread (the only one Python delivers signals to) and over a Python-level SIGINT handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):  # SIG_IGN, SIG_DFL or a handler set outside Python: nothing to hold
        yield
        return
    held: list = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        if held:
            handler(*held[0])  # the default handler raises KeyboardInterrupt here


class OneThread:
    """`with guard("generate()"):` runs the call as the only call into an engine. The thread already inside may enter
    again (generate() steps and aborts); another thread gets a RuntimeError at once, nothing changed.
    NOTE: a refusal, not a wait: waiting behind another thread's whole generate() would look like a hang, and the
    engine's state (the scheduler's queues, the requests' tokens) is not safe to share between steps of two callers
    anyway. The cost: about 1 us a call on one CPU core, against milliseconds a step."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # reentrant: generate() may call step() and abort() in its thread
        self.running: str | None = None  # the outermost call holding the lock, for the refusal's message

    @contextmanager
    def __call__(self, call: str) -> Iterator[None]:
        if not self.lock.acquire(blocking=False):
            raise RuntimeError(f"this LLM is already running {self.running or 'a call'} in another thread; "
                               "use one LLM per thread or call it from one thread")
        outer = self.running
        self.running = outer or call
        try:
            yield
        finally:
            self.running = outer
            self.lock.release()
