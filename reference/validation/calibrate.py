"""`python -m reference calibrate`: time the engine step by step over a designed set of batch shapes, fit the
simulator's cost model to the steps, and write it as JSON for `python -m sim run --cost-model FILE`.

The simulator prices a step from four numbers of its plan (sim.clock.cost.CostModel.step_time): prompt tokens computed,
decode sequences, K/V tokens the attention reads, and the prompt chunks' query-key pairs. The engine runs the very
same plans (reference/engine/engine.py), so its `step_log` records those numbers beside each step's wall time
(StepRecord.num_prefill_tokens, decodes, num_context_tokens, num_prefill_pairs). The design makes them vary
independently and covers what the engine does with its defaults (a 4,096-token budget on a CPU, 8,192 of context):

    scenario          what it runs                                                 what it pins down
    prefill           single prompts of 8 .. 4,096 tokens, one after another      g across the whole budget
    prompts-KxL       K prompts of L tokens in one step (2x2048 .. 8x512)          tokens apart from attention pairs
    decode-S          S = 1 .. 64 short prompts, then 16 decode steps of S seqs    g at small sizes, per-sequence cost
    decode-8x384      8 private 384-token prompts decoding                         cost per K/V token read
    long-context-S    S sequences behind one cached 1,024-token prefix, decoding   the same, read by many at once
    long-6k-n4        a 6,144-token prompt (2 chunks), 4 samples decoding at 6K    long contexts, parallel sampling
    chunks-B          decodes running while long prompts arrive, budget B tokens   mixed steps (chunked prefill)
    sampling-n2       4 prompts x 2 samples                                        sibling decodes
    beam-4            2 prompts x 4 beams                                          beam steps (forks, copies)

Every step is timed `--passes` times (default 3; each pass serves the whole design once, with the same prompts, so
the plans repeat exactly) and the fit takes each step's median; the file records the spread of the repeats, so a
noisy calibration shows. (`--quick`: the same kinds, seconds in all; the tests run it.) The fit is
sim.clock.cost.PiecewiseCostModel: g, a non-decreasing piecewise-linear cost of the tokens a step computes, plus a cost
per decoding sequence, per K/V token read and per prompt attention pair, all >= 0, fitted to relative errors with
Huber weights. The file says how good it is: in-sample errors per step, and each scenario predicted by a fit that
never saw it (leave one scenario out), so a reader sees how the model extrapolates. `--repeat 2` calibrates twice
and the file's `stability` says how far the fits to single passes (one per pass of every repeat) differ, step by
step and on the validation suite, so even a plain run reports how stable its fit is.

From the outside (`--url URL`): the same model fitted to any OpenAI-compatible server, vLLM's or this project's, that
nobody instruments. Its KV pool and limits come from what it publishes (reference/validation/server_facts.py: vLLM's
vllm:cache_config_info; the token budget and sequence limit, which vLLM does not publish, from --max-num-batched-tokens
and --max-num-seqs), then bursts of streamed requests (client_steps.BURSTS, each kept only where one step computes
every prompt and nothing is preempted) show every step's shape and time at the client (client_steps.py: tokens of
one step arrive together). The file records the server (its URL, version, model and those facts) instead of an
engine; `--quick` runs four small bursts. What a client sees includes what the server does between steps.

NOTE: a step's wall time depends on the machine, the thread count and what else runs on it: calibrate on the
machine and with the thread count (OMP_NUM_THREADS; the engine's CPU default is 1) you simulate, when it is quiet.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from reference.validation.client_steps import STEP_FIELDS
from reference.validation.validation_suite import SUITE, case_requests, simulate_case
from sim.clock.cost import PIECEWISE_COLUMNS, PiecewiseCostModel
from sim.config import RUN_DEFAULTS

DEFAULT_OUT = "figures/cost_model_cpu.json"
DEFAULT_STEPS = "figures/calibration_steps_cpu.csv"
SERVER_OUT = "figures/cost_model_server.json"  # --url's defaults: a server's model, beside the engine's
SERVER_STEPS = "figures/calibration_steps_server.csv"
SERVER_STEP_COLUMNS = ("scenario", "pass", "step", *STEP_FIELDS)
QUICK_DIR = "figures/quick"  # --quick's outputs (ignored by git): a smoke run never overwrites the committed model
MODEL_SPEC = "smollm2-135m"  # the sim.base.specs entry of the engine's embedded model
FIRST_TOKEN_ID = 100  # synthetic prompts avoid SmolLM2's special tokens (ids < 17)


@dataclass(frozen=True, slots=True)
class Wave:
    """`count` requests of `prompt_len` tokens generating `max_tokens` each, added before engine step `at_step`
    of their scenario; the first `shared_prefix` tokens are the same in every wave of the scenario that has one.
    `n` > 1: parallel sampling (n samples of one prompt); `beam_width` > 1: beam search."""

    prompt_len: int
    count: int
    max_tokens: int
    at_step: int = 0
    shared_prefix: int = 0
    n: int = 1
    beam_width: int = 1


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    waves: tuple[Wave, ...]
    engine: dict = field(default_factory=dict)  # LLM keyword arguments beyond the common ones


def _prompts_alone(sizes) -> Scenario:
    return Scenario("prefill", tuple(Wave(p, 1, 2, at_step=2 * i) for i, p in enumerate(sizes)))


def design(quick: bool = False) -> list[Scenario]:
    """The designed batch shapes (module docstring); `quick` for the tests."""
    if quick:
        return [
            _prompts_alone((8, 64, 160)),
            Scenario("prompts-3x48", (Wave(48, 3, 2),)),
            *(Scenario(f"decode-{s}", (Wave(8, s, 6),)) for s in (2, 8)),
            Scenario("long-context-4", (Wave(104, 1, 6, 0, 96), Wave(104, 3, 6, 1, 96)), {"enable_prefix_caching": True}),
            Scenario("chunks-32", (Wave(8, 4, 10), Wave(96, 1, 2, at_step=2)), {"max_num_batched_tokens": 32}),
            Scenario("sampling-n3", (Wave(24, 1, 6, n=3),)),
        ]
    return [
        # prompts alone across the whole range, up to the engine's CPU token budget (4,096)
        _prompts_alone((8, 16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096)),
        # several long prompts in one step, up to the budget: the same tokens as one prompt, less attention
        *(Scenario(f"prompts-{k}x{p}", (Wave(p, k, 2),)) for k, p in ((2, 2048), (4, 1024), (8, 512), (3, 640))),
        # decode batches: g at small token counts and the cost of a sequence
        *(Scenario(f"decode-{s}", (Wave(12, s, 16),)) for s in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)),
        # decodes of private contexts (no block shared): the cost of a K/V token read from memory, not cache
        Scenario("decode-8x384", (Wave(384, 8, 16),)),
        # decodes behind a cached 1,024-token prefix: a K/V token read by many sequences at once
        *(Scenario(f"long-context-{s}", (Wave(1032, 1, 16, 0, 1024), Wave(1032, s - 1, 16, 1, 1024)),
                   {"enable_prefix_caching": True}) for s in (4, 16, 48)),
        # a 6,144-token prompt in two chunks (the second reads 4,096 cached tokens), then 4 samples decoding at 6K
        Scenario("long-6k-n4", (Wave(6144, 1, 12, n=4),)),
        # chunked prompts with decodes riding along, at several budgets
        Scenario("chunks-64", (Wave(12, 8, 40), Wave(384, 1, 4, at_step=3)), {"max_num_batched_tokens": 64}),
        Scenario("chunks-256", (Wave(12, 16, 48), Wave(1024, 1, 8, at_step=3), Wave(512, 2, 8, at_step=12)),
                 {"max_num_batched_tokens": 256}),
        Scenario("chunks-1024", (Wave(12, 8, 16), Wave(2048, 1, 4, at_step=2)), {"max_num_batched_tokens": 1024}),
        Scenario("chunks-2048", (Wave(12, 12, 16), Wave(3072, 1, 4, at_step=2)), {"max_num_batched_tokens": 2048}),
        # parallel sampling and beam search: decode batches of siblings sharing a prompt's blocks
        Scenario("sampling-n2", (Wave(256, 4, 24, n=2),)),
        Scenario("beam-4", (Wave(512, 2, 16, beam_width=4),)),
    ]


def _prompts(scenario: Scenario, rng: np.random.Generator, vocab_size: int) -> list[list[list[int]]]:
    """Token ids per wave per request; waves with a shared prefix share one."""
    prefix = rng.integers(FIRST_TOKEN_ID, vocab_size, max((w.shared_prefix for w in scenario.waves), default=0))
    out = []
    for w in scenario.waves:
        own = rng.integers(FIRST_TOKEN_ID, vocab_size, (w.count, w.prompt_len - w.shared_prefix))
        out.append([prefix[:w.shared_prefix].tolist() + row.tolist() for row in own])
    return out


def _params(wave: Wave):
    from reference import SamplingParams
    from reference.engine.sampling import BeamSearchParams

    if wave.beam_width > 1:
        return BeamSearchParams(beam_width=wave.beam_width, max_tokens=wave.max_tokens, ignore_eos=True)
    # NOTE: n samples are greedy here, as in validate-sim: every row is then sampled at the same cost. A row sampled
    # with a temperature costs ~1 ms more on the project's 2-core machine (torch.multinomial over SmolLM2's 49,152
    # tokens, measured 0.87 ms of it), a cost of this engine's sampler that the model's per-sequence c does not split out.
    return SamplingParams(n=wave.n, temperature=0.0, max_tokens=wave.max_tokens, ignore_eos=True)


def run_scenario(loaded, scenario: Scenario, *, block_size: int, rng: np.random.Generator | None = None,
                 prompts: list[list[list[int]]] | None = None) -> list[dict]:
    """Serve the scenario on a fresh engine over the loaded model; one row per executed step (its index `step`)
    without swaps. `prompts` (per wave, per request) or else drawn from `rng`."""
    from reference import LLM

    # room for every sequence's whole length, as if nothing were shared (the admission check's own rule)
    tokens = sum(w.count * max(w.n, w.beam_width) * (w.prompt_len + w.max_tokens + block_size) for w in scenario.waves)
    llm = LLM.from_loaded(*loaded, block_size=block_size, num_gpu_blocks=-(-tokens // block_size) + 8,
                          **scenario.engine)
    if prompts is None:
        prompts = _prompts(scenario, rng, loaded[0].config.vocab_size)
    pending = sorted(zip(scenario.waves, prompts), key=lambda wave: wave[0].at_step)
    step = 0
    while pending or llm.has_unfinished_requests():
        while pending and (pending[0][0].at_step <= step or not llm.has_unfinished_requests()):
            wave, ids = pending.pop(0)
            for prompt in ids:
                llm.add_request(prompt, _params(wave))
        llm.step()
        step += 1
    return [{"scenario": scenario.name, "step": r.step, "num_prefill_tokens": r.num_prefill_tokens,
             "num_decode_seqs": len(r.decodes), "num_context_tokens": r.num_context_tokens,
             "num_prefill_pairs": r.num_prefill_pairs, "num_shared_context_tokens": r.num_shared_context_tokens,
             "step_time_s": r.step_time_s}
            for r in llm.step_log if not (r.blocks_to_swap_in or r.blocks_to_swap_out)]


PASSES, QUICK_PASSES = 3, 2  # timings of every step (the fit takes their median)
STEP_COLUMNS = ("scenario", "repeat", "pass", "step", *PIECEWISE_COLUMNS)
SHAPE = PIECEWISE_COLUMNS[:-1]


def measure(loaded, scenarios: list[Scenario], *, block_size: int = 16, seed: int = 0, passes: int = 3,
            progress: bool = True) -> list[dict]:
    """Every scenario's steps, timed `passes` times, after an untimed warm-up (the first steps load compiled kernels).

    A pass serves every scenario once; passes run one after another (not a scenario three times in a row), so a
    burst of noise on the machine hits one timing of many steps rather than every timing of a few. Each scenario
    gets the same prompts in every pass, so its plans, and hence its steps' shapes, repeat exactly. One row per
    step and pass (column `pass`)."""
    rng = np.random.default_rng([seed, 0xCA1])
    run_scenario(loaded, Scenario("warm-up", (Wave(16, 2, 4),)), block_size=block_size, rng=rng)
    vocab = loaded[0].config.vocab_size
    prompts = [_prompts(s, rng, vocab) for s in scenarios]
    rows, total, started = [], passes * len(scenarios), time.perf_counter()
    for p in range(passes):
        for i, (scenario, ids) in enumerate(zip(scenarios, prompts)):
            got = run_scenario(loaded, scenario, block_size=block_size, prompts=ids)
            rows += [{**r, "pass": p} for r in got]
            if progress:
                done = p * len(scenarios) + i + 1
                print(f"  [{done}/{total}] pass {p + 1}/{passes} {scenario.name}: {len(got)} steps "
                      f"({time.perf_counter() - started:.0f} s)", flush=True)
    return rows


def median_steps(rows: list[dict]) -> list[dict]:
    """One row per distinct step (scenario, step index, shape) with the median of its timings (`step_time_s`), how
    many there were (`timings`) and their spread ((max - min) / median, `spread`)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["scenario"], r["step"], *(r[c] for c in SHAPE)), []).append(r)
    out = []
    for found in groups.values():
        times = np.array([r["step_time_s"] for r in found])
        median = float(np.median(times))
        out.append({**{k: v for k, v in found[0].items() if k != "pass"}, "step_time_s": median,
                    "timings": len(times), "spread": float((times.max() - times.min()) / median)})
    return out


