"""Keep freed memory in the process, so that a forward step does not page-fault through every new tensor.

torch's CPU allocator is glibc's malloc. glibc serves a large block (above its mmap threshold, which it adapts up
to 32 MiB) with fresh pages from the kernel and gives them back on free; it also trims the top of its heap
whenever more than a threshold is free there. A forward pass allocates and frees tensors of several MiB per
layer (a prefill of 2,048 tokens: [2048, 1536] float32 is 12 MiB), so the same memory went back and forth to
the kernel ~30 times per step, and every round trip costs a page fault and the kernel zeroing each 4 KiB page.
Measured on the 2-core box, one prefill step of the bench workload (2,048 tokens, 1 thread): 3.97 s with glibc's
defaults, 3.61 s with the settings below; `silu` of a fresh [2048, 1536] tensor 9.7 ms vs 4.0 (torch profiler).

vLLM's CPU build solves the same problem by preloading tcmalloc into its worker process
(vllm/platforms/cpu.py: "LD_PRELOAD libtcmalloc ... to reduce memory allocation overhead"); a library cannot
preload anything into a process already running, but glibc's `mallopt` changes the same behaviour at run time:
serve blocks up to 32 MiB from the heap, and never trim it. The cost is that the process keeps its peak heap
(a few hundred MiB for SmolLM2) instead of returning it between steps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

THP_ENV = "THP_MEM_ALLOC_ENABLE"  # torch's switch (c10/core/alloc_cpu.cpp), read once, at its first large allocation
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's largest allowed value on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
_done = False


def keep_freed_memory() -> bool:
    """Tune glibc's malloc for this process (once; process-wide); False where there is no glibc (macOS, musl)."""
    global _done
    if _done:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 2**30) == 1
    except (OSError, AttributeError):
        return False
    _done = ok
    return ok


def huge_pages() -> None:
    """Have torch's CPU allocator back its tensors of 2 MiB and more with transparent huge pages.

    With the variable set, torch aligns each such block to 2 MiB and asks the kernel for huge pages
    (madvise(MADV_HUGEPAGE)). The kernel grants them where transparent huge pages are "always" or "madvise"
    (/sys/kernel/mm/transparent_hugepage/enabled); under "never" nothing changes.

    A decode step reads every weight matrix and each sequence's K/V blocks. Those are hundreds of MiB spread
    over 4 KiB pages, so the reads keep missing the TLB. Measured on the 2-core box with
    tools/engine_profile.py (float32, 1 thread, the two runs alternating):
    - bench workload: 14.9 -> 14.4 s and 14.8 -> 14.3 s, GEMMs 89 -> 94 GFLOPS;
    - long workload: 56.9 -> 55.1 s, its decode K/V read at 5.95 -> 6.63 GB/s.

    torch reads the variable once, at its first large allocation. So this is called when the `reference`
    package is imported, before any model loads; a process whose torch allocated before that keeps 4 KiB
    pages. A value already set in the environment is kept (THP_MEM_ALLOC_ENABLE=0 turns this off)."""
    os.environ.setdefault(THP_ENV, "1")
