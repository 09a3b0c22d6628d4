"""`--quick`: the edit-test loop (`make check`), a few minutes on 2 cores; `make test` runs everything.

Under `--quick` pytest keeps, of what it collected:

- no test marked `@pytest.mark.slow` (a test that takes more than a few seconds on 2 CPU cores: a whole notebook, a
  server process, a state machine of hundreds of programs, a command run in many processes);
- of a parametrized test, its first case only: every check runs once, on one example;
- and every test module at least once: a module all of whose tests are slow keeps its first one (the summary names
  it), so no module goes unrun however its tests are marked.

What is left out is reported as "deselected". `quick_selection` is the rule, tests/test_quick.py its tests.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import pytest

T = TypeVar("T")
RESCUED = pytest.StashKey[list]()  # the modules --quick kept through one slow test, for the summary line


def pytest_addoption(parser):
    parser.addoption(
        "--quick",
        action="store_true",
        default=False,
        help="the edit-test loop (make check): no slow tests, the first case of each parametrized test, "
        "every test module at least once (tests/conftest.py)",
    )


def quick_selection(
    items: Sequence[T], module: Callable[[T], str], function: Callable[[T], str], slow: Callable[[T], bool]
) -> tuple[list[T], list[str]]:
    """(the items kept, in their order; the modules kept only through one of their slow tests).

    `module` and `function` name an item's file and its test function (the cases of one parametrized test share
    both); `slow` says whether it is marked slow."""
    kept, seen, fallback = [], set(), {}
    for item in items:
        key = (module(item), function(item))
        if key in seen:
            continue  # a later case of a parametrized test
        if slow(item):
            fallback.setdefault(module(item), item)
            continue
        seen.add(key)
        kept.append(item)
    covered = {module(item) for item in kept}
    rescued = [m for m in fallback if m not in covered]
    chosen = set(map(id, kept)) | {id(fallback[m]) for m in rescued}
    return [item for item in items if id(item) in chosen], rescued


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--quick"):
        return
    kept, rescued = quick_selection(
        items,
        module=lambda item: str(item.path),
        function=lambda item: (
            f"{item.cls.__qualname__ + '.' if item.cls else ''}{getattr(item, 'originalname', item.name)}"
        ),
        slow=lambda item: item.get_closest_marker("slow") is not None,
    )
    config.stash[RESCUED] = rescued
    chosen = set(map(id, kept))
    deselected = [item for item in items if id(item) not in chosen]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def pytest_terminal_summary(terminalreporter, config):
    rescued = config.stash.get(RESCUED, [])
    if rescued:
        terminalreporter.write_line(
            f"--quick ran one slow test of each module whose tests are all slow: {', '.join(rescued)}"
        )
