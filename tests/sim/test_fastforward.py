"""The fast plane (sim/fast/) gives the same run as the plain core stepping token by token.

Each case simulates one workload three times: `jump=False` (the plain loop: one schedule()/finish_step() per token),
`jump=True` with `validate=True` (run by run: after every run the loop checks its booked memory against the KV
manager), and `jump=True` alone (where the pool allows, decode epochs: the same runs applied lazily, sim/fast/paged.py's
DecodeEpoch, with each request's token times booked when it finishes or the epoch closes). Everything
per request and per step must be identical: times are the same float sums in the same order, and the memory
counts are integers. The time-weighted memory shares may differ only by summation order: rel 1e-9. Every case
runs under the paper's scheduler (v0) and under v1 with a small token budget, so prompt chunks, mixed steps
and preemption while chunking are interleaved with the runs.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.api import run
from sim.base.request import Request
from sim.clock.metrics import REQUEST_COLUMNS, STEP_COLUMNS
from sim.fast.epoch import DecodeEpochs, EpochStep
from sim.fast.paged import DecodeEpoch, run_capacity
from sim.fast.runs import advance, kv_runs, plain_decodes
from sim.kv.base import SHARE_NAMES, NewSequence
from sim.kv.paged import PagedKVManager
from sim.scheduling.plan import StepOutcome
from sim.scheduling.scheduler import Scheduler, SchedulerConfig

# (policy, extra arguments). Small pools (kv_slots) make memory run out: preemption for paged, long waits
# for the contiguous policies. 4096 slots still hold the longest request (2048 tokens) twice.
BASE_CASES = {
    "paged": ("paged", {}),
    "paged-small-pool": ("paged", {"kv_slots": 4096}),
    "paged-swap": ("paged", {"kv_slots": 4096, "preemption": "swap", "swap_space_gib": 1.0}),
    "paged-block-1": ("paged", {"kv_slots": 4096, "block_size": 1}),
    "paged-parallel-sampling": ("paged", {"n": 2}),
    "paged-parallel-sampling-preempt": ("paged", {"n": 3, "kv_slots": 8192}),
    "paged-fewest-computed-victim": ("paged", {"kv_slots": 4096, "victim": "fewest_computed"}),
    "paged-beam": ("paged", {"beam_width": 3, "kv_slots": 8192, "workload": "alpaca"}),
    "paged-prefix": ("paged", {"prefix_len": 40, "num_prefixes": 2, "kv_slots": 4096}),
    "paged-prefix-budget-after-hits": (
        "paged",
        {"prefix_len": 40, "num_prefixes": 2, "kv_slots": 8192, "max_num_batched_tokens": 2100},
    ),
    "max": ("max", {}),
    "max-small-pool": ("max", {"kv_slots": 4096}),
    "pow2": ("pow2", {"kv_slots": 4096}),
    "oracle": ("oracle", {"kv_slots": 4096}),
    "oracle-parallel-sampling": ("oracle", {"n": 2, "kv_slots": 8192, "allocator": "first_fit"}),
}
MODES = {"v0": {"scheduler": "v0"}, "v1": {"scheduler": "v1", "max_num_batched_tokens": 256}}
CASES = {
    f"{mode}-{name}": (policy, {**MODES[mode], **extra})
    for mode in MODES
    for name, (policy, extra) in BASE_CASES.items()
}
CASES["static"] = ("paged", {"scheduler": "static", "kv_slots": 4096})
CASES["v1-unchunked"] = ("paged", {"scheduler": "v1", "enable_chunked_prefill": False, "kv_slots": 4096})
# priority scheduling: arrivals of the better class head the queue (a run may not go on past them), victims by class
CASES["v0-paged-priority"] = (
    "paged",
    {"scheduler": "v0", "kv_slots": 4096, "scheduling_policy": "priority", "priority_share": 0.3},
)
CASES["v1-paged-priority"] = (
    "paged",
    {
        "scheduler": "v1",
        "max_num_batched_tokens": 256,
        "kv_slots": 4096,
        "scheduling_policy": "priority",
        "priority_share": 0.3,
    },
)
# short requests admitted into a running batch: they join an open decode epoch and some finish in their first run
CASES["v0-paged-short-joiners"] = (
    "paged",
    {
        "scheduler": "v0",
        "workload": "uniform",
        "rate": 30.0,
        "prompt_len_range": (1, 40),
        "output_len_range": (1, 12),
        "num_requests": 120,
        "kv_slots": 2048,
    },
)
# parallel samples re-admitted while an epoch is open, one of which ends in its first step while its siblings go on:
# its blocks leave the epoch's counts though its request still runs (found by the random workloads below)
CASES["v1-paged-a-sample-ends-alone"] = (
    "paged",
    {
        "scheduler": "v1",
        "workload": "uniform",
        "prompt_len_range": (1, 1),
        "output_len_range": (1, 48),
        "num_requests": 23,
        "n": 3,
        "block_size": 1,
        "rate": 20.0,
        "kv_slots": 189,
        "seed": 0,
        "max_num_batched_tokens": 64,
    },
)


def _simulate(policy: str, jump: bool, epochs: bool = False, **extra):
    args = {"workload": "sharegpt", "rate": 4.0, "num_requests": 40, "seed": 3, **extra}
    return run(policy=policy, jump=jump, validate=jump and not epochs, **args)  # validate: run by run


@pytest.mark.parametrize("how", ["runs", "epochs"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_jump_equals_stepping(case, how):
    policy, extra = CASES[case]
    stepped, jumped = _simulate(policy, False, **extra), _simulate(policy, True, how == "epochs", **extra)
    assert jumped.summary["num_finished"] == stepped.summary["num_finished"] == stepped.summary["num_requests"]
    for name in REQUEST_COLUMNS:  # arrival, first token, finish, preemptions, normalized latency: bit-identical
        np.testing.assert_array_equal(jumped.requests[name], stepped.requests[name], err_msg=name)
    for name in STEP_COLUMNS:  # step count, start times, durations, batch sizes, slot counts: bit-identical
        np.testing.assert_array_equal(jumped.steps[name], stepped.steps[name], err_msg=name)
    for key in ("num_steps", "mean_batch_size", "num_preemptions", "throughput_req_per_s", "sim_time_s"):
        assert jumped.summary[key] == stepped.summary[key], key
    for name in SHARE_NAMES:  # only the order of a float sum may differ
        assert jumped.summary["memory"][name] == pytest.approx(stepped.summary["memory"][name], rel=1e-9, abs=1e-12)


def _assert_same_run(jumped, stepped) -> None:
    for name in REQUEST_COLUMNS:
        np.testing.assert_array_equal(jumped.requests[name], stepped.requests[name], err_msg=name)
    for name in STEP_COLUMNS:
        np.testing.assert_array_equal(jumped.steps[name], stepped.steps[name], err_msg=name)


@settings(deadline=None, max_examples=100)  # each example: three whole (small) simulations
@given(st.data())
def test_jump_equals_stepping_on_random_small_workloads(data):
    """Beyond the cases above: random uniform workloads in pools from barely big enough to ample, any block size,
    parallel samples, each scheduler, either victim policy, a sequence cap that binds or not, FCFS or priority
    scheduling (with two classes of requests or one). Stepping, run by run (validated) and decode epochs (which
    preempt inside the epoch where memory runs out) give the same requests and steps, bit for bit."""
    prompt_hi = data.draw(st.integers(1, 200), "longest prompt")
    output_hi = data.draw(st.integers(1, 120), "longest output")
    n = data.draw(st.sampled_from([1, 1, 2, 3]), "n")
    block_size = data.draw(st.sampled_from([1, 2, 8, 16]), "block size")
    longest = -(-(prompt_hi + output_hi) // block_size) * block_size * n  # a request alone must fit
    extra = {
        "workload": "uniform",
        "prompt_len_range": (1, prompt_hi),
        "output_len_range": (1, output_hi),
        "num_requests": data.draw(st.integers(1, 30), "requests"),
        "n": n,
        "block_size": block_size,
        "rate": data.draw(st.sampled_from([2.0, 20.0, 200.0]), "rate"),
        "kv_slots": data.draw(st.integers(longest + block_size * n, 6 * longest), "kv slots"),
        "scheduler": data.draw(st.sampled_from(["v0", "v1", "static"]), "scheduler"),
        "victim": data.draw(st.sampled_from(["latest_arrival", "latest_arrival", "fewest_computed"]), "victim"),
        "max_num_seqs": data.draw(st.sampled_from([n, 2 * n + 1, 256]), "max_num_seqs"),
        "scheduling_policy": data.draw(st.sampled_from(["fcfs", "fcfs", "priority"]), "scheduling policy"),
        "priority_share": data.draw(st.sampled_from([0.0, 0.3, 0.8]), "priority share"),
        "seed": data.draw(st.integers(0, 3), "seed"),
    }
    if extra["scheduler"] == "v1":
        extra["max_num_batched_tokens"] = data.draw(st.sampled_from([64, 256, 2048]), "budget")
    stepped = _simulate("paged", False, **extra)
    _assert_same_run(_simulate("paged", True, **extra), stepped)
    _assert_same_run(_simulate("paged", True, True, **extra), stepped)


@pytest.mark.parametrize(
    "case", ["v0-paged-small-pool", "v1-paged-parallel-sampling-preempt", "v0-paged-short-joiners"]
)
def test_an_epoch_that_trims_its_step_ends_books_the_same_times(case, monkeypatch):
    """An epoch may stay open for a whole run: its list of step ends drops the steps no member reads any more once it
    is long (sim.fast.loop.EPOCH_TRIM steps). Trimming every few steps changes nothing in what is booked."""
    monkeypatch.setattr("sim.fast.loop.EPOCH_TRIM", 4)
    policy, extra = CASES[case]
    _assert_same_run(_simulate(policy, True, True, **extra), _simulate(policy, False, **extra))


def test_jumps_happen_and_matter():
    """The fast path is really taken: far fewer events than steps (a run of K steps is one event)."""
    jumped = _simulate("paged", True)
    stepped = _simulate("paged", False)
    assert jumped.summary["num_events"] < stepped.summary["num_events"] / 2
    assert jumped.summary["num_steps"] == stepped.summary["num_steps"]


def test_decode_epochs_are_taken_where_the_manager_can(monkeypatch):
    """Without validate, the paged runs go through decode epochs (opened, and holding several runs each); with a
    prefix cache or under validate they do not (the run-by-run path)."""
    opened, runs = [], []
    real_open, real_advance = DecodeEpochs.open, DecodeEpochs.advance

    def spy_open(self, on_close=None):
        opened.append(real_open(self, on_close))
        return opened[-1]

    def spy_advance(self, max_steps):
        runs.append(real_advance(self, max_steps))
        return runs[-1]

    monkeypatch.setattr(DecodeEpochs, "open", spy_open)
    monkeypatch.setattr(DecodeEpochs, "advance", spy_advance)
    _simulate("paged", True, epochs=True)
    num_opened = opened.count(True)
    assert num_opened > 0 and len(runs) > 1.5 * num_opened  # several runs an epoch
    opened.clear()
    _simulate("paged", True, epochs=True, prefix_len=40, num_prefixes=2)  # prefix caching: every full block registers
    _simulate("paged", True)  # validate checks the pool after every run
    assert not any(opened)


def test_cases_exercise_what_they_claim():
    """The small-pool paged cases really preempt, and the v1 cases really chunk prompts and mix steps (else they
    would test less than they claim)."""
    for case in ("v0-paged-small-pool", "v0-paged-swap", "v0-paged-block-1", "v1-paged-small-pool", "v1-paged-swap"):
        policy, extra = CASES[case]
        assert _simulate(policy, True, **extra).summary["num_preemptions"] > 0, case
    steps = _simulate("paged", True, **MODES["v1"]).steps
    mixed = (steps["num_prefill_tokens"] > 0) & (steps["num_decode_seqs"] > 0)
    assert mixed.any() and (steps["num_batched_tokens"] <= 256).all()


# --- the closed form behind a paged run's length ------------------------------------------------------------
@given(st.lists(st.integers(1, 40), min_size=1, max_size=8), st.integers(1, 8), st.integers(0, 30))
def test_paged_run_capacity_is_the_largest_run_that_fits(tokens, block_size, num_free_blocks):
    def need(k):  # blocks that k more tokens per sequence open, summed (the obvious count)
        return sum(-(-(n + k) // block_size) - -(-n // block_size) for n in tokens)

    k = run_capacity(tokens, block_size, num_free_blocks)
    assert need(k) <= num_free_blocks < need(k + 1)


def _preempted_sampling_group() -> Scheduler:
    """Request 0 grows to fill the pool; request 1 (n = 2) is preempted by recompute and waits, too big to return."""
    sched = Scheduler(PagedKVManager(12, 4), SchedulerConfig(mode="v0"))
    sched.add_request(Request(0, 0.0, prompt_len=8, output_len=40))
    sched.add_request(Request(1, 0.0, prompt_len=8, output_len=10, n=2))
    while sched.waiting_request_ids() != [1] or not sched.num_preemptions:
        plan = sched.schedule()
        sched.finish_step(plan, StepOutcome())
    return sched


def test_decode_runs_go_on_while_a_preempted_sampling_group_cannot_return():
    """A multi-sequence group preempted by recompute waits, too big for the memory left: the run of request 0's
    decodes goes on, and stepping confirms the group stays out for as long as the run says."""
    jumped, stepped = _preempted_sampling_group(), _preempted_sampling_group()
    decodes = plain_decodes(jumped)
    seqs = decodes.seqs
    assert [s.request_id for s in seqs] == [0]
    until_finish = decodes.steps_left - 1  # the simulator's finish rule
    k = kv_runs(jumped.kv).max_decode_steps([[s.seq_id for s in seqs]], until_finish)
    assert k > 20
    counts, finished = advance(jumped, decodes, k)
    assert len(counts) == k and finished == []
    for _ in range(k):
        plan = stepped.schedule()
        assert not plan.prefills and not plan.preempted and plan.request_ids() == [0]
        stepped.finish_step(plan, StepOutcome())
    for sched in (jumped, stepped):
        sched.kv.check_invariants()
    assert jumped.kv.block_table(0) == stepped.kv.block_table(0) and jumped.num_generated(0) == stepped.num_generated(0)
    assert jumped.waiting_request_ids() == stepped.waiting_request_ids() == [1]


def _v1_epoch_step() -> tuple[Scheduler, DecodeEpochs, EpochStep]:
    """Requests 0 and 1 decode in an open epoch; request 2 arrives: the next v1 step admits it, and the epoch takes
    the members' decodes (not in the plan)."""
    sched = Scheduler(PagedKVManager(64, 4), SchedulerConfig(mode="v1", max_num_batched_tokens=64, max_num_seqs=8))
    for rid in (0, 1):
        sched.add_request(Request(rid, 0.0, prompt_len=5, output_len=20))
    for _ in range(3):
        plan = sched.schedule()
        sched.finish_step(plan, StepOutcome())
    epochs = DecodeEpochs(sched)
    assert epochs.open() is True
    sched.add_request(Request(2, 0.0, prompt_len=6, output_len=20))
    plan = epochs.schedule()
    assert epochs.is_open and isinstance(plan, EpochStep)
    assert (plan.num_member_seqs, plan.member_context) == (2, 2 * 7 + 2)  # 7 K/V each, plus the token fed
    assert plan.request_ids() == [2] and not plan.decodes and plan.num_decode_seqs == 2
    return sched, epochs, plan


