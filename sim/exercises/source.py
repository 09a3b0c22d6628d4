"""Reading a submission: a .py module or an .ipynb notebook, and the exercise's class inside it.

- A module (.py) runs as Python imports it, under the name `submission` (so an `if __name__ == "__main__":`
  block does not run).
- A notebook (.ipynb) is NOT executed cell by cell. Its code cells are parsed in order and what the student's
  code needs is kept, statement by statement:

  * in a cell that defines a class or a function (where the student's code lives): every top-level definition,
    import and assignment, whatever its value calls (`MIN_SIZES = list(range(1, 2))`, `TABLE = build()`,
    `MyClass.free = free`), and the `if` / `try` / `with` blocks around definitions (a guarded import);
  * in any other cell: imports, constant assignments (no call, index, attribute or comprehension in the value), and
    any other assignment only when kept code reads the name it binds (a constant computed in a cell of its own);
  * never: bare expressions (the `check(...)` cell, plots, prints), loops, IPython lines (`%magic`, `!shell`), and
    an assignment whose value calls the grader itself (`report = check(...)`).

  Each kept statement runs on its own, in notebook order (a later definition replaces an earlier one, as when the
  kernel runs top to bottom). A statement that raises is skipped, and so is a cell that does not parse: each with
  ONE line in the feedback saying which cell (its number and first line) and why, and grading goes on. A name the
  student's code later misses is explained (`explain_name_error`): where the notebook binds it and why that was
  not run, or that nothing binds it.

  NOTE: why not run the notebook (or the class's cells) as the student did: the other cells would make grading
  slow, could fail for reasons that have nothing to do with the exercise (a missing file, a plot backend), the
  `check` cell would grade the class a second time, and a kernel's out-of-order history cannot be replayed anyway.
  Keeping every definition and assignment of the student's cells, plus whatever they read from other cells, gives
  the class everything it can see at module level, without the experiments around it.

Every way a submission can be unusable (no such file, a module that is not valid Python, no class) is a
`SubmissionError`: one line saying what is wrong (with the notebook's skipped cells, if any).
"""
from __future__ import annotations

import ast
import inspect
import json
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .limits import CheckTimeout
from .referee import student_text

MODULE_NAME = "submission"
NOTES = "__grader_notes__"  # the namespace's list of skipped cells and statements, one line each
ORIGINS = "__grader_origins__"  # name -> why the notebook's binding of it did not run (explain_name_error)
GRADER_CALLS = frozenset({"check", "grade"})  # an assignment calling these would grade inside the grade


class SubmissionError(ValueError):
    """The submission cannot be graded; the message is one line saying why."""


def load(path: Path) -> dict[str, Any]:
    """The namespace a submission defines (see the module docstring for what runs). A notebook's namespace holds,
    under NOTES, the one-line notes on what was skipped (`notes(namespace)`)."""
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
            _run_notebook(path, module.__dict__)
        else:
            exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), module.__dict__)
    except SubmissionError:
        raise
    except SyntaxError as exc:
        raise SubmissionError(f"{path}: line {exc.lineno}: SyntaxError: {exc.msg}") from exc
    except NameError as exc:
        raise SubmissionError(f"{path}: running it raised {explain_name_error(exc)}") from exc
    except BaseException as exc:  # the submission's own error (sys.exit() too), told in one line; Ctrl-C stops
        if isinstance(exc, (KeyboardInterrupt, CheckTimeout)):
            raise
        raise SubmissionError(f"{path}: running it raised {_raised(exc)}") from exc
    finally:
        sys.path.remove(str(path.parent))
    if path.suffix != ".ipynb":
        module.__dict__[NOTES] = []  # a module's own `__grader_notes__` is not the grader's
    return module.__dict__


def notes(namespace: dict[str, Any]) -> list[str]:
    """The one-line notes `load` left on a notebook's namespace (skipped cells and statements); [] for a module."""
    found = namespace.get(NOTES)
    return [n for n in found if isinstance(n, str)] if isinstance(found, list) else []


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
    skipped = notes(namespace)
    why = f" ({'; '.join(skipped)})" if skipped else ""
    if not fits:
        raise SubmissionError(f"{path}: no class {class_name} found (nor any other class defining {wanted}){why}")
    names = ", ".join(sorted(c.__name__ for c in fits))
    raise SubmissionError(f"{path}: no class {class_name} found, and several classes define {wanted}: {names}")


