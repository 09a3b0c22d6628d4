"""`python -m reference calibrate`: time the engine step by step over a designed set of batch shapes, fit the
simulator's cost model to the steps, and write it as JSON for `python -m sim run --cost-model FILE`.

The simulator prices a step from three numbers of its plan (sim.cost.CostModel.step_time): prompt tokens computed,
decode sequences, and K/V tokens the attention reads. The engine runs the very same plans (reference/engine.py), so
its `step_log` records those three numbers beside each step's wall time (StepRecord.num_prefill_tokens, decodes,
num_context_tokens). The design makes them vary independently:

    scenario          what it runs                                                  what it pins down
    prefill           single prompts of 8 .. 2,048 tokens, one after another       g at large token counts
    decode-S          S = 1 .. 64 short prompts, then ~24 decode steps of S seqs    g at small ones, per-sequence cost
    long-context-S    S sequences behind one cached 1,024-token prefix, decoding    cost per K/V token read
    chunks-B          decodes running while long prompts arrive, budget B tokens    mixed steps (chunked prefill)

(`--quick`: the same kinds, a few seconds in all; the tests run it.) The fit is sim.cost.PiecewiseCostModel: g, a
piecewise-linear cost of the tokens a step computes, plus a cost per decoding sequence and per K/V token read,
fitted to relative errors. (The first version fitted CalibratedCostModel's roofline-shaped knee; on this CPU a step
of 2 decoding sequences takes longer than one of 4, which no knee follows: 17-20% median error on those shapes.) The file says how good it is: in-sample errors per step, and each scenario predicted by
a fit that never saw it (leave one scenario out), so a reader sees how the model extrapolates.

NOTE: a step's wall time depends on the machine, the thread count and what else runs on it: calibrate on the
machine and with the thread count (OMP_NUM_THREADS; the engine's CPU default is 1) you simulate, when it is quiet.
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.cost import CSV_COLUMNS, PiecewiseCostModel

DEFAULT_OUT = "figures/cost_model_cpu.json"
DEFAULT_STEPS = "figures/calibration_steps_cpu.csv"
QUICK_DIR = "figures/quick"  # --quick's outputs (ignored by git): a smoke run never overwrites the committed model
MODEL_SPEC = "smollm2-135m"  # the sim.specs entry of the engine's embedded model
FIRST_TOKEN_ID = 100  # synthetic prompts avoid SmolLM2's special tokens (ids < 17)


@dataclass(frozen=True, slots=True)
class Wave:
    """`count` requests of `prompt_len` tokens generating `max_tokens` each, added before engine step `at_step`
    of their scenario; the first `shared_prefix` tokens are the same in every wave of the scenario that has one."""

    prompt_len: int
    count: int
    max_tokens: int
    at_step: int = 0
    shared_prefix: int = 0


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    waves: tuple[Wave, ...]
    engine: dict = field(default_factory=dict)  # LLM keyword arguments beyond the common ones


def design(quick: bool = False) -> list[Scenario]:
    """The designed batch shapes (module docstring); `quick` for the tests."""
    if quick:
        return [
            Scenario("prefill", tuple(Wave(p, 1, 2, at_step=2 * i) for i, p in enumerate((8, 64, 160)))),
            *(Scenario(f"decode-{s}", (Wave(8, s, 6),)) for s in (2, 8)),
            Scenario("long-context-4", (Wave(104, 1, 6, 0, 96), Wave(104, 3, 6, 1, 96)), {"enable_prefix_caching": True}),
            Scenario("chunks-32", (Wave(8, 4, 10), Wave(96, 1, 2, at_step=2)), {"max_num_batched_tokens": 32}),
        ]
    sizes = (8, 32, 64, 128, 256, 512, 1024, 2048)
    return [
        Scenario("prefill", tuple(Wave(p, 1, 2, at_step=2 * i) for i, p in enumerate(sizes))),
        *(Scenario(f"decode-{s}", (Wave(12, s, 24),)) for s in (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64)),
        *(Scenario(f"long-context-{s}", (Wave(1032, 1, 16, 0, 1024), Wave(1032, s - 1, 16, 1, 1024)),
                   {"enable_prefix_caching": True}) for s in (4, 16, 48)),  # fmt: skip
        Scenario("chunks-256", (Wave(12, 16, 48), Wave(1024, 1, 8, at_step=3), Wave(512, 2, 8, at_step=12)),
                 {"max_num_batched_tokens": 256}),
        Scenario("chunks-64", (Wave(12, 8, 40), Wave(384, 1, 4, at_step=3)), {"max_num_batched_tokens": 64}),
    ]


def _prompts(scenario: Scenario, rng: np.random.Generator, vocab_size: int) -> list[list[list[int]]]:
    """Token ids per wave per request; waves with a shared prefix share one."""
    prefix = rng.integers(FIRST_TOKEN_ID, vocab_size, max((w.shared_prefix for w in scenario.waves), default=0))
    out = []
    for w in scenario.waves:
        own = rng.integers(FIRST_TOKEN_ID, vocab_size, (w.count, w.prompt_len - w.shared_prefix))
        out.append([prefix[:w.shared_prefix].tolist() + row.tolist() for row in own])
    return out


def run_scenario(loaded, scenario: Scenario, *, block_size: int, rng: np.random.Generator) -> list[dict]:
    """Serve the scenario on a fresh engine over the loaded model; one row per executed step."""
    from reference import LLM, SamplingParams

    tokens = sum(w.count * (w.prompt_len + w.max_tokens) for w in scenario.waves)
    llm = LLM.from_loaded(*loaded, block_size=block_size, num_gpu_blocks=-(-tokens // block_size) + 8,
                          **scenario.engine)  # fmt: skip
    prompts = _prompts(scenario, rng, loaded[0].config.vocab_size)
    pending = sorted(zip(scenario.waves, prompts), key=lambda wave: wave[0].at_step)
    step = 0
    while pending or llm.has_unfinished_requests():
        while pending and (pending[0][0].at_step <= step or not llm.has_unfinished_requests()):
            wave, ids = pending.pop(0)
            for prompt in ids:
                llm.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=wave.max_tokens, ignore_eos=True))
        llm.step()
        step += 1
    return [{"scenario": scenario.name, "num_prefill_tokens": r.num_prefill_tokens, "num_decode_seqs": len(r.decodes),
             "num_context_tokens": r.num_context_tokens, "step_time_s": r.step_time_s}
            for r in llm.step_log if not (r.blocks_to_swap_in or r.blocks_to_swap_out or r.blocks_to_copy)]


def measure(loaded, scenarios: list[Scenario], *, block_size: int = 16, seed: int = 0, progress: bool = True) -> list[dict]:
    """Every scenario's steps, after an untimed warm-up (the first steps load compiled kernels)."""
    rng = np.random.default_rng([seed, 0xCA1])
    run_scenario(loaded, Scenario("warm-up", (Wave(16, 2, 4),)), block_size=block_size, rng=rng)
    rows = []
    for i, scenario in enumerate(scenarios):
        started = time.perf_counter()
        rows += run_scenario(loaded, scenario, block_size=block_size, rng=rng)
        if progress:
            print(f"  [{i + 1}/{len(scenarios)}] {scenario.name}: {sum(r['scenario'] == scenario.name for r in rows)} "
                  f"steps in {time.perf_counter() - started:.1f} s", flush=True)  # fmt: skip
    return rows


