"""What executors, metrics and figures may read of a scheduler: its queues, requests and sequences, never
changing anything.

A mixin of `Scheduler` (sim/scheduler.py), which owns the state: `self._waiting` (a deque of sequence groups),
`self._running` and `self._swapped` (lists in arrival order), `self._groups` (request id -> group, finished
ones included), `self._seqs` (seq id -> sequence, dropped beams excepted) and `self._num_preemptions`.
"""
from __future__ import annotations

from .request import Request
from .sequence import SequenceGroup, SequenceStatus


class SchedulerViews:
    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_swapped(self) -> int:
        return len(self._swapped)

    @property
    def num_running_seqs(self) -> int:
        return sum(len(g.live) for g in self._running)

    @property
    def num_preemptions(self) -> int:
        return self._num_preemptions

    def waiting_request_ids(self) -> list[int]:
        return [g.request_id for g in self._waiting]

    def running_request_ids(self) -> list[int]:
        return [g.request_id for g in self._running]

    def swapped_request_ids(self) -> list[int]:
        return [g.request_id for g in self._swapped]

    def seq_ids(self, request_id: int) -> list[int]:
        """The request's current sequences (finished ones included, dropped beams not), in beam order."""
        return [s.seq_id for s in self._group(request_id).seqs]

    def num_generated(self, seq_id: int) -> int:
        return self._seqs[seq_id].num_generated

    def num_computed_tokens(self, seq_id: int) -> int:
        return self._seqs[seq_id].num_computed_tokens

    def group_status(self, request_id: int) -> SequenceStatus:
        return self._group(request_id).status

    def is_finished(self, request_id: int) -> bool:
        return self._group(request_id).status is SequenceStatus.FINISHED

    def request(self, request_id: int) -> Request:
        return self._group(request_id).request

    def _group(self, request_id: int) -> SequenceGroup:
        if request_id not in self._groups:
            raise KeyError(f"unknown request {request_id}")
        return self._groups[request_id]
