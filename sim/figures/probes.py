"""Probes: what a figure measures on a run beyond its summary, computed where the run happens.

A probe is a frozen (hashable, picklable) description; `start()` makes a fresh recorder for one run, whose
`on_step(simulator, step)` watches the run (`sim.run(on_step=...)`, called after every step, or after a
fast-forwarded run of steps with its `DecodeRun`), whose `stop_at` names times the fast-forward must not jump
across, and whose `finish(result)` returns something small to send back to the parent process (sim.drivers.sweep).
Every probe measures exactly what it would with the fast-forward off.

    Timeline   the per-step memory counts, time-binned (Fig. 2-style breakdown over time)
    Sharing    blocks in use vs blocks the sequences would hold without sharing (paper Fig. 15)
    Snapshot   the KV pool slot by slot at the first step ending at or after a chosen time (the memory map)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..fast.runs import DecodeRun
from ..kv.base import SHARE_NAMES
from .memory_map import SlotMap, seq_owners, slot_map


@dataclass(frozen=True, slots=True)
class Timeline:
    """Time-weighted means of the step table's slot counts (and running/waiting requests) in `num_bins` bins."""

    num_bins: int = 240
    name: str = "timeline"

    def start(self) -> "_TimelineRecorder":
        return _TimelineRecorder(self.num_bins)


class _TimelineRecorder:
    on_step = None  # reads the finished run's step table only
    stop_at = ()

    def __init__(self, num_bins: int) -> None:
        self.num_bins = num_bins

    def finish(self, result) -> dict:
        """Each step's counts weigh its duration, booked in the bin where the step starts. Modelling
        approximation of the drawing only: a step (tens of ms) never straddles bins (seconds) here.
        Bins the engine spent idle (no step started) are NaN: the pool then held what the last step left."""
        steps = result.steps
        start, duration = steps["time"], steps["duration"]
        end = float((start + duration).max()) if len(steps) else 1.0
        edges = np.linspace(0.0, end, self.num_bins + 1)
        where = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, self.num_bins - 1)
        covered = np.bincount(where, weights=duration, minlength=self.num_bins)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = {name: np.bincount(where, weights=steps[name] * duration, minlength=self.num_bins) / covered
                     for name in (*SHARE_NAMES, "num_running", "num_waiting")}
        return {"time": (edges[:-1] + edges[1:]) / 2, **means}


@dataclass(frozen=True, slots=True)
class Sharing:
    """Paper Fig. 15's measure: saving = 1 - (blocks in use) / (blocks without sharing), time-weighted.

    Without sharing, every running sequence would hold its own copy of every block its block table points
    at: sum over running sequences of len(block_table) = ceil(num_tokens / block_size). With sharing, the
    pool holds the distinct blocks: the blocks in use (prefix caching off, so no other owner). The pool as each
    step leaves it weighs the simulated time since the previous step ended; inside a fast-forwarded run the
    states after its steps come from the run's record (tokens grow by one per step, nothing is freed before
    its last step), so the measure is what stepping would give."""

    name: str = "sharing"

    def start(self) -> "_SharingRecorder":
        return _SharingRecorder()


class _SharingRecorder:
    stop_at = ()

    def __init__(self) -> None:
        self.last = None
        self.shared = self.unshared = 0.0

    def _observe(self, now: float, held: int, used: int) -> None:
        weight, self.last = (0.0 if self.last is None else now - self.last), now
        self.unshared += weight * held
        self.shared += weight * used

    def on_step(self, simulator, step) -> None:
        sched, kv = simulator.scheduler, simulator.kv
        bs = kv.block_size
        if isinstance(step, DecodeRun):  # the states after each step of the run but its last
            for j in range(step.num_steps - 1):
                held = sum(-(-(n + j + 1) // bs) for n in step.num_tokens_before)
                self._observe(step.starts[j] + step.durations[j], held, kv.num_blocks - step.counts[j][4] // bs)
        live = set(kv.seq_ids)
        held = sum(-(-kv.num_tokens(s) // bs) for r in sched.running_request_ids() for s in sched.seq_ids(r)
                   if s in live)
        self._observe(simulator.now, held, kv.num_blocks - kv.num_free_blocks)

    def finish(self, result) -> dict:
        saving = 1.0 - self.shared / self.unshared if self.unshared > 0 else 0.0
        return {"saving": saving, "block_seconds_shared": self.shared, "block_seconds_unshared": self.unshared}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The pool as a `SlotMap` (owner and kind of every slot) when the first step ends at or after `at_time`."""

    at_time: float
    name: str = "snapshot"

    def start(self) -> "_SnapshotRecorder":
        return _SnapshotRecorder(self.at_time)


class _SnapshotRecorder:
    def __init__(self, at_time: float) -> None:
        self.at_time = at_time
        self.stop_at = (at_time,)  # no fast-forward across it: the step that contains it ends a run
        self.map: SlotMap | None = None

    def on_step(self, simulator, plan) -> None:
        if self.map is None and simulator.now >= self.at_time:
            sched, kv = simulator.scheduler, simulator.kv
            self.map = slot_map(kv, owners=seq_owners(sched), waiting=head_blocked(sched),
                                time=simulator.now, num_waiting=sched.num_waiting + sched.num_swapped)

    def finish(self, result) -> SlotMap | None:
        return self.map


def head_blocked(scheduler) -> bool:
    """Is a request kept waiting for memory? The breakdown then counts free slots as external waste.

    NOTE: the loop decides this after scheduling (anything still waiting was refused); an observer runs after
    a step ends, when requests that arrived during the step wait only for the next schedule(). So ask the
    scheduler whether the first waiting request would be admitted now (a swapped-out group always counts as
    kept out)."""
    if not scheduler.num_waiting:
        return scheduler.num_swapped > 0
    return not scheduler.can_admit_head()