def _predict(model: PiecewiseCostModel, rows: list[dict]) -> np.ndarray:
    return np.array([model.step_time(*(r[c] for c in SHAPE)) for r in rows])


def _errors(model: PiecewiseCostModel, rows: list[dict]) -> np.ndarray:
    """|predicted - measured| / measured per row."""
    measured = np.array([r["step_time_s"] for r in rows])
    return np.abs(_predict(model, rows) - measured) / measured


def _summary(errors: np.ndarray) -> dict:
    return {"num_steps": int(len(errors)), "median_abs_rel_error": float(np.median(errors)),
            "p90_abs_rel_error": float(np.percentile(errors, 90)), "max_abs_rel_error": float(errors.max())}


def _as_tuples(rows: list[dict]) -> list[tuple]:
    return [tuple(r[c] for c in PIECEWISE_COLUMNS) for r in rows]


def fit(rows: list[dict]) -> tuple[PiecewiseCostModel, dict]:
    """The model fitted to the median timing of every step, and how good it is: in-sample, per scenario, and per
    scenario held out (fitted without it), plus the spread of the repeated timings."""
    steps = median_steps(rows)
    model = PiecewiseCostModel.fit(_as_tuples(steps))
    spread = np.array([r["spread"] for r in steps if r["timings"] > 1])
    quality = {"in_sample": _summary(_errors(model, steps)), "per_scenario": {},
               "repeats": {"timings_per_step": int(min(r["timings"] for r in steps)),
                           "median_spread": float(np.median(spread)) if len(spread) else None,
                           "p90_spread": float(np.percentile(spread, 90)) if len(spread) else None}}
    for name in dict.fromkeys(r["scenario"] for r in steps):
        mine = [r for r in steps if r["scenario"] == name]
        rest = [r for r in steps if r["scenario"] != name]
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
    p.add_argument("--quick", action="store_true", help=f"a few seconds of small shapes (a smoke run, not ~7 minutes; "
                   f"its files go under {QUICK_DIR}/ unless named, so the committed model stays)")
    p.add_argument("--out", help=f"cost model JSON to write (default: {DEFAULT_OUT})")
    p.add_argument("--steps-csv", help=f"the measured steps, one row per step (default: {DEFAULT_STEPS})")
    p.add_argument("--block-size", type=int, default=RUN_DEFAULTS["block_size"],
                   help="the engine's KV block size (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt ids (default: 0)")
    p.add_argument("--passes", type=int, default=None, help=f"timings of every step; the fit takes their median "
                   f"(default: {PASSES} full, {QUICK_PASSES} with --quick)")
    p.add_argument("--url", help="calibrate against the OpenAI-compatible server there (vLLM's or `python -m reference "
                   "serve`), from the outside: bursts of streamed requests, the steps recovered from when each token "
                   "arrives (reference/validation/client_steps.py); its KV pool is read from its /metrics")
    p.add_argument("--max-num-batched-tokens", type=int, help="with --url: the server's token budget per step, when "
                   "it does not publish it (vLLM does not)")
    p.add_argument("--max-num-seqs", type=int, help="with --url: the server's sequences at most, when it does not "
                   "publish them (vLLM does not)")
    p.add_argument("--num-gpu-blocks", type=int, help="with --url: the server's KV pool in blocks, when its /metrics "
                   "has no vllm:cache_config_info")
    p.add_argument("--repeat", type=int, default=1, help="measure the whole design this many times over (each time "
                   "--passes timings a step); every pass is fitted alone too, and the file's `stability` reports how far "
                   "those fits' predictions differ, step by step and on the validation suite; the model written is "
                   "the fit to every timing (default: 1)")


