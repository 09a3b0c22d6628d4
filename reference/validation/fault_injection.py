"""Faults at every KV call: what a failed step leaves behind, counted over every point where it can fail.

The scheduler changes memory only through the KV contract (sim/kv/base.py). Here a run of the engine (a tiny
random model, milliseconds a step) is repeated once per call into the KV manager, and once per call the manager
makes into its own parts (its block allocator, its radix tree: "inside" a KV call), each time raising at that
call: an exception or KeyboardInterrupt, before the real call or just after it returned (its result lost). Then
the run goes on, as a server would, and the harness checks the engine's promise (reference/engine/engine.py, `step`):

- the step's own exception reaches the caller, once: the cleanup raised nothing of its own (else `replaced`);
- the engine is not wedged: the later steps run (else `wedged`);
- nothing leaked: once every request is done the pool is entirely free and the manager's invariants hold
  (else `leaked`);
- the requests the failed step did not touch finish with the tokens of the run without the fault (else
  `mismatch`); the K/V memory starts as NaN, so a step reading a slot nothing wrote poisons that request;
- only requests the step touched are aborted: those of the step's plan in the fault-free run, the ones it
  preempted, the owners of blocks it copies into (else `over_aborted`);
- a fresh generate() afterwards gives what a fresh engine gives (else `broken_after`).

`survived` is all of these. `python tools/kv_faults.py` runs every point of every configuration and saves the
table; tests/reference/test_kv_faults.py runs all points of the small configurations and a sample of the others.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .. import LLM, BeamSearchParams, SamplingParams
from ..models import random_model
from ..models.loader import TINY_GEMMA3_CONFIG

# The KV manager's methods the scheduler calls while a step runs (schedule, finish_step, abandon_step).
KV_METHODS = ("allocate_slots", "can_allocate_slots", "fork", "free", "uncache", "get_computed_tokens", "swap_out",
              "swap_in", "can_swap_out", "can_swap_in", "block_table")
OUTCOMES = ("survived", "replaced", "wedged", "leaked", "mismatch", "over_aborted", "broken_after")


class Fault(Exception):
    """The injected failure: a bug inside a KV call, or in the code around it."""


@dataclass(frozen=True)
class Config:
    """One engine configuration and the workload it serves."""

    name: str
    llm: dict  # keyword arguments of LLM.from_loaded (block size, pool, policy, preemption, prefix caching)
    gemma: bool = False  # the tiny Gemma 3 (sliding-window layers, for the hybrid policy), else the tiny Llama
    shared_prefix: bool = False  # prompts open with one 8-token prefix (prefix-cache hits)


GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
BEAMS = BeamSearchParams(beam_width=2, max_tokens=8, ignore_eos=True)


def workload(config: Config) -> list[tuple[list[int], object]]:
    """Six requests: greedy, beam search (forks, fork copies) and seeded n = 2 sampling (shared prompt blocks,
    copy-on-write), sized so the small pools preempt."""
    prefix = [(5 * j + 3) % 200 + 20 for j in range(8)] if config.shared_prefix else []
    out = []
    for i in range(6):
        prompt = prefix + [(7 * i + j) % 200 + 17 for j in range(5 + 3 * i)]
        if i % 3 == 1:
            params = BEAMS
        elif i % 3 == 2:
            params = SamplingParams(temperature=0.8, n=2, seed=i, max_tokens=10, ignore_eos=True)
        else:
            params = GREEDY
        out.append((prompt, params))
    return out


_COMMON = dict(block_size=4, max_model_len=64)
CONFIGS = {c.name: c for c in [
    Config("paged, recompute", dict(_COMMON, num_gpu_blocks=24)),
    Config("paged, swap", dict(_COMMON, num_gpu_blocks=24, preemption="swap", num_cpu_blocks=32)),
    Config("paged, prefix caching", dict(_COMMON, num_gpu_blocks=24, enable_prefix_caching=True), shared_prefix=True),
    Config("paged, prefix caching, swap", dict(_COMMON, num_gpu_blocks=28, enable_prefix_caching=True,
                                               preemption="swap", num_cpu_blocks=32), shared_prefix=True),
    Config("paged, chunked budget", dict(_COMMON, num_gpu_blocks=24, max_num_batched_tokens=6)),
    Config("max", dict(_COMMON, policy="max", num_gpu_blocks=96)),
    Config("pow2", dict(_COMMON, policy="pow2", num_gpu_blocks=96)),
    Config("vattention", dict(_COMMON, policy="vattention", num_gpu_blocks=24)),
    Config("radix", dict(_COMMON, policy="radix", num_gpu_blocks=24), shared_prefix=True),
    Config("hybrid", dict(_COMMON, policy="hybrid", num_gpu_blocks=24), gemma=True),
]}


@dataclass(frozen=True)
class Point:
    """Where a fault is injected: the `index`-th call (0-based, counting every wrapped call of the run) to
    `target` ("kv.free", or "allocator.allocate" for a call the manager makes inside a KV call), raised
    `when` ("before" the real call, or "after" it returned)."""

    index: int
    target: str
    when: str
    interrupt: bool  # KeyboardInterrupt, else Fault


@dataclass
class Result:
    config: str
    point: Point
    outcome: str
    detail: str = ""


_MODELS: dict[bool, object] = {}


def _model(gemma: bool):
    if gemma not in _MODELS:  # untied embeddings: a tied tiny model mostly repeats the prompt's last token
        _MODELS[gemma] = (random_model(TINY_GEMMA3_CONFIG, seed=5) if gemma
                          else random_model(seed=5, tie_word_embeddings=False))
    return _MODELS[gemma]


def _engine(config: Config) -> LLM:
    llm = LLM.from_loaded(_model(config.gemma), **config.llm)
    cache = llm.kv_cache
    for tensor in cache.key_caches + cache.value_caches + cache.cpu_key_caches + cache.cpu_value_caches:
        tensor.fill_(float("nan"))  # a read of a slot nothing wrote poisons the request that reads it
    return llm


def _parts(kv) -> list[tuple[str, object]]:
    """The manager's own parts that a fault inside a KV call can hit: objects of the simulator's classes it holds
    (its block allocator, CPU allocator, radix tree), by attribute name."""
    return [(name, value) for name, value in vars(kv).items()
            if type(value).__module__.startswith("sim.") and not isinstance(value, type)]


def _methods(obj) -> list[str]:
    return [n for n in dir(type(obj)) if not n.startswith("_") and callable(getattr(type(obj), n, None))]


class _Injector:
    """Wraps the KV manager's methods (and its parts' methods) on the instance: counts every call in `calls` and
    raises at `point`."""

    def __init__(self, llm: LLM, point: Point | None) -> None:
        self.calls: list[str] = []
        self.requests: list[set[int]] = []  # per call, the requests whose sequences the KV call (or the one around it) names
        self.point, self.fired = point, False
        self.llm = llm
        kv = llm.kv_manager
        targets = [("kv", kv, [m for m in KV_METHODS if hasattr(kv, m)])]
        targets += [(name, part, _methods(part)) for name, part in _parts(kv)]
        for label, obj, names in targets:
            for name in names:
                setattr(obj, name, self._wrap(f"{label}.{name}", getattr(obj, name)))

    def _named(self, method: str, args) -> set[int]:
        """The requests of the sequences a KV call names (none for uncache, get_computed_tokens)."""
        if method in ("uncache", "get_computed_tokens") or not args:
            return set()
        ids = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]
        request_of = self.llm.scheduler.request_of
        return {r for r in map(request_of, ids) if r is not None}

    def _wrap(self, target: str, real: Callable) -> Callable:
        def call(*args, **kwargs):
            index = len(self.calls)
            self.calls.append(target)
            if target.startswith("kv."):
                self.requests.append(self._named(target[3:], args))
            else:  # a part's call belongs to the KV call around it
                self.requests.append(self.requests[-1] if self.requests else set())
            point = self.point
            hit = point is not None and not self.fired and point.index == index
            if hit:
                self.fired = True
                exc = KeyboardInterrupt() if point.interrupt else Fault(f"injected at call {index} ({target})")
                if point.when == "before":
                    raise exc
            result = real(*args, **kwargs)
            if target.endswith(".copy"):  # a throwaway trial copy (contiguous policies): plain methods, not ours
                for name in [n for n, v in vars(result).items() if getattr(v, "injected", False)]:
                    delattr(result, name)
            if hit:
                raise exc
            return result

        call.injected = True
        return call


@dataclass
class Reference:
    """The fault-free run: tokens by scheduler request id, the calls in order, and per step the requests a
    failure of that step may abort."""

    tokens: dict[int, list]
    calls: list[str]
    call_requests: list[set[int]]  # per call, the requests it names: a fault there may abort them
    step_of_call: list[int]  # the step (0-based) each call belongs to
    may_abort: list[set[int]] = field(default_factory=list)
    after: list = field(default_factory=list)  # a fresh engine's greedy tokens for the check afterwards


class _Steps:
    """Counts schedule() calls and records, per step, the requests a failure of it may abort."""

    def __init__(self, llm: LLM, injector: _Injector) -> None:
        self.llm, self.injector = llm, injector
        self.step_of_call: list[int] = []
        self.may_abort: list[set[int]] = []
        self.starts: list[int] = []  # the index of the first call of each step
        sched = llm.scheduler
        real = sched.schedule

        def schedule():
            self.starts.append(len(injector.calls))
            plan = real()
            kv = llm.kv_manager
            written = {dst for _, dst in plan.blocks_to_copy}
            owners = {rid for rid in sched.running_request_ids() for s in sched.seq_ids(rid)
                      if written and s in kv.seq_ids and written & set(kv.block_table(s))}
            self.may_abort.append(set(plan.request_ids()) | set(plan.preempted) | owners)
            return plan

        sched.schedule = schedule


def _serve(llm: LLM, work, max_steps: int) -> tuple[dict[int, list], list[BaseException], bool]:
    for i, (prompt, params) in enumerate(work):
        assert llm.scheduler_request_id(llm.add_request(prompt, params)) == i
    finished, errors, steps = {}, [], 0
    while llm.has_unfinished_requests() and steps < max_steps and len(errors) < 3:
        steps += 1
        try:
            outs = llm.step()
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - counted, whatever it is
            errors.append(exc)
            continue
        finished.update({llm.scheduler_request_id(o.request_id): [c.token_ids for c in o.outputs]
                         for o in outs if o.finished})
    return finished, errors, not llm.has_unfinished_requests()


AFTER_PROMPTS = [[33, 34, 35, 36, 37, 38], [90, 91, 92]]


def reference(config: Config) -> Reference:
    llm = _engine(config)
    injector = _Injector(llm, None)
    steps = _Steps(llm, injector)
    tokens, errors, done = _serve(llm, workload(config), 1000)
    assert not errors and done, (config.name, errors)
    step_of_call, s = [], -1
    starts = set(steps.starts)
    for i in range(len(injector.calls)):
        s += i in starts
        step_of_call.append(max(s, 0))
    after = [o.outputs[0].token_ids for o in _engine(config).generate(AFTER_PROMPTS, GREEDY)]
    return Reference(tokens, list(injector.calls), list(injector.requests), step_of_call, steps.may_abort, after)


def points(ref: Reference) -> list[Point]:
    """Every KV call before and after, every call of a part (inside a KV call) before; the interrupt and the
    exception alternate. NOTE: a part's call is atomic (the block allocator changes nothing when it raises), so
    "before" it is any point between two steps of the KV call. Just after a part's call returned, before the
    manager stored its result, only an asynchronous KeyboardInterrupt could strike, and the engine holds Ctrl-C
    back while the scheduler runs (reference/engine/engine.py, `_step`)."""
    return [Point(i, target, when, interrupt=(i + (when == "after")) % 2 == 1)
            for i, target in enumerate(ref.calls) for when in ("before", "after")
            if when == "before" or target.startswith("kv.")]


def _pool_problem(llm: LLM) -> str:
    kv = llm.kv_manager
    if llm.has_unfinished_requests() or llm._requests:
        return "requests left queued"
    if kv.num_free_blocks != kv.num_blocks:
        return f"{kv.num_blocks - kv.num_free_blocks} blocks still used"
    cpu = getattr(kv, "cpu_allocator", None)
    if cpu is not None and cpu.num_free_blocks != kv.num_cpu_blocks:
        return f"{kv.num_cpu_blocks - cpu.num_free_blocks} CPU blocks still used"
    try:
        kv.check_invariants()
    except Exception as exc:  # noqa: BLE001
        return f"invariants: {exc}"
    return ""


def inject(config: Config, ref: Reference, point: Point) -> Result:
    """One run with a fault at `point`; its outcome."""
    llm = _engine(config)
    injector = _Injector(llm, point)
    _Steps(llm, injector)
    work = workload(config)
    finished, errors, done = _serve(llm, work, 10 * len(ref.may_abort) + 20)

    def result(outcome: str, detail: str = "") -> Result:
        return Result(config.name, point, outcome, detail)

    if not injector.fired:
        return result("wedged", "the fault was never reached")
    first = errors[0] if errors else None
    if first is None or not (isinstance(first, KeyboardInterrupt) if point.interrupt else isinstance(first, Fault)):
        return result("replaced", f"{type(first).__name__}: {first}")
    if len(errors) > 1 or not done:
        later = errors[1] if len(errors) > 1 else "steps never ended"
        return result("wedged", f"{type(later).__name__}: {later}" if isinstance(later, BaseException) else later)
    problem = _pool_problem(llm)
    if problem:
        return result("leaked", problem)
    wrong = sorted(rid for rid, toks in finished.items() if toks != ref.tokens[rid])
    if wrong:
        return result("mismatch", f"requests {wrong} finished with other tokens")
    aborted = set(range(len(work))) - set(finished)
    step = ref.step_of_call[point.index]
    allowed = (ref.may_abort[step] if step < len(ref.may_abort) else set()) | ref.call_requests[point.index]
    if aborted - allowed:
        return result("over_aborted", f"aborted {sorted(aborted - allowed)} outside step {step}'s {sorted(allowed)} "
                                      "and the call's")
    try:
        after = [o.outputs[0].token_ids for o in llm.generate(AFTER_PROMPTS, GREEDY)]
    except Exception as exc:  # noqa: BLE001
        return result("broken_after", f"{type(exc).__name__}: {exc}")
    if after != ref.after or _pool_problem(llm):
        return result("broken_after", "a fresh generate() afterwards differs from a fresh engine's")
    return result("survived")


def run(configs: Iterable[str], sample: int | None = None, seed: int = 0,
        progress: Callable[[str, int, int], None] | None = None) -> list[Result]:
    """Inject at every point of each configuration (or `sample` points drawn at random); the results in order."""
    results = []
    for name in configs:
        config = CONFIGS[name]
        ref = reference(config)
        todo = points(ref)
        if sample is not None and sample < len(todo):
            todo = sorted(random.Random(seed).sample(todo, sample), key=lambda p: (p.index, p.when))
        for i, point in enumerate(todo):
            results.append(inject(config, ref, point))
            if progress is not None:
                progress(name, i + 1, len(todo))
    return results
