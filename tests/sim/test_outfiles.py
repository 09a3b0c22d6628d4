"""Nothing lost: outputs are written whole or not at all, and refused before any work when they could not be.

sim.base.outfiles is tested with writers that fail midway (an exception, Ctrl-C, a file size limit in a child
process), then the command lines with the output paths of docs/ARCHITECTURE.md "Bad input": `main(argv)` in
this process where the refusal comes before any work, a subprocess where a size limit is needed.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sim.base.outfiles import (
    OutputPathError,
    atomic_files,
    atomic_write,
    check_output_folder,
    check_outputs,
    remove_stale_temps,
    temp_prefix,
    write_bytes,
    write_csv,
    write_text,
)
from sim.base.request import Request
from sim.drivers import bench_alloc
from sim.drivers.cli import main
from sim.workloads.trace import write_csv as write_trace_csv

ROOT = Path(__file__).resolve().parents[2]
OLD = "old content\n"


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ------------------------------------------------------------------------------------------- atomic writes


@pytest.mark.parametrize("error", [RuntimeError("writer failed"), KeyboardInterrupt()], ids=["exception", "ctrl-c"])
def test_a_writer_failing_midway_leaves_the_old_file_and_no_temporary(tmp_path, error):
    path = tmp_path / "out.csv"
    path.write_text(OLD)
    with pytest.raises(type(error)):
        with atomic_write(path) as f:
            f.write("new,half\n" * 1000)
            raise error
    assert path.read_text() == OLD
    assert listing(tmp_path) == ["out.csv"]


def test_a_new_file_appears_only_whole(tmp_path):
    path = tmp_path / "new.csv"
    with atomic_write(path) as f:
        f.write("a,b\n")
        assert not path.exists()  # still a temporary beside it
        assert len(listing(tmp_path)) == 1 and listing(tmp_path)[0].startswith(".new.csv.tmp-")
    assert path.read_text() == "a,b\n" and listing(tmp_path) == ["new.csv"]


def test_a_failing_group_replaces_none_of_its_files(tmp_path):
    """A figure's PNG and CSV: a failure on the CSV must not leave a new PNG beside the old CSV."""
    png, table = tmp_path / "fig.png", tmp_path / "fig.csv"
    png.write_bytes(b"old png")
    table.write_text(OLD)
    with pytest.raises(RuntimeError):
        with atomic_files() as files:
            with files.open(png, "wb") as f:
                f.write(b"new png")
            with files.open(table) as f:
                f.write("new")
                raise RuntimeError("disk full")
    assert png.read_bytes() == b"old png" and table.read_text() == OLD
    assert listing(tmp_path) == ["fig.csv", "fig.png"]
    with atomic_files() as files:
        with files.open(png, "wb") as f:
            f.write(b"new png")
        with files.open(table) as f:
            f.write("new")
    assert png.read_bytes() == b"new png" and table.read_text() == "new"


SIZE_LIMIT_CHILD = textwrap.dedent("""
    import resource, signal, sys
    from sim.base.outfiles import OutputWriteError, atomic_files, atomic_write
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG, not a kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (40 * 1024, 40 * 1024))  # `ulimit -f 40`
    big, small, other = sys.argv[1:]
    try:
        with atomic_write(big, "wb") as f:
            f.write(b"x" * (200 * 1024))
    except OutputWriteError as err:
        print("single", err.errno)
    try:
        with atomic_files() as files:
            with files.open(small) as f:
                f.write("fits")
            with files.open(other, "wb") as f:
                f.write(b"x" * (200 * 1024))
    except OutputWriteError as err:
        print("group", err.errno, str(err))
""")


