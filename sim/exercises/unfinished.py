"""Which methods a student has not written yet: every one at once, before any check runs.

A check stops at the first `NotImplementedError` it meets, so a student who has written nothing would learn
about one method per attempt. Instead each method the exercise asks for is called once on a FRESH allocator
with harmless arguments (the probes: `allocate(1)`, `free([0])` ...). What is listed is the function in whose
frame the `NotImplementedError` was raised (a written `copy_on_write` that calls an unwritten `allocate` names
`allocate`, not itself). Anything else a probe raises (a `RuntimeError` for freeing a free block, a bug) is left for
the checks to report. Methods the grader calls that the class does not define at all are listed as missing.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from .limits import time_limit
from .report import raising_method

PROBE_TIMEOUT_S = 10.0  # one probe call on a tiny object: a correct method answers in microseconds

_ABSENT = object()


def unfinished(make: Callable[..., Any], ctor_args: tuple, probes: dict[str, tuple | None],
               surface: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(methods raising NotImplementedError, names the grader needs but the class lacks), in the exercise's order.

    `probes` maps each method the student writes to the arguments of its probe call (None: a property, read).
    `surface` is everything the grader reads or calls.
    """
    try:
        with time_limit(PROBE_TIMEOUT_S):
            obj = make(*ctor_args)
    except NotImplementedError:
        return ["__init__"], []
    except BaseException as exc:  # a constructor that fails (sys.exit() too) is reported by every check; Ctrl-C stops
        if isinstance(exc, KeyboardInterrupt):
            raise
        return [], []
    missing = [name for name in surface if inspect.getattr_static(obj, name, _ABSENT) is _ABSENT]
    not_implemented: list[str] = []
    for name, args in probes.items():
        if name in missing:
            continue
        try:
            with time_limit(PROBE_TIMEOUT_S):  # an endless loop is for the checks to report, each on its own
                attr = getattr(make(*ctor_args), name)
                if args is not None:
                    attr(*args)
        except NotImplementedError as exc:
            where = raising_method(exc)
            if where not in not_implemented:
                not_implemented.append(where)
        except BaseException as exc:  # a written method may refuse the probe: the checks judge it
            if isinstance(exc, KeyboardInterrupt):
                raise
    return not_implemented, missing
