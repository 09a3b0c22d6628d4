"""What lab `capstone` runs: the real engine and the simulator, once on the student's pieces and once on the project's,
and the comparison of the two, told in the engine's and the simulator's own words.

    the student's stack                         the project's stack (the reference run)
    block_allocator(num_blocks, block_size)     sim.kv.blocks.BlockAllocator
    victim_policy(max_preemptions).victim       LabRule(max_preemptions): lab 08's rule, composed from
                                                sim.scheduling.preemption's fewest_computed and latest_arrival

Where a physical block lands is the allocator's own choice, and nothing a request computes depends on it: the block
table hides it. So with the same victim policy, the student's allocator must give the SAME tokens (bit for bit: the
same steps run the same sums over the same values, gathered from other addresses), the same preemptions, and in the
simulator the same step table (every share of memory, every step's time) and request table. The victim policy
decides the schedule, so it is compared with lab 08's rule by the preemptions it makes, in order.

The engine runs SmolLM2-135M (loaded once per process, ~4 s) through `LLM.add_request` / `step`, checking the KV
manager's invariants after every step (reference counts against the block tables, the memory breakdown block by
block), with a step limit (an allocator that leaks blocks would otherwise preempt forever). The reference runs are
cached per batch: each is computed once per process.
"""
from __future__ import annotations

import math
import unittest
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from sim.exercises.limits import beat
from sim.exercises.report import ExpectationFailed, Story
from sim.scheduling.preemption import fewest_computed, latest_arrival

PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time", "Water boils at",
           "The three primary colours are", "My favourite book is")
PROJECT_DIRS = tuple(str(Path(__file__).resolve().parents[3] / d) for d in ("sim", "reference"))


class LabRule:
    """Lab 08's victim policy, as the grader's oracle: the fewest computed tokens among the candidates preempted fewer
    than `max_preemptions` times (ties to the latest arrival), else the latest arrival among all."""

    def __init__(self, max_preemptions: int) -> None:
        self.max_preemptions = max_preemptions
        self.counts: dict[int, int] = {}

    def victim(self, candidates: list) -> Any:
        below = [g for g in candidates if self.counts.get(g.request_id, 0) < self.max_preemptions]
        chosen = fewest_computed(below) if below else latest_arrival(candidates)
        self.counts[chosen.request_id] = self.counts.get(chosen.request_id, 0) + 1
        return chosen


class Watched:
    """A victim function that records who it chose (request ids, in order) and checks the answer is a candidate."""

    def __init__(self, victim: Callable[[list], Any]) -> None:
        self.victim, self.chosen = victim, []

    def __call__(self, candidates: list) -> Any:
        found = self.victim(list(candidates))
        if not any(g is found for g in candidates):
            offered = ", ".join(f"r{g.request_id}" for g in candidates)
            raise ExpectationFailed(f"your victim policy returned {found!r} from the candidates [{offered}]: "
                                    "expected one of them (the SequenceGroup itself, not its id)")
        self.chosen.append(found.request_id)
        return found


