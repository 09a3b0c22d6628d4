"""docs/ARCHITECTURE.md cannot drift from the code: every file, module, class, function and method it names in
`code spans` exists, and its table of the KV contract names exactly the methods of `sim.kv.base.KVManager`.

What counts as a name: a span that is a path ending in .py or / (`sim/kv/paged.py`, `sim/testing/`), a bare file
name (`paged_runs.py`, found somewhere in the project), a dotted name under sim or reference
(`reference.threads.held_interrupts`), or Class.member (`Scheduler.abandon_step(plan)`: the class is found in the
project's sources). Paths of other projects (vllm/...) are left alone.
"""
from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGES = ("sim", "reference", "tools", "tests", "notebooks", "docs", "figures")
SPAN = re.compile(r"`([^`\n]+)`")


def spans() -> list[str]:
    return SPAN.findall(DOC.read_text())


def _project_files() -> list[Path]:
    return [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*") if "__pycache__" not in p.parts]


def _classes() -> dict[str, list[str]]:
    """class name -> the modules (dotted) that define it, from the sources of sim/ and reference/."""
    found: dict[str, list[str]] = {}
    for pkg in ("sim", "reference"):
        for path in (ROOT / pkg).rglob("*.py"):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for name in re.findall(r"^class (\w+)", path.read_text(), re.M):
                found.setdefault(name, []).append(module)
    return found


def _resolve_dotted(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def check_span(span: str, files: list[Path], classes: dict[str, list[str]]) -> str | None:
    """None if what `span` names exists (or it names nothing checkable); else why not."""
    text = span.strip()
    if text.startswith("vllm/") or " " in text or text.startswith(("-", "{", "|")):
        return None
    path_like = re.fullmatch(r"[\w./-]+(\.py|\.md|\.csv|\.json|/)", text)
    if path_like and "/" in text:  # from the root, or inside a package (`kv/base.py` in sim/)
        found = any((base / text).exists() for base in (ROOT, ROOT / "sim", ROOT / "reference", ROOT / "tests"))
        return None if found else f"no file {text}"
    if path_like and text.endswith(".py"):
        return None if any(p.name == text for p in files) else f"no file named {text} in the project"
    name = re.sub(r"\(.*\)$", "", text)  # a call: the callable's name
    if not re.fullmatch(r"[A-Za-z_][\w.]*", name) or "." not in name:
        return None
    head = name.split(".")[0]
    if head in ("sim", "reference"):
        return None if _resolve_dotted(name) else f"no {name}"
    if head in classes:
        rest = name.split(".")[1:]
        for module in classes[head]:
            obj = getattr(importlib.import_module(module), head)
            try:
                for attr in rest:
                    obj = getattr(obj, attr)
                return None
            except AttributeError:
                continue
        return f"no {name} (class {head} in {', '.join(classes[head])})"
    return None


def test_every_name_the_architecture_doc_gives_exists():
    files, classes = _project_files(), _classes()
    problems = sorted({p for s in spans() if (p := check_span(s, files, classes))})
    assert not problems, problems


def test_the_check_sees_a_name_that_does_not_exist():
    files, classes = _project_files(), _classes()
    assert check_span("sim/kv/nonexistent.py", files, classes) == "no file sim/kv/nonexistent.py"
    assert check_span("engine_gone.py", files, classes) == "no file named engine_gone.py in the project"
    assert check_span("Scheduler.no_such_method(plan)", files, classes).startswith("no Scheduler.no_such_method")
    assert check_span("sim.cli.no_such_thing", files, classes) == "no sim.cli.no_such_thing"
    assert check_span("Scheduler.schedule()", files, classes) is None


def _contract_table() -> list[str]:
    """The first and last columns of the KV contract's table: the methods it names."""
    text = DOC.read_text()
    start = text.index("| method | what it answers |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows += [cells[0], cells[-1]]
    return [m for cell in rows for m in re.findall(r"`([a-z_]+)", cell)]


def test_the_contract_table_names_exactly_the_protocol():
    from sim.kv.base import KVManager

    methods = {name for name, member in vars(KVManager).items()
               if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))}  # fmt: skip
    attributes = set(KVManager.__annotations__)
    named = set(_contract_table())
    assert named - methods - attributes == set(), "the table names what the Protocol lacks"
    assert methods - named == set(), "the Protocol has methods the table leaves out"


@pytest.mark.parametrize("path", ["docs/code.md", "docs/ARCHITECTURE.md"])
def test_the_map_of_folders_names_existing_files(path):
    """The map of the folders (a code block of `name   what it is` lines) names files that exist. README.md's map moved
    to docs/code.md, which must have it."""
    text = (ROOT / path).read_text()
    if "## Map of the folders" not in text and path != "docs/code.md":
        pytest.skip("no map")
    block = text.split("## Map of the folders", 1)[1].split("```", 2)[1]
    folder, missing = None, []
    for line in block.splitlines():
        m = re.match(r"^(\S+/)\s", line)
        if m:
            folder = m.group(1)
            continue
        m = re.match(r"^\s{2}(\w[\w.]*\.py)\b", line)
        if m and folder and not (ROOT / folder / m.group(1)).exists():
            missing.append(folder + m.group(1))
    assert not missing, missing
