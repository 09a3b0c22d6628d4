"""Lab `capstone`: the student's block allocator (lab 03) and victim policy (lab 08) under the real engine and the
simulator, against the project's own.

Both systems take the two pieces by keyword, as vLLM takes its options:

    LLM("smollm2", block_allocator=MyBlockAllocator, victim=MyVictimPolicy(2).victim)
    sim.run(..., block_allocator=MyBlockAllocator, victim=MyVictimPolicy(2).victim)

`block_allocator` is called as block_allocator(num_blocks, block_size) for the GPU pool of the paged KV manager
(sim/kv/paged.py, which calls only lab 03's methods); `victim` is called with the candidates whenever memory runs
out (sim/scheduling/preemption.py). What the student writes is the glue, `MyServingStack`: a fresh allocator and a fresh
policy on demand (a pool and a policy per run: sharing one instance between two runs carries blocks and
preemption counts across them). The rest is their labs' work, pasted into the notebook.

What is checked (reference/exercises/labs/_capstone_checks.py runs both systems):

- the engine (SmolLM2-135M, float32): with the student's allocator the tokens are those of the project's allocator,
  greedy and sampled (n > 1 shares the prompt's blocks: copy-on-write must keep the samples apart); with their
  policy, the same victims in the same order as lab 08's rule; the KV manager's invariants after every step, and
  every block free at the end;
- the simulator: Figure 12a's workload on their allocator gives the project's step table (the memory breakdown of
  every step) and request table, column by column; random small workloads (parallel samples, beams, swap and
  recompute) likewise (visible); random engine batches and ten minutes of the paper's trace on a tight pool (hidden).

A difference is told in the engine's words (the two texts where the tokens part) or the simulator's (the first step
and column that differ); an error the engine or the simulator raised is quoted as it said it.
"""
from __future__ import annotations

from sim.exercises.referee import NO_RULES
from sim.exercises.registry import Exercise, MachineCheck
from sim.exercises.report import Story

# programs at most per property check: the engine's runs take about a second each
CAPS = {"model": 40, "rule": 3, "long": 1}


def your_allocator_serves_greedy(make, t: Story) -> None:
    """SmolLM2 on your allocator: 4 prompts, greedy, on a pool that fills; the tokens equal the project allocator's"""
    from ._capstone_checks import Batch, engine_story

    batch = Batch(prompts=(0, 1, 2, 3), max_tokens=12, block_size=4, num_blocks=14)
    t.say(f"LLM(..., block_allocator=stack.block_allocator, victim=stack.victim_policy(2).victim): {batch.describe()}")
    engine_story(make, t, batch)


def samples_stay_apart(make, t: Story) -> None:
    """parallel sampling (n=3, seeded): the samples share the prompt's blocks, and copy-on-write keeps them apart"""
    from ._capstone_checks import Batch, engine_story

    batch = Batch(prompts=(2, 4), max_tokens=10, n=3, temperature=1.0, block_size=4, num_blocks=24)
    t.say("each request's 3 samples share its prompt's blocks (share), and each copies the half-full last block "
          "before it writes into it (copy_on_write)")
    engine_story(make, t, batch)


def beams_fork_and_drop(make, t: Story) -> None:
    """beam search (width 3): every step forks the best beams and drops the rest; each keeps its own K/V"""
    from ._capstone_checks import Batch, engine_story

    batch = Batch(prompts=(0, 3), max_tokens=10, n=3, beam=True, block_size=4, num_blocks=40)
    t.say("a fork shares all of a beam's blocks (share); a dropped beam gives its references back (free); a beam "
          "writing into a shared block copies it first (copy_on_write)")
    engine_story(make, t, batch)


