"""Time limits that follow the machine: a check fails for looping, never for running on a slow or busy computer.

A grader needs a time limit (a `while True:` in a student's method would otherwise hang the whole grade), but a
fixed number of seconds is unfair: a correct capstone takes 12 s on one 2-core server and several times that on an
older laptop, or on the same server with other work beside it. So a check's limit is made of three rules:

    no progress for   stall  = min(30 s, timeout) x slowness   ->  "no progress ... (an endless loop?)"
    a budget of       budget = timeout x slowness              ->  past it, going on while progress is made
    and at most       4 x budget                               ->  "still making progress: this machine is slow"

- **slowness** is measured once per process, when the first check starts: a fixed piece of the grader's own kind of
  work (Python calls over dicts and lists, and a numpy product) timed three times, the median divided by what it
  took on the reference machine (`REFERENCE_S`), and never below 1. A slower CPU, or one already busy, gets
  proportionally longer limits.
- **progress** is a heartbeat (`beat()`): every call into the student's object that begins or returns (the
  referee, referee.py), and every engine step a check drives. An endless loop inside one call beats no more.
- `timeout` is `--check-timeout` (seconds on the reference machine; default `CHECK_TIMEOUT_S`; 0: no limit).

The clock is SIGALRM's (it interrupts a Python loop and a sleep), so limits hold on the main thread of a system
that has it; elsewhere (Windows, another thread) a check runs without one.

NOTE: the check in progress is found through a context variable (`_CURRENT`), the one piece of state here that is
not passed as an argument: the referee and the labs' engine runs beat without knowing whether a limit is set.
"""
from __future__ import annotations

import contextvars
import functools
import signal
import statistics
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

CHECK_TIMEOUT_S = 60.0  # a check's budget on the reference machine: a whole grade of a solution takes well under a
# minute (the capstone's, the longest: 12 s on the reference machine; 27 s on a 2-core Intel Xeon, 2026-11-27)
STALL_S = 30.0  # the longest a correct check goes without progress on the reference machine is ~2 s (a simulator
# run of ten minutes of the paper's trace); loading SmolLM2 and compiling the engine's kernels happen before the
# checks (Exercise.warm_up), outside every limit
SLOW_CAP = 4.0  # how far past its budget a check that keeps making progress may run
# The reference workload's median seconds on the reference machine: a 2-core AMD EPYC (AVX-512) virtual machine,
# quiet, python 3.11.7, numpy 2.x with OpenBLAS: 0.062-0.065 s (medians of 9 runs, three processes, 2026-11-28; with
# two busy loops beside it 0.55 s, so a busy machine gets limits ~8x as long).
REFERENCE_S = 0.065


class CheckTimeout(BaseException):
    """A check ran past its time limit (time_limit below). Not an Exception, so that a student's `except
    Exception:` cannot swallow it (hypothesis also lets it through at once, without shrinking)."""


def reference_workload() -> None:
    """The grader's own kind of work, for a fixed amount: calls, dicts and lists (the referee, hypothesis, the
    scheduler), then a float32 matrix product (the engine's steps)."""
    owners: dict[int, int] = {}
    free: list[int] = []
    for i in range(400_000):
        block = i % 4096
        owners[block] = owners.get(block, 0) + 1
        if owners[block] > 3:
            owners[block] = 0
            free.append(block)
        if len(free) > 64:
            free.sort()
            del free[:32]
    a = np.linspace(-1.0, 1.0, 512 * 512, dtype=np.float32).reshape(512, 512)
    for _ in range(16):
        a = np.tanh(a @ a.T / 512)


@functools.cache
def machine_slowness() -> float:
    """How much slower this machine is than the reference one, now: >= 1, measured once per process."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        reference_workload()
        times.append(time.perf_counter() - start)
    return max(1.0, statistics.median(times) / REFERENCE_S)


@dataclass(slots=True)
class Watch:
    """One check's clock: when it started, when it last made progress, and its limits in seconds."""

    timeout: float  # the limit asked for, in reference-machine seconds
    slowness: float
    what: str = "the check"  # what runs, as the messages name it
    started: float = field(default_factory=time.monotonic)
    last_beat: float = field(default_factory=time.monotonic)
    beats: int = 0

    @property
    def budget(self) -> float:
        return self.timeout * self.slowness

    @property
    def stall(self) -> float:
        return min(STALL_S, self.timeout) * self.slowness

    def verdict(self, now: float) -> str | None:
        """Why the check must stop now, or None to let it go on."""
        quiet, elapsed = now - self.last_beat, now - self.started
        if quiet >= self.stall:
            return (f"{self.what} made no progress for {quiet:.3g} s, past its time limit of {self.stall:.3g} s "
                    f"without progress (an endless loop?)")
        if elapsed >= SLOW_CAP * self.budget:
            return (f"{self.what} was still making progress after {elapsed:.0f} s ({self.beats:,} steps), past its "
                    f"time limit of {self.budget:.3g} s and the {SLOW_CAP:g}x more given to a check that makes "
                    f"progress: this machine is slow (it measured {self.slowness:.1f}x the reference machine when "
                    f"grading began), not your code looping; grade again with --check-timeout 0 (no limit)")
        return None


_CURRENT: contextvars.ContextVar[Watch | None] = contextvars.ContextVar("check_watch", default=None)


def beat() -> None:
    """The check in progress made progress (a call into the student's code began or returned, an engine step ran)."""
    watch = _CURRENT.get()
    if watch is not None:
        watch.last_beat = time.monotonic()
        watch.beats += 1


@contextmanager
def time_limit(seconds: float | None, what: str = "the check"):
    """Raise CheckTimeout in this thread when the check makes no progress for too long, or runs far past its budget
    (the module docstring). None or 0, or where there is no SIGALRM (Windows) or off the main thread: no limit."""
    if not seconds or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return
    watch = Watch(seconds, machine_slowness(), what)
    token = _CURRENT.set(watch)

    def tick(signum, frame) -> None:
        why = watch.verdict(time.monotonic())
        if why is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            raise CheckTimeout(why)

    period = max(0.01, min(1.0, watch.stall / 4))
    previous = signal.signal(signal.SIGALRM, tick)
    signal.setitimer(signal.ITIMER_REAL, period, period)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        _CURRENT.reset(token)
