"""The referee: a stand-in for the student's allocator that passes every call through and watches the rules.

Every check builds the student's class through `Referee(obj, rules)`, so whatever the examples and the state
machines call goes through here first. The referee

1. remembers which call is in progress, so when the student's code raises, the feedback names the CALL
   (`free([0, 5])`), not only the line inside it (`exercise_call(exc)`);
2. enforces all-or-nothing: before each mutating call it snapshots what the allocator reports (free counts,
   reference counts, free runs ...); if the call raises, the snapshot afterwards must be the same. A refused
   `free([0, 0])` on a block with one owner that already freed block 0 is broken (`RuleBroken`), whatever
   check made the call;
3. optionally runs an oracle beside the student's allocator (the slot exercises' placement rules, see
   `placement.py`) and compares each answer, and the free runs after it, with the oracle's.

    student = Referee(MyBlockAllocator(4, 16), BLOCK_RULES)
    student.free([0, 0])   # RuleBroken: "free([0, 0]) raised RuntimeError ... but changed the allocator ..."

# NOTE: a proxy, not a subclass, so it works on any class or factory the student hands in (and sees calls the
# class makes through its own `self` only from the outside: `copy_on_write(3)` is the call, even if the error
# came from the `allocate` it calls inside).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .limits import beat


class RuleBroken(AssertionError):
    """A rule of the exercise broke during a call; the message names the call and the rule."""


MAX_TEXT = 2_000  # characters of one value or message of the student's code in the feedback


def student_text(value: Any, use_repr: bool = False) -> str:
    """str() (or repr()) of something the student's code made (an exception, a return value), for the feedback:
    never raises (a __str__ with a typo in it is the student's bug to be told, not the grader's crash), and is cut
    to MAX_TEXT characters (a 20 MB message would be repeated in every line that quotes it)."""
    try:
        text = repr(value) if use_repr else str(value)
        if not isinstance(text, str):
            raise TypeError(f"it returned a {type(text).__name__}")
    except Exception as exc:  # noqa: BLE001 - said instead
        return f"<a {type(value).__name__} whose {'repr' if use_repr else 'str'}() raised {type(exc).__name__}>"
    return text if len(text) <= MAX_TEXT else f"{text[:MAX_TEXT]}... ({len(text):,} characters)"


def steers_hypothesis(exc: BaseException) -> bool:
    """Whether the student's code raised one of hypothesis's own exceptions (reject(), assume(False), StopTest):
    hypothesis would take it as the grader's and drop the example, so a class could hide the programs it fails."""
    return type(exc).__module__.split(".")[0] == "hypothesis"


def _refuse_steering(exc: BaseException, call: str) -> None:
    if steers_hypothesis(exc):
        raise RuleBroken(f"{call}: your code raised hypothesis's {type(exc).__name__} (reject(), assume()): only "
                         f"the grader may steer hypothesis") from None


@dataclass(frozen=True, slots=True)
class Rules:
    mutating: tuple[str, ...]  # the calls that change the allocator (snapshotted, and logged)
    snapshot: Callable[[Any], dict[str, Any]]  # what the allocator reports, read without going through the referee
    quiet: tuple[str, ...] = ()  # mutating calls that answer nothing (shown without "-> None")


def block_snapshot(a: Any) -> dict[str, Any]:
    n = a.num_blocks
    shot = {"num_free_blocks": a.num_free_blocks, "ref counts": [a.ref_count(b) for b in range(n)]}
    if getattr(a, "enable_prefix_caching", False):
        shot["cached"] = [b for b in range(n) if a.is_cached(b)]
        shot["(hits, misses)"] = (a.num_prefix_hits, a.num_prefix_misses)
    return shot


def slot_snapshot(a: Any) -> dict[str, Any]:
    return {"free_runs()": a.free_runs(), "num_free_slots": a.num_free_slots}


BLOCK_RULES = Rules(("allocate", "share", "free", "copy_on_write", "cache_block", "lookup"), block_snapshot,
                    quiet=("share", "free", "cache_block"))
SLOT_RULES = Rules(("allocate", "free"), slot_snapshot, quiet=("free",))
# For a lab whose class computes answers (a scheduler step, attention): nothing snapshotted, calls still named.
NO_RULES = Rules((), lambda a: {})


def format_call(method: str, args: tuple) -> str:
    return f"{method}({', '.join(_short(a) for a in args)})"


def _short(arg: Any) -> str:
    """repr(arg), but an array (numpy, torch) as its type and shape: its values would fill the feedback."""
    if hasattr(arg, "shape") and hasattr(arg, "dtype"):
        return f"<{type(arg).__name__} {list(arg.shape)} {arg.dtype}>"
    return repr(arg)


def exercise_call(exc: BaseException) -> str | None:
    """The call (`free([0, 5])`) during which `exc` left the student's code, if a referee saw it."""
    return getattr(exc, "_exercise_call", None)


