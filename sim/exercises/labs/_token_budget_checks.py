"""The property checks of lab `token_budget`: random runs of the project's v1 scheduler, the student's plan
checked against it at every step.

Each check draws a small serving run (a pool of blocks, a budget, max_num_seqs, requests arriving over the first
steps) and drives `sim.scheduling.scheduler.Scheduler` (mode "v1", chunked prefill, recompute) through it. Before each step
the student's `schedule` gets the scheduler's state as plain data (`snapshot`, _token_budget_oracle.py); its plan
must obey the rules below, in the order a student should fix them, and then equal the scheduler's own plan:

    a dict {request_id: tokens > 0}  ->  within the budget  ->  no more than a request misses
    ->  the blocks it opens are free  ->  max_num_seqs  ->  served in order (running first, then FCFS), only
    the last one cut short  ->  exactly the tokens sim's Scheduler gives each request

Steps in which the scheduler preempts (a running request out of memory) are not compared (lab victim_policy).
Shapes: "model" (pools where memory sometimes binds), "rule" (tight pools and max_num_seqs 1-3: admission
stops often, so skipping ahead shows), "long" (more, longer requests over more steps).
"""
from __future__ import annotations

import numbers
import unittest
from typing import Any, Callable

from hypothesis import given, note, settings
from hypothesis import strategies as st

from ...base.request import Request
from ...kv import make_kv_manager
from ...scheduling.plan import StepOutcome
from ...scheduling.scheduler import Scheduler, SchedulerConfig
from ...testing.blocks import machine_settings
from ..referee import NO_RULES, Referee
from ._token_budget_oracle import RequestState, oracle_plan, snapshot

# shape -> (block sizes, budget, max_num_seqs, num_blocks, num_requests, prompt_len, output_len) ranges
SHAPES = {
    "model": ((2, 4, 8), (4, 32), (4, 8), (8, 40), (2, 8), (1, 40), (1, 10)),
    "rule": ((2, 4), (4, 24), (1, 3), (3, 12), (3, 8), (1, 24), (1, 8)),
    "long": ((4, 8, 16), (8, 64), (2, 12), (16, 64), (6, 16), (1, 120), (1, 30)),
}