def check_args(args: argparse.Namespace) -> None:
    from sim.base.limits import MAX_SEED
    from sim.base.outfiles import check_outputs

    defaults = (("out", DEFAULT_OUT), ("steps_csv", DEFAULT_STEPS))
    if args.url is not None:  # a server's model never replaces the committed model of the project's engine
        defaults = (("out", SERVER_OUT), ("steps_csv", SERVER_STEPS))
    for name, default in defaults:
        if getattr(args, name) is None:
            setattr(args, name, str(Path(QUICK_DIR) / Path(default).name) if args.quick else default)
    server_flags = {"max_num_batched_tokens": args.max_num_batched_tokens, "max_num_seqs": args.max_num_seqs,
                    "num_gpu_blocks": args.num_gpu_blocks}
    if args.url is None and any(v is not None for v in server_flags.values()):
        given = next(name for name, v in server_flags.items() if v is not None)
        raise ValueError(f"--{given.replace('_', '-')} describes a server: it needs --url (allowed without --url: "
                         "--quick, --out, --steps-csv, --block-size, --seed, --passes, --repeat)")
    if args.block_size < 1 or args.block_size > 256:
        raise ValueError(f"--block-size: got {args.block_size} (allowed: 1 to 256 tokens)")
    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"--seed: got {args.seed} (allowed: an integer from 0 to {MAX_SEED})")
    if args.passes is None:
        args.passes = QUICK_PASSES if args.quick else PASSES
    if not 1 <= args.passes <= 9:
        raise ValueError(f"--passes: got {args.passes} (allowed: 1 to 9)")
    if not 1 <= args.repeat <= 5:
        raise ValueError(f"--repeat: got {args.repeat} (allowed: 1 to 5)")
    check_outputs({"--out": args.out, "--steps-csv": args.steps_csv}, make_parents=True)
    args.facts = None
    if args.url is not None:
        from reference.validation.server_facts import read_facts

        if not args.url.startswith(("http://", "https://")):
            raise ValueError(f"--url {args.url!r} (allowed: http://host:port)")
        if args.repeat != 1:
            raise ValueError("--repeat with --url: not measured from outside yet (allowed with --url: --repeat 1)")
        args.facts = read_facts(args.url, server_flags)  # one line if a fact is missing


