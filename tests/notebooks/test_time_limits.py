"""The grader's time limits follow the machine (sim/exercises/limits.py): a check fails for looping, never for
running on a slow or busy computer.

The rules are tested on the watch's own clock (times given, nothing slept), then end to end: a submission that
loops inside one call is told "an endless loop?", one that is slow but keeps answering is told the machine is slow,
and one whose calls are slow but finish in time passes.
"""

from __future__ import annotations

import time

import pytest

from sim.exercises.limits import SLOW_CAP, STALL_S, Watch, beat, machine_slowness, time_limit
from sim.exercises.referee import NO_RULES, refereed
from sim.exercises.report import CheckReport, CheckResult, Story, run_example


def test_limits_scale_with_the_measured_slowness():
    fast, slow = Watch(60, 1.0), Watch(60, 3.0)
    assert (fast.budget, fast.stall) == (60, STALL_S)
    assert (slow.budget, slow.stall) == (180, 3 * STALL_S)
    assert Watch(2, 2.5).stall == 5  # a limit below STALL_S is also the longest wait for progress


def test_no_progress_for_the_stall_limit_is_an_endless_loop():
    watch = Watch(60, 2.0, started=100.0, last_beat=100.0)
    assert watch.verdict(100.0 + watch.stall - 0.1) is None
    said = watch.verdict(100.0 + watch.stall)
    assert said is not None and "(an endless loop?)" in said and "made no progress for 60 s" in said


def test_a_check_that_keeps_progressing_gets_more_than_its_budget_then_is_called_slow():
    watch = Watch(10, 1.5, started=0.0)
    for now in (watch.budget, 2 * watch.budget, SLOW_CAP * watch.budget - 0.1):
        watch.last_beat = now - 1.0  # progress a second ago
        assert watch.verdict(now) is None, now
    watch.beats = 1234
    said = watch.verdict(SLOW_CAP * watch.budget)
    assert said is not None and "endless loop" not in said
    assert "still making progress after 60 s (1,234 steps)" in said and "this machine is slow" in said
    assert "1.5x the reference machine" in said and "--check-timeout 0" in said


def test_the_slowness_is_measured_once_and_never_below_one():
    assert machine_slowness() >= 1.0
    assert machine_slowness() is machine_slowness()


def test_beats_reach_only_the_check_in_progress():
    beat()  # outside any check: nothing to tell, nothing raised
    with time_limit(60):
        beat()
    with time_limit(None):
        beat()


class Worker:
    """A student's class whose one method takes `seconds` a call (a slow machine, or a slow but correct method)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def work(self) -> int:
        time.sleep(self.seconds)
        return 1


def _run(calls: int, seconds: float, timeout: float) -> CheckResult:
    """One check through the grader's own path (run_example, the referee): `calls` calls of `seconds` each."""

    def example(make, story: Story) -> None:
        worker = make(seconds)
        for _ in range(calls):
            worker.work()

    example.__doc__ = "a check"
    report = CheckReport("lab", "Worker")
    run_example("a check", example, refereed(Worker, NO_RULES), report, timeout=timeout)
    return report.results[0]


@pytest.mark.slow
def test_a_check_past_its_budget_that_keeps_progressing_passes():
    # 0.5 s of calls of 10 ms each against a budget of 0.2 s (scaled): past the budget, inside 4x of it
    slowness = machine_slowness()
    result = _run(calls=50, seconds=0.01, timeout=0.5 / 2.5 / slowness)
    assert result.passed, result.detail


@pytest.mark.slow
def test_a_check_far_past_its_budget_is_told_the_machine_is_slow():
    slowness = machine_slowness()
    result = _run(calls=1000, seconds=0.01, timeout=0.1 / slowness)  # 10 s of steady progress, a budget of 0.1 s
    assert not result.passed
    assert "still making progress" in result.detail and "endless loop" not in result.detail, result.detail


def test_one_call_that_never_returns_is_an_endless_loop():
    result = _run(calls=1, seconds=1e9, timeout=0.2)
    assert not result.passed
    assert "made no progress" in result.detail and "(an endless loop?)" in result.detail, result.detail
    assert "during the call work()" in result.detail
