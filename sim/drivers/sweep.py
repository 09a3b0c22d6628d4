"""Parameter sweeps: run `sim.run` at every point of a grid, in parallel, and collect one row per point.

The paper's evaluation (vLLM, Kwon et al., SOSP 2023, section 6) is a set of sweeps: latency against
request rate per system (Fig. 12), block size (Fig. 18), preemption mode (Fig. 19). Every point is an
independent simulation, so points run in separate processes: `multiprocessing.Pool` on
this machine (`backend="local"`), or tasks on a Ray cluster (`backend="ray"`, the optional `ray` extra).
Results come back in the order of the points whatever order they finish in, so a sweep is deterministic.

    python -m sim sweep --grid 'policy=max,pow2,oracle,paged' --grid 'rate=1,2,3' --set duration=600 --out r.csv

A point may carry *probes*: small recorders that watch a run through `sim.run(on_step=...)` or read its
per-step table, and return a compact result (the figures use them: `sim.figures.probes`). A probe is a
frozen dataclass with a `name` and `start()`, which returns a recorder with `on_step(simulator, plan)` (or
`on_step = None`) and `finish(result) -> value`; probes travel to the worker process by pickling.
"""
from __future__ import annotations

import csv
import itertools
import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from ..api import run
from ..arguments import check_arguments
from ..base.limits import MAX_JOBS
from ..base.outfiles import atomic_write, check_outputs
from ..config import RUN_FIELDS, choices

BACKENDS = ("local", "ray")
RAY_MISSING = "--backend ray needs the 'ray' extra: pip install 'paged-attention-lab[ray]'"
# run() keywords a sweep cannot set from text: objects, callbacks, and the terminal progress bar.
NOT_SWEEPABLE = ("requests", "on_step", "cost_model", "progress", "stop_at",  # stop_at: the probes set it
                 "block_allocator")
_TRUE, _FALSE = ("true", "on", "yes", "1"), ("false", "off", "no", "0")


class SweepError(ValueError):
    """Bad sweep input (a grid name or value, a backend): the CLI prints it as one `error:` line, exit 2."""


def sweepable_params() -> dict[str, str]:
    """run() keyword -> its annotation text in sim.config.RunConfig (`from __future__ import annotations` keeps
    annotations as text)."""
    return {name: str(f.type) for name, f in RUN_FIELDS.items() if name not in NOT_SWEEPABLE}


def parse_value(name: str, text: str):
    """One value of run() keyword `name`, typed from run()'s annotation: 'none' -> None where allowed,
    booleans as true/false/on/off, 'LO:HI' for a (low, high) range, and choices checked up front."""
    params = sweepable_params()
    if name not in params:
        raise SweepError(f"unknown sweep parameter {name!r} (allowed: {', '.join(params)})")
    kind, text = params[name], text.strip()
    if "None" in kind and text.lower() == "none":
        return None
    try:
        if kind.startswith("bool"):
            if text.lower() not in _TRUE + _FALSE:
                raise ValueError
            return text.lower() in _TRUE
        if kind.startswith("tuple"):
            low, high = (int(x) for x in text.split(":"))
            return low, high
        if kind.startswith("int"):
            return int(text)
        if kind.startswith("float"):
            return float(text)
    except ValueError:
        raise SweepError(f"{name}: cannot read {text!r} as {kind} (e.g. {_example(kind)})") from None
    if RUN_FIELDS[name].metadata["kind"] == "choice" and text not in choices(name):
        raise SweepError(f"{name}: got {text!r} (allowed: {', '.join(choices(name))})")
    return text


def _example(kind: str) -> str:
    for prefix, example in (("bool", "true, off"), ("tuple", "16:512"), ("int", "16"), ("float", "2.5")):
        if kind.startswith(prefix):
            return example
    return "a word"


def parse_assignment(spec: str) -> tuple[str, list]:
    """'name=v1,v2,...' -> (name, [typed values])."""
    name, sep, values = spec.partition("=")
    if not sep or not name.strip() or not values.strip():
        raise SweepError(f"expected NAME=VALUE[,VALUE...], got {spec!r}")
    name = name.strip().replace("-", "_")
    return name, [parse_value(name, v) for v in values.split(",")]


def grid_points(grid: dict[str, list], fixed: dict | None = None) -> list[dict]:
    """Every combination of the grid's values (the first name varies slowest), each merged over `fixed`."""
    names = list(grid)
    return [{**(fixed or {}), **dict(zip(names, combo))} for combo in itertools.product(*grid.values())]