def calibrate(loaded, *, quick: bool, block_size: int = 16, seed: int = 0, command: str = "", passes: int | None = None,
              repeat: int = 1, progress: bool = True) -> tuple[dict, list[dict]]:
    """Measure, fit, and return the cost-model record (sim.clock.cost_file) and the measured rows (one per step, pass and
    repeat). `repeat` > 1: the whole measurement that many times; the record's `stability` compares the fits."""
    import torch

    from reference.engine.executor import default_backend
    from sim.clock.cost_file import cost_model_record

    scenarios = design(quick)
    passes = passes if passes is not None else (QUICK_PASSES if quick else PASSES)
    started = time.perf_counter()
    rows = []
    for k in range(repeat):
        if progress and repeat > 1:
            print(f"repeat {k + 1}/{repeat}", flush=True)
        rows += [{**r, "repeat": k} for r in measure(loaded, scenarios, block_size=block_size, seed=seed, passes=passes,
                                                     progress=progress)]
    model, quality = fit(rows)
    # every pass of every repeat is a whole, independent timing of the design: a fit to each says how stable the fit is
    groups = sorted({(r["repeat"], r["pass"]) for r in rows})
    fits = [PiecewiseCostModel.fit(_as_tuples([r for r in rows if (r["repeat"], r["pass"]) == g])) for g in groups]
    extra = {"stability": stability(fits, median_steps(rows), quick=quick, seed=seed)} if len(fits) > 1 else {}
    engine = {"device": "cpu", "threads": torch.get_num_threads(), "dtype": str(loaded[0].dtype).removeprefix("torch."),
              "backend": default_backend(None, loaded[0].device, loaded[0].dtype), "block_size": block_size}
    record = cost_model_record(
        model, MODEL_SPEC, fit=quality, engine=engine, machine=machine(), versions=versions(),
        design=[{"name": s.name, "waves": [vars_of(w) for w in s.waves], "engine": s.engine} for s in scenarios],
        command=command, created=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        measured_in_s=round(time.perf_counter() - started, 1), **extra,
    )
    return record, rows


