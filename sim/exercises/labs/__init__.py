"""The labs after the four allocator exercises that need only `sim`: scheduling, accounting, prefix caches, beams.

Each lab is one module here defining `EXERCISE` (a `registry.Exercise`): what the student writes (a class whose
methods raise NotImplementedError in the notebook's skeleton), the narrated examples, and the property checks
(each a `MachineCheck` whose builder returns a unittest.TestCase class, a hypothesis test or state machine).
Its notebook is notebooks/exercises/{EXERCISE.notebook}.ipynb, its solution notebooks/solutions/{EXERCISE.solution}.py
and its planted bugs tests/notebooks/planted/{name}.py. The module name is the exercise's name
(`check("victim_policy", MyVictimPolicy)`); every module here is a lab, in the order of their notebooks' numbers,
except those whose names start with "_": a lab's property checks (`_{name}_checks.py` or `_{name}_machines.py`,
imported only when a check runs, as they need hypothesis) and the oracle its examples and checks share, if it has
one (`_{name}_oracle.py`). A lab imports them; they never import the lab.
The labs whose checks run tensors (attention through a block table, chunked prefill, the Triton kernel) live in
reference/exercises/labs/, which `reference.exercises` adds to these with the same `load_labs`: sim never imports
torch or reference.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any


def load_labs(package: str = __name__, path: Any = None) -> dict[str, Any]:
    """{lab name: its Exercise}, every module of `package` (this one by default; `path` its __path__), ordered by
    notebook (course order)."""
    names = [m.name for m in pkgutil.iter_modules(__path__ if path is None else path) if not m.name.startswith("_")]
    labs = {name: importlib.import_module(f"{package}.{name}").EXERCISE for name in names}
    return dict(sorted(labs.items(), key=lambda item: item[1].notebook))
