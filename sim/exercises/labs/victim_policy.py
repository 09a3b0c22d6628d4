"""Lab `victim_policy`: who is preempted when memory runs out, with a guard against starving one request.

When a running request cannot get the blocks its next tokens need, the scheduler preempts running requests
until it can (vLLM v1, vllm/v1/core/sched/scheduler.py; the paper, section 4.5). Who goes is a policy
(sim/scheduling/preemption.py): `victim(candidates) -> one of them`, passed as `SchedulerConfig(victim=...)`.

The policy asked for here: the candidate with the FEWEST computed tokens (the cheapest to recompute), ties to
the latest arrival, but a request already preempted `max_preemptions` times is PROTECTED while any candidate
is below that count; when all have reached it, the latest arrival goes (vLLM's default, which always lets the
oldest request progress). Why the guard: with recompute, a preempted request comes back with 0 computed
tokens, so "fewest computed" picks it again and again (the notebook shows it); the cap bounds that.

Checks: the narrated examples call `victim` on hand-made candidates; the property checks run the project's
`Scheduler` with the student's policy on small pools that preempt often (`_victim_policy_checks.py`).
"""
from __future__ import annotations

from ..referee import NO_RULES
from ..registry import Exercise, MachineCheck
from ..report import Story


def candidate(request_id: int, num_computed_tokens: int, prompt_len: int = 64):
    """A running request as the scheduler offers it: a `SequenceGroup` of one sequence (sim/scheduling/sequence.py), its
    arrival order its id."""
    from ...base.request import Request
    from ...scheduling.sequence import Sequence, SequenceGroup, SequenceStatus

    seq = Sequence(request_id, request_id, prompt_len, 16, num_computed_tokens=num_computed_tokens,
                   status=SequenceStatus.RUNNING)
    return SequenceGroup(Request(request_id, 0.0, prompt_len, 16), [seq], request_id, SequenceStatus.RUNNING)


def describe(groups) -> str:
    return "[" + ", ".join(f"r{g.request_id} ({g.num_computed_tokens} computed)" for g in groups) + "]"


def choose(t: Story, policy, groups) -> object:
    """policy.victim(groups), told as `victim([r0 (40 computed), ...]) -> r1`; the answer must be a candidate."""
    t.steps.append(f"victim({describe(groups)})")
    found = policy.victim(list(groups))
    named = next((f"r{g.request_id}" for g in groups if g is found), None)
    t.steps[-1] += f" -> {named or repr(found)}"
    t.ensure(named is not None, f"victim({describe(groups)}) returned {found!r}: expected one of the candidates "
             f"(the SequenceGroup itself, not its id)")
    return found


def fewest_computed_first(make, t: Story) -> None:
    """the candidate with the fewest computed tokens goes: the cheapest to compute again"""
    r0, r1, r2 = candidate(0, 40), candidate(1, 8), candidate(2, 25)
    t.expect("the victim", f"r{choose(t, make(2), [r0, r1, r2]).request_id}", "r1")


def ties_to_latest_arrival(make, t: Story) -> None:
    """equal computed tokens: the latest arrival goes (the larger arrival_order)"""
    r0, r1, r2 = candidate(0, 8), candidate(1, 8), candidate(2, 30)
    t.expect("the victim", f"r{choose(t, make(2), [r0, r1, r2]).request_id}", "r1")


def the_cap_protects(make, t: Story) -> None:
    """a request preempted max_preemptions times is protected while anyone is below; then the latest arrival goes"""
    policy = make(1)
    r0, r1, r2 = candidate(0, 40), candidate(1, 8), candidate(2, 25)
    t.say("max_preemptions 1; the policy counts its own answers: each one is preempted")
    t.expect("the first victim", f"r{choose(t, policy, [r0, r1, r2]).request_id}", "r1")
    t.expect("[is_protected(0), is_protected(1)] after r1 was preempted once",
             [t.do(policy, "is_protected", 0), t.do(policy, "is_protected", 1)], [False, True])
    r1 = candidate(1, 0)
    t.say("r1 came back with 0 computed tokens (recompute): the cheapest again, but it has had its turn")
    t.expect("the second victim", f"r{choose(t, policy, [r0, r1, r2]).request_id}", "r2")
    r2 = candidate(2, 0)
    t.expect("the third victim", f"r{choose(t, policy, [r0, r1, r2]).request_id}", "r0")
    t.say("every candidate is at the cap now: the latest arrival goes")
    r0 = candidate(0, 0)
    t.expect("the fourth victim", f"r{choose(t, policy, [r0, candidate(1, 30), candidate(2, 50)]).request_id}", "r2")


def alone_it_goes(make, t: Story) -> None:
    """the only candidate (the request needing memory, nobody left to preempt) is the victim, cap or not"""
    policy = make(1)
    for _ in range(3):
        t.expect("the victim", f"r{choose(t, policy, [candidate(4, 12)]).request_id}", "r4")


def on_the_scheduler(make, t: Story) -> None:
    """on the project's Scheduler: a pool of 6 blocks, 3 requests; every one finishes with all its tokens"""
    from ...base.request import Request
    from ...kv import make_kv_manager
    from ...scheduling.plan import StepOutcome
    from ...scheduling.scheduler import Scheduler, SchedulerConfig

    policy = make(1)
    kv = make_kv_manager("paged", 6 * 4, block_size=4)
    sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=16, victim=policy.victim))
    for rid in range(3):
        sched.add_request(Request(rid, 0.0, prompt_len=5, output_len=8))
    t.say("Scheduler(kv, SchedulerConfig(max_num_batched_tokens=16, victim=policy.victim)); 3 requests (5, 8)")
    for step in range(200):
        if not sched.has_unfinished():
            break
        plan = sched.schedule()
        if plan.preempted:
            t.say(f"step {step}: preempted {['r%d' % r for r in plan.preempted]}")
        sched.finish_step(plan, StepOutcome())
    t.expect("requests finished", [sched.is_finished(r) for r in range(3)], [True, True, True])
    t.expect("tokens generated", [sched.num_generated(sched.seq_ids(r)[0]) for r in range(3)], [8, 8, 8])


EXAMPLES = (fewest_computed_first, ties_to_latest_arrival, the_cap_protects, alone_it_goes, on_the_scheduler)


def _lazy(shape: str):
    def build(make, max_examples: int, steps: int) -> type:
        from ._victim_policy_checks import run_check

        return run_check(shape)(make, max_examples, steps)

    return build


EXERCISE = Exercise(
    "a preemption victim policy with a guard against starvation (vLLM v1 / paper section 4.5)",
    "YourClass(max_preemptions)", "MyVictimPolicy",
    (2,), {"is_protected": (0,), "victim": ([],)}, ("is_protected", "victim"), NO_RULES, EXAMPLES,
    (
        MachineCheck("model", "serving runs: {n} runs on small pools; a candidate every time, nobody starved, "
                     "every request finishes with all its tokens", _lazy("model"), 4.0, "visible"),
        MachineCheck("rule", "the rule: {n} runs, every choice against sim.scheduling.preemption's fewest_computed and "
                     "latest_arrival", _lazy("rule"), 3.0, "hidden"),
        MachineCheck("long", "long runs: {n} runs, more and longer requests, preempted by swap or recompute",
                     _lazy("long"), 2.0, "hidden", scale=2, steps=60),
    ),
    "08_victim_policy", "victim_policy",
)
