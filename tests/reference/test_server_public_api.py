"""reference/server/ reads the engine only through its public API: no file of it imports a private name or reads a
private attribute of another object (its own `self._x` and `cls._x` are its business).

Python's dunder names (`__name__`, `__class__`, ...) are its public protocol, not private, and are allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVER = Path(__file__).resolve().parents[2] / "reference" / "server"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_reads(source: str) -> list[str]:
    """'line: what' for every private name imported and every private attribute read on something not self/cls,
    spelled as an attribute or as getattr's, setattr's or hasattr's constant string."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            found += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names if _private(a.name)]
            if node.module and any(_private(part) for part in node.module.split(".")):
                found.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [
                f"{node.lineno}: import {a.name}"
                for a in node.names
                if any(_private(part) for part in a.name.split(".")[1:])
            ]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls"))
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda line: int(line.split(":")[0]))


@pytest.mark.parametrize("path", sorted(SERVER.glob("*.py")), ids=lambda p: p.name)
def test_the_server_reads_the_engine_through_its_public_api(path):
    assert private_reads(path.read_text()) == [], path.name


def test_the_check_finds_each_kind_of_private_read():
    source = (
        "from reference.engine.engine import _checked\nfrom reference._impl import x\nimport reference._impl\n"
        "llm._scheduler.step()\ngetattr(llm, '_queue')\nself._lock\ncls._count\nllm.__class__\n"
    )
    assert private_reads(source) == [
        "1: from reference.engine.engine import _checked",
        "2: from reference._impl import ...",
        "3: import reference._impl",
        "4: llm._scheduler",
        "5: getattr(llm, '_queue')",
    ]