def project_words(exc: BaseException) -> bool:
    """Whether `exc` was raised by the project's code (the engine, the scheduler, the KV manager), not the student's."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(PROJECT_DIRS)


def in_their_words(what: str, run: Callable[[], Any]) -> Any:
    """run(); an error the engine or the simulator raised becomes the expectation that failed, in its own words (an
    error raised inside the student's code goes on, and the grader names the method and line)."""
    try:
        return run()
    except (ExpectationFailed, NotImplementedError):
        raise
    except Exception as exc:  # noqa: BLE001  (the project's own words are the feedback)
        if project_words(exc):
            raise ExpectationFailed(f"{what}: the {'engine' if 'engine' in what else 'simulator'} said: "
                                    f"{type(exc).__name__}: {exc}") from exc
        raise


# --- the engine --------------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def smollm2() -> tuple:
    """(model, tokenizer): SmolLM2-135M in float32 on the CPU, loaded once per process."""
    from reference.models import load_model

    model, tokenizer, _ = load_model("smollm2")
    return model, tokenizer


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch served by the engine: PROMPTS[i] for i in `prompts`, all queued at once."""

    prompts: tuple[int, ...]
    max_tokens: int = 12
    n: int = 1
    temperature: float = 0.0  # 0: greedy; else seeded sampling (each request's own seed)
    block_size: int = 4
    num_blocks: int = 12
    max_preemptions: int = 2
    swap: bool = False  # preempt by swapping to as many CPU blocks as the GPU has
    beam: bool = False  # beam search of width n (BeamSearchParams) instead of n samples

    def describe(self) -> str:
        how = "greedy" if self.temperature == 0 else f"sampled at temperature {self.temperature:g}, seeded"
        n = f", n={self.n}" if self.n > 1 else ""
        if self.beam:
            how, n = f"beam search of width {self.n}", ""
        swap = ", preempting by swap" if self.swap else ""
        return (f"SmolLM2 serves {len(self.prompts)} prompts ({how}, {self.max_tokens} tokens{n}) on {self.num_blocks} "
                f"blocks of {self.block_size} tokens{swap}")


@dataclass(slots=True)
class Served:
    tokens: list[list[list[int]]]  # per prompt, per sample: the generated token ids
    texts: list[list[str]]
    preempted: list[int]  # the victims, in order (the scheduler's request ids: 0, 1, ... in queueing order)
    num_steps: int
    broken: tuple[int, BaseException] | None = None  # the first step after which the KV manager's recount failed


def serve(batch: Batch, block_allocator: Callable | None, victim: Callable[[list], Any]) -> Served:
    """Serve `batch` on a fresh LLM over the loaded SmolLM2 with these pieces (None: the project's allocator)."""
    from reference.engine.llm import LLM
    from reference.engine.sampling import BeamSearchParams, SamplingParams

    model, tokenizer = smollm2()
    watched = Watched(victim)
    llm = LLM.from_loaded(model, tokenizer, block_size=batch.block_size, num_gpu_blocks=batch.num_blocks,
                          num_cpu_blocks=batch.num_blocks if batch.swap else 0,
                          preemption="swap" if batch.swap else "recompute", block_allocator=block_allocator,
                          victim=watched)
    def params(k: int):
        if batch.beam:
            return BeamSearchParams(beam_width=batch.n, max_tokens=batch.max_tokens)
        return SamplingParams(max_tokens=batch.max_tokens, temperature=batch.temperature, n=batch.n, seed=100 + k)

    ids = [llm.add_request(PROMPTS[i], params(k)) for k, i in enumerate(batch.prompts)]
    finals, step, broken = {}, 0, None
    # NOTE: the bound is generous (the project needs ~2 steps a token); a leaking allocator preempts forever
    limit = 20 * batch.max_tokens * len(batch.prompts) * batch.n + 50
    while llm.has_unfinished_requests():
        if step == limit:
            raise ExpectationFailed(f"the engine made no progress in {limit} steps: {llm.kv_manager.num_free_blocks} "
                                    f"of {batch.num_blocks} blocks free (does free() give blocks back?)")
        for out in llm.step():
            if out.finished:
                finals[out.request_id] = out
        try:  # the project's recount, after every step; told after the tokens (compare_served), which say more
            llm.kv_manager.check_invariants()
        except Exception as exc:  # noqa: BLE001
            broken = broken or (step, exc)
        step += 1
        beat()  # progress, for the check's time limit (sim/exercises/limits.py)
    free = llm.kv_manager.num_free_blocks
    if free != batch.num_blocks and broken is None:
        raise ExpectationFailed(f"every request finished, and {batch.num_blocks - free} of {batch.num_blocks} blocks "
                                f"are still in use: expected all free")
    outs = [finals[i] for i in ids]
    return Served([[list(c.token_ids) for c in o.outputs] for o in outs], [[c.text for c in o.outputs] for o in outs],
                  watched.chosen, step, broken)


def warm_up() -> None:
    """The grader's own setup, before the checks and outside their time limits (Exercise.warm_up): load SmolLM2 and
    serve the first example's batch on the project's pieces, which compiles the engine's CPU kernels (numba: seconds
    on a fresh install, a minute on a slow, busy machine) and caches the reference run."""
    reference_serve(Batch(prompts=(0, 1, 2, 3), max_tokens=12, block_size=4, num_blocks=14))


@lru_cache(maxsize=64)
def reference_serve(batch: Batch) -> Served:
    """The project's allocator under lab 08's rule: what the student's pieces must reproduce."""
    return serve(batch, None, LabRule(batch.max_preemptions).victim)


def engine_story(make: Callable[..., Any], t: Story, batch: Batch) -> None:
    """The engine on the student's stack (their allocator, their policy capped at batch.max_preemptions) against the
    reference run of `batch`: the same tokens and victims (compare_served)."""
    stack = make()
    mine = in_their_words("the engine on your pieces", lambda: serve(
        batch, stack.block_allocator, stack.victim_policy(batch.max_preemptions).victim))
    compare_served(t, batch, mine, reference_serve(batch), victims=True)


def _parting(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare_served(t: Story, batch: Batch, mine: Served, ref: Served, *, victims: bool) -> None:
    """Tokens (and, if `victims`, the preemptions) equal the reference run's; told with the texts where they part."""
    t.say(f"{batch.describe()}: {mine.num_steps} steps, victims {['r%d' % r for r in mine.preempted]}")
    if victims and mine.preempted != ref.preempted:
        k = _parting(mine.preempted, ref.preempted)
        theirs = f"r{ref.preempted[k]}" if k < len(ref.preempted) else "nobody more"
        yours = f"r{mine.preempted[k]}" if k < len(mine.preempted) else "nobody more"
        raise ExpectationFailed(f"preemption {k + 1}: your policy chose {yours}, lab 08's rule chooses {theirs} "
                                f"(the victims in order: yours {['r%d' % r for r in mine.preempted]}, the rule's "
                                f"{['r%d' % r for r in ref.preempted]})")
    tokenizer = smollm2()[1]
    for p, (yours, theirs) in enumerate(zip(mine.tokens, ref.tokens)):
        for s, (a, b) in enumerate(zip(yours, theirs)):
            if a != b:
                k = _parting(a, b)
                sample = f", {'beam' if batch.beam else 'sample'} {s}" if batch.n > 1 else ""
                raise ExpectationFailed(
                    f"prompt {p} ({PROMPTS[batch.prompts[p]]!r}){sample}: the tokens part at token {k}. "
                    f"On the project's allocator the model wrote {ref.texts[p][s]!r}; on yours "
                    f"{mine.texts[p][s]!r} ({tokenizer.decode(b[k:k + 1])!r} became {tokenizer.decode(a[k:k + 1])!r})"
                    ": its K/V was read from a block that held another sequence's tokens, or was overwritten"
                    + _recount(mine))
    if mine.broken is not None:
        step, exc = mine.broken
        if not project_words(exc):
            raise exc  # the student's own check_invariants: their words, their line
        raise ExpectationFailed(f"the tokens are right, but after step {step} the engine's KV manager said: "
                                f"{type(exc).__name__}: {exc}")


def _recount(served: Served) -> str:
    if served.broken is None:
        return ""
    step, exc = served.broken
    return f". The KV manager's recount first failed after step {step}: {type(exc).__name__}: {exc}"


# --- the simulator -----------------------------------------------------------------------------------------------
# Figure 12a's setting: OPT-13B on one A100-40GB, ShareGPT requests at 2 req/s (the simulator's defaults)
PAPER_TRACE = {"model": "opt-13b", "gpu": "a100-40gb", "workload": "sharegpt", "rate": 2.0}


def simulate(settings: dict, block_allocator: Callable | None, victim: Callable[[list], Any]):
    """sim.run(**settings) with these pieces (None: the project's allocator); (result, victims in order)."""
    import sim

    watched = Watched(victim)
    result = sim.run(**settings, block_allocator=block_allocator, victim=watched)
    return result, watched.chosen


def compare_runs(t: Story, what: str, mine, ref, *, victims: tuple[list, list] | None = None) -> None:
    """Every column of the step table and the request table equal, told as the first step (or request) that
    differs and its columns."""
    if victims is not None and victims[0] != victims[1]:
        k = _parting(*victims)
        raise ExpectationFailed(f"{what}: preemption {k + 1}: your policy chose r{victims[0][k]}, lab 08's rule "
                                f"chooses r{victims[1][k]}" if k < min(map(len, victims)) else
                                f"{what}: your policy made {len(victims[0])} preemptions, the rule "
                                f"{len(victims[1])}")
    for table, row in (("steps", "step"), ("requests", "request")):
        a, b = getattr(mine, table), getattr(ref, table)
        if len(a) != len(b):
            raise ExpectationFailed(f"{what}: {len(a)} {table} on your pieces, {len(b)} on the project's")
        for name in b.columns:
            x, y = a[name], b[name]
            same = (x == y) | ((x != x) & (y != y))  # NaN (no token yet) equals NaN
            if not same.all():
                i = int((~same).nonzero()[0][0])
                when = f" (t = {b['time'][i]:.3f} s)" if table == "steps" else ""
                raise ExpectationFailed(f"{what}: {row} {i}{when}: {name} is {x[i]:g} on your pieces, {y[i]:g} on "
                                        f"the project's")
    t.say(f"{what}: {len(ref.steps)} steps, {len(ref.requests)} requests, every column equal")


def simulator_story(stack, t: Story, what: str, settings: dict, max_preemptions: int, *,
                    label: str = "the simulator on your pieces", ref=None):
    """The simulator on the student's `stack` against the reference run (the project's allocator, lab 08's rule
    capped at `max_preemptions`; `ref` if already run): every table column and the victims equal (compare_runs).
    Returns the reference run."""
    mine = in_their_words(label, lambda: simulate(settings, stack.block_allocator,
                                                  stack.victim_policy(max_preemptions).victim))
    ref = ref if ref is not None else simulate(settings, None, LabRule(max_preemptions).victim)
    compare_runs(t, what, mine[0], ref[0], victims=(mine[1], ref[1]))
    return ref


def pool_gib(model: str, num_blocks: int, block_size: int) -> float:
    """The swap space (GiB) that holds `num_blocks` blocks of `model`'s K/V."""
    from sim.base.specs import MODELS

    return num_blocks * block_size * MODELS[model].kv_bytes_per_token / 2**30


# --- the property checks ---------------------------------------------------------------------------------------


def _workloads():
    from hypothesis import strategies as st

    from sim.base.request import Request

    @st.composite
    def workload(draw) -> dict:
        block_size = draw(st.sampled_from([1, 2, 4, 8, 16]), label="block_size")
        num_blocks = draw(st.integers(4, 24), label="num_blocks")
        sampling = draw(st.sampled_from(["n", "beam"]), label="parallel")
        rows = draw(st.lists(st.tuples(st.floats(0, 2, allow_nan=False).map(lambda x: round(x, 2)),
                                       st.integers(1, 48), st.integers(1, 48), st.integers(1, 3)),
                             min_size=1, max_size=10), label="requests (arrival s, prompt, output, n or beam)")
        requests = []
        for at, prompt, output, width in sorted(rows):
            if width * math.ceil((prompt + output) / block_size) > num_blocks:
                continue  # a request the whole pool cannot hold is refused at admission: left out
            wide = {"n": width} if sampling == "n" else {"beam_width": width}
            requests.append(Request(len(requests), at, prompt, output, **wide))
        swap = draw(st.booleans(), label="swap")
        settings = {"model": "opt-13b", "requests": requests, "kv_slots": num_blocks * block_size,
                    "block_size": block_size, "preemption": "swap" if swap else "recompute",
                    "swap_space_gib": pool_gib("opt-13b", num_blocks, block_size) if swap else 4.0,
                    "jump": draw(st.booleans(), label="jump")}
        return {"settings": settings, "cap": draw(st.integers(1, 3), label="max_preemptions")}

    return workload()


def sim_check(shape: str, most: int) -> Callable[[Callable[..., Any], int, int], type]:
    """The simulator on random small workloads ("model"), or the engine on random batches ("rule"), or Figure 12a's
    trace for ten minutes on a pool a quarter of the A100's ("long"): at most `most` programs."""

    def build(make: Callable[..., Any], max_examples: int, steps: int) -> type:
        from hypothesis import given, note, settings
        from hypothesis import strategies as st

        from sim.testing.blocks import machine_settings

        cap = min(max_examples, most)

        if shape == "model":
            @settings(machine_settings(cap, steps), report_multiple_bugs=False)
            @given(run=_workloads())
            def run_test(self: unittest.TestCase, run: dict) -> None:
                s, stack = run["settings"], make()
                if not s["requests"]:
                    return
                note(f"{len(s['requests'])} requests on {s['kv_slots'] // s['block_size']} blocks of "
                     f"{s['block_size']}, {s['preemption']}, max_preemptions {run['cap']}, jump {s['jump']}")
                for r in s["requests"]:
                    note(f"  r{r.request_id}: arrives {r.arrival_time} s, prompt {r.prompt_len}, output "
                         f"{r.output_len}, n {r.n}, beam_width {r.beam_width}")
                simulator_story(stack, Story(), "the run", s, run["cap"])
        elif shape == "rule":
            @settings(machine_settings(cap, steps), report_multiple_bugs=False)
            @given(batch=st.builds(Batch, prompts=st.lists(st.integers(0, len(PROMPTS) - 1), min_size=1, max_size=4,
                                                           unique=True).map(tuple),
                                   max_tokens=st.integers(4, 12), n=st.integers(1, 3),
                                   temperature=st.sampled_from([0.0, 1.0]), block_size=st.sampled_from([1, 2, 4, 16]),
                                   num_blocks=st.integers(4, 16), max_preemptions=st.integers(1, 3),
                                   swap=st.booleans(), beam=st.booleans()))
            def run_test(self: unittest.TestCase, batch: Batch) -> None:
                need = math.ceil((12 + batch.max_tokens) / batch.block_size) * batch.n  # SmolLM2: prompts <= 8 tokens
                batch = replace(batch, num_blocks=max(batch.num_blocks, need))
                note(batch.describe())
                engine_story(make, Story(), batch)
        else:
            def run_test(self: unittest.TestCase) -> None:
                s = {**PAPER_TRACE, "duration": 600.0, "kv_slots": 12_000, "preemption": "swap",
                     "swap_space_gib": pool_gib("opt-13b", 12_000 // 16, 16) / 4}
                simulator_story(make(), Story(), "Figure 12a's trace, 10 minutes, 12,000 slots, swap", s, 2)

        return type(f"Capstone_{shape}", (unittest.TestCase,), {"runTest": run_test})

    return build
