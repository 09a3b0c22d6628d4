"""Request ids: vLLM's strings outside the engine, the simulator's integers inside.

vLLM names a request by a `str`: `RequestOutput.request_id`, `LLMEngine.add_request(request_id: str, ...)` and
`abort_request(request_ids)`; its offline `LLM.generate` numbers the requests it queues with a per-LLM counter,
`request_id = str(next(self.request_counter))`, so "0", "1", "2", ... across every call on one LLM
(vllm/entrypoints/common/offline.py, `_add_request`; the counter is made in vllm/entrypoints/llm.py).

The scheduler and KV manager under the engine are the simulator's (sim/), which key requests, sequences and their
records by `int`, and keep doing so. `RequestIds` is the one place the two meet: every public id maps to the int
the scheduler knows the request by, handed out in order 0, 1, 2, ... (so `llm.scheduler`, `llm.step_log` and
the simulator's records keep their ints). The engine converts at its boundary: `add_request` and `abort` take
the public id, `RequestOutput.request_id` carries it, and everything below the engine sees the int.

The rules, as `LLM.add_request` documents them:
- a public id is a `str`; an `int` is still accepted and converted with `str()` (7 and "7" name the same request),
  so scripts written when this engine's ids were ints keep working. A bool or any other type is a TypeError;
- an id names one request for the engine's whole life: one already given (running, finished or aborted) is
  refused with a ValueError. NOTE: vLLM 0.32 itself accepts a repeated id (it appends a random suffix inside,
  vllm/v1/engine/input_processor.py `assign_request_id`); here the scheduler's records stay unambiguous instead;
- None asks for the engine's next id: the counter's next value, as `LLM.generate` numbers them, skipping any
  value a caller already took for its own request (vLLM does not skip, since it accepts repeats).
"""
from __future__ import annotations

import numbers

import numpy as np


class RequestIds:
    """Public request ids (str) <-> the scheduler's request ids (int), for one engine's life."""

    def __init__(self) -> None:
        self._to_scheduler: dict[str, int] = {}  # every public id ever given -> its scheduler id
        self._counter = 0  # the next value LLM.generate's numbering would use

    @staticmethod
    def normalize(request_id, what: str = "request_id") -> str:
        """`request_id` as a public id: a str as it is, an int (or numpy integer) through str(); TypeError
        otherwise."""
        if isinstance(request_id, str):
            return request_id
        if isinstance(request_id, numbers.Integral) and not isinstance(request_id, (bool, np.bool_)):
            return str(int(request_id))
        raise TypeError(f"{what} must be a str (or an int, converted with str()), "
                        f"got {type(request_id).__name__} {request_id!r}")

    def check_new(self, request_id) -> str | None:
        """The normalized id of a request about to be queued (None stays None: the engine's next id).
        ValueError if it was already given to this engine. Changes nothing."""
        if request_id is None:
            return None
        request_id = self.normalize(request_id)
        if request_id in self._to_scheduler:
            raise ValueError(f"request_id {request_id!r} was already given to this engine (allowed: an id not "
                             "given before, or None for the next one)")
        return request_id

    def next_public(self) -> str:
        """The id a request queued with request_id=None gets: the counter's next value not already given."""
        while str(self._counter) in self._to_scheduler:
            self._counter += 1
        return str(self._counter)

    @property
    def next_scheduler_id(self) -> int:
        """The int the next request is queued under in the scheduler."""
        return len(self._to_scheduler)

    def add(self, public: str, scheduler_id: int) -> None:
        """Record a request the scheduler has accepted (under `next_scheduler_id`)."""
        if scheduler_id != len(self._to_scheduler) or public in self._to_scheduler:
            raise RuntimeError(f"expected a new id under scheduler id {len(self._to_scheduler)}, found "
                               f"{public!r} under {scheduler_id}")
        self._to_scheduler[public] = scheduler_id

    def scheduler_id(self, request_id) -> int | None:
        """The scheduler's int for a public id (an int is converted with str()); None if never given."""
        return self._to_scheduler.get(self.normalize(request_id))
