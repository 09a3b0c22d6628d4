"""The fast plane: the simulator's speed machinery, beside the plain core and proven equal to it.

The plain core (sim/scheduling/scheduler.py, sim/kv/, sim/clock/loop.py) steps one step at a time. Between events a busy server
mostly repeats one step (every running sequence feeds its last token and samples the next), and this package
applies whole runs of such steps at once, with exactly the results of stepping, bit for bit:

    runs.py    is the next step a plain decode of the running sequences? apply a run of them (run by run)
    paged.py   the paged pool's closed forms: how long a run can last, which blocks it opens, and the lazy form
               (DecodeEpoch) whose cost does not grow with the number of sequences
    epoch.py   decode epochs: the running sequences kept in the lazy form across runs and arrivals
    loop.py    FastSimulator: sim.clock.loop.Simulator with runs applied at once (sim.run's default; jump=False: the plain
               loop alone)

It reaches the core only through the public calls docs/ARCHITECTURE.md lists under "The fast plane", and imports
no private name of it (tests/sim/test_core_report.py checks). tests/sim/test_fastforward.py proves the planes equal.
"""
from .loop import FastSimulator

__all__ = ["FastSimulator"]
