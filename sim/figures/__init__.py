"""Paper-style figures: the vLLM paper's (Kwon et al., SOSP 2023) utilization and throughput results, simulated.

    python -m sim figures [--only NAME ...] [--out DIR] [--quick] [--jobs N]

Each figure is a `FigureSpec`: the simulation points it needs (`sim.drivers.sweep.Task`s, each with its probes) and
how to draw them. `make_figures` gathers the points of every figure asked for, merges equal ones (the same
run() keywords run once, with the union of their probes: e.g. the ShareGPT 2 req/s runs feed Figs. 1, 2, 3,
4 and 5), runs them all in parallel processes with one progress bar (sim.drivers.sweep.run_tasks), and draws each
figure as soon as its last point is in. Every figure writes NAME.png beside NAME.csv, the data it draws.

    memory_waste       Fig. 2    memory breakdown per system (whole pool, and memory in use)
    memory_timeline    -         the breakdown over time, same trace for every system
    memory_map         Figs. 3/6 the KV pool slot by slot at one moment, contiguous vs paged
    latency_vs_rate    Fig. 12   normalized latency vs request rate, ShareGPT and Alpaca
    latency_vs_rate_tp Fig. 12   the same for OPT-66B on 4 GPUs and OPT-175B on 8 (tensor parallel, all-reduces priced)
    batch_size         Fig. 13   mean batched requests
    sampling_latency   Fig. 14   parallel sampling and beam search: normalized latency vs request rate
    sharing            Fig. 15   memory saved by sharing (parallel sampling, beam search)
    shared_prefix      Fig. 16   a shared few-shot prefix, with and without prefix caching
    chatbot            Fig. 17   a chatbot: conversation history as the prompt, latency vs request rate
    paged_kernel_overhead Fig. 18a  the paged attention kernel's overhead per block size, MEASURED (a committed GPU CSV)
    block_size         Fig. 18b  block size: latency and memory
    swap_recompute_cost   Fig. 19a  swap vs recompute of one sequence's KV per block size: the cost model's numbers
    recompute_vs_swap  Fig. 19b  preemption by recompute vs swap across block sizes
    chunked_prefill    -         the paper's scheduler (v0) vs vLLM v1's chunked prefill: stalls and TTFT
    vattention_pages   -         vAttention's page size: from paging to contiguous reservation
    hybrid_memory      -         sliding-window layers (Gemma 3): the hybrid KV manager vs all layers as full
    memory_managers    -         every KV manager's breakdown and batch size; prefix hits vs block size, hashed vs radix
    kv_dtype           -         an 8-bit KV cache vs 16-bit: token slots, batch size, latency and throughput vs rate
    priority           -         priority scheduling: latency per class, FCFS vs priority (vLLM's scheduling policy)
    disagg_goodput     -         disaggregated prefill/decode (DistServe) vs colocated on 4 GPUs: SLO attainment, goodput
    speculative        -         speculative decoding, k = 0, 2, 4, 8 draft tokens: latency, batch, lookahead memory
    cpu_offload        -         a CPU offload tier for the prefix cache on conversations: hits per tier, TTFT

The paper's figures run its scheduler (`scheduler="v0"`: prefill-only steps); `chunked_prefill` compares it
with vLLM v1's.

A figure with no simulation points (the two microbenchmarks) is drawn before any simulation starts.

`quick=True` shortens every trace and keeps a few points per curve (seconds per figure; the tests use it).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib

from ..base.outfiles import check_output_folder
from ..drivers.sweep import PointResult, SweepError, Task, run_tasks
from . import (
    ablations,
    chatbot,
    disagg,
    hybrid,
    kv_dtype,
    managers,
    memory,
    microbench,
    offload,
    pages,
    priority,
    sampling,
    scheduling,
    sharing,
    speculative,
    tensor_parallel,
    throughput,
)


@dataclass(frozen=True, slots=True)
class FigureSpec:
    name: str
    tasks: Callable[[bool], list[Task]]  # quick -> the simulation points the figure needs
    draw: Callable[..., list[Path]]  # (runs: [(task, result)], outdir, quick) -> files written


FIGURES = {spec.name: spec for spec in (
    FigureSpec("memory_waste", memory.waste_tasks, memory.draw_waste),
    FigureSpec("memory_timeline", memory.timeline_tasks, memory.draw_timeline),
    FigureSpec("memory_map", memory.map_tasks, memory.draw_map),
    FigureSpec("latency_vs_rate", throughput.latency_tasks, throughput.draw_latency),
    FigureSpec("latency_vs_rate_tp", tensor_parallel.tp_tasks, tensor_parallel.draw_tp),
    FigureSpec("batch_size", throughput.batch_tasks, throughput.draw_batch),
    FigureSpec("sampling_latency", sampling.sampling_tasks, sampling.draw_sampling),
    FigureSpec("sharing", sharing.sharing_tasks, sharing.draw_sharing),
    FigureSpec("shared_prefix", sharing.prefix_tasks, sharing.draw_prefix),
    FigureSpec("chatbot", chatbot.chatbot_tasks, chatbot.draw_chatbot),
    FigureSpec("paged_kernel_overhead", microbench.no_tasks, microbench.draw_kernel),
    FigureSpec("block_size", ablations.block_tasks, ablations.draw_block),
    FigureSpec("swap_recompute_cost", microbench.no_tasks, microbench.draw_swap),
    FigureSpec("recompute_vs_swap", ablations.preemption_tasks, ablations.draw_preemption),
    FigureSpec("chunked_prefill", scheduling.chunked_tasks, scheduling.draw_chunked),
    FigureSpec("vattention_pages", pages.pages_tasks, pages.draw_pages),
    FigureSpec("hybrid_memory", hybrid.hybrid_tasks, hybrid.draw_hybrid),
    FigureSpec("memory_managers", managers.manager_tasks, managers.draw_managers),
    FigureSpec("kv_dtype", kv_dtype.kv_dtype_tasks, kv_dtype.draw_kv_dtype),
    FigureSpec("priority", priority.priority_tasks, priority.draw_priority),
    FigureSpec("disagg_goodput", disagg.disagg_tasks, disagg.draw_disagg),
    FigureSpec("speculative", speculative.speculative_tasks, speculative.draw_speculative),
    FigureSpec("cpu_offload", offload.offload_tasks, offload.draw_offload),
)}


def merge_tasks(tasks: list[Task]) -> tuple[list[Task], list[int]]:
    """Equal run() keywords run once, with every probe asked for. Returns the merged tasks and, for each input
    task, the index of the merged task that serves it."""
    index: dict[tuple, int] = {}
    probes: list[dict] = []
    where = []
    for task in tasks:
        i = index.setdefault((task.runner, task.kwargs), len(index))
        if i == len(probes):
            probes.append({})
        for probe in task.probes:
            if probes[i].setdefault(probe.name, probe) != probe:
                raise RuntimeError(f"two figures ask one run for different {probe.name!r} probes: "
                                   f"expected {probes[i][probe.name]}, found {probe}")
        where.append(i)
    merged = [Task(kwargs, tuple(p.values()), runner) for (runner, kwargs), p in zip(index, probes)]
    return merged, where


def make_figures(names=None, outdir="figures", quick: bool = False, jobs: int | None = None,
                 progress: bool = True) -> list[Path]:
    """Simulate and draw the figures `names` (default: all of FIGURES) into `outdir`; returns the files written."""
    # NOTE: files only, never a window. Chosen here, not at import, so that a notebook importing
    # sim.figures (e.g. for draw_memory_map) keeps its inline backend.
    matplotlib.use("Agg")
    names = list(FIGURES) if not names else list(dict.fromkeys(names))
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise SweepError(f"unknown figure {unknown[0]!r} (allowed: {', '.join(FIGURES)})")
    # Before any simulation: a folder that cannot hold the files is refused now, not after minutes of work.
    check_output_folder(outdir, "--out", files=[f"{n}.{ext}" for n in names for ext in ("png", "csv")])
    wanted = {name: FIGURES[name].tasks(quick) for name in names}
    flat = [(name, task) for name, tasks in wanted.items() for task in tasks]
    merged, where = merge_tasks([task for _, task in flat])
    needs: dict[int, set[str]] = {}  # merged task -> the figures still waiting for it
    for (name, _), i in zip(flat, where):
        needs.setdefault(i, set()).add(name)
    pending = {name: {where[k] for k, (n, _) in enumerate(flat) if n == name} for name in names}
    results: dict[int, PointResult] = {}
    written: list[Path] = []

    def draw(name: str) -> None:
        runs = [(task, results[where[k]]) for k, (n, task) in enumerate(flat) if n == name]
        written.extend(FIGURES[name].draw(runs, Path(outdir), quick))

    def on_result(i: int, result: PointResult) -> None:  # draw each figure as soon as its last point is in
        results[i] = result
        for name in sorted(needs[i], key=names.index):
            pending[name].discard(i)
            if not pending[name]:
                draw(name)

    for name in names:  # nothing to simulate: drawn now
        if not pending[name]:
            draw(name)
    run_tasks(merged, jobs=jobs, progress=progress, desc="figure simulations", on_result=on_result)
    return written


__all__ = ["FIGURES", "FigureSpec", "make_figures", "merge_tasks"]
