"""The waiting queue: which request the scheduler admits next, first come first served or by priority.

vLLM v1's `request_queue.py` (vllm/v1/core/sched/request_queue.py): one interface, one class per scheduling policy, so
the scheduler never asks which policy it runs. A group's place is its `queue_key` (sim/scheduling/sequence.py), which the queue
gives it when it is added: its arrival order under FCFS, (request.priority, arrival order) under priority scheduling
(the lower value first, vLLM's rule).

    add_request(group)       a request arrives                     FCFS: at the back      priority: in key order
    prepend_request(group)   a preempted group (recompute) returns  FCFS: at the front     priority: in key order
    peek_request()           the next group to admit (admission never overtakes it); pop_request() takes it

NOTE: under FCFS a preempted group goes to the front whatever its key: the running groups arrived before every
waiting one, and a step preempts the latest arrival first (the default victim), so the earliest victim ends up in
front; under a victim policy that picks in another order the victim picked last is in front, as in vLLM's FCFS
queue. Both queues are deques (len, iteration and the ends in C: the simulator asks millions of times).
"""
from __future__ import annotations

import bisect
from collections import deque
from operator import attrgetter
from typing import Callable

from ..base.request import Request

_queue_key = attrgetter("queue_key")


class FCFSRequestQueue(deque):
    """Groups in arrival order; a preempted group goes back to the front."""

    @staticmethod
    def queue_key(request: Request, arrival_order: int) -> int | tuple[int, int]:
        """A group's place in every queue (waiting, running, swapped) and among the victims."""
        return arrival_order

    add_request = deque.append
    prepend_request = deque.appendleft
    pop_request = deque.popleft
    remove_request = deque.remove

    def peek_request(self):
        return self[0]

    def keep(self, wanted: Callable[[object], bool]) -> None:
        """Drop the groups `wanted` says no to, the others keeping their order."""
        kept = [g for g in self if wanted(g)]
        if len(kept) != len(self):
            self.clear()
            self.extend(kept)


class PriorityRequestQueue(FCFSRequestQueue):
    """Groups in (priority, arrival) order, the lowest first; a preempted group goes back to its place in that order."""

    @staticmethod
    def queue_key(request: Request, arrival_order: int) -> int | tuple[int, int]:
        return request.priority, arrival_order

    def add_request(self, group) -> None:
        bisect.insort(self, group, key=_queue_key)

    prepend_request = add_request
