"""How readable is the core? Counts what a student meets reading the serving path, and the rot around it.

    .venv/bin/python tools/core_report.py [--json]

- core path: the files of the concepts a request goes through (the block allocator, the KV contract, the paged
  manager, the scheduler, its waiting queue, sequences, the plan, preemption, the event loop, the engine's step),
  each matched by name so that a concept split over several files counts all of them; lines of code exclude blank
  lines, comments and docstrings;
- mixins: classes that read a private attribute (`self._x`) that neither they nor any class they inherit from
  (followed through the project's imports) defines: they borrow the state of a class they are mixed into;
- private names imported across modules: `from m import _name` where m is a module of this project;
- the fast plane's private reads: in sim/fast/ (the speed machinery beside the core), any private name it imports
  from outside the package or reads on an object other than its own (`obj._x`, not `self._x`): the fast plane
  reaches the core through public calls only (docs/ARCHITECTURE.md, "The fast plane");
- import circles: groups of modules of `sim/` or `reference/` that import each other (imports inside functions
  count: they hide a circle, they do not remove it).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "reference")
FAST = "sim.fast"  # the fast plane's package
# the concepts of the core path, each a glob: a concept cut into several files counts them all
CORE = (
    "sim/kv/blocks.py",
    "sim/kv/base.py",
    "sim/kv/paged*.py",
    "sim/scheduling/scheduler*.py",
    "sim/scheduling/request_queue.py",
    "sim/scheduling/sequence.py",
    "sim/scheduling/plan.py",
    "sim/scheduling/preemption.py",
    "sim/clock/loop.py",
    "reference/engine/engine*.py",
)


def code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not inside a docstring."""
    tree = ast.parse(source)
    doc_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                doc_lines.update(range(first.lineno, first.end_lineno + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (
            tokenize.COMMENT,
            tokenize.NL,
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
            tokenize.ENDMARKER,
        ):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - doc_lines)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module a `from ... import` in `module` names (relative imports made absolute)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(mods: dict[str, Path]) -> dict[str, list[tuple[str, str]]]:
    """module -> [(imported module, imported name or "")] for every import of a project module, anywhere in the file."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name, path in mods.items():
        tree, edges = ast.parse(path.read_text()), []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges += [(a.name, "") for a in node.names if a.name.split(".")[0] in PACKAGES]
            elif isinstance(node, ast.ImportFrom):
                target = resolve(name, path.name == "__init__.py", node)
                if target.split(".")[0] not in PACKAGES:
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    edges.append((sub, "") if sub in mods else (target, alias.name))
        out[name] = edges
    return out


def private_imports(mods, edges) -> list[str]:
    return sorted(
        f"{m}: from {t} import {n}"
        for m, es in edges.items()
        for t, n in es
        if n.startswith("_") and not n.startswith("__") and t in mods
    )


def fast_plane_private(mods, edges) -> list[str]:
    """Private names the fast plane imports from outside its package, or reads on another object."""
    found = [
        f"{m}: from {t} import {n}"
        for m, es in edges.items()
        if m == FAST or m.startswith(FAST + ".")
        for t, n in es
        if n.startswith("_") and not n.startswith("__") and not t.startswith(FAST)
    ]
    for name, path in mods.items():
        if not (name == FAST or name.startswith(FAST + ".")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def circles(mods, edges) -> list[list[str]]:
    """Strongly connected components (Tarjan) of more than one module; a package's __init__ re-exporting its
    own submodules is not a circle of the submodules (edges from a package into itself are left out)."""
    graph = {
        m: sorted({t for t, _ in es if t in mods and t != m and not t.startswith(m + ".")}) for m, es in edges.items()
    }
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return sorted(out)


def _class_facts(mods) -> dict[tuple[str, str], tuple[set[str], set[str], list[tuple[str, str]]]]:
    """(module, class) -> (private names it defines, private names it reads on self, its bases as (module, name))."""
    facts = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        imported = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = resolve(name, path.name == "__init__.py", node)
                for alias in node.names:
                    imported[alias.asname or alias.name] = (target, alias.name)
        for cls in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
            defined, read = set(), set()
            for node in ast.walk(cls):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node in cls.body:
                    defined.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                    (defined if isinstance(node.ctx, ast.Store) else read).add(node.attr)
            for node in cls.body:
                targets = (
                    node.targets
                    if isinstance(node, ast.Assign)
                    else [node.target]
                    if isinstance(node, ast.AnnAssign)
                    else []
                )
                defined.update(t.id for t in targets if isinstance(t, ast.Name))
            bases = []
            for b in cls.bases:
                if isinstance(b, ast.Name):
                    bases.append(imported.get(b.id, (name, b.id)))
            facts[(name, cls.name)] = (
                {d for d in defined if d.startswith("_")},
                {r for r in read if r.startswith("_") and not r.startswith("__")},
                bases,
            )
    return facts


def mixins(mods) -> list[str]:
    facts = _class_facts(mods)

    def defined(key, seen=()):
        if key not in facts or key in seen:
            return set()
        own, _, bases = facts[key]
        return own.union(*[defined(b, (*seen, key)) for b in bases])

    return sorted(
        f"{m}.{c} reads {', '.join(sorted(read - defined((m, c))))}"
        for (m, c), (_, read, _) in facts.items()
        if read - defined((m, c))
    )


def core() -> list[tuple[str, int, int]]:
    rows = []
    for pattern in CORE:
        for path in sorted(ROOT.glob(pattern)):
            text = path.read_text()
            rows.append((str(path.relative_to(ROOT)), len(text.splitlines()), code_lines(text)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    args = parser.parse_args(argv)
    mods = modules()
    edges = imports(mods)
    report = {
        "core_files": core(),
        "mixins": mixins(mods),
        "private_imports": private_imports(mods, edges),
        "fast_plane_private": fast_plane_private(mods, edges),
        "circles": circles(mods, edges),
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    files = report["core_files"]
    print(f"core path: {len(files)} files, {sum(f[1] for f in files):,} lines, {sum(f[2] for f in files):,} of code")
    for path, lines, code in files:
        print(f"  {path:32s} {lines:5d} lines {code:5d} code")
    for key, title in (
        ("mixins", "mixins"),
        ("private_imports", "private names imported across modules"),
        ("fast_plane_private", "private names the fast plane reads"),
        ("circles", "import circles"),
    ):
        print(f"{title}: {len(report[key])}")
        for item in report[key]:
            print(f"  {' <-> '.join(item) if isinstance(item, list) else item}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