def test_a_v1_step_the_epoch_takes_is_the_step_stepping_takes():
    """The members' blocks open before the admission's (plan order), and the report applies their tokens."""
    sched, epochs, plan = _v1_epoch_step()
    twin = Scheduler(PagedKVManager(64, 4), SchedulerConfig(mode="v1", max_num_batched_tokens=64, max_num_seqs=8))
    for rid in (0, 1):
        twin.add_request(Request(rid, 0.0, prompt_len=5, output_len=20))
    for _ in range(3):
        twin.finish_step(twin.schedule(), StepOutcome())
    twin.add_request(Request(2, 0.0, prompt_len=6, output_len=20))
    stepped = twin.schedule()
    assert [e.request_id for e in stepped.decodes] == [0, 1] and stepped.prefills == plan.prefills
    assert [sched.kv.block_table(e.seq_id) for e in stepped.decodes] == [e.block_table for e in stepped.decodes]
    assert plan.num_batched_tokens == stepped.num_batched_tokens
    assert plan.num_context_tokens == stepped.num_context_tokens
    epochs.finish_step(plan, StepOutcome())
    twin.finish_step(stepped, StepOutcome())
    epochs.close()
    assert not epochs.is_open
    for seq_id in (0, 1, 2):
        assert sched.num_computed_tokens(seq_id) == twin.num_computed_tokens(seq_id)
        assert sched.kv.block_table(seq_id) == twin.kv.block_table(seq_id)
    assert sched.kv.breakdown() == twin.kv.breakdown()