def explain_name_error(exc: NameError, namespace: dict[str, Any] | None = None) -> str:
    """One actionable line for a NameError raised by the student's code: which name, and where the notebook binds
    it but the grader did not run it (a skipped cell, a statement that raised, a loop), or that nothing binds it.
    `namespace`: the submission's globals; by default read off the innermost frame of the traceback."""
    name = getattr(exc, "name", None) or _name_in_message(str(exc))
    if namespace is None:
        namespace = _innermost_globals(exc)
    origins = (namespace or {}).get(ORIGINS, {})
    if name is None:
        return f"NameError: {exc} (define or import it at the top level of the cell with your class)"
    if name in origins:
        return f"NameError: name {name!r} is not defined when the grader runs your code: {origins[name]}"
    return (f"NameError: name {name!r} is not defined: nothing in your submission defines or imports {name} at the "
            f"top level (define it in the cell with your class, or import it there)")


# --- notebooks ---------------------------------------------------------------------------------------------------
@dataclass
class _Statement:
    node: ast.stmt
    cell: int  # the code cell's number (1-based, counting every cell, as Jupyter's order shows them)
    first_line: str  # the cell's first non-empty line, to name the cell in a note
    binds: set[str] = field(default_factory=set)
    reads: set[str] = field(default_factory=set)


def _run_notebook(path: Path, namespace: dict[str, Any]) -> None:
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise SubmissionError(f"{path}: not a Jupyter notebook (no readable 'cells' list): {exc}") from exc
    if not isinstance(cells, list):
        raise SubmissionError(f"{path}: not a Jupyter notebook ('cells' is a {type(cells).__name__}, not a list)")
    skipped: list[str] = []
    origins: dict[str, str] = {}
    namespace[ORIGINS] = origins  # NOTE: the notes join the namespace only at the end: the code run cannot edit them
    kept = _kept_statements(path, cells, skipped, origins)
    for s in kept:
        code = compile(ast.Module(body=[s.node], type_ignores=[]), f"{path} cell {s.cell}", "exec")
        try:
            exec(code, namespace)
        except BaseException as exc:  # noted, and grading goes on (sys.exit() in a cell too); Ctrl-C stops
            if isinstance(exc, (KeyboardInterrupt, CheckTimeout)):
                raise
            line = s.node.lineno
            what = explain_name_error(exc, namespace) if isinstance(exc, NameError) else _raised(exc)
            skipped.append(f"skipped line {line} of code cell {s.cell} ({s.first_line!r}): it raised {what}")
            for name in s.binds:
                origins.setdefault(name, f"it is bound in code cell {s.cell} ({s.first_line!r}), line {line}, which "
                                         f"raised {type(exc).__name__} when the grader ran it")
    namespace[NOTES] = list(skipped)


