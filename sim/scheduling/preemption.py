"""Who is preempted when memory runs out: a small pluggable victim policy.

When a running request cannot get the slots its next tokens need, the scheduler preempts running requests
until it can (vLLM v1, vllm/v1/core/sched/scheduler.py; the paper, section 4.5). Which one goes is a policy:

    latest_arrival     the request that arrived last (vLLM's default: FCFS, so the newest loses); under priority
                       scheduling the last in the queues' order: the latest arrival of the lowest priority (the
                       largest (priority, arrival), vLLM v1's victim with scheduling_policy="priority")
    fewest_computed    the request with the fewest computed tokens, the cheapest to recompute
                       (ties: the latest arrival)

A policy is any function `victim(candidates) -> one of them`. The candidates are `SequenceGroup`s (see
sim/scheduling/sequence.py): every running request not yet scheduled in this step, in the scheduler's running order, and
LAST the request that needs memory (whatever its arrival: order by `arrival_order`, not by place in the list).
Each offers `request` (arrival_time, prompt_len, output_len, priority, ...), `arrival_order`, `num_computed_tokens`,
`num_seqs` and `queue_key` (its place in the queues: `arrival_order`, or (priority, arrival_order) under priority
scheduling). Pass a name or a function as `SchedulerConfig(victim=...)`.
"""
from __future__ import annotations

from typing import Callable, Sequence


def latest_arrival(candidates: Sequence) -> object:
    return max(candidates, key=lambda g: g.queue_key)


def fewest_computed(candidates: Sequence) -> object:
    return min(candidates, key=lambda g: (g.num_computed_tokens, -g.arrival_order))


VICTIM_POLICIES: dict[str, Callable] = {"latest_arrival": latest_arrival, "fewest_computed": fewest_computed}


def victim_policy(victim: str | Callable) -> Callable:
    """The policy function for a name of VICTIM_POLICIES, or `victim` itself if it is callable."""
    if callable(victim):
        return victim
    if victim not in VICTIM_POLICIES:
        raise ValueError(f"victim must be one of {', '.join(VICTIM_POLICIES)} or a function, got {victim!r}")
    return VICTIM_POLICIES[victim]
