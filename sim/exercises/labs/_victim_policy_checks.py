"""The property checks of lab `victim_policy`: the project's Scheduler runs small serving runs with the student's
policy as `SchedulerConfig(victim=policy.victim)`, on pools small enough that preemption is frequent.

Every call of the policy is watched (the scheduler preempts whatever it returns), and the run's outcome judged:

- "model" (visible): the answer is one of the candidates; NOBODY IS STARVED: a request that has already been
  preempted max_preemptions times is never chosen while a candidate below that count is offered; every request
  finishes, within a step limit, having generated exactly its output_len tokens (preemption changes no output).
- "rule" (hidden): the same runs, tighter pools, and every choice exactly the policy's, composed from the
  project's own policies (sim/scheduling/preemption.py): `fewest_computed` among the candidates below the cap, else
  `latest_arrival` among all. Candidates come in the scheduler's order (the request needing memory LAST, though
  it arrived first), so a policy that reads arrival from list positions fails here.
- "long" (hidden): as "model" with more and longer requests, preempting by swap (CPU blocks) or recompute.
"""
from __future__ import annotations

import unittest
from typing import Any, Callable

from hypothesis import given, note, settings
from hypothesis import strategies as st

from ...base.request import Request
from ...kv import make_kv_manager
from ...scheduling.plan import StepOutcome
from ...scheduling.preemption import fewest_computed, latest_arrival
from ...scheduling.scheduler import Scheduler, SchedulerConfig
from ...testing.blocks import machine_settings
from ..referee import tag_exercise_call

# shape -> (num_blocks, num_requests, prompt_len, output_len, max_preemptions, swap allowed): many requests that
# arrive together and grow long outputs in a few blocks, so that decodes run out of memory often
SHAPES = {"model": ((4, 8), (4, 8), (1, 8), (4, 16), (1, 3), False),
          "rule": ((3, 6), (4, 8), (1, 8), (4, 16), (1, 2), False),
          "long": ((6, 12), (8, 14), (1, 24), (8, 32), (1, 3), True)}
BLOCK_SIZE = 4