def _errors(model: PiecewiseCostModel, rows: list[dict]) -> np.ndarray:
    """|predicted - measured| / measured per row."""
    predicted = np.array([model.step_time(r["num_prefill_tokens"], r["num_decode_seqs"], r["num_context_tokens"])
                          for r in rows])  # fmt: skip
    measured = np.array([r["step_time_s"] for r in rows])
    return np.abs(predicted - measured) / measured


def _summary(errors: np.ndarray) -> dict:
    return {"num_steps": int(len(errors)), "median_abs_rel_error": float(np.median(errors)),
            "p90_abs_rel_error": float(np.percentile(errors, 90)), "max_abs_rel_error": float(errors.max())}


def _as_tuples(rows: list[dict]) -> list[tuple]:
    return [tuple(r[c] for c in CSV_COLUMNS) for r in rows]


def fit(rows: list[dict]) -> tuple[PiecewiseCostModel, dict]:
    """The model fitted to every row, and how good it is: in-sample, per scenario, and per scenario held out."""
    model = PiecewiseCostModel.fit(_as_tuples(rows))
    quality = {"in_sample": _summary(_errors(model, rows)), "per_scenario": {}}
    for name in dict.fromkeys(r["scenario"] for r in rows):
        mine = [r for r in rows if r["scenario"] == name]
        rest = [r for r in rows if r["scenario"] != name]
        entry = {"in_sample": _summary(_errors(model, mine))}
        try:
            entry["held_out"] = _summary(_errors(PiecewiseCostModel.fit(_as_tuples(rest)), mine))
        except ValueError:  # the other scenarios alone do not determine the coefficients
            entry["held_out"] = None
        quality["per_scenario"][name] = entry
    return model, quality


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "system": platform.platform()}


