"""Lab `token_budget`: one step of vLLM v1's scheduler under a token budget, planned by the student.

vLLM v1 (vllm/v1/core/sched/scheduler.py, `Scheduler.schedule`) has no prefill phase and no decode phase. Each
step hands out `max_num_batched_tokens` tokens: first to the RUNNING requests, in order (a decode takes 1 token,
an unfinished chunked prompt takes what it still misses, cut to what is left of the budget), then to the
WAITING requests, first come first served, each prompt cut to what is left. A request is scheduled only if the
blocks its new tokens open are free; the first waiting request that cannot get them stops admission (nobody
behind it overtakes), and so does `max_num_seqs`. The project's own version is `sim.scheduling.scheduler.Scheduler` in
mode "v1", the oracle of every check here.

The student sees plain data: a list of `RequestState`s (what `snapshot` reads off a scheduler between two
steps) and the number of free blocks; the answer is the plan `{request_id: tokens this step}` (`oracle_plan` reads
the scheduler's own). All three live in _token_budget_oracle.py, shared with the random runs of
_token_budget_checks.py; notebook 06 imports them from this module.

NOTE: a running request that cannot get memory is preempted (lab `victim_policy`). This lab leaves that out:
the checks compare only steps in which the project's scheduler preempted nobody.
"""
from __future__ import annotations

from ..referee import NO_RULES
from ..registry import Exercise, MachineCheck
from ..report import Story
from ._token_budget_oracle import RequestState, oracle_plan, snapshot  # noqa: F401  (notebook 06)


# --- narrated examples -----------------------------------------------------------------------------------------
def _step(t: Story, planner, requests: list[RequestState], num_free_blocks: int) -> dict:
    # NOTE: the call is told as a short line under the requests it gets (each on its own line), not as
    # Story.do's one long repr; the referee still names the whole call should the student's code raise.
    t.steps += [f"  {r!r}" for r in requests] + [f"schedule(the {len(requests)} requests above, {num_free_blocks})"]
    plan = planner.schedule(requests, num_free_blocks)
    t.steps[-1] += f" -> {plan!r}"
    return plan


def blocks_opened(make, t: Story) -> None:
    """num_new_blocks: new tokens take only the blocks they open (the partly filled last block first)"""
    planner = make(4, 16, 8)
    t.say("block_size 4: a request with 6 computed tokens holds 2 blocks, the second half full")
    for computed, new, blocks in ((0, 1, 1), (0, 9, 3), (3, 1, 0), (4, 1, 1), (6, 2, 0), (6, 5, 1)):
        t.expect(f"num_new_blocks({computed}, {new})", t.do(planner, "num_new_blocks", computed, new), blocks)


def decodes_then_chunk(make, t: Story) -> None:
    """running requests decode first; a waiting prompt gets what is left of the budget, as a chunk"""
    planner = make(4, 8, 8)
    requests = [RequestState(0, "running", 6, 5, 4), RequestState(1, "running", 5, 4, 3),
                RequestState(2, "waiting", 20, 0, 20)]
    plan = _step(t, planner, requests, 32)
    t.expect("the plan (budget 8: two decodes, then 6 of r2's 20 prompt tokens)", plan, {0: 1, 1: 1, 2: 6})


def chunk_continues(make, t: Story) -> None:
    """an unfinished chunked prompt is running: it continues before anything waiting, then r1 gets the rest"""
    planner = make(4, 8, 8)
    requests = [RequestState(0, "running", 20, 14, 20), RequestState(1, "waiting", 3, 0, 3)]
    plan = _step(t, planner, requests, 32)
    t.expect("the plan (r0 misses 6 tokens; 2 are left for r1)", plan, {0: 6, 1: 2})
    plan = _step(t, planner, [RequestState(0, "running", 40, 14, 40), RequestState(1, "waiting", 3, 0, 3)], 32)
    t.expect("the plan when r0 misses 26 tokens: it takes the whole budget, r1 waits", plan, {0: 8})


def no_overtaking(make, t: Story) -> None:
    """FCFS: the first waiting request that cannot get its blocks stops admission; nobody behind it overtakes"""
    planner = make(4, 16, 8)
    requests = [RequestState(0, "running", 9, 8, 9), RequestState(1, "waiting", 12, 0, 12),
                RequestState(2, "waiting", 2, 0, 2)]
    t.say("3 blocks free: r0's decode opens block 3 of its table (1 block); r1 needs 3, only 2 are left")
    plan = _step(t, planner, requests, 3)
    t.expect("the plan (r2 would fit in 1 block, but it may not overtake r1)", plan, {0: 1})


def max_num_seqs_caps(make, t: Story) -> None:
    """max_num_seqs caps the requests in the batch: the running ones count first"""
    planner = make(4, 16, 2)
    requests = [RequestState(0, "running", 4, 3, 3), RequestState(1, "waiting", 2, 0, 2),
                RequestState(2, "waiting", 2, 0, 2)]
    plan = _step(t, planner, requests, 16)
    t.expect("the plan (max_num_seqs 2: r0 runs, r1 joins it, r2 must wait)", plan, {0: 1, 1: 2})
    requests = [RequestState(0, "running", 4, 3, 3), RequestState(1, "running", 3, 2, 2),
                RequestState(2, "waiting", 2, 0, 2)]
    plan = _step(t, planner, requests, 16)
    t.expect("the plan (two running already: r2 must wait)", plan, {0: 1, 1: 1})


def recompute_after_preemption(make, t: Story) -> None:
    """a preempted request waits with nothing cached: it recomputes its prompt AND the tokens it had sampled"""
    planner = make(4, 16, 8)
    requests = [RequestState(0, "waiting", 9, 0, 5)]
    t.say("r0 had a 5-token prompt and sampled 4 tokens before it was preempted")
    plan = _step(t, planner, requests, 8)
    t.expect("the plan (all 9 tokens, in 3 blocks)", plan, {0: 9})
    plan = _step(t, planner, [RequestState(0, "waiting", 9, 0, 5)], 2)
    t.expect("the plan with 2 blocks free (9 tokens need 3: nothing is scheduled)", plan, {})


EXAMPLES = (blocks_opened, decodes_then_chunk, chunk_continues, no_overtaking, max_num_seqs_caps,
            recompute_after_preemption)


def _lazy(shape: str):
    def build(make, max_examples: int, steps: int) -> type:
        from ._token_budget_checks import step_check

        return step_check(shape)(make, max_examples, steps)

    return build


EXERCISE = Exercise(
    "one scheduler step under a token budget (vLLM v1's Scheduler.schedule)",
    "YourClass(block_size, max_num_batched_tokens, max_num_seqs)", "MyTokenBudget",
    (4, 8, 4), {"num_new_blocks": (0, 1), "schedule": ([], 4)}, ("num_new_blocks", "schedule"), NO_RULES,
    EXAMPLES,
    (
        MachineCheck("model", "random runs: {n} runs, every step's plan against sim's Scheduler (mode v1)",
                     _lazy("model"), 4.0, "visible"),
        MachineCheck("rule", "tight memory and max_num_seqs: {n} runs where admission stops often",
                     _lazy("rule"), 3.0, "hidden"),
        MachineCheck("long", "long runs: {n} runs of up to 60 steps, more and longer requests",
                     _lazy("long"), 2.0, "hidden", scale=2, steps=60),
    ),
    "06_token_budget", "token_budget",
)