def your_policy_chooses(make, t: Story) -> None:
    """a pool too small for the batch: your policy chooses the victims lab 08's rule chooses, and no token changes"""
    from ._capstone_checks import Batch, engine_story, reference_serve

    batch = Batch(prompts=(0, 1, 2, 3, 4, 5), max_tokens=12, block_size=2, num_blocks=24, max_preemptions=1)
    t.say("6 prompts on 24 blocks of 2 tokens, max_preemptions 1: the decodes run out of blocks again and again")
    t.ensure(bool(reference_serve(batch).preempted), "expected the reference run to preempt (the grader's batch)")
    engine_story(make, t, batch)


def the_papers_trace(make, t: Story) -> None:
    """the simulator, Figure 12a's workload for 3 minutes on a small pool: every step's memory and latency equal"""
    from ._capstone_checks import PAPER_TRACE, LabRule, simulate, simulator_story

    settings = {**PAPER_TRACE, "duration": 180.0, "kv_slots": 4_000}
    t.say("OPT-13B on an A100-40GB, ShareGPT requests at 2 req/s, on 4,000 token slots (a tenth of the A100's): "
          "preemptions happen")
    t.say(f"sim.run({', '.join(f'{k}={v!r}' for k, v in settings.items())}, block_allocator=..., victim=...)")
    stack = make()
    ref = simulate(settings, None, LabRule(2).victim)
    t.ensure(bool(ref[1]), "expected the reference run to preempt (the grader's own setting is wrong)")
    simulator_story(stack, t, "Figure 12a's trace", settings, 2, ref=ref)


def fresh_pieces_per_run(make, t: Story) -> None:
    """two runs, one after the other, each on fresh pieces: no block and no preemption count carries over"""
    from ._capstone_checks import PAPER_TRACE, simulator_story

    settings = {**PAPER_TRACE, "duration": 60.0, "kv_slots": 4_000}
    stack = make()
    a, b = stack.block_allocator(8, 4), stack.block_allocator(8, 4)
    t.ensure(a is not b, "block_allocator(8, 4) returned the same allocator twice: each run needs a pool of its own")
    p, q = stack.victim_policy(2), stack.victim_policy(2)
    t.ensure(p is not q, "victim_policy(2) returned the same policy twice: each run needs its own preemption counts")
    ref = None
    for run in ("first", "second"):
        ref = simulator_story(stack, t, f"the {run} run", settings, 2,
                              label=f"the simulator on your pieces, {run} run", ref=ref)


EXAMPLES = (your_allocator_serves_greedy, samples_stay_apart, beams_fork_and_drop, your_policy_chooses,
            the_papers_trace, fresh_pieces_per_run)


def _lazy(shape: str):
    def build(make, max_examples: int, steps: int) -> type:
        from ._capstone_checks import sim_check

        return sim_check(shape, CAPS[shape])(make, max_examples, steps)

    return build


def _warm_up() -> None:
    from ._capstone_checks import warm_up

    warm_up()


EXERCISE = Exercise(
    "the capstone: your allocator (lab 3) and victim policy (lab 8) under SmolLM2 and the simulator",
    "YourClass()", "MyServingStack",
    (), {"block_allocator": (4, 16), "victim_policy": (1,)}, ("block_allocator", "victim_policy"), NO_RULES, EXAMPLES,
    (
        MachineCheck("model", f"serving runs: up to {CAPS['model']} random small workloads in the simulator "
                     "(parallel samples, beams, swap and recompute): every step and request equal the project's",
                     _lazy("model"), 4.0, "visible"),
        MachineCheck("rule", f"the engine: up to {CAPS['rule']} random batches (block sizes 1-16, samples or beams "
                     "up to 3, swap or recompute): tokens and victims equal the project's", _lazy("rule"), 3.0,
                     "hidden"),
        MachineCheck("long", "Figure 12a's trace for 10 minutes on a tight pool, preempting by swap: every step and "
                     "request equal the project's", _lazy("long"), 2.0, "hidden"),
    ),
    "13_capstone", "capstone", model="smollm2", warm_up=_warm_up,
)