def test_a_file_size_limit_leaves_the_old_files_and_no_temporary(tmp_path):
    names = ("big.bin", "small.csv", "other.png")
    for name in names:
        (tmp_path / name).write_text(OLD)
    out = subprocess.run(
        [sys.executable, "-c", SIZE_LIMIT_CHILD, *(str(tmp_path / n) for n in names)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"single {errno.EFBIG}" and lines[1].startswith(f"group {errno.EFBIG} cannot write ")
    assert "other.png" in lines[1]
    assert all((tmp_path / name).read_text() == OLD for name in names)
    assert listing(tmp_path) == sorted(names)


def test_permissions_ordinary_for_new_files_and_kept_for_replaced_ones(tmp_path):
    umask = os.umask(0o022)
    try:
        write_text(tmp_path / "new.txt", "x")
        assert (tmp_path / "new.txt").stat().st_mode & 0o777 == 0o644  # not mkstemp's private 0600
        kept = tmp_path / "kept.txt"
        kept.write_text(OLD)
        kept.chmod(0o640)
        write_bytes(kept, b"y")
        assert kept.stat().st_mode & 0o777 == 0o640 and kept.read_bytes() == b"y"
    finally:
        os.umask(umask)


def test_a_symlinked_output_stays_a_link_and_devices_are_written_in_place(tmp_path):
    target = tmp_path / "target.csv"
    target.write_text(OLD)
    (tmp_path / "link.csv").symlink_to(target)
    write_csv(tmp_path / "link.csv", ["a"], [{"a": 1}])
    assert (tmp_path / "link.csv").is_symlink() and target.read_text().splitlines() == ["a", "1"]
    write_text(os.devnull, "discarded")  # /dev/null is not replaced by a regular file
    assert Path(os.devnull).is_char_device()


def test_stale_temporaries_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    name = "model-float32"
    child = (
        "import sys, tempfile; from sim.base.outfiles import temp_prefix; "
        "print(tempfile.mkdtemp(dir=sys.argv[1], prefix=temp_prefix(sys.argv[2])))"
    )
    out = subprocess.run(
        [sys.executable, "-c", child, str(tmp_path), name],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    dead = Path(out.stdout.strip())  # its process has exited: an interrupted conversion
    (dead / "model.safetensors").write_bytes(b"\0" * 1024)
    live = tmp_path / f"{temp_prefix(name)}abc123"  # this process: a conversion still running
    live.mkdir()
    legacy_old = tmp_path / f".{name}.tmp-k2j4h5g6"  # no writer in the name (an older version), untouched 1 h
    legacy_old.mkdir()
    os.utime(legacy_old, (time.time() - 3600, time.time() - 3600))
    legacy_new = tmp_path / f".{name}.tmp-q1w2e3r4"  # no writer in the name, recent: might still be written
    legacy_new.mkdir()
    elsewhere = tmp_path / f".{name}.tmp-123@another-host-abcd1234"  # another machine's, recent
    elsewhere.write_text("x")
    unrelated = [tmp_path / name, tmp_path / f".other.tmp-1@{name}-x"]
    unrelated[0].mkdir()
    unrelated[1].write_text("x")
    removed = remove_stale_temps(tmp_path, name)
    assert sorted(removed) == sorted([dead, legacy_old])
    assert not dead.exists() and not legacy_old.exists()
    assert all(p.exists() for p in (live, legacy_new, elsewhere, *unrelated))


def test_the_next_write_removes_a_killed_writers_temporary(tmp_path):
    child = (
        "import os, signal, sys; from sim.base.outfiles import atomic_write\n"
        "with atomic_write(sys.argv[1]) as f:\n    f.write('half'); f.flush(); os.kill(os.getpid(), signal.SIGKILL)"
    )
    path = tmp_path / "sharing.png"
    path.write_text(OLD)
    out = subprocess.run([sys.executable, "-c", child, str(path)], cwd=ROOT, capture_output=True, timeout=60)
    assert out.returncode == -signal.SIGKILL
    assert path.read_text() == OLD and len(listing(tmp_path)) == 2  # the old file, and the killed one's temporary
    write_text(path, "new")
    assert path.read_text() == "new" and listing(tmp_path) == ["sharing.png"]


# ----------------------------------------------------------------------------------------- checking paths


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A working folder with an input trace t.csv, an earlier output A.csv and a folder adir."""
    monkeypatch.chdir(tmp_path)
    write_trace_csv([Request(i, 0.1 * i, 20, 5) for i in range(3)], tmp_path / "t.csv")
    (tmp_path / "A.csv").write_text(OLD)
    (tmp_path / "adir").mkdir()
    (tmp_path / "link.csv").symlink_to(tmp_path / "t.csv")
    os.link(tmp_path / "t.csv", tmp_path / "hard.csv")
    return tmp_path


REFUSED = {  # name -> (outputs, inputs, the start of the message, words in it)
    "missing folder": ({"--steps-csv": "/nodir/x"}, {}, "--steps-csv /nodir/x:", "folder /nodir does not exist"),
    "missing relative folder": ({"--out": "nodir/x.csv"}, {}, "--out nodir/x.csv:", "folder nodir does not exist"),
    "a folder": ({"--steps-csv": "adir"}, {}, "--steps-csv adir:", "is a folder"),
    "the current folder": ({"--out": "."}, {}, "--out .:", "is a folder"),
    "parent is a file": ({"--steps-csv": "A.csv/x.csv"}, {}, "--steps-csv A.csv/x.csv:", "A.csv is not a folder"),
    "dotdot through a missing folder": ({"--out": "nodir/../x.csv"}, {}, "--out nodir/../x.csv:", "does not exist"),
    "empty": ({"--out": ""}, {}, "--out:", "empty path"),
    "two outputs": (
        {"--requests-csv": "A.csv", "--steps-csv": "A.csv"},
        {},
        "--steps-csv A.csv:",
        "is also --requests-csv A.csv",
    ),
    "two spellings": (
        {"--requests-csv": "A.csv", "--steps-csv": "adir/../A.csv"},
        {},
        "--steps-csv adir/../A.csv:",
        "is also --requests-csv A.csv",
    ),
    "the input": ({"--requests-csv": "t.csv"}, {"--trace": "t.csv"}, "--requests-csv t.csv:", "is the input --trace"),
    "the input as ./": ({"--requests-csv": "./t.csv"}, {"--trace": "t.csv"}, "--requests-csv ./t.csv:", "input"),
    "the input by a symlink": ({"--requests-csv": "link.csv"}, {"--trace": "t.csv"}, "--requests-csv link", "input"),
    "the input by a hard link": ({"--requests-csv": "hard.csv"}, {"--trace": "t.csv"}, "--requests-csv hard", "input"),
    "the input, absolute": ({"--requests-csv": "{folder}/t.csv"}, {"--trace": "t.csv"}, "--requests-csv /", "input"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_check_outputs_refuses_with_the_flag_named(folder, case):
    outputs, inputs, start, words = REFUSED[case]
    outputs = {flag: path.format(folder=folder) for flag, path in outputs.items()}
    with pytest.raises(OutputPathError) as err:
        check_outputs(outputs, inputs)
    message = str(err.value)
    assert message.startswith(start) and words in message and "\n" not in message, message


def test_check_outputs_accepts_writable_paths(folder):
    check_outputs({"--requests-csv": "A.csv", "--steps-csv": "adir/new.csv", "--json": None}, {"--trace": "t.csv"})
    check_outputs([("--out", "nodir/deeper/x.csv")], make_parents=True)  # the program will create the folders
    check_outputs(["/dev/null"])
    with pytest.raises(OutputPathError, match="A.csv is not a folder"):
        check_outputs({"--out": "A.csv/deeper/x.csv"}, make_parents=True)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write read-only files")
def test_check_outputs_refuses_a_read_only_file_and_folder(folder):
    (folder / "A.csv").chmod(0o444)
    with pytest.raises(OutputPathError, match="read-only"):
        check_outputs({"--out": "A.csv"})
    (folder / "adir").chmod(0o555)
    with pytest.raises(OutputPathError, match="not writable"):
        check_outputs({"--out": "adir/x.csv"})


def test_check_output_folder(folder):
    check_output_folder("adir", "--out", files=["fig.png"])
    check_output_folder("new/deeper", "--out")  # created by the writer
    with pytest.raises(OutputPathError, match="--out A.csv: is a file, not a folder"):
        check_output_folder("A.csv", "--out")
    with pytest.raises(OutputPathError, match="cannot create folder"):
        check_output_folder("A.csv/sub", "--out")
    (folder / "adir" / "fig.png").mkdir()
    with pytest.raises(OutputPathError, match="fig.png is a folder"):
        check_output_folder("adir", "--out", files=["fig.png", "fig.csv"])


# ------------------------------------------------------------------------------------------ command lines


@pytest.fixture
def no_work(monkeypatch):
    """Every command's work (a simulation, a benchmark) fails the test if it starts."""
    import sim.api
    import sim.drivers.sweep
    import sim.figures
    from sim.drivers import bench_sim

    def work(*args, **kwargs):
        raise AssertionError("work started before the output paths were checked")

    for module, name in (
        (sim.api, "run"),
        (sim.drivers.sweep, "run_tasks"),
        (sim.figures, "run_tasks"),
        (bench_sim, "bench"),
        (bench_alloc, "bench"),
    ):
        monkeypatch.setattr(module, name, work)


def one_error_line(capsys, *words: str) -> None:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def test_run_with_an_unwritable_second_output_leaves_the_first_untouched(folder, capsys, no_work):
    assert main(["run", "--num-requests", "5", "--requests-csv", "A.csv", "--steps-csv", "/nodir/x"]) == 2
    one_error_line(capsys, "--steps-csv /nodir/x", "/nodir")
    assert (folder / "A.csv").read_text() == OLD


@pytest.mark.parametrize("spelling", ["t.csv", "./t.csv", "adir/../t.csv", "link.csv", "hard.csv"])
def test_run_refuses_to_overwrite_its_trace(folder, capsys, no_work, spelling):
    before = (folder / "t.csv").read_bytes()
    assert main(["run", "--trace", "t.csv", "--requests-csv", spelling]) == 2
    one_error_line(capsys, f"--requests-csv {spelling}", "--trace t.csv")
    assert main(["run", "--trace", "t.csv", "--steps-csv", spelling]) == 2
    one_error_line(capsys, "--steps-csv")
    assert (folder / "t.csv").read_bytes() == before and (folder / "link.csv").is_symlink()


def test_run_writes_both_tables(folder, capsys):
    assert main(["run", "--trace", "t.csv", "--requests-csv", "A.csv", "--steps-csv", "adir/steps.csv"]) == 0
    requests = (folder / "A.csv").read_text().splitlines()
    assert requests[0].startswith("request_id,") and len(requests) == 4  # the header and the trace's 3 requests
    assert (folder / "adir" / "steps.csv").read_text().startswith("time,duration,")
    assert listing(folder / "adir") == ["steps.csv"] and (folder / "t.csv").is_file()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["figures", "--only", "memory_waste", "--quick", "--out", "A.csv"], "--out A.csv: is a file"),
        (["figures", "--only", "memory_waste", "--quick", "--out", "A.csv/sub"], "cannot create folder"),
        (["bench", "--quick", "--csv", "nodir/x.csv"], "--csv nodir/x.csv: folder nodir does not exist"),
        (["bench", "--quick", "--csv", "adir"], "--csv adir: is a folder"),
        (["sweep", "--grid", "rate=1", "--set", "duration=5", "--out", "nodir/x.csv"], "--out nodir/x.csv"),
        (["sweep", "--grid", "rate=1", "--set", "trace=t.csv", "--out", "./t.csv"], "is the input trace t.csv"),
        (["bench-alloc", "--ops", "100", "--csv", "A.csv/x.csv"], "--csv A.csv/x.csv: A.csv is not a folder"),
    ],
    ids=[
        "figures-file",
        "figures-under-file",
        "bench-nodir",
        "bench-folder",
        "sweep-nodir",
        "sweep-trace",
        "bench-alloc-under-file",
    ],
)
def test_every_command_checks_its_outputs_before_any_work(folder, capsys, no_work, argv, words):
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    assert main(argv) == 2
    one_error_line(capsys, words)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
    assert listing(folder) == ["A.csv", "adir", "hard.csv", "link.csv", "t.csv"]


