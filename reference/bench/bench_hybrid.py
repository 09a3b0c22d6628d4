"""CPU benchmark of the hybrid KV cache manager on the real Gemma 3 270M: the same KV bytes, more requests at once.

Gemma 3 270M computes 15 of its 18 layers with sliding-window attention (the last 512 tokens). The engine serves it
twice in ONE run, in the same KV budget in bytes, on the same requests (all arriving at once, greedy, ignore EOS):

- `--policy paged`: every layer keeps every block of every token for the whole life of a request (18 K/V tensors
  of blocks; a block holds 16 tokens of all 18 layers);
- `--policy hybrid`: vLLM's hybrid KV cache manager (sim/kv/hybrid.py; Jenga, SOSP 2025, has the same idea): six
  KV cache groups of three layers over one pool of pages, and a sliding group gives a page back as soon as the
  window has passed it. Per request, past the window, that is about 1/6 of the memory per token.

Measured per policy, side by side: most and mean requests running per step (`LLM.step_log`; running includes a
request whose prompt is still being computed in chunks, so the most requests decoding together is given too),
preemptions and the prompt tokens they recompute, the KV memory held after each step (pages in use x bytes per
page; and per request holding memory), wall time in `LLM.step` and output tokens/s; and the greedy tokens of every
request, which must be the same under both policies (the run fails if they are not).
After every step three counts must agree (a RuntimeError if not): the pool's free count, the blocks in the live
sequences' tables, and the memory breakdown's slots in use; and the manager's own `check_invariants` passes.

NOTE: memory is read AFTER each step (as `step_log` records it): a request that finished in the step has already
given its blocks back, so this is the most memory held between steps, a lower bound on the peak within one.
NOTE: a step's whole prompt chunk gets pages in every group, sliding ones too, until the sequence's next step frees
what the window has passed (sim/kv/hybrid.py, as vLLM): right after a long prefill a hybrid request holds as much
as a paged one, so the peak memory of the two runs is alike; the difference is in what stays held.
NOTE: torch.set_num_threads(1), as `python -m reference bench`: both policies run in one process on a 2-core
machine that other processes may share (the load average is saved with the numbers).
"""
from __future__ import annotations

import argparse
import os
import shlex
import time
from pathlib import Path

import numpy as np

DEFAULT_OUT = "figures/bench_hybrid_cpu.csv"
DEFAULT_STEPS_OUT = "figures/bench_hybrid_steps_cpu.csv"
DEFAULT_FIGURE = "figures/bench_hybrid_cpu.png"
QUICK_DIR = "figures/quick"  # outputs of any other workload (ignored by git): the committed run stays
POLICIES = ("paged", "hybrid")  # the baseline first: the hybrid run's tokens are compared with its
BUDGET_REQUESTS = 4  # the default KV budget: this many of the longest requests, each alone under paged
WORKLOADS = {False: {"num_requests": 12, "prompt_len": (1024, 2048), "output_len": 32},  # a few minutes per policy
             True: {"num_requests": 6, "prompt_len": (768, 1024), "output_len": 8}}  # --quick: well under a minute
MIB = 2**20
BLOCK_SIZE = 16  # tokens per block (paged) or page (hybrid), unless --block-size
SUMMARY_COLUMNS = ("policy", "num_requests", "output_tokens", "num_steps", "wall_s", "tokens_per_s",
                   "max_concurrent_requests", "max_decoding_requests", "mean_concurrent_requests", "num_preemptions",
                   "recomputed_tokens", "kv_budget_mib", "pool_pages", "page_kib", "peak_kv_mib", "mean_kv_mib",
                   "mean_kv_mib_per_request", "note")
STEP_COLUMNS = ("policy", "step", "start_s", "step_time_s", "num_running_requests", "num_waiting",
                "num_prefill_tokens", "num_decodes", "num_preempted", "num_finished", "pages_used", "layer_blocks",
                "kv_mib")


