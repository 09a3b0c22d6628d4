"""Ctrl-C and SIGTERM on the commands that run long: one line, the shell's status (130, 143), no traceback, no
temporary left, every earlier output as it was, and no worker process left computing (`sim sweep` runs points in
worker processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _interruptible() -> None:
    """A child's SIGINT as a terminal's, however the suite was started: a job a non-interactive shell sends to the
    background (`make test &`, nohup) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _children(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def _workers_of(proc: subprocess.Popen) -> set[int]:
    """A two-worker sweep's worker processes, once both have started (within a minute)."""
    deadline = time.monotonic() + 60
    workers: set[int] = set()
    while len(workers) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        workers = _children(proc.pid)
    assert len(workers) >= 2, "the sweep never started its workers"
    return workers


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads worker processes from /proc")
@pytest.mark.parametrize(
    "sig, status, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_sweep_stops_at_once_with_its_workers(tmp_path, sig, status, word):
    out = tmp_path / "X.csv"
    out.write_text("old")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sim",
            "sweep",
            "--grid",
            "rate=1,2,3,4",
            "--set",
            "duration=20000",
            "--jobs",
            "2",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_interruptible,
    )
    workers = _workers_of(proc)
    time.sleep(1.0)
    sent = time.monotonic()
    os.kill(proc.pid, sig)  # to the parent alone (a terminal's Ctrl-C reaches the whole group; workers ignore it)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10, "took more than 10 s to stop"
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip() and "simulations" not in line]
    assert proc.returncode == status and len(lines) == 1 and lines[0].startswith(f"error: {word}"), err
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["X.csv"]
    time.sleep(0.5)
    assert not [w for w in workers if _alive(w)], "a worker is still computing"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="die_with_parent is Linux's PR_SET_PDEATHSIG")
def test_a_sweep_killed_outright_leaves_no_worker(tmp_path):
    """SIGKILL runs no cleanup in the parent: the kernel stops the workers (sim.drivers.sweep.die_with_parent)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sim",
            "sweep",
            "--grid",
            "rate=1,2,3,4",
            "--set",
            "duration=20000",
            "--jobs",
            "2",
            "--out",
            str(tmp_path / "X.csv"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    workers = _workers_of(proc)
    time.sleep(1.0)
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while [w for w in workers if _alive(w)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [w for w in workers if _alive(w)], "a worker outlived its killed parent"


def _start_sweep(out: Path, grid: str, *sets: str, **popen) -> tuple[subprocess.Popen, set[int]]:
    """A two-worker sweep, once both workers are up: (the process, its workers)."""
    sets = [arg for value in ("kv_slots=3000", *sets) for arg in ("--set", value)]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sim",
            "sweep",
            "--no-progress",
            "--grid",
            grid,
            *sets,
            "--jobs",
            "2",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
    return proc, _workers_of(proc)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads worker processes from /proc")
def test_sigterm_to_the_process_group_with_a_worker_idle_stops_the_sweep(tmp_path):
    """What `timeout`, `kill -- -PGID` and systemd send: every process gets SIGTERM, one worker idle (its short point
    done, no point left for it). multiprocessing.Pool's terminate() then waited forever for a lock the dead worker
    held; the sweep now ends with one line and 143."""
    proc, workers = _start_sweep(tmp_path / "X.csv", "num_requests=100,60000", start_new_session=True)
    time.sleep(2.0)  # the 100-request point is done: its worker waits for a task
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10, "took more than 10 s to stop"
    assert proc.returncode == 143 and err.strip().startswith("error: terminated"), err
    assert not (tmp_path / "X.csv").exists()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads worker processes from /proc")
def test_a_worker_killed_outright_ends_the_sweep_with_one_line(tmp_path):
    """The out-of-memory killer takes a worker: Pool lost its point without a word and the sweep waited forever.
    Now: one line naming the point and the signal, the other worker stopped, nothing written."""
    proc, workers = _start_sweep(tmp_path / "X.csv", "rate=1,2,3,4", "duration=20000", preexec_fn=_interruptible)
    time.sleep(1.0)
    os.kill(min(workers), signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert "ended without a result (killed by SIGKILL, perhaps by the out-of-memory killer)" in err, err
    assert not (tmp_path / "X.csv").exists()
    time.sleep(0.5)
    assert not [w for w in workers if _alive(w)], "a worker is still computing"


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ["sim", "run", "--rate", "3", "--duration", "200000", "--requests-csv", "R.csv", "--steps-csv", "S.csv"],
        ["reference", "calibrate", "--quick", "--passes", "9", "--out", "R.csv", "--steps-csv", "S.csv"],
    ],
)
def test_a_long_run_stops_with_one_line(tmp_path, command):
    if command[0] == "reference":
        pytest.importorskip("torch", reason="the engine's command needs the full install (torch)")
    (tmp_path / "R.csv").write_text("old")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", *command],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_interruptible,
    )
    time.sleep(8)  # past the imports and into the run
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    lines = err.strip().splitlines()
    assert proc.returncode == 130 and len(lines) == 1 and lines[0].startswith("error: interrupted"), err
    assert (tmp_path / "R.csv").read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["R.csv"]


def test_an_interrupt_a_c_extension_wrapped_is_still_one_line(capsys):
    """numba, interrupted while loading a compiled function from its cache (a cold cache: a fresh machine), turns
    the KeyboardInterrupt into a SystemError caused by it: still one line and status 130, not a traceback. Any other
    failure goes on as it was."""
    from sim.drivers.cli import Terminated, interruptible

    def wrapped(inner: BaseException):
        def body():
            try:
                raise inner
            except BaseException as exc:
                raise SystemError("<function _numba_unpickle> returned a result with an exception set") from exc

        return body

    assert interruptible(wrapped(KeyboardInterrupt())) == 130
    assert capsys.readouterr().err.strip() == "error: interrupted; outputs not yet written were left as they were"
    assert interruptible(wrapped(Terminated())) == 143
    assert capsys.readouterr().err.strip().startswith("error: terminated")
    with pytest.raises(SystemError):
        interruptible(wrapped(ValueError("not an interrupt")))
    with pytest.raises(RuntimeError):
        interruptible(lambda: (_ for _ in ()).throw(RuntimeError("plain failure")))
