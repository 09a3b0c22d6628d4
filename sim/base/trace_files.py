"""What the two trace readers share: opening a user's file safely, integers of any length, values shortened for a
message, and the one error every problem with a file becomes.

sim.workloads.trace reads a trace one request a line (JSONL, CSV) and sim.workloads.sharegpt a ShareGPT conversation list (JSON); a
trace file is user input, so whatever it holds, a problem with it is one `TraceError` line naming the file and
the line, never a traceback, a hang on a FIFO, or minutes spent converting a 100,000-digit integer.
"""
from __future__ import annotations

import os
from pathlib import Path

LONGEST_INT = 24  # digits: no field allows more than 19, and Python converts at most 4,300


class TraceError(ValueError):
    """A malformed trace: one line naming the file, the line (or "the whole file") and what is wrong."""


class LongInt(str):
    """An integer with more digits than any field allows, kept as text (Python converts at most 4,300)."""


def parse_int(text: str) -> int | LongInt:
    """An integer's digits (a JSON number, a CSV cell) as an int, or as `LongInt` text past LONGEST_INT digits; a
    field's range check then refuses it, and `show` names it by its length."""
    return int(text) if len(text) <= LONGEST_INT else LongInt(text)


def show(value) -> str:
    """A value for an error message: its repr, shortened (a message is one line, whatever the file holds)."""
    if isinstance(value, LongInt):
        return f"an integer of {len(value.lstrip('+-'))} digits"
    if type(value) is int and abs(value) >= 10**LONGEST_INT:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= 40 else text[:36] + "..." + text[-1]


def json_object(pairs: list) -> dict:
    """json's object_pairs_hook for a trace: an object that holds no key twice (json would keep the last: refused)."""
    record = dict(pairs)
    if len(record) < len(pairs):
        seen: set = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        name = twice if twice.isidentifier() and len(twice) <= 40 else show(twice)
        raise ValueError(f"field {name} appears twice in one object")
    return record


def no_constant(name: str):
    """json's parse_constant for a trace: NaN and Infinity are Python's extensions, not JSON."""
    raise ValueError(f"{name} is not JSON (allowed: finite numbers)")


def open_trace(path: str | Path):
    """The file, opened for reading bytes; TraceError (one line) if it cannot be, or if it is not a regular file (a
    FIFO would block until a writer came, a device like /dev/zero never end)."""
    try:
        special = os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path)
    except ValueError:  # a path holding a NUL byte: open() below says so
        special = False
    if special:
        raise TraceError(f"{path}: not a regular file (a FIFO, a device or a socket; allowed: a trace file)")
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, not a trace file") from None
    except PermissionError:
        raise TraceError(f"{path}: cannot be read (permission denied)") from None
    except (OSError, ValueError) as e:  # ValueError: a path holding a NUL byte
        raise TraceError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