def test_a_failed_step_the_epoch_took_part_in_aborts_its_members_too():
    """abandon_step after a v1 step whose decodes the epoch took: the members were in the step (their K/V may be half
    written), so they are aborted with the admitted request, and every block returns to the pool."""
    sched, epochs, plan = _v1_epoch_step()
    assert sorted(epochs.abandon_step(plan)) == [0, 1, 2]
    assert not epochs.is_open and sched.kv.num_free_blocks == 64
    sched.kv.check_invariants()


def test_advance_decodes_stops_where_memory_does_and_refuses_what_is_not_a_plain_run():
    sched = _preempted_sampling_group()
    decodes = plain_decodes(sched)
    until_finish = decodes.steps_left
    with pytest.raises(ValueError, match="no sequence finishing before the last step"):
        advance(sched, decodes, until_finish + 1)
    room = kv_runs(sched.kv).max_decode_steps([[s.seq_id for s in decodes.seqs]], until_finish)
    counts, _ = advance(sched, decodes, until_finish)
    assert len(counts) == room  # as many steps as memory allows, no more
    plan = sched.schedule()  # a plan in flight: the next step is not the fast plane's to skip
    assert plain_decodes(sched) is None
    sched.finish_step(plan, StepOutcome())


@pytest.mark.parametrize("mode", sorted(MODES))
def test_figure_probes_see_what_stepping_shows(mode):
    """The figures' probes measure the same with the fast-forward on as off: the sharing measure integrates
    the states after every step of a run from its record, and the snapshot time stops the fast-forward."""
    from sim.drivers.sweep import Task, run_task
    from sim.figures.probes import Sharing, Snapshot

    params = {
        "policy": "paged",
        "workload": "alpaca",
        "rate": 6.0,
        "num_requests": 60,
        "seed": 2,
        "n": 2,
        "kv_slots": 4096,
        **MODES[mode],
    }
    found = [
        run_task(Task.of((Sharing(), Snapshot(at_time=5.1)), jump=jump, **params)).probes for jump in (True, False)
    ]
    jumped, stepped = found
    assert jumped["sharing"] == stepped["sharing"] and jumped["sharing"]["saving"] > 0
    assert jumped["snapshot"].time == stepped["snapshot"].time
    np.testing.assert_array_equal(jumped["snapshot"].kind, stepped["snapshot"].kind)
    np.testing.assert_array_equal(jumped["snapshot"].owner, stepped["snapshot"].owner)


