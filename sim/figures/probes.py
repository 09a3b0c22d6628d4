"""Probes: what a figure measures on a run beyond its summary, computed where the run happens.

A probe is a frozen (hashable, picklable) description; `start()` makes a fresh recorder for one run, whose
`on_step(simulator, plan)` watches the run (`sim.run(on_step=...)`, called after every step or decode run)
and whose `finish(result)` returns something small to send back to the parent process (sim.sweep).

    Timeline   the per-step memory counts, time-binned (Fig. 2-style breakdown over time)
    Sharing    blocks in use vs blocks the sequences would hold without sharing (paper Fig. 15)
    Snapshot   the KV pool slot by slot at the first step ending at or after a chosen time (the memory map)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
                     for name in (*SHARE_NAMES, "num_running", "num_waiting")}  # fmt: skip
        return {"time": (edges[:-1] + edges[1:]) / 2, **means}


@dataclass(frozen=True, slots=True)
class Sharing:
    """Paper Fig. 15's measure: saving = 1 - (blocks in use) / (blocks without sharing), time-weighted.

    Without sharing, every running sequence would hold its own copy of every block its block table points
    at: sum over running sequences of len(block_table) = ceil(num_tokens / block_size). With sharing, the
    pool holds the distinct blocks: the allocator's used blocks (prefix caching off, so no other owner).
    Each observation weighs the simulated time since the previous one. Modelling approximation: after a
    jumped decode run the observer sees the run's end state, which then stands for the whole run."""

    name: str = "sharing"

    def start(self) -> "_SharingRecorder":
        return _SharingRecorder()


class _SharingRecorder:
    def __init__(self) -> None:
        self.last = None
        self.shared = self.unshared = 0.0

    def on_step(self, simulator, plan) -> None:
        now = simulator.now
        weight, self.last = (0.0 if self.last is None else now - self.last), now
        sched, kv = simulator.scheduler, simulator.kv
        bs = kv.block_size
        held = sum(-(-kv.num_tokens(s) // bs) for r in sched.running_request_ids() for s in sched.seq_ids(r))
        self.unshared += weight * held
        self.shared += weight * kv.allocator.num_used_blocks

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
        self.map: SlotMap | None = None

    def on_step(self, simulator, plan) -> None:
        if self.map is None and simulator.now >= self.at_time:
            sched, kv = simulator.scheduler, simulator.kv
            self.map = slot_map(kv, owners=seq_owners(sched), waiting=head_blocked(sched),
                                time=simulator.now, num_waiting=sched.num_waiting + sched.num_swapped)  # fmt: skip

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
