"""No sim module imports one in a higher layer (tools/layers.py holds the order), and sim.run's setup reads in one
direction: settings, workload, pool, loop, never back to a module it had left.

Every import counts, at the top of a file or inside a function (an import inside a function hides a climb, it does
not remove it), and so does the package __init__ an import runs on its way (importing sim.fast.runs runs
sim/fast/__init__.py). No exception is listed: there is none.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from sim import compiled

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("layers", ROOT / "tools" / "layers.py")
layers = importlib.util.module_from_spec(_spec)
sys.modules["layers"] = layers
_spec.loader.exec_module(layers)


def test_every_sim_module_has_a_row():
    assert {name: layers.layer_of(name) for name in layers.modules()}  # layer_of raises for a module in no row


def test_no_module_imports_a_higher_layer():
    assert layers.climbs() == []


def test_the_check_sees_an_import_inside_a_function_and_the_packages_on_the_way(tmp_path):
    """The check can fail: a KV manager that imports the entry point inside a function, and the fast plane's package
    from below, are climbs."""
    path = tmp_path / "fake.py"
    path.write_text(
        "from .base import KVManager\n\n\ndef f():\n    from ..api import run\n    from ..fast.runs import x\n"
    )
    found = layers.imported("sim.kv.fake", path, layers.modules())
    assert found == [(1, "sim.kv.base"), (5, "sim.api"), (6, "sim.fast"), (6, "sim.fast.runs")]
    climbs = [name for _, name in found if layers.layer_of(name) > layers.layer_of("sim.kv.fake")]
    assert climbs == ["sim.api", "sim.fast", "sim.fast.runs"]


@pytest.mark.skipif(
    compiled.active(), reason="traces Python calls: a compiled build (LAB_FAST) runs none in its modules"
)
def test_sim_run_sets_up_in_one_direction():
    """From run() to its event loop: run calls settings, workload, pool, then the loop's modules, and never goes
    back to one it had left; no call anywhere in the setup climbs to a higher layer."""
    found = layers.trace_setup(**layers.SETUP_RUN)
    assert found["run_path"][:4] == ["sim.arguments", "sim.config", "sim.workloads.workload_source", "sim.kv.pool"]
    assert found["run_path_returns"] == 0, found["run_path"]
    assert found["climbs"] == 0, found["climbs_seen"]
    assert {"sim.api", "sim.workloads.workload", "sim.workloads.conversation", "sim.scheduling.scheduler"} <= set(
        found["modules"]
    )
