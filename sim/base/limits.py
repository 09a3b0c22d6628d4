"""The simulator's stated limits: the largest inputs it accepts, in one place.

Every argument of `sim.run`, every flag of `python -m sim` and every field of a trace is checked against these
before anything is built, so an input past a limit gets one line naming it and the limit (docs/ARCHITECTURE.md,
"Bad input") instead of an overflow, a MemoryError or silently wrong results. Each limit is far beyond any
real serving run; the comment says what breaks past it.
"""
from __future__ import annotations

import math
import numbers

# Seconds: arrival times, durations, SLO targets. The clock is a float64 (53-bit mantissa): at 1e9 s (31 years)
# consecutive floats are 2**-23 s = 1.2e-7 s apart, still well below a step's length (milliseconds); at 1e17 s
# they are 16 s apart and every latency rounds to 0.
MAX_TIME_S = 1e9

# request_id, prefix_id and token ids are stored as int64 (the per-request table) and hashed as signed 64-bit
# integers (sim/kv/blocks.py, the prefix cache's block hashes).
MAX_ID = 2**63 - 1

# Tokens of one prompt, one output, one shared prefix, one block, one step's budget: 2**20 = 1,048,576 is past
# any model's context (the largest spec here has 8,192) and keeps token ids of a prompt within one trace line.
MAX_TOKENS = 2**20

# Requests of one workload or trace (and conversations of a ShareGPT file): each is a Python object plus its
# rows, about 1 KB, so 10 million is ~10 GB and minutes of simulation per million.
MAX_NUM_REQUESTS = 10_000_000

# Counts that are not requests: parallel samples n, beam width, distinct prefixes, running sequences.
MAX_COUNT = 10_000_000

# The mean number of turns of a conversation (sim/workloads/conversation.py): a session longer than a few thousand turns is
# no chat; with a history limit sessions never end for the context, and the requests' count is the real bound.
MAX_TURNS = 1000

# A tensor-parallel group: more GPUs than this serve no model in sim.base.specs.
MAX_NUM_GPUS = 1024

# a request's priority (vLLM's: lower is served first) lies in [-MAX_PRIORITY, MAX_PRIORITY]
MAX_PRIORITY = 1_000_000

# KV pool sizes. A paged pool keeps a Python list entry and a queue entry per block (~130 bytes), so 2**23
# blocks (8.4M, ~1.1 GB) is the most a GPU pool or a CPU swap pool may hold; contiguous pools keep no
# per-slot state, but a pool over 2**40 slots (a terabyte of tokens) is no real GPU.
MAX_POOL_BLOCKS = 2**23
MAX_KV_SLOTS = 2**40
MAX_SWAP_GIB = 2**20  # CPU swap space per GPU: a PiB

# Gamma arrivals' shape k (CV = 1/sqrt(k)): below 1e-3 (CV 32) the gaps underflow to 0 and overflow in turns;
# above 1e6 (CV 0.001) the process is a clock and rate * k loses precision.
MIN_BURSTINESS, MAX_BURSTINESS = 1e-3, 1e6

# Seeds feed numpy's SeedSequence, which takes integers >= 0; 64 bits are plenty.
MAX_SEED = 2**64 - 1

# One line of a trace file, in bytes (UTF-8). A JSONL line holds one request, its prompt_token_ids included:
# 16 MiB holds a MAX_TOKENS-token prompt of ids up to 12 digits. Longer lines are refused before they are read
# whole. (CSV cells keep the csv module's own limit, 131,072 characters: CSV holds numbers only.)
MAX_LINE_BYTES = 2**24

# Worker processes of a sweep or of `python -m sim figures` (--jobs): each is a Python process of its own.
MAX_JOBS = 1024


def is_int(value) -> bool:
    """An integer (numpy's included), not a bool: what every count and id above must be."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    """A finite number (an integer included), not a bool: what every time, rate and size above must be."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def require(ok: bool, name: str, value, allowed: str) -> None:
    """ValueError "name: got value (allowed: ...)" unless `ok`: the one line every refused argument gets."""
    if not ok:
        raise ValueError(f"{name}: got {value!r} (allowed: {allowed})")