@dataclass(frozen=True, slots=True)
class Task:
    """One simulation: run() keywords, and the probes that watch it."""

    kwargs: tuple[tuple[str, object], ...]  # sorted (name, value) pairs: hashable, so equal tasks merge
    probes: tuple = ()
    # None: sim.run(**kwargs); else another module-level simulation taking the keywords and returning a result with a
    # `summary` (sim.disagg.run_cluster: a cluster of instances); probes watch sim.run only
    runner: Callable | None = None

    @classmethod
    def of(cls, probes: tuple = (), runner: Callable | None = None, **kwargs) -> "Task":
        if runner is not None and probes:
            raise SweepError("a task with a runner has no probes (they watch sim.run)")
        return cls(tuple(sorted(kwargs.items())), tuple(probes), runner)

    @property
    def params(self) -> dict:
        return dict(self.kwargs)


@dataclass(slots=True)
class PointResult:
    summary: dict  # the `python -m sim run --json` object
    probes: dict = field(default_factory=dict)  # probe name -> what its recorder's finish() returned
    cpu_s: float = 0.0  # CPU seconds the run took in its worker (for budgeting sweeps; never in results)


def run_task(task: Task) -> PointResult:
    """Run one task (in whatever process it lands): sim.run with the probes' recorders attached."""
    cpu = time.process_time()
    if task.runner is not None:
        return PointResult(task.runner(**task.params).summary, {}, time.process_time() - cpu)
    recorders = {probe.name: probe.start() for probe in task.probes}
    watchers = [r.on_step for r in recorders.values() if r.on_step is not None]

    def on_step(simulator, plan) -> None:
        for watch in watchers:
            watch(simulator, plan)

    stop_at = sorted(t for r in recorders.values() for t in r.stop_at)
    result = run(**task.params, on_step=on_step if watchers else None, stop_at=stop_at)
    probes = {name: r.finish(result) for name, r in recorders.items()}
    return PointResult(result.summary, probes, time.process_time() - cpu)


def _ignore_interrupts() -> None:
    """A worker ignores Ctrl-C (the terminal sends it to the whole process group): the parent decides, and
    terminates every worker at once, with SIGTERM, whose default action a worker restores (the command line's
    handler, inherited through fork, would print a traceback from each). A parent killed outright (SIGKILL, the
    out-of-memory killer) runs no cleanup: on Linux the kernel then sends each worker SIGTERM (die_with_parent)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(os.getppid())


def die_with_parent(parent: int) -> None:
    """Ask Linux to send this process SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG); elsewhere nothing.
    `parent`: the parent's pid, read before the call: had it died already, this process exits now."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # no prctl (an unusual libc): the workers then stop at their next task
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(143)


def cost_hint(params: dict) -> float:
    """A rough relative cost of a run (simulated sequences), to start the longest runs first.
    Modelling approximation for scheduling only: it never changes a result, only the order work starts in."""
    rate = params.get("rate") or 2.0
    count = params.get("num_requests") or rate * (params.get("duration") or 3600.0)
    seqs = max(params.get("n", 1), params.get("beam_width", 1))
    beam = 3.0 if params.get("beam_width", 1) > 1 else 1.0  # beam search forks and frees every step
    return count * seqs * beam * (2.0 if params.get("block_size", 16) < 4 else 1.0)


def default_jobs() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def run_tasks(tasks: list[Task], *, jobs: int | None = None, backend: str = "local", progress: bool = True,
              desc: str = "simulations", on_result=None) -> list[PointResult]:
    """Run every task; results in the order of `tasks`. `jobs`: worker processes (default: the usable cores;
    1 runs in this process). `on_result(index, result)` is called as each one finishes (any order)."""
    if backend not in BACKENDS:
        raise SweepError(f"backend: got {backend!r} (allowed: {', '.join(BACKENDS)})")
    jobs = default_jobs() if jobs is None else jobs
    if not 1 <= jobs <= MAX_JOBS:
        raise SweepError(f"jobs: got {jobs} (allowed: an integer from 1 to {MAX_JOBS:,})")
    results: list[PointResult | None] = [None] * len(tasks)
    bar = tqdm(total=len(tasks), desc=desc, unit="run", disable=not progress, file=sys.stderr)

    def done(index: int, result: PointResult) -> None:
        results[index] = result
        bar.update()
        if on_result is not None:
            on_result(index, result)

    # NOTE: the costliest runs start first, so the last worker to finish is not left with the biggest run.
    order = sorted(range(len(tasks)), key=lambda i: -cost_hint(tasks[i].params))
    if backend == "ray":
        _run_ray(tasks, order, done)
    elif jobs == 1 or len(tasks) <= 1:
        for i in order:
            done(i, run_task(tasks[i]))
    else:
        try:
            _run_in_workers(tasks, order, min(jobs, len(tasks)), done)
        except BaseException:
            bar.close()
            raise
    bar.close()
    return results


