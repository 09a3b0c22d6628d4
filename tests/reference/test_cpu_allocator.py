"""reference.cpu_allocator.huge_pages: importing `reference` asks torch for transparent huge pages on its large tensors
(unless the environment already says otherwise), and where the kernel grants them a large tensor lands on them.
Each case runs in a fresh Python, since torch reads its switch once per process."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# a 64 MiB tensor allocated after `import reference`, then the process's huge-page kilobytes (smaps)
PROBE = (
    "import os, re, reference, torch; x = torch.ones(16 * 2**20); "
    "huge = sum(int(k) for k in re.findall(r'AnonHugePages:\\s+(\\d+) kB', open('/proc/self/smaps').read())); "
    "print(os.environ.get('THP_MEM_ALLOC_ENABLE'), huge)"
)


def probe(env_value: str | None) -> tuple[str, int]:
    env = {k: v for k, v in __import__("os").environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if env_value is not None:
        env["THP_MEM_ALLOC_ENABLE"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    value, huge = out.stdout.split()
    return value, int(huge)


def thp_mode() -> str | None:
    """The kernel's transparent-huge-page mode (always, madvise, never), or None where it cannot be read."""
    try:
        found = re.search(r"\[(\w+)\]", THP.read_text())
    except OSError:
        return None
    return found.group(1) if found else None


needs_smaps = pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="no /proc/self/smaps (not Linux)")


@needs_smaps
def test_importing_reference_turns_huge_pages_on_unless_the_environment_says_otherwise():
    assert probe(None)[0] == "1"
    assert probe("0")[0] == "0"  # the user's setting is kept


@needs_smaps
@pytest.mark.skipif(thp_mode() not in ("always", "madvise"), reason="the kernel grants no transparent huge pages")
def test_a_large_tensor_lands_on_huge_pages():
    _, huge = probe(None)
    assert huge >= 32 * 1024  # kB: most of the 64 MiB tensor (the kernel may leave some pages small)
    if thp_mode() == "madvise":  # only torch's madvise asks for them: without the switch, none
        assert probe("0")[1] == 0
