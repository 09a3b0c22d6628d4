"""The layers of `sim`, bottom to top, and what crosses them: imports that climb, and where a run's setup goes.

    .venv/bin/python tools/layers.py            # every import of a sim module that names a higher layer (none: exit 0)
    .venv/bin/python tools/layers.py --trace    # follow one small `sim.run` from its call to its event loop

A module may import from its own row or a row below, never from a row above (docs/ARCHITECTURE.md, "The layers";
tests/sim/test_layers.py holds every module to it). `LAYERS` below is the one place the order is written.

Why the settings sit where they do: a setting's allowed values are owned by the layer that implements them (the KV
registry's `POLICIES`, the workloads' `DATASETS` and `ARRIVALS`, the slot allocators, the victim policies), and
`sim.config` reads them from there, so the settings sit above those layers; the scheduler takes its
`SchedulerConfig` from `sim.config`, so the settings sit below it.

`--trace` runs `sim.run` on a small synthetic workload under `sys.setprofile` and follows the calls from `run` until
the event loop starts (`Simulator.run`), counting, over the calls from one sim module into another:

- modules visited: the distinct sim modules whose functions ran;
- calls between modules: the distinct call sites (caller function, called function) whose two functions lie in two
  sim modules, each counted once however often it runs (a loop over the requests is one);
- climbs: those calls into a module of a higher layer (a callback handed down and called back counts too);
- returns to a module already left: those calls, when first made, into a module that ran before and is no longer
  on the call stack (the setup bouncing back to a place it had finished with);
- run's own path: the other modules `run` itself calls into (its helpers in sim.api are part of it), in order, a
  module called twice in a row written once, and
  how often that path goes back to a module it had left (the measure of "reads in one direction": helpers such as
  sim.base.limits.is_int, called from everywhere, make the counts above bounce whatever the shape of `run`).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from core_report import resolve  # noqa: E402  (relative imports made absolute, as the core counter does)

ROOT = Path(__file__).resolve().parents[1]

# Bottom first. A name covers the module and, for a package, everything under it that no longer name covers (the
# folders of sim/ are these rows: sim.kv holds the physical row too, sim.scheduling the decisions row too).
LAYERS = (
    ("base", "limits, specs and records any row may use", ("sim.base",)),
    (
        "data",
        "requests: generated, read from a trace, imported from ShareGPT; a run's workload step",
        ("sim.workloads",),
    ),
    ("physical", "block ids and slot runs, integers only", ("sim.kv.blocks", "sim.kv.slots")),
    ("memory", "the KV contract, its managers and their registry; a run's pool step", ("sim.kv",)),
    ("step records", "what the scheduler keeps and hands out", ("sim.scheduling",)),
    (
        "settings",
        "every setting and its default, each field checked once; the combinations",
        ("sim.config", "sim.arguments"),
    ),
    ("decisions", "the scheduler", ("sim.scheduling.scheduler",)),
    ("clock", "the event loop, its cost models, the tables", ("sim.clock",)),
    ("fast plane", "runs of decode steps at once, beside the plain loop", ("sim.fast",)),
    ("entry points", "sim.run and run_cluster", ("sim.api", "sim.disagg")),
    (
        "drivers and views",
        "command lines, figures, sweeps, benchmarks, viewers, exercises, test machines",
        (
            "sim",
            "sim.__main__",
            "sim.compiled",
            "sim.drivers",
            "sim.views",
            "sim.figures",
            "sim.exercises",
            "sim.testing",
        ),
    ),
)


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of sim/."""
    found = {}
    for path in sorted((ROOT / "sim").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def layer_of(module: str) -> int:
    """The row of `module` in LAYERS (0 is the bottom): the row naming it or, else, its nearest package."""
    rows = {name: i for i, (_, _, names) in enumerate(LAYERS) for name in names}
    parts = module.split(".")
    for cut in range(len(parts), 0, -1):
        if ".".join(parts[:cut]) in rows:
            return rows[".".join(parts[:cut])]
    raise KeyError(f"{module} is in no row of tools/layers.py's LAYERS (add it to the row it belongs to)")


def imported(module: str, path: Path, mods: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, module) of every sim module that `module` imports, at the top or inside a function. Importing
    a.b.c also runs the packages a.b's __init__: those count too (but not `sim`'s own, the top row)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve(module, path.name == "__init__.py", node)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            if parts[0] != "sim":
                continue
            for cut in range(2, len(parts) + 1):  # the packages on the way, then the module
                name = ".".join(parts[:cut])
                if name in mods and name != module and not module.startswith(name + "."):
                    found.append((node.lineno, name))
    return sorted(set(found))