def tag_exercise_call(exc: BaseException, call: str) -> None:
    """Remember on `exc` the call it left the student's code through (`exercise_call` reads it); an exception
    already tagged keeps its call."""
    if exercise_call(exc) is None:
        try:
            exc._exercise_call = call  # type: ignore[attr-defined]
        except (AttributeError, TypeError):  # NOTE: an exception type with __slots__ cannot carry it
            pass


class Referee:
    """Passes attribute reads and method calls through to `target`; see the module docstring."""

    # NOTE: the referee's own state, named `_referee_*` so that no name of the student's class is hidden behind it.
    # __init__ sets it with object.__setattr__, as this class's __setattr__ writes to the target.
    _referee_target: Any  # the student's object
    _referee_rules: Rules  # what a mutating call is, and what is snapshotted around it
    _referee_placement: Any  # None, or an oracle beside the target and the rule it checks (placement.py)
    referee_calls: list[str]  # the mutating calls so far, "allocate(2) -> [0, 1]"

    def __init__(self, target: Any, rules: Rules, placement: Any = None) -> None:
        object.__setattr__(self, "_referee_target", target)
        object.__setattr__(self, "_referee_rules", rules)
        object.__setattr__(self, "_referee_placement", placement)
        object.__setattr__(self, "referee_calls", [])

    def __getattr__(self, name: str) -> Any:
        target = object.__getattribute__(self, "_referee_target")
        try:
            value = getattr(target, name)  # a property runs here
        except BaseException as exc:  # (tagged, then passed on unchanged)
            _refuse_steering(exc, name)
            tag_exercise_call(exc, name)
            raise
        if not callable(value) or name.startswith("_"):
            return value
        return lambda *args: self._referee_call(name, value, args)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_referee_target"), name, value)

    def __repr__(self) -> str:
        return repr(object.__getattribute__(self, "_referee_target"))

    def _referee_call(self, name: str, method: Callable[..., Any], args: tuple) -> Any:
        beat()  # progress, for the check's time limit (limits.py); and again when the call returns or raises
        try:
            return self._referee_checked_call(name, method, args)
        finally:
            beat()

    def _referee_checked_call(self, name: str, method: Callable[..., Any], args: tuple) -> Any:
        rules: Rules = self._referee_rules
        call = format_call(name, args)
        if name not in rules.mutating:
            try:
                return method(*args)
            except BaseException as exc:
                _refuse_steering(exc, call)
                tag_exercise_call(exc, call)
                raise
        before = self._referee_snapshot()
        placement = self._referee_placement if name in getattr(self._referee_placement, "methods", ()) else None
        oracle = placement.ask(name, args) if placement is not None else None
        self.referee_calls.append(call)
        try:
            result = method(*args)
        except NotImplementedError as exc:
            tag_exercise_call(exc, call)
            raise
        except RuleBroken:
            raise
        except Exception as exc:  # noqa: BLE001
            _refuse_steering(exc, call)
            tag_exercise_call(exc, call)
            self.referee_calls[-1] = f"{call} raised {type(exc).__name__}"
            after = self._referee_snapshot()
            if before is not None and after is not None and after != before:
                raise RuleBroken(_changed(call, exc, before, after)) from exc
            raise
        except BaseException as exc:  # sys.exit(), a time limit, hypothesis' StopTest: no all-or-nothing check
            _refuse_steering(exc, call)
            tag_exercise_call(exc, call)
            raise
        shown = student_text(result, use_repr=True)
        self.referee_calls[-1] = call if (result is None and name in rules.quiet) else f"{call} -> {shown}"
        if placement is not None:
            placement.check(self._referee_target, name, args, result, oracle)
        return result

    def _referee_snapshot(self) -> dict[str, Any] | None:
        # NOTE: read from the target directly (not logged). If a read fails (not implemented yet, a bug), there is
        # no snapshot and no all-or-nothing check: the failing read will surface where a check makes it.
        try:
            return self._referee_rules.snapshot(self._referee_target)
        except Exception:  # noqa: BLE001
            return None


def _changed(call: str, exc: BaseException, before: dict[str, Any], after: dict[str, Any]) -> str:
    diffs = "; ".join(f"{k} {before[k]} -> {after.get(k)}" for k in before if before[k] != after.get(k))
    return (f"{call} raised {type(exc).__name__} ({student_text(exc)}) but changed the allocator: {diffs}. "
            f"A refused call must change nothing (all-or-nothing): check every argument before changing anything.")


def refereed(make: Callable[..., Any], rules: Rules) -> Callable[..., Any]:
    """A factory like `make` whose allocators come wrapped in a `Referee`."""

    def build(*args: Any) -> Referee:
        try:
            made = make(*args)
        except BaseException as exc:
            _refuse_steering(exc, format_call("__init__", args))
            raise
        return Referee(made, rules)

    build.__name__ = getattr(make, "__name__", "factory")
    return build
