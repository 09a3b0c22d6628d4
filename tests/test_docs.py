"""docs/ARCHITECTURE.md cannot drift from the code: every file, module, class, function and method it names in
`code spans` exists, and its table of the KV contract names exactly the methods of `sim.kv.base.KVManager`.

What counts as a name: a span that is a path ending in .py or / (`sim/kv/paged.py`, `sim/testing/`), a bare file
name (`paged_runs.py`, found somewhere in the project), a dotted name under sim or reference
(`reference.engine.threads.held_interrupts`), or Class.member (`Scheduler.abandon_step(plan)`: the class is found in the
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
    assert check_span("sim.drivers.cli.no_such_thing", files, classes) == "no sim.drivers.cli.no_such_thing"
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

    methods = {
        name
        for name, member in vars(KVManager).items()
        if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
    }
    attributes = set(KVManager.__annotations__)
    named = set(_contract_table())
    assert named - methods - attributes == set(), "the table names what the Protocol lacks"
    assert methods - named == set(), "the Protocol has methods the table leaves out"


def _map_blocks(text: str) -> dict[str, dict[str, str]]:
    """The map of the folders (a code block after "## Map of the folders"): top folder -> {entry: its text}, where an
    entry is a name at a two-space indent (`kv/`, `config.py`) and its text runs on over the more indented lines."""
    block = text.split("## Map of the folders", 1)[1].split("```", 2)[1]
    tops: dict[str, dict[str, str]] = {}
    top = entry = None
    for line in block.splitlines():
        if m := re.match(r"^(\S+/)(\s|$)", line):
            top, entry = m.group(1), None
            tops[top] = {}
        elif (m := re.match(r"^ {2}(\S+)(.*)$", line)) and top:
            entry = m.group(1)
            tops[top][entry] = m.group(2)
        elif top and entry:
            tops[top][entry] += " " + line.strip()
    return tops


@pytest.mark.parametrize("path", ["docs/code.md", "docs/ARCHITECTURE.md"])
def test_the_map_of_folders_names_existing_files(path):
    """The map of the folders names files that exist: each entry (`kv/`, `api.py`) in its folder, and each file its
    text names (`paged.py` in kv/'s text: in kv/; `disagg.py` in api.py's: beside it). README.md's map moved to
    docs/code.md, which must have it."""
    text = (ROOT / path).read_text()
    if "## Map of the folders" not in text and path != "docs/code.md":
        pytest.skip("no map")
    missing = []
    for top, entries in _map_blocks(text).items():
        for entry, words in entries.items():
            if not (ROOT / top / entry).exists():
                missing.append(top + entry)
            here = top + entry if entry.endswith("/") else top
            for name in re.findall(r"(?<![\w/.])([\w/]+\.py)\b", words):
                if not ((ROOT / here / name).exists() or (ROOT / top / name).exists()):
                    missing.append(f"{here}{name} (named in {top}{entry}'s text)")
    assert not missing, missing


@pytest.mark.parametrize("package", ["sim", "reference"])
def test_the_map_of_folders_names_every_folder_and_module_at_the_top(package):
    """`ls sim` and `ls reference` are what docs/code.md's map draws: every folder and module at the top of the package
    is an entry of the map or named in an entry's text (its __init__.py and __main__.py aside)."""
    entries = _map_blocks((ROOT / "docs" / "code.md").read_text())[package + "/"]
    named = set(entries) | {n for words in entries.values() for n in re.findall(r"(?<![\w/.])([\w]+\.py)\b", words)}
    on_disk = {
        p.name + "/" if p.is_dir() else p.name
        for p in (ROOT / package).iterdir()
        if p.name not in ("__pycache__", "__init__.py", "__main__.py") and (p.is_dir() or p.suffix == ".py")
    }
    assert on_disk - named == set(), f"{package}/ holds what docs/code.md's map does not name"