def _raised(exc: BaseException) -> str:
    """What a submission's code raised, in one line (a SystemExit as the sys.exit() it came from)."""
    if isinstance(exc, SystemExit):
        return f"SystemExit: it called sys.exit({student_text(exc.code, use_repr=True)})"
    text = student_text(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _kept_statements(path: Path, cells: list, skipped: list[str], origins: dict[str, str]) -> list[_Statement]:
    """The statements to run, in notebook order (see the module docstring); notes skipped cells on the way."""
    always: list[_Statement] = []  # kept whatever they read
    maybe: list[_Statement] = []  # assignments that compute, outside the definition cells: kept if their name is read
    for number, cell in enumerate(cells, 1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        text = cell.get("source", "")
        text = "".join(text) if isinstance(text, list) else str(text)
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        first = first if len(first) <= 60 else first[:57] + "..."
        lines = [("pass" if line.lstrip().startswith(("%", "!")) else line) for line in text.splitlines()]
        try:
            tree = ast.parse("\n".join(lines))
        except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:  # (a null byte, a lone surrogate,
            # an expression nested past the parser's depth): the cell is skipped, never the notebook
            why = (f"line {exc.lineno}: SyntaxError: {exc.msg}" if isinstance(exc, SyntaxError)
                   else f"{type(exc).__name__}: {student_text(exc) or 'Python cannot parse it'}")
            skipped.append(f"skipped code cell {number} ({first!r}): {why}")
            for name in _names_in_unparsable(text):
                origins.setdefault(name, f"it is defined in code cell {number} ({first!r}), which the grader skipped "
                                         f"({why}); fix that cell")
            continue
        defines = any(isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) for n in tree.body)
        for node in tree.body:
            s = _Statement(node, number, first, _binds(node), _reads(node))
            kind = _kind(node, defines)
            if kind == "keep":
                always.append(s)
            elif kind == "if read":
                maybe.append(s)
            else:
                for name in s.binds:
                    origins.setdefault(name, f"it is bound in code cell {number} ({first!r}), line {node.lineno}, in "
                                             f"a statement the grader does not run ({_dropped_why(node)}); bind it "
                                             f"at the top level of the cell with your class")
    # NOTE: a computed constant may read another computed constant: follow the names read, each once (a work list:
    # a chain of N constants is N steps, where a pass per link was N^2, and N = 2,000 ran for minutes)
    binders: dict[str, list[_Statement]] = {}
    for s in maybe:
        for name in s.binds:
            binders.setdefault(name, []).append(s)
    needed = set().union(*(s.reads for s in always)) if always else set()
    todo, chosen, chosen_ids = list(needed), [], set()
    while todo:
        for s in binders.get(todo.pop(), ()):
            if id(s) not in chosen_ids:
                chosen_ids.add(id(s))
                chosen.append(s)
                todo += [name for name in s.reads if name not in needed]
                needed |= s.reads
    for s in maybe:
        if id(s) not in chosen_ids:
            for name in s.binds:
                origins.setdefault(name, f"it is bound in code cell {s.cell} ({s.first_line!r}), line {s.node.lineno}, "
                                         f"which the grader does not run (no top-level code it runs reads {name}); "
                                         f"bind it in the cell with your class")
    order = {id(s.node): i for i, s in enumerate(always + maybe)}
    runs = sorted(always + chosen, key=lambda s: (s.cell, order[id(s.node)]))
    for s in runs:  # bound by a statement that runs: a dropped binding elsewhere is not the story
        for name in s.binds:
            origins.pop(name, None)
    return runs


_DEFINITIONS = (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_ASSIGNMENTS = (ast.Assign, ast.AnnAssign, ast.AugAssign)


def _kind(node: ast.stmt, in_definition_cell: bool) -> str:
    """'keep', 'if read' (an assignment that computes, outside the definition cells) or 'drop'."""
    if isinstance(node, _DEFINITIONS):
        return "keep"
    if isinstance(node, _ASSIGNMENTS):
        if node.value is None:  # `x: int`
            return "keep"
        if _calls_grader(node.value):
            return "drop"
        if in_definition_cell or not _computes(node.value):
            return "keep"
        return "if read"
    if in_definition_cell and isinstance(node, (ast.If, ast.Try, ast.With)) and _only_definitions(node):
        return "keep"
    return "drop"


def _only_definitions(node: ast.stmt) -> bool:
    """A block holding only definitions, imports, assignments, `pass` and nested such blocks (a guarded import)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.stmt):
            if isinstance(child, _DEFINITIONS + _ASSIGNMENTS + (ast.Pass,)):
                continue
            if isinstance(child, (ast.If, ast.Try, ast.With)) and _only_definitions(child):
                continue
            return False
        if isinstance(child, ast.ExceptHandler) and not all(
            isinstance(c, _DEFINITIONS + _ASSIGNMENTS + (ast.Pass,)) for c in child.body
        ):
            return False
    return True


_COMPUTATIONS = (ast.Call, ast.Await, ast.Subscript, ast.Attribute, ast.ListComp, ast.SetComp, ast.DictComp,
                 ast.GeneratorExp)


def _computes(expr: ast.AST) -> bool:
    """Whether a value is more than a constant: it calls, indexes, reads an attribute or loops (a comprehension).
    `N = 4` and `SIZES = [1, N]` are constants; `chunks = [r.x for r in engines["a"].log]` reads an experiment's
    results, which the grader did not run."""
    return any(isinstance(n, _COMPUTATIONS) for n in ast.walk(expr))


def _calls_grader(expr: ast.AST) -> bool:
    for n in ast.walk(expr):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in GRADER_CALLS:
                return True
    return False


def _binds(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
    found = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, _ASSIGNMENTS) else []
    for target in targets:  # `MyClass.free = free`, `TABLE[k] = v`: they change MyClass, TABLE
        while isinstance(target, (ast.Attribute, ast.Subscript)):
            target = target.value
        if isinstance(target, ast.Name):
            found.add(target.id)
    return found


def _reads(node: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _dropped_why(node: ast.stmt) -> str:
    if isinstance(node, _ASSIGNMENTS):
        return "it calls the grader"
    return f"a top-level `{type(node).__name__.lower()}` block"


_TOP_LEVEL_NAME = re.compile(r"^(?:class|def|async def)\s+(\w+)|^(\w+)\s*(?::[^=]*)?=(?!=)", re.MULTILINE)


def _names_in_unparsable(text: str) -> set[str]:
    """The names a cell that does not parse seems to bind at its top level (class X, def f, NAME = ...)."""
    return {a or b for a, b in _TOP_LEVEL_NAME.findall(text)}


def _name_in_message(message: str) -> str | None:
    found = re.search(r"name '(\w+)' is not defined", message)
    return found.group(1) if found else None


def _innermost_globals(exc: BaseException) -> dict[str, Any] | None:
    tb, found = exc.__traceback__, None
    while tb is not None:
        if ORIGINS in tb.tb_frame.f_globals:
            found = tb.tb_frame.f_globals
        tb = tb.tb_next
    return found