@st.composite
def runs(draw: Callable, shape: str) -> dict[str, Any]:
    blocks, count, prompt, output, cap, swap = SHAPES[shape]
    run = {"num_blocks": draw(st.integers(*blocks), label="num_blocks"),
           "budget": draw(st.integers(8, 32), label="max_num_batched_tokens"),
           "max_preemptions": draw(st.integers(*cap), label="max_preemptions"),
           "swap": swap and draw(st.booleans(), label="swap")}
    requests = draw(st.lists(st.tuples(st.integers(0, 2), st.integers(*prompt), st.integers(*output)),
                             min_size=count[0], max_size=count[1]), label="requests (arrival step, prompt, output)")
    # NOTE: a request whose final length the whole pool cannot hold is refused by add_request: left out here.
    run["requests"] = [r for r in sorted(requests) if -(-(r[1] + r[2] - 1) // BLOCK_SIZE) <= run["num_blocks"]]
    return run


def _offered(groups, counts: dict[int, int]) -> str:
    return "[" + ", ".join(f"r{g.request_id} ({g.num_computed_tokens} computed, preempted {counts[g.request_id]}x)"
                           for g in groups) + "]"


class Watch:
    """The policy the scheduler calls: asks the student's, checks the answer, counts the preemptions."""

    def __init__(self, student: Any, cap: int, exact: bool) -> None:
        self.student, self.cap, self.exact = student, cap, exact
        self.counts: dict[int, int] = {}
        self.step = 0

    def __call__(self, candidates: list) -> Any:
        for g in candidates:
            self.counts.setdefault(g.request_id, 0)
        call = f"victim({_offered(candidates, self.counts)})"
        try:
            found = self.student.victim(list(candidates))
        except Exception as exc:  # noqa: BLE001  (named, then passed on)
            tag_exercise_call(exc, call)
            raise
        named = next((g for g in candidates if g is found), None)
        if named is None:
            raise AssertionError(f"step {self.step}: {call} returned {found!r}: expected one of the candidates "
                                 f"(the SequenceGroup itself)")
        note(f"step {self.step}: {call} -> r{found.request_id}")
        below = [g for g in candidates if self.counts[g.request_id] < self.cap]
        if self.counts[found.request_id] >= self.cap and below:
            raise AssertionError(
                f"step {self.step}: {call} chose r{found.request_id}, already preempted "
                f"{self.counts[found.request_id]} "
                f"time(s) (max_preemptions {self.cap}), while r{below[0].request_id} was preempted "
                f"{self.counts[below[0].request_id]} time(s): starvation. A request at the cap is protected while any "
                f"candidate is below it")
        if self.exact:
            expected = fewest_computed(below) if below else latest_arrival(candidates)
            if found is not expected:
                why = ("the fewest computed tokens among those below the cap, ties to the latest arrival "
                       "(the larger arrival_order, not the later place in the list)" if below
                       else "every candidate is at the cap: the latest arrival (the largest arrival_order)")
                raise AssertionError(f"step {self.step}: {call} chose r{found.request_id}, expected "
                                     f"r{expected.request_id}: {why}")
        self.counts[found.request_id] += 1
        return found


def play(make: Callable[..., Any], run: dict, exact: bool) -> None:
    cap, arrivals = run["max_preemptions"], run["requests"]
    mode = "swap" if run["swap"] else "recompute"
    note(f"{run['num_blocks']} blocks of {BLOCK_SIZE} slots, max_num_batched_tokens {run['budget']}, preemption by "
         f"{mode}, max_preemptions {cap}")
    note("requests (arrives before step, prompt_len, output_len): "
         + ", ".join(f"r{i} {r}" for i, r in enumerate(arrivals)))
    watch = Watch(make(cap), cap, exact)
    kv = make_kv_manager("paged", run["num_blocks"] * BLOCK_SIZE, block_size=BLOCK_SIZE,
                         num_cpu_blocks=run["num_blocks"] if run["swap"] else 0)
    sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=run["budget"], preemption=mode, victim=watch))
    # NOTE: a generous bound: the solution needs far fewer steps; a policy that keeps undoing work runs past it.
    limit = 50 + 4 * sum(p + o for _, p, o in arrivals) * (cap + 2)
    for step in range(limit):
        watch.step = step
        for rid, (at, prompt_len, output_len) in enumerate(arrivals):
            if at == step:
                sched.add_request(Request(rid, float(at), prompt_len=prompt_len, output_len=output_len))
        if step > max((a for a, _, _ in arrivals), default=0) and not sched.has_unfinished():
            break
        sched.finish_step(sched.schedule(), StepOutcome())
    unfinished = [f"r{rid}" for rid in range(len(arrivals)) if not sched.is_finished(rid)]
    if unfinished:
        raise AssertionError(f"after {limit} steps {', '.join(unfinished)} had not finished (preempted "
                             f"{[watch.counts.get(int(r[1:]), 0) for r in unfinished]} times): every request "
                             f"must finish")
    for rid, (_, _, output_len) in enumerate(arrivals):
        generated = sched.num_generated(sched.seq_ids(rid)[0])
        if generated != output_len:
            raise AssertionError(f"r{rid} generated {generated} tokens, expected its output_len {output_len}: "
                                 f"preemption must change no output")


def run_check(shape: str) -> Callable[[Callable[..., Any], int, int], type]:
    def build(make: Callable[..., Any], max_examples: int, steps: int) -> type:
        @settings(machine_settings(max_examples, steps), report_multiple_bugs=False)
        @given(run=runs(shape))
        def run_test(self: unittest.TestCase, run: dict) -> None:
            play(make, run, exact=shape == "rule")

        return type(f"VictimPolicy_{shape}", (unittest.TestCase,), {"runTest": run_test})

    return build