def climbs() -> list[str]:
    """'module:line imports target (row -> higher row)' for every import that names a higher layer."""
    mods = modules()
    out = []
    for module, path in mods.items():
        for line, target in imported(module, path, mods):
            if layer_of(target) > layer_of(module):
                out.append(
                    f"{module}:{line} imports {target} ({LAYERS[layer_of(module)][0]} -> {LAYERS[layer_of(target)][0]})"
                )
    return out


def trace_setup(**settings) -> dict:
    """Follow `sim.run(**settings)` from its call until the event loop starts (module docstring): the modules in the
    order first entered, and the counts."""
    import sim
    from sim.clock.loop import Simulator
    from sim.fast.loop import FastSimulator

    mods = modules()
    path_to_module = {str(p): m for m, p in mods.items()}
    stack: list[str | None] = []  # the sim module of each frame on the stack (None: outside sim)
    visited: list[str] = []
    counts = {"calls_between_modules": 0, "climbs": 0, "returns_to_a_module_left": 0}
    climbs_seen: list[str] = []
    seen: set[tuple] = set()  # (caller's code, called code): each call site once
    codes: list = []  # the code object of each frame on the stack
    loops = {Simulator.run.__code__, FastSimulator.run.__code__}
    path: list[str] = []  # run's own calls, by module, repeats in a row merged
    state = {"on": False, "done": False}

    def profile(frame, event, _arg):
        if state["done"] or event not in ("call", "return"):
            return
        code = frame.f_code
        if event == "call" and code in loops:
            state["done"] = True
            return
        module = path_to_module.get(code.co_filename)
        if event == "call" and not state["on"]:
            if code is not sim.api.run.__code__:
                return
            state["on"] = True
        if not state["on"]:
            return
        if event == "return":
            if stack:
                stack.pop()
                codes.pop()
            return
        caller, caller_code = next(
            ((m, c) for m, c in zip(reversed(stack), reversed(codes)) if m is not None), (None, None)
        )
        if caller_code is sim.api.run.__code__ and module not in (None, "sim.api") and (not path or path[-1] != module):
            path.append(module)
        first = (caller_code, code) not in seen
        seen.add((caller_code, code))
        if first and module is not None and caller is not None and module != caller:
            counts["calls_between_modules"] += 1
            if layer_of(module) > layer_of(caller):
                counts["climbs"] += 1
                climbs_seen.append(f"{caller} -> {module} ({code.co_name})")
            if module in visited and module not in stack:
                counts["returns_to_a_module_left"] += 1
        if module is not None and module not in visited:
            visited.append(module)
        stack.append(module)
        codes.append(code)

    sys.setprofile(profile)
    try:
        sim.run(**settings)
    finally:
        sys.setprofile(None)
    path_returns = sum(1 for i, m in enumerate(path) if m in path[:i])
    return {
        "modules_visited": len(visited),
        **counts,
        "modules": visited,
        "climbs_seen": climbs_seen,
        "run_path": path,
        "run_path_returns": path_returns,
    }


SETUP_RUN = {"policy": "paged", "workload": "conversation", "num_requests": 20, "rate": 1.0, "model": "opt-13b"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", action="store_true", help="follow one sim.run's setup (module docstring)")
    args = parser.parse_args(argv)
    if args.trace:
        found = trace_setup(**SETUP_RUN)
        print(f"sim.run({', '.join(f'{k}={v!r}' for k, v in SETUP_RUN.items())}), from run() to Simulator.run:")
        print(f"  modules visited: {found['modules_visited']}")
        print(f"  calls from one sim module into another: {found['calls_between_modules']}")
        print(f"  climbs to a higher layer: {found['climbs']}")
        print(f"  returns to a module already left: {found['returns_to_a_module_left']}")
        print("  in the order first entered: " + ", ".join(found["modules"]))
        print(
            f"  run's own path ({len(found['run_path'])} steps, {found['run_path_returns']} back to a module it had "
            f"left): " + " -> ".join(found["run_path"])
        )
        for line in found["climbs_seen"]:
            print(f"  climb: {line}")
        return 0
    found = climbs()
    for line in found:
        print(line)
    print(f"{len(found)} import(s) of a higher layer")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