def stability(fits: list[PiecewiseCostModel], steps: list[dict], *, quick: bool, seed: int) -> dict:
    """How far independent fits disagree (one per pass of every repeat, each fitted to that pass's timings alone): on
    the design's steps (relative difference of each step's predicted time from the first fit's), and on the
    validation suite (each trace simulated under every fit: the largest relative difference from the first fit's
    median end-to-end latency, median TTFT and simulated span, the time to serve the whole trace)."""
    first = _predict(fits[0], steps)
    step_diff = np.concatenate([np.abs(_predict(f, steps) / first - 1) for f in fits[1:]])
    traces = {}
    for case in SUITE:
        requests = case_requests(case, quick=quick, seed=seed)
        runs = [simulate_case(case, requests, f).summary for f in fits]
        traces[case.name] = {key: max(abs(r[key] / runs[0][key] - 1) for r in runs[1:])
                             for key in ("p50_e2e_latency_s", "p50_ttft_s", "sim_time_s") if runs[0].get(key)}
    return {"num_fits": len(fits), "steps": {"median_rel_diff": float(np.median(step_diff)),
                                             "p90_rel_diff": float(np.percentile(step_diff, 90)),
                                             "max_rel_diff": float(step_diff.max())},
            "suite": traces}


def vars_of(wave: Wave) -> dict:
    return {name: getattr(wave, name) for name in Wave.__slots__}