class WorkerDied(ChildProcessError):
    """A worker process ended while it ran a point (killed: the out-of-memory killer, `kill -9`). An OSError, so the
    command line says it in one `error:` line."""


def _run_in_workers(tasks: list[Task], order: list[int], num_workers: int, done) -> None:
    """Run tasks[i] for i in `order` on `num_workers` processes, calling done(i, result) as each finishes.

    NOTE: why not multiprocessing.Pool: its workers share one task queue behind a lock. A worker killed while it
    holds that lock (SIGTERM to the process group while it waits for a task) leaves Pool.terminate() waiting for
    the lock forever, and a worker killed mid-run loses its task without a word, so the parent waits forever too.
    Here each worker has a pipe of its own, the parent waits on the pipes and on the processes themselves (their
    sentinels), and on any exit it kills what is left: a bad point, Ctrl-C, SIGTERM, a worker that died."""
    from collections import deque
    from multiprocessing.connection import wait

    context = multiprocessing.get_context()
    workers: list[tuple[multiprocessing.Process, object]] = []
    try:
        for _ in range(num_workers):
            parent_end, child_end = context.Pipe()
            process = context.Process(target=_worker, args=(child_end,), daemon=True)
            process.start()
            child_end.close()
            workers.append((process, parent_end))
        todo, running = deque(order), {}  # running: pipe -> (its process, the index it runs)
        for process, pipe in workers:
            if todo:
                index = todo.popleft()
                pipe.send((index, tasks[index]))
                running[pipe] = (process, index)
        while running:
            ready = wait([*running, *(process.sentinel for process, _ in running.values())])
            for pipe in [p for p in running if p in ready or running[p][0].sentinel in ready]:
                process, index = running.pop(pipe)
                try:
                    answer_index, result, error = pipe.recv()
                except (EOFError, OSError):  # its process ended without an answer
                    process.join(1)
                    point = ", ".join(f"{k}={v}" for k, v in sorted(tasks[index].params.items()))
                    raise WorkerDied(f"the worker process running point {index} ({point[:160]}) ended without a result "
                                     f"({_exit_reason(process.exitcode)}); nothing was written") from None
                if error is not None:
                    raise error
                done(answer_index, result)
                if todo:
                    index = todo.popleft()
                    pipe.send((index, tasks[index]))
                    running[pipe] = (process, index)
        for _, pipe in workers:
            pipe.send(None)  # done: each worker returns
    finally:
        for process, pipe in workers:
            process.join(0.5 if process.exitcode is None else 0)
            if process.is_alive():
                process.kill()
                process.join()
            pipe.close()


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        why = ", perhaps by the out-of-memory killer" if name == "SIGKILL" else ""
        return f"killed by {name}{why}"
    return f"exit status {code}"


def _worker(pipe) -> None:
    """A worker: runs the (index, task) pairs it is sent until it gets None; answers (index, result, None), or
    (index, None, the exception) for a point that raised (a bad point: the parent re-raises it)."""
    _ignore_interrupts()
    while True:
        item = pipe.recv()
        if item is None:
            return
        index, task = item
        try:
            pipe.send((index, run_task(task), None))
        except Exception as exc:  # noqa: BLE001 - the parent raises it
            try:
                pipe.send((index, None, exc))
            except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
                pipe.send((index, None, RuntimeError(f"{type(exc).__name__}: {exc}")))


def _run_ray(tasks: list[Task], order: list[int], done) -> None:
    try:
        import ray
    except ImportError:
        raise SweepError(RAY_MISSING) from None
    if not ray.is_initialized():
        _start_ray(ray)
    remote = ray.remote(run_task)
    pending = {remote.remote(tasks[i]): i for i in order}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            done(pending.pop(ref), ray.get(ref))


RAY_START_ATTEMPTS = 3  # NOTE: Ray gives its local node a fixed 30 s to register (ray/_private/node.py); on a busy
# machine that may not be enough, so a local start that timed out is shut down and tried again