def add_arguments(p: argparse.ArgumentParser) -> None:
    full, quick = WORKLOADS[False], WORKLOADS[True]
    p.add_argument("--quick", action="store_true",
                   help=f"{quick['num_requests']} requests of {quick['prompt_len'][0]}-{quick['prompt_len'][1]} "
                   f"prompt tokens, {quick['output_len']} output tokens (a smoke run)")
    p.add_argument("--num-requests", type=int, help=f"requests (default: {full['num_requests']})")
    p.add_argument("--prompt-len", type=int, nargs=2, metavar=("MIN", "MAX"),
                   help=f"prompt lengths, uniform in [MIN, MAX] tokens (default: {full['prompt_len'][0]} "
                   f"{full['prompt_len'][1]})")
    p.add_argument("--output-len", type=int, help=f"output tokens per request (default: {full['output_len']})")
    p.add_argument("--kv-budget-mib", type=float,
                   help=f"the KV budget of both policies in MiB (default: {BUDGET_REQUESTS} of the longest requests "
                   "as paged holds them)")
    p.add_argument("--block-size", type=int, default=BLOCK_SIZE,
                   help=f"tokens per block or page (default: {BLOCK_SIZE})")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt lengths and ids (default: 0)")
    where = f"; under {QUICK_DIR}/ for any other workload than the default"
    p.add_argument("--out", help=f"summary CSV (default: {DEFAULT_OUT}{where})")
    p.add_argument("--steps-out", help=f"per-step CSV (default: {DEFAULT_STEPS_OUT}{where})")
    p.add_argument("--figure", help=f"PNG figure (default: {DEFAULT_FIGURE}{where})")


def workload(args: argparse.Namespace) -> tuple[int, tuple[int, int], int]:
    """(requests, (shortest, longest) prompt, output tokens): the flags, else the defaults of the mode."""
    mode = WORKLOADS[args.quick]
    given = {key: getattr(args, key) for key in mode}
    count, prompt_len, output_len = (mode[key] if value is None else value for key, value in given.items())
    return count, tuple(prompt_len), output_len


def budget_bytes(config, args: argparse.Namespace) -> int:
    """The KV budget of both policies; ValueError (one line) for --kv-budget-mib too small for the longest request.

    One request of final length L needs cdiv(L, block_size) blocks of all layers under paged, and the same bytes
    under hybrid (check_request counts its whole prompt in every group, as one unchunked prefill would take)."""
    import torch

    from reference.engine.kv_cache import kv_bytes_per_block

    _, (_, longest), output_len = workload(args)
    per_block = kv_bytes_per_block(config.num_layers, args.block_size, config.num_kv_heads, config.head_dim,
                                   torch.float32)
    need = -(-(longest + output_len) // args.block_size) * per_block
    if args.kv_budget_mib is None:
        return BUDGET_REQUESTS * need
    if not args.kv_budget_mib * MIB >= need:
        least = np.ceil(need / MIB * 100) / 100
        raise ValueError(f"--kv-budget-mib {args.kv_budget_mib:g} holds no request: the longest ({longest} + "
                         f"{output_len} tokens) needs {least:.2f} MiB of K/V (allowed: a number >= {least:.2f})")
    return int(args.kv_budget_mib * MIB)


def check_args(args: argparse.Namespace) -> None:
    """ValueError (one line, with the allowed range) for a bad flag, a budget that holds no request, or an output
    that could not be written, before the model loads (reads Gemma 3's config only)."""
    from reference.models.loader import gemma3_checkpoint_dir, read_config
    from sim.base.limits import MAX_SEED
    from sim.base.outfiles import check_outputs

    count, (shortest, longest), output_len = workload(args)
    if not 1 <= count <= 1000:
        raise ValueError(f"--num-requests {count} (allowed: an integer from 1 to 1,000)")
    if not 1 <= output_len <= 4096:
        raise ValueError(f"--output-len {output_len} (allowed: an integer from 1 to 4,096)")
    if not 1 <= args.block_size <= 1024:
        raise ValueError(f"--block-size {args.block_size} (allowed: an integer from 1 to 1,024)")
    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"--seed {args.seed} (allowed: an integer from 0 to {MAX_SEED:,})")
    if args.kv_budget_mib is not None and not 0 < args.kv_budget_mib <= 2**20:
        raise ValueError(f"--kv-budget-mib {args.kv_budget_mib:g} (allowed: a number of MiB in (0, 1,048,576])")
    full = argparse.Namespace(quick=False, num_requests=None, prompt_len=None, output_len=None)
    default_run = (workload(args), args.kv_budget_mib, args.block_size, args.seed) == (workload(full), None,
                                                                                        BLOCK_SIZE, 0)
    for name, default in (("out", DEFAULT_OUT), ("steps_out", DEFAULT_STEPS_OUT), ("figure", DEFAULT_FIGURE)):
        if getattr(args, name) is None:  # a path the program names: its folder may be made, a user's may not
            setattr(args, name, default if default_run else str(Path(QUICK_DIR) / Path(default).name))
            Path(getattr(args, name)).parent.mkdir(parents=True, exist_ok=True)
    check_outputs({f"--{name.replace('_', '-')}": getattr(args, name) for name in ("out", "steps_out", "figure")})
    config = read_config(gemma3_checkpoint_dir())  # the package missing is one line too
    context = config.max_position_embeddings
    if not 2 <= shortest <= longest or longest + output_len > context:
        raise ValueError(f"--prompt-len {shortest} {longest} with --output-len {output_len} (allowed: 2 <= MIN <= "
                         f"MAX, MAX + output length <= {context:,}, the model's context)")
    budget_bytes(config, args)


