"""The engine on CPUs without AVX2 or AVX-512, proven on whatever CPU runs the suite (reference/cpu_paths.py).

The libraries decide their kernels when they load, from the CPU and from their own switches; a process started with
`LESSER_CPU`'s switches computes as an AVX-only x86-64 CPU does (torch's DEFAULT kernels, oneDNN at AVX, MKL at
AVX, numba for a generic x86-64). Here, in such processes:

- the paths are decided as on such a CPU: no bfloat16 prepacking (torch itself refuses it there: "bf16 path needs
  the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"), and asking for it is one clear error;
- the engine's tests of every CPU path (bfloat16, the numba kernels and fused steps, the prepacked float32
  projections) pass as they pass here, with the same tolerances.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reference.cpu_paths import LESSER_CPU, cpu_paths

ROOT = Path(__file__).resolve().parents[2]

# The engine's tests whose paths depend on the CPU: bfloat16 end to end, the projections, the compiled kernels.
CPU_PATH_TESTS = (
    "tests/reference/test_bf16_cpu.py",
    "tests/reference/test_matmul.py",
    "tests/reference/test_cpu_fused.py",
    "tests/reference/test_attention_numba.py",
)


def lesser_env() -> dict[str, str]:
    return {**os.environ, **LESSER_CPU, "PYTHONPATH": str(ROOT)}


PROBE = """
import json, torch
from reference.cpu_paths import cpu_paths
from reference.models.matmul import default_matmul
cpu = torch.device("cpu")
paths = cpu_paths()
try:
    default_matmul("onednn", cpu, torch.bfloat16)
    refused = None
except ValueError as exc:
    refused = str(exc)
print(json.dumps({"aten": paths.aten, "onednn": paths.onednn, "onednn_bfloat16": paths.onednn_bfloat16,
                  "numba_cpu": paths.numba_cpu, "describe": paths.describe(), "refused": refused,
                  "float32": default_matmul(None, cpu, torch.float32),
                  "bfloat16": default_matmul(None, cpu, torch.bfloat16)}))
"""


def test_the_paths_are_decided_once_per_process():
    paths = cpu_paths()
    assert cpu_paths() is paths
    assert paths.packs(torch.float32) == paths.onednn
    assert not paths.packs(torch.float16)  # never prepacked (not measured)
    assert paths.aten in paths.describe()


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs torch's oneDNN")
def test_a_cpu_without_avx512_multiplies_bfloat16_through_f_linear():
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=lesser_env(), capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["aten"] == "DEFAULT"  # torch's own kernels follow the switch: this is an AVX-only process
    assert found["onednn_bfloat16"] is False
    assert found["numba_cpu"] == "generic"
    assert (found["float32"], found["bfloat16"]) == ("onednn", "torch")
    assert "cannot prepack bfloat16 weights on this CPU" in found["refused"]
    assert "\n" not in found["refused"]
    assert "F.linear (oneDNN cannot prepack bfloat16 here)" in found["describe"]


@pytest.mark.slow
def test_the_engines_cpu_path_tests_pass_on_a_lesser_cpu():
    """The CPU-dependent tests, run whole in a process that computes as an AVX-only CPU: nothing skipped that runs
    here except what needs the bfloat16 prepacking this CPU lacks."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *CPU_PATH_TESTS],
        env=lesser_env(),
        capture_output=True,
        text=True,
        timeout=1500,
        cwd=ROOT,
    )
    tail = done.stdout[-4000:]
    assert done.returncode == 0, tail + done.stderr[-2000:]
    assert " passed" in tail and " failed" not in tail
    skipped = [line for line in tail.splitlines() if line.startswith("SKIPPED")]
    assert all("cannot pack bfloat16" in line for line in skipped), skipped
