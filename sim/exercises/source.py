"""Reading a submission: a .py module or an .ipynb notebook, and the exercise's class inside it.

- A module (.py) runs as Python imports it, under the name `submission` (so an `if __name__ == "__main__":`
  block does not run).
- A notebook (.ipynb) is NOT executed cell by cell. Its code cells are parsed in order and only definitions
  are kept: imports, classes, functions, and assignments that call nothing (constants, `MyClass.free = free`).
  Everything else is dropped (the `check(...)` cell, plots, prints, experiments), and so are IPython lines
  (`%magic`, `!shell`). NOTE: why not run the notebook: the class is all the grader needs; the other cells
  would make grading slow, could fail for reasons that have nothing to do with the exercise (a missing file,
  a plot backend), and the `check` cell would grade the class a second time. A later definition replaces an
  earlier one, as it does when the kernel runs top to bottom.

Every way a submission can be unusable (no such file, not valid Python, no class) is a `SubmissionError`:
one line saying what is wrong.
"""
from __future__ import annotations

import ast
import inspect
import json
import sys
import types
from pathlib import Path
from typing import Any

MODULE_NAME = "submission"


class SubmissionError(ValueError):
    """The submission cannot be graded; the message is one line saying why."""


def load(path: Path) -> dict[str, Any]:
    """The namespace a submission defines (see the module docstring for what runs)."""
    if not path.is_file():
        raise SubmissionError(f"no such file: {path} (expected a .py module or an .ipynb notebook)")
    if path.suffix not in (".py", ".ipynb"):
        found = path.suffix or "no suffix"
        raise SubmissionError(f"{path}: expected a .py module or an .ipynb notebook, found {found}")
    module = types.ModuleType(MODULE_NAME)
    module.__file__ = str(path)
    sys.modules[MODULE_NAME] = module  # NOTE: @dataclass and pickling look the class's module up by name
    sys.path.insert(0, str(path.parent))  # a module may import a helper file submitted beside it
    try:
        if path.suffix == ".ipynb":
            for code in _notebook_definitions(path):
                exec(code, module.__dict__)
        else:
            exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), module.__dict__)
    except SubmissionError:
        raise
    except SyntaxError as exc:
        raise SubmissionError(f"{path}: line {exc.lineno}: SyntaxError: {exc.msg}") from exc
    except Exception as exc:  # noqa: BLE001  (the submission's own error, told in one line)
        raise SubmissionError(f"{path}: running it raised {type(exc).__name__}: {exc}") from exc
    finally:
        sys.path.remove(str(path.parent))
    return module.__dict__


def find_class(namespace: dict[str, Any], class_name: str, methods: tuple[str, ...], path: Path) -> type:
    """`class_name` if the submission defines it, else the one class it defines with all of `methods`."""
    found = namespace.get(class_name)
    if inspect.isclass(found):
        return found
    own = [v for v in namespace.values() if inspect.isclass(v) and v.__module__ == MODULE_NAME]
    fits = [c for c in own if all(inspect.getattr_static(c, m, None) is not None for m in methods)]
    if len(fits) == 1:
        return fits[0]
    wanted = ", ".join(methods)
    if not fits:
        raise SubmissionError(f"{path}: no class {class_name} found (nor any other class defining {wanted})")
    names = ", ".join(sorted(c.__name__ for c in fits))
    raise SubmissionError(f"{path}: no class {class_name} found, and several classes define {wanted}: {names}")


def _notebook_definitions(path: Path) -> list[types.CodeType]:
    """The definitions of each code cell, compiled with the cell's own line numbers ("<path> cell 3", line 12)."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SubmissionError(f"{path}: not a Jupyter notebook (no readable 'cells' list): {exc}") from exc
    kept: list[types.CodeType] = []
    for number, cell in enumerate(cells, 1):
        if cell.get("cell_type") != "code":
            continue
        text = cell.get("source", "")
        text = "".join(text) if isinstance(text, list) else text
        lines = [("pass" if line.lstrip().startswith(("%", "!")) else line) for line in text.splitlines()]
        try:
            tree = ast.parse("\n".join(lines))
        except SyntaxError as exc:
            raise SubmissionError(f"{path}: code cell {number}, line {exc.lineno}: SyntaxError: {exc.msg}") from exc
        body = [node for node in tree.body if _is_definition(node)]
        kept.append(compile(ast.Module(body=body, type_ignores=[]), f"{path} cell {number}", "exec"))
    return kept


def _is_definition(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        return node.value is not None and not any(isinstance(n, (ast.Call, ast.Await)) for n in ast.walk(node.value))
    return False
