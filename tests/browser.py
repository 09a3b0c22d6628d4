"""Headless Chromium for the tests that load a pool page (Debian's `chromium` package): found, or installed by the
test's setup where it is missing and this user may (root, apt-get), or the test is skipped saying why."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def need_chromium() -> str:
    from sim.views.pool_page import find_chromium

    if find_chromium() is None and shutil.which("apt-get") and os.geteuid() == 0:
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], capture_output=True, timeout=900)
    if find_chromium() is None:
        pytest.skip("no Chromium, and apt-get could not install Debian's chromium package here")
    return find_chromium()