def _start_ray(ray) -> None:
    """Join a running cluster (`ray start --head`), if there is one, else start a local Ray on this machine, up to
    RAY_START_ATTEMPTS times when its start-up times out."""
    try:
        ray.init(address="auto")
        return
    except (ConnectionError, RuntimeError):
        pass
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            ray.init()
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises a plain Exception when its node does not come up
            ray.shutdown()
            if "timed out during startup" not in str(exc):
                raise
            if attempt == RAY_START_ATTEMPTS:
                raise SweepError(f"--backend ray: a local Ray did not start in {RAY_START_ATTEMPTS} attempts (Ray "
                                 f"said: {exc}); the machine may be busy: retry, or use --backend local") from None


def summary_row(params: dict, summary: dict) -> dict:
    """The point's parameters, then the summary's scalar fields (not already a parameter), then the memory
    shares flattened as memory.<kind> (of the whole pool) and memory_busy.<kind> (of the non-free pool)."""
    row = dict(params)
    for key, value in summary.items():
        if isinstance(value, dict):
            row.update({f"{key}.{name}": share for name, share in value.items()})
        elif key not in row:
            row[key] = value
    return row


def sweep(grid: dict[str, list], fixed: dict | None = None, *, jobs: int | None = None, backend: str = "local",
          progress: bool = True) -> list[dict]:
    """Run sim.run at every grid point (over the `fixed` keywords); one `summary_row` per point, in grid order."""
    for name, values in {**grid, **(fixed or {})}.items():
        if name not in sweepable_params():
            raise SweepError(f"unknown sweep parameter {name!r} (allowed: {', '.join(sweepable_params())})")
        if isinstance(values, list) and not values:
            raise SweepError(f"{name}: the grid gives no values")
    points = grid_points(grid, fixed)
    for point in points:  # every point checked before any runs (a bad one would fail only when its turn came)
        check_arguments(point)
    results = run_tasks([Task.of(**p) for p in points], jobs=jobs, backend=backend, progress=progress)
    return [summary_row(p, r.summary) for p, r in zip(points, results)]


def write_csv(rows: list[dict], path: str | Path | None) -> None:
    """Rows as CSV (columns in first-seen order) to `path` (whole or not at all), or to stdout when path is None."""
    columns = list(dict.fromkeys(key for row in rows for key in row))

    def write(f) -> None:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)

    if path is None:
        write(sys.stdout)
        return
    with atomic_write(path, newline="") as f:
        write(f)


def add_arguments(parser) -> None:
    parser.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2,...",
                        help="a run() parameter and its values; repeat for a grid (every combination runs)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a run() parameter held fixed at every point (e.g. duration=600)")
    parser.add_argument("--jobs", type=int, help="worker processes (default: the usable CPU cores)")
    parser.add_argument("--backend", default="local", metavar="{local,ray}",
                        help="local processes, or a Ray cluster (the 'ray' extra) (default: local)")
    parser.add_argument("--out", metavar="PATH", help="CSV file to write (default: stdout)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def run_from_args(args) -> int:
    if not args.grid:
        raise SweepError("give at least one --grid NAME=V1,V2,...")
    grid, fixed = {}, {}
    for flag, specs in (("--grid", args.grid), ("--set", args.set)):
        for spec in specs:
            name, values = parse_assignment(spec)
            if name in grid or name in fixed:
                raise SweepError(f"{flag} {spec!r}: {name} is given twice (allowed: one --grid or --set per name)")
            if flag == "--set" and len(values) != 1:
                raise SweepError(f"--set {spec!r}: expected exactly one value (use --grid to vary it)")
            if flag == "--grid" and len(set(map(repr, values))) != len(values):
                raise SweepError(f"--grid {spec!r}: a value is given twice (each grid value runs once)")
            (grid if flag == "--grid" else fixed)[name] = values if flag == "--grid" else values[0]
    if args.backend not in BACKENDS:
        raise SweepError(f"--backend: got {args.backend!r} (allowed: {', '.join(BACKENDS)})")
    # before any run: --out must be writable and must not be a trace the points read
    traces = [("trace", v) for v in [*grid.get("trace", []), fixed.get("trace")] if isinstance(v, str)]
    check_outputs({"--out": args.out}, traces)
    rows = sweep(grid, fixed, jobs=args.jobs, backend=args.backend, progress=not args.no_progress)
    write_csv(rows, args.out)
    if args.out:
        print(f"wrote {len(rows)} rows to {args.out}", file=sys.stderr)
    return 0