# --- a decode epoch in a paged pool (sim/fast/paged.py's DecodeEpoch) against the run-by-run path ---------------------
@settings(deadline=None)  # an example is a whole epoch of draws: its time says nothing (it passed 200 ms on a busy box)
@given(st.data())
def test_a_paged_decode_epoch_is_the_runs_it_replaces(data):
    """Sequences of random lengths decode in an epoch, leaving (freed) at random steps, some early (preempted), and new
    ones are admitted and join between runs; where memory runs out, a step preempts the latest members while the
    others open their blocks one by one (open_ahead). A twin manager applies the same runs one by one
    (advance_decodes, checked against stepping above) and such a step sequence by sequence (allocate_slots), to the
    same sequences: every run's counts and length limit, the counts after every change (told to the epoch, as the
    fast plane tells it: `leave` before a free, `changed` after a free or an admission), and at the end every block
    table are the same."""
    bs = data.draw(st.sampled_from([1, 2, 4, 16]), "block_size")
    num_blocks = data.draw(st.integers(4, 60), "num_blocks")
    managers = [PagedKVManager(num_blocks, bs) for _ in range(2)]
    lazy, twin = managers
    runs = kv_runs(twin)
    alive: dict[int, int] = {}  # seq id -> the epoch step after which it leaves
    steps, epoch = 0, None
    fresh_ids = itertools.count()

    def admit(count: int) -> list[int]:
        """Up to `count` new sequences in both managers (as an admission would), leaving at random steps."""
        added = []
        for _ in range(count):
            tokens, left, slack = data.draw(st.tuples(st.integers(1, 40), st.integers(0, 30), st.integers(0, 3)))
            seq_id = next(fresh_ids)
            spec = [NewSequence(tokens, tokens + left + 1 + slack, None, 0)]  # holds its last step's tokens
            if not lazy.can_allocate_slots([seq_id], [tokens], spec):
                break
            for kv in managers:
                kv.allocate_slots([seq_id], [tokens], spec)
            if epoch is not None:
                epoch.changed(lazy.seq_state(seq_id), +1)
            alive[seq_id] = steps + left
            added.append(seq_id)
        return added

    def free(seq_id: int, between_steps: bool = True) -> None:
        del alive[seq_id]
        state = epoch.leave(seq_id)  # its count made current, out of the epoch
        lazy.free(seq_id)
        epoch.changed(state, -1)
        twin.free(seq_id)
        if between_steps:  # (inside a step that preempts, blocks opened ahead count as free until it)
            assert epoch.counts == twin.breakdown().counts()

    admit(data.draw(st.integers(1, 6), "first"))
    if not alive:
        return
    epoch = DecodeEpoch(lazy.allocator, bs, lazy.breakdown().counts())
    for key, (seq_id, last) in enumerate(alive.items()):
        assert epoch.join(seq_id, lazy.seq_state(seq_id), last, key)
    key = len(alive)
    assert epoch.counts == twin.breakdown().counts()
    while alive:
        assert all(lazy.block_table(i) == twin.block_table(i) for i in alive)  # tables exact, counts held
        limit = data.draw(st.integers(1, min(alive.values()) - steps + 1), "steps asked")
        k = epoch.max_steps(limit)
        assert k == runs.max_decode_steps([[i] for i in alive], limit)
        if k < 1:  # memory runs out: one step that preempts the latest (sim.fast.epoch.DecodeEpochs.preempt)
            opening = epoch.opening()
            for i in sorted(alive):  # plan order: the keys grow with the ids
                while i in alive and not (i not in opening or epoch.open_ahead(1)):
                    free(max(alive), between_steps=False)
                if i in alive:  # stepping's call for this sequence, in the twin
                    assert twin.allocate_slots([i], [1]) is not None
            if not alive:
                break
            k = 1
            assert epoch.advance(1) == [twin.breakdown().counts()]
        else:
            assert epoch.advance(k) == runs.advance_decodes([[i] for i in alive], k)
        steps += k
        for i in data.draw(st.lists(st.sampled_from(sorted(alive)), max_size=2, unique=True), "preempted"):
            if alive[i] >= steps:  # leaves early (preempted at a step boundary): its final block may be unopened
                free(i)
        for i in [i for i, last in alive.items() if last == steps - 1]:
            free(i)
        joining = admit(data.draw(st.integers(0, 2), "joining"))
        assert epoch.counts == twin.breakdown().counts()
        for i in joining:
            assert epoch.join(i, lazy.seq_state(i), alive[i], key)
            key += 1
    epoch.close()
    for i in alive:
        assert lazy.block_table(i) == twin.block_table(i) and lazy.num_tokens(i) == twin.num_tokens(i)
    assert lazy.breakdown() == twin.breakdown() and lazy.num_free_blocks == twin.num_free_blocks
    lazy.check_invariants()