def calibrate_server(facts, *, quick: bool, passes: int, seed: int = 0, command: str = "",
                     progress: bool = True) -> tuple[dict, list[dict], list[str]]:
    """The cost-model record fitted to the server `facts` describes, measured from the outside
    (reference/validation/client_steps.py), its step rows, and the bursts left out (one line each)."""
    from reference.validation.client_steps import measure_server
    from sim.clock.cost_file import cost_model_record

    started = time.perf_counter()
    rows, skipped = measure_server(facts, quick=quick, passes=passes, seed=seed, progress=progress)
    if not rows:
        raise ValueError(f"{facts.url}: no burst of the design fits this server ({'; '.join(skipped)})")
    model, quality = fit(rows)
    server = {"url": facts.url, "version": facts.version, "model": facts.model, "block_size": facts.block_size,
              "num_gpu_blocks": facts.num_gpu_blocks, "max_num_batched_tokens": facts.max_num_batched_tokens,
              "max_num_seqs": facts.max_num_seqs, "enable_prefix_caching": facts.enable_prefix_caching,
              "facts_from": facts.sources}
    record = cost_model_record(model, MODEL_SPEC, fit=quality, server=server, machine=machine(), versions=versions(),
                               measured_from="outside: step times recovered from streamed token arrivals",
                               skipped=skipped, command=command, created=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                               measured_in_s=round(time.perf_counter() - started, 1))
    return record, rows, skipped


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """The `python -m reference calibrate` command (flags checked by check_args first)."""
    if args.facts is not None:
        return run_server(args, argv)
    import torch

    from reference.engine.executor import use_one_cpu_thread
    from reference.models import load_model
    from sim.base.outfiles import atomic_files, write_csv
    from sim.clock.cost_file import write_cost_model

    use_one_cpu_thread(torch.device("cpu"))
    print(f"calibrate: {'quick' if args.quick else 'full'} design at {torch.get_num_threads()} thread(s)", flush=True)
    loaded = load_model("smollm2")
    record, rows = calibrate(loaded, quick=args.quick, block_size=args.block_size, seed=args.seed,
                             command=" ".join(argv), passes=args.passes, repeat=args.repeat)
    with atomic_files(make_parents=True) as files:  # both files or neither
        write_csv(args.steps_csv, STEP_COLUMNS, rows, comments=[f"command: {' '.join(argv)}"], files=files)
        write_cost_model(args.out, record, files=files)
    c = record["coefficients"]
    model = PiecewiseCostModel(tuple(c["knots"]), tuple(c["values"]), c["c"], c["d"], c["e"])
    g = ", ".join(f"{n:g}: {model.tokens_time(n) * 1e3:.0f}" for n in (1, 2, 4, 8, 64, 256, 1024, 4096))
    shared = "" if c["d_shared"] is None else f" ({c['d_shared'] * 1e6:.3f} us read from a shared block)"
    print(f"step_time = g(tokens) + {c['c'] * 1e3:.3f} ms x decode seqs + {c['d'] * 1e6:.3f} us x context tokens{shared}"
          f" + {c['e'] * 1e9:.1f} ns x prompt attention pairs; g in ms at {g}")
    print(f"fit: {fit_sentence(record)}")
    spread = record["fit"]["repeats"]
    if spread["median_spread"] is not None:
        print(f"repeats: {spread['timings_per_step']} timings a step; (max - min) / median: median "
              f"{spread['median_spread']:.1%}, p90 {spread['p90_spread']:.1%}")
    if "stability" in record:
        print(stability_sentence(record))
        st = record["stability"]
        print(f"stability over {st['num_fits']} fits: step predictions differ by {st['steps']['median_rel_diff']:.1%} "
              f"(median), {st['steps']['p90_rel_diff']:.1%} (p90), {st['steps']['max_rel_diff']:.1%} (max)")
        for name, diff in st["suite"].items():
            print(f"  {name:16s} " + "   ".join(f"{key} {value:.1%}" for key, value in diff.items()))
    print_scenarios(record)
    print(f"wrote {args.out} and {args.steps_csv}")
    return 0