def versions() -> dict:
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import numba

        found["numba"] = numba.__version__
    except ImportError:
        pass
    return found


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help=f"a few seconds of small shapes (a smoke run, not ~2 minutes; "
                   f"its files go under {QUICK_DIR}/ unless named, so the committed model stays)")
    p.add_argument("--out", help=f"cost model JSON to write (default: {DEFAULT_OUT})")
    p.add_argument("--steps-csv", help=f"the measured steps, one row per step (default: {DEFAULT_STEPS})")
    p.add_argument("--block-size", type=int, default=16, help="the engine's KV block size (default: 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt ids (default: 0)")


def check_args(args: argparse.Namespace) -> None:
    from sim.limits import MAX_SEED
    from sim.outfiles import check_outputs

    for name, default in (("out", DEFAULT_OUT), ("steps_csv", DEFAULT_STEPS)):
        if getattr(args, name) is None:
            setattr(args, name, str(Path(QUICK_DIR) / Path(default).name) if args.quick else default)
    if args.block_size < 1 or args.block_size > 256:
        raise ValueError(f"--block-size: got {args.block_size} (allowed: 1 to 256 tokens)")
    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"--seed: got {args.seed} (allowed: an integer from 0 to {MAX_SEED})")
    check_outputs({"--out": args.out, "--steps-csv": args.steps_csv}, make_parents=True)


def calibrate(loaded, *, quick: bool, block_size: int = 16, seed: int = 0, command: str = "",
              progress: bool = True) -> tuple[dict, list[dict]]:
    """Measure, fit, and return the cost-model record (sim.cost_file) and the measured rows."""
    import torch

    from reference.executor import default_backend
    from sim.cost_file import cost_model_record

    scenarios = design(quick)
    started = time.perf_counter()
    rows = measure(loaded, scenarios, block_size=block_size, seed=seed, progress=progress)
    model, quality = fit(rows)
    engine = {"device": "cpu", "threads": torch.get_num_threads(), "dtype": str(loaded[0].dtype).removeprefix("torch."),
              "backend": default_backend(None, loaded[0].device, loaded[0].dtype), "block_size": block_size}
    record = cost_model_record(
        model, MODEL_SPEC, fit=quality, engine=engine, machine=machine(), versions=versions(),
        design=[{"name": s.name, "waves": [vars_of(w) for w in s.waves], "engine": s.engine} for s in scenarios],
        command=command, created=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        measured_in_s=round(time.perf_counter() - started, 1),
    )  # fmt: skip
    return record, rows


def vars_of(wave: Wave) -> dict:
    return {name: getattr(wave, name) for name in Wave.__slots__}


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """The `python -m reference calibrate` command (flags checked by check_args first)."""
    from reference.executor import use_one_cpu_thread
    from reference.models import load_model
    from sim.cost_file import write_cost_model
    from sim.outfiles import write_csv
    import torch

    use_one_cpu_thread(torch.device("cpu"))
    print(f"calibrate: {'quick' if args.quick else 'full'} design at {torch.get_num_threads()} thread(s)", flush=True)
    loaded = load_model("smollm2")
    record, rows = calibrate(loaded, quick=args.quick, block_size=args.block_size, seed=args.seed,
                             command=" ".join(argv))  # fmt: skip
    write_csv(args.steps_csv, ("scenario", *CSV_COLUMNS), rows, comments=[f"command: {' '.join(argv)}"],
              make_parents=True)  # fmt: skip
    write_cost_model(args.out, record, make_parents=True)
    c = record["coefficients"]
    model = PiecewiseCostModel(tuple(c["knots"]), tuple(c["values"]), c["c"], c["d"])
    g = ", ".join(f"{n:g}: {model.tokens_time(n) * 1e3:.0f}" for n in (1, 2, 4, 8, 64, 256, 1024))
    print(f"step_time = g(tokens) + {c['c'] * 1e3:.3f} ms x decode seqs + {c['d'] * 1e6:.3f} us x context tokens; "
          f"g in ms at {g}")
    print(f"fit: {fit_sentence(record)}")
    for name, entry in record["fit"]["per_scenario"].items():
        held = entry["held_out"]
        print(f"  {name:16s} median |error| {entry['in_sample']['median_abs_rel_error']:6.1%}"
              + ("" if held is None else f"   held out: {held['median_abs_rel_error']:6.1%}"))
    print(f"wrote {args.out} and {args.steps_csv}")
    return 0


def fit_sentence(record: dict) -> str:
    """How well a cost-model record fits, in words (the README quotes this for the committed file; a test checks)."""
    fit = record["fit"]["in_sample"]
    held = [e["held_out"]["median_abs_rel_error"] for e in record["fit"]["per_scenario"].values() if e["held_out"]]
    return (f"median error {fit['median_abs_rel_error']:.1%} over its {fit['num_steps']} steps (p90 "
            f"{fit['p90_abs_rel_error']:.1%}), and {min(held):.1%} to {max(held):.1%} (median per scenario) when each "
            f"scenario is predicted by a fit that never saw it")