def test_bench_alloc_main_checks_its_csv(folder, capsys, no_work):
    assert bench_alloc.main(["--ops", "100", "--csv", "nodir/x.csv"]) == 2
    one_error_line(capsys, "folder nodir does not exist")


def _limit_file_size() -> None:  # in the child, before exec: `ulimit -f 40` (Python ignores SIGXFSZ itself)
    resource.setrlimit(resource.RLIMIT_FSIZE, (40 * 1024, 40 * 1024))


def test_figures_under_a_file_size_limit_leave_the_old_pair(tmp_path):
    """`ulimit -f 40; python -m sim figures`: the PNG does not fit; the old PNG and CSV stay, no temporary."""
    out = tmp_path / "figures"
    out.mkdir()
    (out / "memory_waste.png").write_bytes(b"old png")
    (out / "memory_waste.csv").write_text(OLD)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim",
            "figures",
            "--only",
            "memory_waste",
            "--quick",
            "--jobs",
            "1",
            "--no-progress",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_file_size,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: cannot write ") and result.stderr.count("\n") == 1, result.stderr
    assert "memory_waste.png" in result.stderr and "File too large" in result.stderr
    assert (out / "memory_waste.png").read_bytes() == b"old png" and (out / "memory_waste.csv").read_text() == OLD
    assert listing(out) == ["memory_waste.csv", "memory_waste.png"]
