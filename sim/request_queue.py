"""The waiting queue: which request the scheduler admits next, first come first served or by priority.

vLLM v1's `request_queue.py` (vllm/v1/core/sched/request_queue.py): one interface, one class per scheduling policy, so
the scheduler never asks which policy it runs. A group's place is its `queue_key` (sim/sequence.py), which the queue
gives it when it is added: its arrival order under FCFS, (request.priority, arrival order) under priority scheduling
(the lower value first, vLLM's rule).

    add(group)       a request arrives                     FCFS: at the back      priority: in key order
    prepend(group)   a preempted group (recompute) returns  FCFS: at the front     priority: in key order
    peek() / pop()   the next group to admit (admission never overtakes it)

NOTE: under FCFS a preempted group goes to the front whatever its key: the running groups arrived before every
waiting one, and a step preempts the latest arrival first (the default victim), so the earliest victim ends up in
front; under a victim policy that picks in another order the victim picked last is in front, as in vLLM's FCFS
queue.
"""
from __future__ import annotations

import bisect
from collections import deque
from typing import Callable, Iterator

from .request import Request


class FCFSRequestQueue:
    """Groups in arrival order; a preempted group goes back to the front."""

    def __init__(self) -> None:
        self._groups: deque = deque()

    @staticmethod
    def queue_key(request: Request, arrival_order: int) -> int | tuple[int, int]:
        """A group's place in every queue (waiting, running, swapped) and among the victims."""
        return arrival_order

    def add(self, group) -> None:
        self._groups.append(group)

    def prepend(self, group) -> None:
        self._groups.appendleft(group)

    def peek(self):
        return self._groups[0]

    def pop(self):
        return self._groups.popleft()

    def remove(self, group) -> None:
        self._groups.remove(group)

    def keep(self, wanted: Callable[[object], bool]) -> None:
        """Drop the groups `wanted` says no to, the others keeping their order."""
        kept = [g for g in self._groups if wanted(g)]
        if len(kept) != len(self._groups):
            self._groups = deque(kept)

    def __len__(self) -> int:
        return len(self._groups)

    def __iter__(self) -> Iterator:
        return iter(self._groups)


class PriorityRequestQueue(FCFSRequestQueue):
    """Groups in (priority, arrival) order, the lowest first; a preempted group goes back to its place in that order."""

    @staticmethod
    def queue_key(request: Request, arrival_order: int) -> int | tuple[int, int]:
        return request.priority, arrival_order

    def add(self, group) -> None:
        bisect.insort(self._groups, group, key=lambda g: g.queue_key)

    prepend = add