def run_server(args: argparse.Namespace, argv: list[str]) -> int:
    """`python -m reference calibrate --url URL`: the server measured from the outside, fitted, written."""
    from sim.base.outfiles import atomic_files, write_csv
    from sim.clock.cost_file import write_cost_model

    f = args.facts
    print(f"calibrate: {f.url} ({f.model}, version {f.version or '?'}; {f.num_gpu_blocks} blocks of {f.block_size}, "
          f"{f.max_num_batched_tokens} tokens a step, {f.max_num_seqs} sequences), "
          f"{'quick' if args.quick else 'full'} design from the outside", flush=True)
    try:
        record, rows, skipped = calibrate_server(f, quick=args.quick, passes=args.passes, seed=args.seed,
                                                 command=" ".join(argv))
    except ValueError as exc:  # the server refused a request, or no burst fits it: one line, as a usage error is
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    for line in skipped:
        print(f"  left out: {line}")
    with atomic_files(make_parents=True) as files:  # both files or neither
        write_csv(args.steps_csv, SERVER_STEP_COLUMNS, rows, comments=[f"command: {' '.join(argv)}"], files=files)
        write_cost_model(args.out, record, files=files)
    print(f"fit: {fit_sentence(record)}")
    print_scenarios(record)
    print(f"wrote {args.out} and {args.steps_csv}")
    return 0


def print_scenarios(record: dict) -> None:
    """Each scenario's median error under the fit, and under a fit that never saw it."""
    for name, entry in record["fit"]["per_scenario"].items():
        held = entry["held_out"]
        print(f"  {name:20s} median |error| {entry['in_sample']['median_abs_rel_error']:6.1%}"
              + ("" if held is None else f"   held out: {held['median_abs_rel_error']:6.1%}"))


def stability_sentence(record: dict) -> str:
    """How far fits to single passes disagree, in words (the README's `calibration` block, reference/readme_numbers)."""
    st = record["stability"]
    suite = [v for diffs in st["suite"].values() for k, v in diffs.items() if k == "p50_e2e_latency_s"]
    return (f"Fitted to each of its {st['num_fits']} passes alone, the model's step predictions differ from the first "
            f"pass's fit by {st['steps']['median_rel_diff']:.1%} at the median step ({st['steps']['p90_rel_diff']:.1%} "
            f"p90), and the validation traces' simulated median end-to-end latency by at most {max(suite):.1%}.")


def fit_sentence(record: dict) -> str:
    """How well a cost-model record fits, in words (the README's `calibration` block, reference/readme_numbers)."""
    fit = record["fit"]["in_sample"]
    held = [e["held_out"]["median_abs_rel_error"] for e in record["fit"]["per_scenario"].values() if e["held_out"]]
    return (f"median error {fit['median_abs_rel_error']:.1%} over its {fit['num_steps']} steps (p90 "
            f"{fit['p90_abs_rel_error']:.1%}), and {min(held):.1%} to {max(held):.1%} (median per scenario) when each "
            f"scenario is predicted by a fit that never saw it")