def make_prompts(tokenizer, config, count: int, prompt_len: tuple[int, int], seed: int) -> list[list[int]]:
    """Lengths uniform in [MIN, MAX]; each prompt is BOS (as the tokenizer starts a text) and then ids drawn
    uniformly from the ordinary vocabulary: none of the tokenizer's added tokens (control, unused, image ids)."""
    special = set(tokenizer.added_tokens_decoder) | {config.bos_token_id}
    ordinary = np.array([i for i in range(config.vocab_size) if i not in special])
    rng = np.random.default_rng([seed, 0x4879])
    lengths = rng.integers(prompt_len[0], prompt_len[1] + 1, size=count)
    return [[config.bos_token_id] + rng.choice(ordinary, size=n - 1).tolist() for n in lengths]


def pages_in_tables(kv) -> int:
    """Distinct blocks in the live sequences' tables, in every KV cache group."""
    held = set()
    for seq_id in kv.seq_ids:
        held.update(b for table in kv.group_tables(seq_id) for b in table if b is not None)
    return len(held)


def check_step(llm) -> None:
    """The pool's free count, the blocks in the tables and the breakdown's slots in use agree after this step."""
    kv, record = llm.kv_manager, llm.step_log[-1]
    used, memory = kv.num_blocks - record.num_free_blocks, record.memory
    slots_in_use = memory.token_states + memory.reservation + memory.internal_fragmentation
    counts = (kv.num_blocks - kv.num_free_blocks, pages_in_tables(kv), slots_in_use // kv.block_size)
    if counts != (used,) * 3 or slots_in_use % kv.block_size:
        raise RuntimeError(f"step {record.step}: expected {used} pages in use (step log) in the pool, the tables and "
                           f"the breakdown, found {counts} ({slots_in_use} slots in use)")
    kv.check_invariants()


def serve(llm, prompts: list[list[int]], output_len: int) -> tuple[list[list[int]], float]:
    """Every prompt at once, greedy, ignore EOS; (each request's tokens, seconds spent in llm.step)."""
    from reference import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    ids = [llm.add_request(p, params) for p in prompts]
    tokens, seconds = {}, 0.0
    while llm.has_unfinished_requests():
        started = time.perf_counter()
        outputs = llm.step()
        seconds += time.perf_counter() - started
        check_step(llm)  # not timed
        tokens.update((o.request_id, list(o.outputs[0].token_ids)) for o in outputs if o.finished)
    return [tokens[i] for i in ids], seconds


def run_policy(loaded, policy: str, prompts: list[list[int]], output_len: int, budget: int, block_size: int):
    """(summary row, step rows, tokens) of one policy; an untimed warm-up engine runs one short request first."""
    from reference import LLM

    warm = LLM.from_loaded(*loaded, policy=policy, block_size=block_size, kv_budget_bytes=budget)
    serve(warm, [prompts[0][:64]], 2)
    llm = LLM.from_loaded(*loaded, policy=policy, block_size=block_size, kv_budget_bytes=budget)
    tokens, wall = serve(llm, prompts, output_len)
    kv, cache = llm.kv_manager, llm.kv_cache
    page_bytes = cache.bytes_per_block  # a block of every layer (paged), a page of one group's layers (hybrid)
    steps = [step_row(policy, r, kv.num_blocks - r.num_free_blocks, cache.num_layers, page_bytes, llm.step_log[0])
             for r in llm.step_log]
    running, held = [s["num_running_requests"] for s in steps], [s["kv_mib"] for s in steps]
    if max(running) != llm.stats.max_concurrent_requests:
        raise RuntimeError(f"expected the step log's most running requests {max(running)} in the engine's stats, "
                           f"found {llm.stats.max_concurrent_requests}")
    # memory per request: over the steps after which a request still holds some (it ran and did not finish)
    per_request = [s["kv_mib"] / (s["num_running_requests"] - s["num_finished"]) for s in steps
                   if s["num_running_requests"] > s["num_finished"]]
    out_tokens, groups = sum(map(len, tokens)), cache.layout.num_groups
    summary = {
        "policy": policy, "num_requests": len(prompts), "output_tokens": out_tokens, "num_steps": len(steps),
        "wall_s": round(wall, 3), "tokens_per_s": round(out_tokens / wall, 3),
        "max_concurrent_requests": max(running), "max_decoding_requests": max(s["num_decodes"] for s in steps),
        "mean_concurrent_requests": round(float(np.mean(running)), 3), "num_preemptions": llm.stats.num_preemptions,
        "recomputed_tokens": llm.stats.num_prefill_tokens - sum(map(len, prompts)),
        "kv_budget_mib": round(budget / MIB, 3), "pool_pages": kv.num_blocks, "page_kib": page_bytes / 1024,
        "peak_kv_mib": max(held), "mean_kv_mib": round(float(np.mean(held)), 3),
        "mean_kv_mib_per_request": round(float(np.mean(per_request)), 3),
        "note": f"{cache.num_layers} K/V tensors of {kv.num_blocks} pages of {kv.block_size} tokens; "
                f"{groups} KV cache group(s) of {llm.config.num_layers // groups} layers",
    }
    return summary, steps, tokens


def step_row(policy: str, r, pages_used: int, num_tensors: int, page_bytes: int, first) -> dict:
    """One StepRecord as a row of the per-step CSV; memory after the step (see the module docstring)."""
    return {"policy": policy, "step": r.step, "start_s": round(r.start_s - first.start_s, 4),
            "step_time_s": round(r.step_time_s, 4), "num_running_requests": r.num_running_requests,
            "num_waiting": r.num_waiting, "num_prefill_tokens": r.num_prefill_tokens, "num_decodes": len(r.decodes),
            "num_preempted": len(r.preempted), "num_finished": len(r.finished_request_ids),
            "pages_used": pages_used, "layer_blocks": pages_used * num_tensors,
            "kv_mib": round(pages_used * page_bytes / MIB, 3)}


def compare_tokens(tokens: dict[str, list[list[int]]]) -> str:
    """A sentence saying every request got the same greedy tokens under every policy; RuntimeError if not."""
    (base, expected), *others = tokens.items()
    for policy, got in others:
        bad = [i for i, (a, b) in enumerate(zip(expected, got)) if a != b]
        if bad or len(got) != len(expected):
            i = bad[0] if bad else min(len(got), len(expected))
            raise RuntimeError(f"expected the same greedy tokens under {base} and {policy}, found {len(bad)} of "
                               f"{len(expected)} requests differ (request {i}: {expected[i][:8]}... vs "
                               f"{got[i][:8]}...)")
    total = sum(map(len, expected))
    return f"identical under {' and '.join(tokens)} for all {len(expected)} requests ({total} tokens)"


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """The `python -m reference bench-hybrid` command (flags checked by check_args first)."""
    import torch

    from reference.bench.bench import machine_description
    from reference.models import load_model

    started, load_before = time.perf_counter(), os.getloadavg()[0]
    torch.set_num_threads(1)  # see the module docstring
    loaded = load_model("gemma3")  # float32 on the CPU
    model, tokenizer, config = loaded
    count, prompt_len, output_len = workload(args)
    prompts = make_prompts(tokenizer, config, count, prompt_len, args.seed)
    budget = budget_bytes(config, args)
    summaries, steps, tokens = [], [], {}
    for policy in POLICIES:
        summary, rows, tokens[policy] = run_policy(loaded, policy, prompts, output_len, budget, args.block_size)
        summaries.append(summary)
        steps += rows
        print(f"  {policy}: {summary['max_concurrent_requests']} requests at most, peak {summary['peak_kv_mib']:.1f} "
              f"MiB, {summary['tokens_per_s']:.2f} output tokens/s", flush=True)
    lengths = [len(p) for p in prompts]
    sliding = sum(config.layer_window(i) is not None for i in range(config.num_layers))
    header = {
        "machine": machine_description(),
        "command": shlex.join(argv),
        "model": f"Gemma 3 270M ({config.num_layers} layers, {sliding} sliding over {config.sliding_window} tokens), "
                 "float32, CPU, torch.set_num_threads(1)",
        "workload": f"{count} requests at t=0: prompt {min(lengths)}-{max(lengths)} (mean {np.mean(lengths):.1f}) "
                    f"tokens (BOS + seeded random ordinary ids, seed {args.seed}), {output_len} output tokens each, "
                    "greedy, ignore EOS",
        "kv_budget": f"{budget:,} bytes ({budget / MIB:.2f} MiB) for both policies, block/page size {args.block_size}",
        "greedy_tokens": compare_tokens(tokens),
        "load_average": f"{load_before:.2f} at start, {os.getloadavg()[0]:.2f} at end (1 min; other processes "
                        "share these cores)",
        "total_s": f"{time.perf_counter() - started:.1f}",
    }
    report(summaries, steps, header, args)
    return 0


def report(summaries: list[dict], steps: list[dict], header: dict[str, str], args: argparse.Namespace) -> None:
    from sim.base.outfiles import atomic_files, save_figure, write_csv

    print(f"{'policy':<8} {'reqs':>5} {'steps':>6} {'wall s':>8} {'tok/s':>7} {'max run':>8} {'mean run':>9} "
          f"{'preempt':>8} {'peak MiB':>9} {'mean MiB':>9}")
    for s in summaries:
        print(f"{s['policy']:<8} {s['num_requests']:>5} {s['num_steps']:>6} {s['wall_s']:>8.1f} "
              f"{s['tokens_per_s']:>7.2f} {s['max_concurrent_requests']:>8} {s['mean_concurrent_requests']:>9.2f} "
              f"{s['num_preemptions']:>8} {s['peak_kv_mib']:>9.1f} {s['mean_kv_mib']:>9.1f}")
    base, other = summaries
    ratio = {key: other[key] / base[key] for key in ("max_concurrent_requests", "mean_concurrent_requests",
                                                     "peak_kv_mib", "tokens_per_s")}
    print(f"{other['policy']} / {base['policy']}: max running {ratio['max_concurrent_requests']:.2f}x, mean running "
          f"{ratio['mean_concurrent_requests']:.2f}x, peak KV {ratio['peak_kv_mib']:.2f}x, throughput "
          f"{ratio['tokens_per_s']:.2f}x")
    for key, value in header.items():
        print(f"{key}: {value}")
    comments = [f"{key}: {value}" for key, value in header.items()]
    fig = draw(summaries, steps, header)
    with atomic_files() as files:  # all three or none; the folders are there (check_args)
        for path, columns, rows in ((args.out, SUMMARY_COLUMNS, summaries), (args.steps_out, STEP_COLUMNS, steps)):
            cells = [{c: _cell(row[c]) for c in columns} for row in rows]
            write_csv(path, columns, cells, comments=comments, files=files)
        save_figure(fig, args.figure, files=files, dpi=120)
    print(f"wrote {args.out}, {args.steps_out}, {args.figure} (the whole bench took {header['total_s']} s)")


def _cell(value):
    return f"{value:g}" if isinstance(value, float) else value  # write_csv's csv writer quotes what needs it


def draw(summaries: list[dict], steps: list[dict], header: dict[str, str]):
    """Two panels over wall time: KV memory held after each step (the budget dashed), and requests running."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from sim.figures.hybrid import SYSTEMS
    from sim.figures.style import caption, new_figure

    fig, (ax_mem, ax_run) = new_figure(1, 2, size=(11, 4.2))
    for s in summaries:
        label, color, _ = SYSTEMS[s["policy"]]
        mine = [r for r in steps if r["policy"] == s["policy"]]
        # a step's value is drawn over the step itself: from the previous step's end to its own end, on a clock of
        # the steps' own durations (the checks between steps are not counted, as in wall_s)
        end = [0.0, *np.cumsum([r["step_time_s"] for r in mine])]
        for ax, key in ((ax_mem, "kv_mib"), (ax_run, "num_running_requests")):
            values = [r[key] for r in mine]
            ax.step(end, values[:1] + values, where="pre", color=color, label=label)
    ax_mem.axhline(summaries[0]["kv_budget_mib"], color="#444444", linestyle="--", linewidth=1, label="KV budget")
    ax_mem.set_title("(a) KV cache memory held after each step")
    ax_mem.set_ylabel("MiB")
    ax_run.set_title("(b) requests running in each step")
    ax_run.set_ylabel("requests")
    ax_run.yaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (ax_mem, ax_run):
        ax.set_xlabel("time in engine steps (s)")
        ax.set_xlim(0, None)
        ax.set_ylim(0, None)
    ax_mem.legend(loc="lower left", fontsize=8, framealpha=0.9)
    fig.suptitle("Gemma 3 270M on the engine (CPU): the hybrid KV cache manager vs every layer as full attention",
                 fontsize=11)
    caption(fig, f"{header['workload']}. Same KV budget: {header['kv_budget']}.")
    plt.close(fig)
    return fig