@st.composite
def runs(draw: Callable, shape: str) -> dict[str, Any]:
    sizes, budget, seqs, blocks, count, prompt, output = SHAPES[shape]
    run = {"block_size": draw(st.sampled_from(sizes), label="block_size"),
           "budget": draw(st.integers(*budget), label="max_num_batched_tokens"),
           "max_num_seqs": draw(st.integers(*seqs), label="max_num_seqs"),
           "num_blocks": draw(st.integers(*blocks), label="num_blocks")}
    requests = draw(st.lists(st.tuples(st.integers(0, 8), st.integers(*prompt), st.integers(*output)),
                             min_size=count[0], max_size=count[1]), label="requests (arrival step, prompt, output)")
    # NOTE: a request whose final length the whole pool cannot hold is refused by add_request: left out here.
    fits = [r for r in sorted(requests) if -(-(r[1] + r[2] - 1) // run["block_size"]) <= run["num_blocks"]]
    run["requests"] = fits
    return run


def _line(requests: list[RequestState]) -> str:
    return ", ".join(f"r{r.request_id} {r.status} {r.num_computed_tokens}/{r.num_tokens}" for r in requests)


def _blocks(r: RequestState, tokens: int, block_size: int) -> int:
    return -(-(r.num_computed_tokens + tokens) // block_size) - -(-r.num_computed_tokens // block_size)


def _whole(x: Any) -> bool:
    """An integer of any kind (int, numpy.int64), not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def judge(requests: list[RequestState], free: int, run: dict, found: Any, expected: dict[int, int]) -> None:
    """Raise AssertionError naming the first rule the student's plan `found` breaks."""
    where = f"schedule(..., num_free_blocks={free}) with budget {run['budget']}, max_num_seqs {run['max_num_seqs']}"
    by_id = {r.request_id: r for r in requests}
    ok = isinstance(found, dict) and all(_whole(k) and k in by_id and _whole(v) and v > 0 for k, v in found.items())
    if not ok:
        raise AssertionError(f"{where} returned {found!r}: expected a dict {{request_id: tokens > 0}} (whole numbers) "
                             f"over the requests given, leaving out those that get no token")
    found = {int(k): int(v) for k, v in found.items()}  # numpy integers are whole numbers too
    fed = sum(found.values())
    if fed > run["budget"]:
        raise AssertionError(f"{where} -> {found}: {fed} tokens, over the budget of {run['budget']} "
                             f"(max_num_batched_tokens)")
    for rid, tokens in found.items():
        if tokens > by_id[rid].num_missing:
            raise AssertionError(f"{where} -> {found}: r{rid} gets {tokens} tokens but misses only "
                                 f"{by_id[rid].num_missing} (num_tokens - num_computed_tokens)")
    need = sum(_blocks(by_id[rid], tokens, run["block_size"]) for rid, tokens in found.items())
    if need > free:
        raise AssertionError(f"{where} -> {found}: the plan opens {need} new blocks, only {free} are free")
    batch = sum(r.status == "running" for r in requests) + sum(by_id[rid].status == "waiting" for rid in found)
    if batch > run["max_num_seqs"]:
        raise AssertionError(f"{where} -> {found}: {batch} requests would run (every running one counts, scheduled "
                             f"or not), over max_num_seqs {run['max_num_seqs']}")
    order = [r for r in requests if r.status == "running"] + [r for r in requests if r.status == "waiting"]
    served = [r for r in order if r.request_id in found]
    for r in served[:-1]:
        if found[r.request_id] < r.num_missing:
            later = served[served.index(r) + 1].request_id
            raise AssertionError(f"{where} -> {found}: r{r.request_id} ({r.status}) is cut to {found[r.request_id]} "
                                 f"of the {r.num_missing} tokens it misses, yet r{later} after it gets tokens: only "
                                 f"the budget cuts a request short, and then nobody after it gets any")
    gaps = [r for r in order[: order.index(served[-1])] if r.request_id not in found] if served else []
    if gaps:
        r, later = gaps[0], served[-1]
        rule = ("running requests come before waiting ones" if r.status == "running" and later.status == "waiting"
                else "running requests are served in order" if r.status == "running"
                else "FCFS: a waiting request that cannot be admitted stops admission, nobody overtakes it")
        raise AssertionError(f"{where} -> {found}: r{later.request_id} ({later.status}) gets tokens while "
                             f"r{r.request_id} ({r.status}, before it) gets none: {rule}")
    if found != expected:
        left = free  # the free blocks each request of sim's plan finds, once those before it have theirs
        for r in order:
            tokens, blocks = expected.get(r.request_id, 0), _blocks(r, expected.get(r.request_id, 0), run["block_size"])
            if tokens != found.get(r.request_id, 0):
                plan = {q.request_id: expected[q.request_id] for q in order if q.request_id in expected}
                raise AssertionError(
                    f"{where} -> {found}: sim's Scheduler plans {plan}; r{r.request_id} ({r.status}, misses "
                    f"{r.num_missing}): expected {tokens} tokens, found {found.get(r.request_id, 0)} (in sim's "
                    f"plan it opens {blocks} block(s), with {left} free once the requests before it have theirs)")
            left -= blocks


def play(make: Callable[..., Any], run: dict, max_steps: int) -> None:
    """Drive sim's Scheduler through `run`, asking the student before every step, and judge each answer."""
    bs, budget, max_seqs = run["block_size"], run["budget"], run["max_num_seqs"]
    note(f"block_size {bs}, max_num_batched_tokens {budget}, max_num_seqs {max_seqs}, {run['num_blocks']} blocks")
    note("requests (arrives before step, prompt_len, output_len): "
         + ", ".join(f"r{i} {r}" for i, r in enumerate(run["requests"])))
    note("each step: the free blocks, then rN status num_computed_tokens/num_tokens, then sim's plan")
    kv = make_kv_manager("paged", run["num_blocks"] * bs, block_size=bs)
    config = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, mode="v1",
                             enable_chunked_prefill=True)
    oracle = Scheduler(kv, config)
    student = Referee(make(bs, budget, max_seqs), NO_RULES)
    arrivals = run["requests"]
    for step in range(max_steps):
        for rid, (at, prompt_len, output_len) in enumerate(arrivals):
            if at == step:
                oracle.add_request(Request(rid, float(at), prompt_len=prompt_len, output_len=output_len))
        if not oracle.has_unfinished():
            if all(at < step for at, _, _ in arrivals):
                return
            continue
        requests, free = snapshot(oracle), kv.num_free_blocks
        plan = oracle.schedule()
        expected = oracle_plan(plan, requests)
        if plan.preempted:
            note(f"step {step}: {free} free; {_line(requests)}: a running request is out of memory, sim preempts "
                 f"{['r%d' % r for r in plan.preempted]} (lab victim_policy): not compared")
        else:
            note(f"step {step}: {free} free; {_line(requests)} -> {expected}")
            judge(requests, free, run, student.schedule(list(requests), free), expected)
        oracle.finish_step(plan, StepOutcome())


def step_check(shape: str) -> Callable[[Callable[..., Any], int, int], type]:
    def build(make: Callable[..., Any], max_examples: int, steps: int) -> type:
        @settings(machine_settings(max_examples, steps), report_multiple_bugs=False)
        @given(run=runs(shape))
        def run_test(self: unittest.TestCase, run: dict) -> None:
            play(make, run, steps)

        return type(f"TokenBudget_{shape}", (unittest.TestCase,), {"runTest": run_test})

    return build
