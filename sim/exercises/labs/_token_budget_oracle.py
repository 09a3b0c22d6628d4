"""The oracle of lab `token_budget`: what the student's `schedule` is given and what it must answer, read off the
project's own v1 scheduler (`sim.scheduling.scheduler.Scheduler`).

`snapshot` reads the running and waiting requests off a scheduler between two steps as `RequestState`s (the
student's input); `oracle_plan` turns the scheduler's `StepPlan` into the lab's answer `{request_id: tokens}`.
The narrated examples (token_budget.py), the random runs (_token_budget_checks.py) and notebook 06 share them. The
module's name starts with "_", so the lab loader does not take it for a lab.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestState:
    """One request between two steps, as vLLM v1's `Request` tracks it (vllm/v1/request.py)."""

    request_id: int
    status: str  # "running" (its K/V is in the cache) or "waiting" (never admitted, or preempted: holds nothing)
    num_tokens: int  # prompt + tokens sampled so far
    num_computed_tokens: int  # leading tokens whose K/V is cached (0 while waiting)
    prompt_len: int  # for reading only: the plan does not need it

    @property
    def num_missing(self) -> int:
        """Tokens still to compute: a decode misses 1, a waiting prompt all of it."""
        return self.num_tokens - self.num_computed_tokens

    def __repr__(self) -> str:  # one short line per request in the feedback
        return (f"RequestState({self.request_id}, {self.status!r}, num_tokens={self.num_tokens}, "
                f"num_computed_tokens={self.num_computed_tokens}, prompt_len={self.prompt_len})")


def snapshot(scheduler) -> list[RequestState]:
    """The running and waiting requests of a `sim.scheduling.scheduler.Scheduler` between two steps, in arrival order,
    read through its public views (one sequence per request)."""
    states = []
    for status, ids in (("running", scheduler.running_request_ids()), ("waiting", scheduler.waiting_request_ids())):
        for rid in ids:
            [seq_id] = scheduler.seq_ids(rid)
            prompt_len = scheduler.request(rid).prompt_len
            states.append(RequestState(rid, status, prompt_len + scheduler.num_generated(seq_id),
                                       scheduler.num_computed_tokens(seq_id), prompt_len))
    # NOTE: request ids are given in arrival order, and with the default victim policy (latest arrival) the
    # waiting queue stays in arrival order too, preempted requests included: so one sorted list says it all.
    return sorted(states, key=lambda r: r.request_id)


def oracle_plan(plan, requests: list[RequestState]) -> dict[int, int]:
    """A `StepPlan` as the lab's answer: {request_id: tokens}, requests with no token left out, in the order the
    step serves `requests` (running ones first; a plan lists prompt chunks before decodes)."""
    tokens = {e.request_id: e.num_new_tokens for e in plan.entries if e.num_new_tokens}
    order = sorted(requests, key=lambda r: (r.status != "running", r.request_id))
    return {r.request_id: tokens[r.request_id] for r in order if r.request_id in tokens}
