"""The README's numbers: every number the README quotes from a committed results file, as small generated tables.

The README's prose explains; the numbers stand beside it in blocks between marker comments
(`<!-- readme-numbers:NAME:begin -->` ... `<!-- readme-numbers:NAME:end -->`), each block made here from the
committed files under figures/ (figure CSVs, benchmark CSVs, the GPU test log), each table naming the files it
reads. Nothing is simulated or measured here. A block lives on whichever page its section does: README.md or a page
under docs/ (PAGES: each block is looked for in all of them, and must be in exactly one). A test checks that every
block is exactly what this module makes of the committed files, so no number there is typed by hand (as
sim/figures/paper.py does for "The paper, side by side" and tools/peer/api_table.py for the vLLM API table).

    python -m sim readme-numbers              # print every block, between its markers
    python -m sim readme-numbers --write      # rewrite the blocks, on whichever page each is
    python -m sim readme-numbers --check      # exit 1 if a block is not what the files give
    python -m sim readme-numbers --check --readme FILE   # one file only: every block must be in it

The blocks, in reading order (BLOCKS: README.md, then the pages in mkdocs.yml's nav):
    memory-waste     figures/memory_waste.csv        Fig. 1: token states among the memory in use
    memory-map       figures/memory_map.csv          Fig. 3: the pool at one moment
    figures          figures/{batch_size,sampling_latency,chatbot,vattention_pages,hybrid_memory,memory_managers,
                     latency_vs_rate_tp,paged_kernel_overhead,swap_recompute_cost}.csv
                                                     the numbers of the figure table's rows
    chunked-prefill  figures/chunked_prefill.csv     Fig. 10: stalls and time to first token, v0 against v1
    priority         figures/priority.csv            latency per class, FCFS against priority scheduling
    disagg           figures/disagg_goodput.csv      goodput per GPU, disaggregated against colocated
    speculative      figures/speculative.csv         speculative decoding, k = 0 to 8: latency, batch, lookahead slots
    spec-engine      figures/speculative_engine.csv  the engine's n-gram draft on a repetitive workload: tokens/s
    cpu-offload      figures/cpu_offload.csv         the prefix cache's CPU offload tier: hits per tier, TTFT
    offload-engine   figures/offload_engine.csv      the tier on the engine: hits per tier, TTFT, tokens identical
    bench-hybrid     figures/bench_hybrid_cpu.csv, bench_hybrid_steps_cpu.csv   Gemma 3 270M, paged vs hybrid
    serve-bench      figures/serve_bench.csv         the server under guidellm and aiperf: req/s, TTFT, ITL per rate
    kv-dtype         figures/kv_dtype.csv            an 8-bit KV cache at paper scale: slots, batch, latency, throughput
    kv-accuracy      figures/kv_accuracy.csv         its accuracy cost on the engine: greedy agreement, logit error
    peer             figures/peer_vllm.csv           this engine's speed against vLLM's
    peer-checks      figures/peer_vllm.csv           the same run's checks: greedy, beams, cold start, block pool
    gpu              figures/gpu_tests.txt, bench_attention_gpu.csv, bench_engine_gpu.csv   the H100 session
    grader-load      figures/grader_load.csv         every lab's solution graded quiet and beside busy processes
    benchmarks       figures/bench_sim.csv, bench_alloc.csv, bench_engine_cpu.csv and the GPU files   `make bench`

Each number keeps the rounding the README has always printed it with (and that the tests check).
"""
from __future__ import annotations

import csv
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..kv import allocates_blocks_on_demand
from .disagg import NUM_GPUS, goodput_per_gpu
from .tensor_parallel import gain

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "figures"
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES_LABEL = "README.md and docs/*.md"  # how messages name the pages together
COMMAND = "python -m sim readme-numbers"
PREFIX = "readme-numbers"

# What the README calls each system of the figure CSVs
LABELS = {"max": "Max", "pow2": "Pow2", "oracle": "Oracle", "paged": "paged"}
CHUNKED_RATE = 1.0  # req/s: the rate the README's chunked-prefill numbers are read at
CHUNKED_SYSTEMS = ("v0", "v1-512", "v1-2048")
SAMPLING_WIDTH = 6  # Fig. 14's numbers: parallel sampling and beam search at this width
VATTENTION_PAGES = (1, 64, 2048)  # tokens per page
HYBRID_PROMPT = 8192  # hybrid_memory's numbers: at this prompt length
MANAGERS = (("max", "Max"), ("pow2", "Pow2"), ("oracle", "Oracle"), ("vattention", "vAttention, 64-token pages"),
            ("paged", "paged"), ("radix", "radix, 1-token pages"))  # memory_managers' panel a, in the README's order
MANAGERS_VATTENTION_PAGE = "64"  # tokens: the vAttention page size of memory_managers' row in the README
PREFIX_SIZES = ("1", "16", "64")  # memory_managers' panel b: block/page sizes
LONG_DECODE = 64 * 2048  # bench_attention_gpu: batch x context from which the decode kernel's bandwidth is quoted
PAGING_FROM = 16  # bench_attention_gpu: paging's price quoted from this block size up
SIM_BENCH_RUNS = (("paper-scale paged", "paged"), ("paper-scale max", "max"), ("paper-scale pow2", "pow2"),
                  ("paper-scale oracle", "oracle"), ("paper-scale paged v1", "paged under v1"))
ENGINE_TARGET = 4.0  # x: the engine bench's target over HF generate (a goal of the project; the CSV has no target)
HF_BATCHES = "HF transformers generate (static batches of {})"
TP_MODELS = (("opt-66b", "OPT-66B, 4 GPUs"), ("opt-175b", "OPT-175B, 8 GPUs"))  # latency_vs_rate_tp's panels
KERNEL_BLOCK = 16  # paged_kernel_overhead's numbers: at this block size (the paper's default)
SWAP_SEQ_LEN = 1024  # swap_recompute_cost's numbers: a sequence of this many tokens


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {PREFIX}:{name}:begin -->", f"<!-- {PREFIX}:{name}:end -->"


# --- the committed files -----------------------------------------------------------------------------------------
class Files:
    """The committed results under one folder (figures/), each read once: a CSV's rows and its `# key: value`
    comment lines, or a text file."""

    def __init__(self, folder: str | Path = FIGURES) -> None:
        self.folder = Path(folder)
        self._read: dict[str, tuple[list[dict], dict[str, str]]] = {}

    def text(self, filename: str) -> str:
        path = self.folder / filename
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file (the README's numbers are read from the committed "
                                    f"files; `{COMMAND} --figures DIR` reads another folder)")
        return path.read_text(encoding="utf-8")

    def _csv(self, name: str) -> tuple[list[dict], dict[str, str]]:
        if name not in self._read:
            lines = self.text(f"{name}.csv").splitlines(keepends=True)
            comments = dict(line[2:].rstrip("\r\n").split(": ", 1) for line in lines
                            if line.startswith("# ") and ": " in line)
            self._read[name] = list(csv.DictReader(line for line in lines if not line.startswith("#"))), comments
        return self._read[name]

    def rows(self, name: str, **match) -> list[dict]:
        """The rows of figures/NAME.csv whose columns equal `match` (as text)."""
        return [r for r in self._csv(name)[0] if all(r[k] == str(v) for k, v in match.items())]

    def one(self, name: str, **match) -> dict:
        rows = self.rows(name, **match)
        if len(rows) != 1:
            raise ValueError(f"{self.folder / name}.csv: expected one row with {match}, found {len(rows)}")
        return rows[0]

    def comments(self, name: str) -> dict[str, str]:
        return self._csv(name)[1]


# --- tables and blocks -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Row:
    key: str  # how code and tests name the row (never printed)
    cells: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Table:
    caption: str  # names the files the numbers come from
    header: tuple[str, ...]
    rows: tuple[Row, ...]

    def text(self) -> str:
        lines = [self.caption, "", _line(self.header), "|" + "---|" * len(self.header)]
        return "\n".join(lines + [_line(r.cells) for r in self.rows])


@dataclass(frozen=True, slots=True)
class Block:
    name: str
    tables: tuple[Table, ...]

    def text(self) -> str:
        return "\n\n".join(t.text() for t in self.tables)

    def row(self, key: str) -> dict[str, str]:
        """{column header: cell} of the row named `key` (the tests compare numbers through this)."""
        for table in self.tables:
            for r in table.rows:
                if r.key == key:
                    return dict(zip(table.header, r.cells))
        raise KeyError(f"block {self.name!r} has no row {key!r}")


def _line(cells: tuple[str, ...]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def _table(caption: str, header: tuple[str, ...], *rows: tuple[str, ...]) -> Table:
    """A table from (key, cell, cell, ...) tuples."""
    return Table(caption, header, tuple(Row(r[0], tuple(r[1:])) for r in rows))


# --- the installs ------------------------------------------------------------------------------------------------
def install(f: Files) -> tuple[Table, ...]:
    """The light and the full install, each built from scratch in a fresh venv (python tools/install_report.py)."""
    rows = {r["install"]: r for r in f.rows("install")}
    first = next(iter(rows.values()))
    caption = (f"Each install built from scratch in a fresh venv by `python tools/install_report.py` "
               f"(`figures/install.csv`), packages from {first['source']}, on {first['platform']}, {first['cpu']}, "
               f"Python {first['python']}:")
    return (_table(caption, ("install", "venv", "time", "torch in it"),
                   *((name, name, f"{int(r['venv_mib']):,} MiB", f"{int(r['seconds']):,} s",
                      "yes" if r["has_torch"] == "True" else "no") for name, r in rows.items())),)


# --- the figures -------------------------------------------------------------------------------------------------
def memory_waste(f: Files) -> tuple[Table, ...]:
    used = {r["policy"]: r for r in f.rows("memory_waste", view="memory in use")}
    reserving = [p for p in used if not allocates_blocks_on_demand(p)]
    paging = [p for p in used if allocates_blocks_on_demand(p)]
    shares = [float(used[p]["token_states"]) for p in reserving]
    return (_table("Token states among the memory in use (`figures/memory_waste.csv`):", ("system", "token states"),
                   ("reserving", f"contiguous reservation ({', '.join(LABELS[p] for p in reserving)})",
                    f"{100 * min(shares):.0f}-{100 * max(shares):.0f}%"),
                   *((p, LABELS[p], f"{float(used[p]['token_states']):.0%}") for p in paging)),)


def memory_map(f: Files) -> tuple[Table, ...]:
    rows = []
    for policy in ("max", "paged"):
        r = f.one("memory_map", policy=policy)
        rows.append((policy, LABELS[policy], r["num_requests_in_memory"], r["num_waiting"],
                     f"{int(r['free']) / int(r['num_slots']):.0%}"))
    return (_table("The pool at the figure's moment (`figures/memory_map.csv`):",
                   ("policy", "requests in memory", "waiting", "slots free"), *rows),)


def _sustained(r: dict) -> str:
    return (">= " if r["sustained_is_lower_bound"] == "True" else "") + r["sustained_rate"]


def figure_rows(f: Files) -> tuple[Table, ...]:
    """The numbers of the README's table of the other figures, each row naming its figure's CSV."""
    rows = []

    def add(key: str, figure: str, quantity: str, value: str) -> None:
        rows.append((key, f"{figure.split('.')[0]}. `figures/{figure.split(' ')[1]}.csv`", quantity, value))

    batch = {r["system"]: r for r in f.rows("batch_size", workload="sharegpt")}
    add("batch_size.paged/max", "5. batch_size", f"ShareGPT, {batch['paged']['rate']} req/s: paged's mean batch over "
        "Max's", f"{float(batch['paged']['mean_batch_size']) / float(batch['max']['mean_batch_size']):.1f}x")
    w = SAMPLING_WIDTH
    for kind, words in (("n", f"parallel sampling, n = {w}"), ("beam_width", f"beam search, width {w}")):
        rate = {s: _sustained(f.rows("sampling_latency", kind=kind, width=w, system=s)[0])
                for s in ("paged", "oracle")}
        add(f"sampling_latency.{kind}", "11. sampling_latency", f"{words}: sustained rate (req/s)",
            f"paged {rate['paged']}, Oracle {rate['oracle']}")
    chat = {s: f.rows("chatbot", system=s)[0]["sustained_rate"] for s in ("paged", "max", "pow2", "oracle")}
    add("chatbot.sustained", "12. chatbot", "sustained rate (req/s)",
        f"paged {chat['paged']}; " + ", ".join(f"{LABELS[s]} {chat[s]}" for s in ("max", "pow2", "oracle")))
    best = max(float(chat[s]) for s in ("max", "pow2", "oracle"))
    add("chatbot.ratio", "12. chatbot", "paged's sustained rate over the best Orca's",
        f"{float(chat['paged']) / best:.2g}x")
    pages = {t: f.one("vattention_pages", system="vattention", page_tokens=t) for t in VATTENTION_PAGES}
    most = f.one("vattention_pages", system="max", page_tokens="")
    add("vattention_pages.used", "13. vattention_pages", "vAttention: token states among the memory in use, by page "
        "size", ", ".join(f"{float(pages[t]['token_states_of_used']):.1%} ({t}-token pages)" for t in VATTENTION_PAGES))
    add("vattention_pages.max", "13. vattention_pages", "Max: token states among the memory in use",
        f"{float(most['token_states_of_used']):.1%}")
    add("vattention_pages.batch", "13. vattention_pages", "mean batched requests",
        f"vAttention, {VATTENTION_PAGES[-1]}-token pages {float(pages[VATTENTION_PAGES[-1]]['mean_batch_size']):.1f}; "
        f"Max {float(most['mean_batch_size']):.1f}")
    hyb, full = (f.one("hybrid_memory", system=s, prompt_len=HYBRID_PROMPT) for s in ("hybrid", "paged"))
    k = f"{HYBRID_PROMPT // 1024}K-token prompts"
    add("hybrid_memory.batch", "14. hybrid_memory", f"{k}: mean batched requests",
        f"hybrid {float(hyb['mean_batch_size']):.1f}, every layer full attention {float(full['mean_batch_size']):.1f}")
    add("hybrid_memory.throughput", "14. hybrid_memory", f"{k}: throughput, hybrid over every layer full attention",
        f"{float(hyb['throughput_req_per_s']) / float(full['throughput_req_per_s']):.1f}x")
    managers = {r["policy"]: r for r in f.rows("memory_managers", panel="a")
                if r["policy"] != "vattention" or r["block_size_tokens"] == MANAGERS_VATTENTION_PAGE}
    add("memory_managers.token_states", "15. memory_managers", "token states, share of the pool",
        ", ".join(f"{float(managers[p]['token_states']):.0%} ({name})" for p, name in MANAGERS))
    add("memory_managers.batch", "15. memory_managers", "mean batched requests",
        ", ".join(f"{float(managers[p]['mean_batch_size']):.1f} ({name})" for p, name in MANAGERS))
    for policy, name in (("paged", "hashed blocks"), ("radix", "radix tree")):
        hits = {r["block_size_tokens"]: float(r["prefix_hit_rate_tokens"])
                for r in f.rows("memory_managers", panel="b", policy=policy)}
        add(f"memory_managers.hits.{policy}", "15. memory_managers", f"conversations, {name}: prompt tokens found in "
            "the prefix cache, by block/page size", ", ".join(f"{hits[b]:.1%} ({b})" for b in PREFIX_SIZES))
    for model, label in TP_MODELS:
        gains = []
        for workload, name in (("sharegpt", "ShareGPT"), ("alpaca", "Alpaca")):
            rate = {r["system"]: r for r in f.rows("latency_vs_rate_tp", model=model, workload=workload)}
            gains.append(f"{name} {_gain(rate['paged'], rate['oracle'])} / {_gain(rate['paged'], rate['max'])}")
        add(f"latency_vs_rate_tp.{model}", "18. latency_vs_rate_tp", f"{label}: vLLM's sustained rate over Orca "
            "(Oracle)'s / Orca (Max)'s", "; ".join(gains))
    kernel = f.one("paged_kernel_overhead", block_size=KERNEL_BLOCK)
    add("paged_kernel_overhead", "19. paged_kernel_overhead", f"block size {KERNEL_BLOCK}: measured overhead, shuffled "
        "over identity table / over the copy bound; the roofline's assumption",
        f"{float(kernel['paging_overhead']):+.1%} / {float(kernel['overhead_over_copy']):+.1%}; "
        f"{float(kernel['roofline_assumed_overhead']):.0%}")
    swap = {int(r["block_size"]): r for r in f.rows("swap_recompute_cost", seq_len=SWAP_SEQ_LEN)}
    cheaper = [b for b in sorted(swap) if all(float(swap[c]["swap_over_recompute"]) < 1 for c in swap if c >= b)]
    add("swap_recompute_cost", "20. swap_recompute_cost", f"{SWAP_SEQ_LEN:,}-token sequence: swap vs recompute "
        f"(ms) at block sizes 1 and 16; swapping the cheaper from block size",
        f"{float(swap[1]['swap_ms']):.0f} vs {float(swap[1]['recompute_ms']):.0f} at 1, "
        f"{float(swap[16]['swap_ms']):.0f} vs {float(swap[16]['recompute_ms']):.0f} at 16; "
        + (f"{cheaper[0]} on" if cheaper else "never"))
    return (_table("The numbers of these rows, read off each figure's CSV:", ("figure", "quantity", "lab"), *rows),)


def _gain(paged: dict, other: dict) -> str:
    """paged's sustained rate over another system's, from two rows of latency_vs_rate_tp.csv."""
    def read(r: dict) -> tuple[float | None, bool]:
        return (float(r["sustained_rate"]) if r["sustained_rate"] else None), r["sustained_is_lower_bound"] == "True"

    return gain(read(paged), read(other))


def chunked_prefill(f: Files) -> tuple[Table, ...]:
    rows = []
    for system in CHUNKED_SYSTEMS:
        r = next(r for r in f.rows("chunked_prefill", system=system) if float(r["rate"]) == CHUNKED_RATE)
        name = "v0, the paper's" if r["scheduler"] == "v0" else f"v1, {r['max_num_batched_tokens']}-token budget"
        rows.append((system, name, *(f"{1e3 * float(r[column]):.0f} ms" for column in ("p99_itl_max_s", "p99_ttft_s"))))
    return (_table(f"At {CHUNKED_RATE:g} req/s (`figures/chunked_prefill.csv`), p99 over the requests:",
                   ("scheduler", "a request's largest gap between two tokens", "time to first token"), *rows),)


def priority(f: Files) -> tuple[Table, ...]:
    """Both classes under both policies at the figure's highest rate."""
    top = max(float(r["rate"]) for r in f.rows("priority"))
    rows = []
    for r in sorted((r for r in f.rows("priority") if float(r["rate"]) == top),
                    key=lambda r: (r["priority"], r["scheduling_policy"])):
        rows.append((f"{r['priority']}.{r['scheduling_policy']}",
                     f"class {r['priority']} ({float(r['priority_share']):.0%} of the requests)" if r["priority"] == "0"
                     else f"class {r['priority']} (the rest)", r["scheduling_policy"],
                     f"{float(r['mean_ttft_s']):.2f} s", f"{float(r['p99_ttft_s']):.1f} s",
                     f"{float(r['normalized_latency_s_per_token']):.3f} s"))
    return (_table(f"At {top:g} req/s (`figures/priority.csv`):",
                   ("class", "policy", "mean time to first token", "p99 time to first token",
                    "normalized latency (s/token)"), *rows),)


def cpu_offload(f: Files) -> tuple[Table, ...]:
    """Every run of the figure: prompt tokens found per tier, time to first token, the reloads' PCIe seconds."""
    rows = []
    for r in sorted(f.rows("cpu_offload"), key=lambda r: (float(r["rate"]), float(r["cpu_offload_gib"]))):
        tier = float(r["cpu_offload_gib"])
        rows.append((f"{r['rate']}.{r['cpu_offload_gib']}", f"{float(r['rate']):g}",
                     "none" if tier == 0 else f"{tier:g} GiB", f"{float(r['gpu_hit_rate_tokens']):.1%}",
                     f"{float(r['cpu_hit_rate_tokens']):.1%}", f"{float(r['mean_ttft_s']):.2f} s",
                     f"{float(r['p99_ttft_s']):.1f} s", f"{float(r['reload_time_s']):.1f} s"))
    duration = float(f.rows("cpu_offload")[0]["trace_duration_s"])
    return (_table(f"From `figures/cpu_offload.csv` (OPT-13B on one A100-40GB, conversations, {duration:g} s of first "
                   "arrivals, prefix caching on in every run):",
                   ("new conversations/s", "CPU tier per GPU", "prompt tokens hit on the GPU", "hit in the CPU tier",
                    "mean time to first token", "p99 time to first token", "reloads over PCIe"), *rows),)


def offload_engine(f: Files) -> tuple[Table, ...]:
    """The tier on the engine (python -m reference offload-bench): SmolLM2, multi-turn sessions, with and without."""
    rows = []
    for r in f.rows("offload_engine"):
        rows.append((r["system"], r["system"], f"{float(r['gpu_hit_share']):.1%}", f"{float(r['cpu_hit_share']):.1%}",
                     r["reloaded_blocks"], f"{1e3 * float(r['mean_ttft_later_turns_s']):.0f} ms",
                     f"{1e3 * float(r['p90_ttft_later_turns_s']):.0f} ms"))
    first = f.rows("offload_engine")[0]
    same = f.one("offload_engine", system="gpu + cpu tier")["identical"] == "True"
    return (_table(f"From `figures/offload_engine.csv` (SmolLM2 on the engine, {first['sessions']} sessions x "
                   f"{first['turns']} turns served one at a time, a pool of {first['gpu_blocks']} blocks; greedy tokens "
                   f"{'identical' if same else 'DIFFERENT'} with and without the tier):",
                   ("engine", "prompt tokens hit on the GPU", "hit in the CPU tier", "blocks reloaded",
                    "mean time to first token, turns 2+", "p90"), *rows),)


SERVE_BENCH_QUIET = 0.5  # load average before the run above which serve_bench's caption says the machine was busy


def serve_bench(f: Files) -> tuple[Table, ...]:
    """The server under the outside load generators guidellm and aiperf (tools/serve_bench.py), each client's own
    measures at each constant rate."""
    comments = f.comments("serve_bench")
    cpu, cores = comments["machine"].split(", ")[:2]
    load = float(comments["load average before the run"].split(" ")[0])
    busy = (f"load average {load:.2f} before the run: the machine was busy with other work, so these are that busy "
            f"machine's numbers" if load > SERVE_BENCH_QUIET else f"load average {load:.2f} before the run")
    rows = [(f"{r['client']}.{r['rate_req_per_s']}", f"{r['client']} {r['client_version']}", r["rate_req_per_s"],
             f"{r['num_requests']} ({r['errors']})", f"{float(r['request_throughput']):.2f}",
             f"{float(r['output_tokens_per_s']):.1f}",
             f"{float(r['ttft_p50_ms']):,.0f} / {float(r['ttft_p99_ms']):,.0f} ms",
             f"{float(r['itl_p50_ms']):,.0f} / {float(r['itl_p99_ms']):,.0f} ms") for r in f.rows("serve_bench")]
    caption = (f"From `figures/serve_bench.csv` (`{comments['command']}`, {comments['date'][:10]}; the server "
               f"`{comments['server'].split(' (')[0]}` at one engine thread and the clients on one machine, {cpu}, "
               f"{cores}; {busy}):")
    return (_table(caption, ("client", "rate (req/s)", "requests (errors)", "completed req/s", "output tokens/s",
                             "TTFT p50 / p99", "inter-token p50 / p99"), *rows),)


def speculative(f: Files) -> tuple[Table, ...]:
    """Every k and acceptance rate of the figure: latency at each rate, and at the highest rate the batch and the share
    of the pool the drafts held."""
    all_rows = f.rows("speculative")
    rates = sorted({float(r["rate"]) for r in all_rows})
    top = rates[-1]
    runs = {}
    for r in all_rows:
        runs.setdefault((int(r["num_speculative_tokens"]), r["acceptance_rate"]), {})[float(r["rate"])] = r
    rows = []
    for (k, alpha), by_rate in sorted(runs.items()):
        last = by_rate[top]
        rows.append((f"{k}.{alpha}", str(k), alpha or "-",
                     *(f"{float(by_rate[rate]['normalized_latency_s_per_token']):.3f} s" for rate in rates),
                     f"{float(last['mean_batch_size']):.1f}",
                     f"{float(last['draft_acceptance']):.0%}" if k else "-",
                     f"{100 * float(last['lookahead_share']):.2f}%"))
    duration = float(all_rows[0]["trace_duration_s"])
    return (_table(f"From `figures/speculative.csv` (OPT-13B on one A100-40GB, ShareGPT, {duration:g} s traces, vLLM v1 "
                   "scheduler; a draft costs nothing):",
                   ("draft tokens k", "acceptance rate", *(f"normalized latency at {rate:g} req/s" for rate in rates),
                    f"mean batch at {top:g} req/s", "drafts accepted", f"pool held by drafts at {top:g} req/s"),
                   *rows),)


def spec_engine(f: Files) -> tuple[Table, ...]:
    """The engine with and without its n-gram draft (python -m reference spec-bench): tokens/s, steps, acceptance."""
    machine = f.comments("speculative_engine")["machine"]
    rows = []
    for r in f.rows("speculative_engine"):
        spec = r["system"] != "plain"
        rows.append((r["system"], "n-gram draft, k = " + r["num_speculative_tokens"] if spec else "plain decoding",
                     r["generated_tokens"], r["steps"], f"{float(r['tokens_per_s']):.1f}",
                     f"{float(r['acceptance_rate']):.0%} of {r['draft_tokens']}" if spec else "-",
                     f"{float(r['speedup']):.2f}x" if spec else "-", "yes" if spec and r["identical"] == "True" else "-"))
    return (_table(f"From `figures/speculative_engine.csv` (`python -m reference spec-bench`; SmolLM2-135M-Instruct, "
                   f"8 repeat/edit prompts as one batch, greedy; {machine}):",
                   ("system", "tokens", "steps", "tokens/s (best round)", "drafts accepted", "speed-up",
                    "tokens identical"), *rows),)


# --- the reference engine's benchmarks ---------------------------------------------------------------------------
def disagg(f: Files) -> tuple[Table, ...]:
    """Disaggregated against colocated on 4 GPUs: DistServe's goodput per GPU, and both latencies at the rate where the
    colocated cluster's goodput lies (python -m sim figures --only disagg_goodput)."""
    rows = f.rows("disagg_goodput")
    table = []
    for gpu in dict.fromkeys(r["gpu"] for r in rows):
        at = float(goodput_per_gpu(rows, gpu, "colocated").lstrip(">=< ")) * NUM_GPUS
        for system in dict.fromkeys(r["system"] for r in rows):
            r = next(r for r in rows if r["gpu"] == gpu and r["system"] == system and float(r["rate"]) == at)
            table.append((f"{gpu}.{system}", gpu, system, goodput_per_gpu(rows, gpu, system),
                          f"{float(r['slo_attainment']):.1%}", f"{float(r['p90_ttft_s']) * 1e3:.0f} ms",
                          f"{float(r['p90_itl_mean_s']) * 1e3:.0f} ms", f"{at:g}"))
    return (_table("From `figures/disagg_goodput.csv` (OPT-13B, ShareGPT; SLOs: time to first token 0.25 s, mean time "
                   "between tokens 0.1 s; goodput per GPU: the highest swept rate of the 4-GPU cluster with at least "
                   "90% of requests meeting both, divided by 4; the latencies at the rate of the colocated cluster's "
                   "goodput):", ("GPU", "system", "goodput per GPU (req/s)", "both SLOs met", "p90 time to first token",
                                 "p90 time between tokens", "at req/s"), *table),)


def bench_hybrid(f: Files) -> tuple[Table, ...]:
    """Gemma 3 270M on the CPU under paged and hybrid (python -m reference bench-hybrid)."""
    summary = f.rows("bench_hybrid_cpu")
    steps = f.rows("bench_hybrid_steps_cpu")
    last = summary[-1]  # the hybrid policy (the CSV's rows: paged, then hybrid)
    low, high = re.search(r"prompt (\d+)-(\d+)", f.comments("bench_hybrid_cpu")["workload"]).groups()
    prompt_tokens = sum(int(s["num_prefill_tokens"]) for s in steps if s["policy"] == last["policy"])
    prompt_tokens -= int(last["recomputed_tokens"])

    def seconds(r: dict, prefill: bool) -> float:  # steps that compute prompt tokens, or only decodes
        return sum(float(s["step_time_s"]) for s in steps
                   if s["policy"] == r["policy"] and (int(s["num_prefill_tokens"]) > 0) == prefill)

    def each(key: str, label: str, cell: Callable[[dict], str]) -> tuple[str, ...]:
        return (key, label, *(cell(r) for r in summary))

    first = summary[0]
    ratio = float(last["tokens_per_s"]) / float(first["tokens_per_s"])
    caption = (f"`figures/bench_hybrid_cpu.csv`, each step in `figures/bench_hybrid_steps_cpu.csv`: "
               f"{float(last['num_requests']):.0f} requests arriving at once (prompts of {int(low):,}-{int(high):,} "
               f"random token ids, {float(last['output_tokens']) / float(last['num_requests']):.0f} greedy output "
               f"tokens each; {prompt_tokens:,} prompt tokens) in the same {float(first['kv_budget_mib']):.1f} MiB of "
               "K/V:")
    ints = lambda column: lambda r: f"{float(r[column]):.0f}"  # noqa: E731
    tenths = lambda column: lambda r: f"{float(r[column]):.1f}"  # noqa: E731
    return (_table(caption, ("", *(f"`{r['policy']}`" for r in summary)),
                   each("max_concurrent", "requests at once, at most", ints("max_concurrent_requests")),
                   each("max_decoding", "requests decoding together, at most", ints("max_decoding_requests")),
                   each("mean_concurrent", "requests per step, mean", tenths("mean_concurrent_requests")),
                   each("preemptions", "preemptions", ints("num_preemptions")),
                   each("kv_per_request", "K/V held per request, MiB (mean after each step)",
                        tenths("mean_kv_mib_per_request")),
                   each("tokens_per_s", "output tokens/s",
                        lambda r: f"{float(r['tokens_per_s']):.2f}" + (f" ({ratio:.2f}x)" if r is last else "")),
                   each("prefill_seconds", "seconds in steps that compute prompt tokens, of all steps' seconds",
                        lambda r: f"{seconds(r, True):.0f} of {seconds(r, True) + seconds(r, False):.0f}"),
                   each("decode_seconds", "seconds in steps that only decode", lambda r: f"{seconds(r, False):.1f}")),)


KV_DTYPE_LATENCY_RATE = 3.0  # req/s: kv_dtype's normalized latency is quoted at this rate (past 16-bit's knee)


def kv_dtype(f: Files) -> tuple[Table, ...]:
    """16-bit against 8-bit K/V in the same bytes (python -m sim figures --only kv_dtype)."""
    top = max(float(r["rate"]) for r in f.rows("kv_dtype"))
    at = {(r["kv_dtype"], float(r["rate"])): r for r in f.rows("kv_dtype")}

    def row(key: str, label: str, column: str, rate: float, cell: Callable[[float], str]) -> tuple[str, ...]:
        full, half = (float(at[d, rate][column]) for d in ("auto", "int8"))
        return key, label, cell(full), cell(half), f"{half / full:.2f}x"

    return (_table(f"OPT-13B on one A100-40GB, ShareGPT, the paper's v0 scheduler, the same KV bytes "
                   f"(`figures/kv_dtype.csv`, {float(at['auto', top]['trace_duration_s']):g} s traces):",
                   ("", "16-bit K/V", "8-bit K/V (int8 + scales)", "8-bit / 16-bit"),
                   row("slots", "token slots", "num_kv_slots", top, lambda v: f"{v:,.0f}"),
                   row("latency", f"normalized latency at {KV_DTYPE_LATENCY_RATE:g} req/s (s/token)",
                       "normalized_latency_s_per_token", KV_DTYPE_LATENCY_RATE, lambda v: f"{v:.3f}"),
                   row("batch", f"mean batched requests at {top:g} req/s", "mean_batch_size", top,
                       lambda v: f"{v:.1f}"),
                   row("throughput", f"throughput at {top:g} req/s offered (req/s)", "throughput_req_per_s", top,
                       lambda v: f"{v:.2f}")),)


def kv_accuracy(f: Files) -> tuple[Table, ...]:
    """int8 K/V against float32 on the engine (python -m reference kv-accuracy), one row per model."""
    rows = []
    for r in f.rows("kv_accuracy", prompt="all"):
        firsts = [x for x in r["first_difference"].split() if x != "-"]
        rows.append((r["model"], r["model"], r["identical"], ", ".join(firsts) or "none",
                     f"{float(r['mean_kl']):.1e}", f"{float(r['max_abs_logit_error']):.2f}",
                     f"{float(r['argmax_agreement']):.1%}",
                     f"{int(r['blocks_per_gib_float32']):,} -> {int(r['blocks_per_gib_int8']):,} "
                     f"({int(r['blocks_per_gib_int8']) / int(r['blocks_per_gib_float32']):.2f}x)"))
    backend = f.comments("kv_accuracy")["backend"]
    return (_table(f"`{f.comments('kv_accuracy')['command']}` (`figures/kv_accuracy.csv`; make peer's greedy prompts, "
                   f"{f.rows('kv_accuracy', prompt='0')[0]['new_tokens']} tokens each, ignore EOS; backend "
                   f"{backend}):",
                   ("model", "greedy tokens identical", "first difference at token", "mean KL (nats/token)",
                    "largest logit error", "same argmax (teacher-forced)", "blocks of 16 per GiB, float32 -> int8"),
                   *rows),)


def _peer(f: Files) -> dict[tuple[str, str, str], dict]:
    return {(r["section"], r["system"], r["threads"]): r for r in f.rows("peer_vllm")}


def peer(f: Files) -> tuple[Table, ...]:
    """This engine's speed against vLLM's CPU build (tools/peer_vllm.py)."""
    table = _peer(f)
    version = re.search(r"vllm (\d+\.\d+)", table["throughput", "vllm", "1"]["note"]).group(1)
    rounds = table["throughput", "engine", "1"]["rounds"]
    rows = []
    for threads, label, suffix in (("1", "1", ""), ("2", "2", ""), ("1", "1, both on one core", "_one_core")):
        ours, theirs = (float(table[f"throughput{suffix}", s, threads]["value"]) for s in ("engine", "vllm"))
        ratio = float(table[f"throughput_ratio{suffix}", "engine / vLLM", threads]["value"])
        rows.append((f"throughput{suffix}.{threads}", label, f"{ours:.1f}", f"{theirs:.1f}", f"{ratio:.2f}"))
    return (_table(f"`figures/peer_vllm.csv`, medians of {rounds} rounds:",
                   ("threads", "this engine (output tokens/s)", f"vLLM {version} CPU", "engine / vLLM"), *rows),)


def peer_checks(f: Files) -> tuple[Table, ...]:
    """The same run's checks: greedy and beam-search equality, cold start, the block pool driven side by side."""
    table = _peer(f)
    greedy = table["greedy_equality", "engine vs vLLM", "1"]
    beams = table["beam_search_equality", "engine vs vLLM", "1"]
    pool = table["block_pool", "sim.BlockAllocator vs vLLM BlockPool", ""]
    cold = {s: float(table["cold_start", s, "1"]["value"]) for s in ("engine", "vllm")}
    return (_table("The checks of the same run (`figures/peer_vllm.csv`):", ("check", "result"),
                    ("greedy", "greedy output", f"{greedy['value']} {greedy['unit']}"),
                    ("beams", "beam search", f"{beams['value']} {beams['unit']}"),
                    ("cold_start", "cold start, 1 thread: this engine, vLLM",
                     f"{cold['engine']:.1f} s against {cold['vllm']:.1f} s"),
                    ("block_pool", "block pool: sim.BlockAllocator against vLLM's BlockPool",
                     f"{pool['value']} of {pool['rounds']} {pool['unit']}")),)


@dataclass(frozen=True, slots=True)
class GPUNumbers:
    passed: str  # tests passed, from the test log
    bandwidth: tuple[float, float]  # decode kernel: fraction of the copy's bytes/s, batch x context >= LONG_DECODE
    paging: tuple[float, float]  # shuffled / identity block table, block sizes >= PAGING_FROM
    paging_sizes: tuple[int, int]
    equal: dict[str, str]  # dtype -> "16 of 16"
    tokens_per_s: dict[str, float]  # "engine", "HF 16", "HF all"
    num_requests: str
    dtype: str


def gpu_numbers(f: Files) -> GPUNumbers:
    kernels = f.rows("bench_attention_gpu")
    long = [float(r["fraction_of_copy"]) for r in kernels
            if r["experiment"] == "decode" and int(r["batch"]) * int(r["context"]) >= LONG_DECODE]
    times: dict[int, dict[str, float]] = {}
    for r in kernels:
        if r["experiment"] == "paging":
            times.setdefault(int(r["block_size"]), {})[r["block_table"]] = float(r["time_us"])
    paging = {bs: t["shuffled"] / t["identity"] for bs, t in times.items()
              if bs >= PAGING_FROM and "shuffled" in t and "identity" in t}
    engine = f.rows("bench_engine_gpu")
    equal = {r["dtype"]: r["note"].split(" sequences")[0] for r in engine if r["section"] == "greedy_equality"}
    tps = {r["system"]: r for r in engine if r["section"] == "throughput"}
    ours = next(r for s, r in tps.items() if s.startswith("engine"))
    everyone = ours["num_requests"]
    return GPUNumbers(
        passed=re.search(r"(\d+) passed", f.text("gpu_tests.txt")).group(1),
        bandwidth=(min(long), max(long)), paging=(min(paging.values()), max(paging.values())),
        paging_sizes=(min(paging), max(paging)), equal=equal,
        tokens_per_s={"engine": float(ours["tokens_per_s"]),
                      "HF 16": float(tps[HF_BATCHES.format(16)]["tokens_per_s"]),
                      "HF all": float(tps[HF_BATCHES.format(everyone)]["tokens_per_s"])},
        num_requests=everyone, dtype=ours["dtype"])


def _decode_words() -> str:
    return f"batch x context >= {LONG_DECODE // 2048} x 2048"


def gpu(f: Files) -> tuple[Table, ...]:
    """The H100 session: the GPU tests, the kernels' bandwidth and paging price, the engine against HF."""
    g = gpu_numbers(f)
    tps, n = g.tokens_per_s, g.num_requests
    return (_table("Measured on the H100:", ("measurement", "result", "file"),
                   ("tests", "attention and KV-cache tests", f"{g.passed} passed", "`figures/gpu_tests.txt`"),
                   ("bandwidth", f"decode kernel, bytes per second over the copy's, at {_decode_words()}",
                    f"{g.bandwidth[0]:.2f} to {g.bandwidth[1]:.2f}", "`figures/bench_attention_gpu.csv`"),
                   ("paging", f"kernel time, shuffled / identity block table, block sizes "
                    f"{g.paging_sizes[0]}-{g.paging_sizes[1]}", f"{g.paging[0]:.3f} to {g.paging[1]:.3f}",
                    "`figures/bench_attention_gpu.csv`"),
                   ("greedy", "greedy output equal to HF transformers', float32; bfloat16",
                    f"{g.equal['float32']} prompts; {g.equal['bfloat16']}", "`figures/bench_engine_gpu.csv`"),
                   ("engine", f"output tokens/s, {n} requests, {g.dtype}: the engine", f"{tps['engine']:,.0f}",
                    "`figures/bench_engine_gpu.csv`"),
                   ("hf16", "HF `generate` in static batches of 16 (the engine's speed-up)",
                    f"{tps['HF 16']:,.0f} ({tps['engine'] / tps['HF 16']:.1f}x)", "`figures/bench_engine_gpu.csv`"),
                   ("hf_all", f"HF `generate` in one padded batch of all {n} (the engine's speed-up)",
                    f"{tps['HF all']:,.0f} ({tps['engine'] / tps['HF all']:.2f}x)",
                    "`figures/bench_engine_gpu.csv`")),)


def benchmarks(f: Files) -> tuple[Table, ...]:
    """The table of `make bench`: what each command measures and what it measured."""
    # rows of the .py files (a CSV from before the `build` column has only those), and of the compiled build if timed
    sim = {r["run"]: r for r in f.rows("bench_sim")
           if r["run"] != "heapq" and r.get("build") in (None, "", "interpreted")}
    wall = {run: float(r["wall_time_s"]) for run, r in sim.items()}
    fast = {r["run"]: float(r["wall_time_s"]) for r in f.rows("bench_sim") if r.get("build") == "compiled"}
    compiled_rows = [("sim_compiled", "", "the same runs compiled (`make fast`, then `LAB_FAST=1`; docs/benchmarks.md, "
                      "\"An optional compiled build\"), timed side by side with the rows above in one run", "; ".join(
                          f"{label} {fast[run]:.2f} s ({wall[run] / fast[run]:.2f}x)" for run, label in (
                              ("paper-scale paged", "paper-scale paged"), ("100k paged v0", "100k v0"),
                              ("1M paged v0", "1M")) if run in fast))] if fast else []
    paper, big, huge = sim["paper-scale paged"], sim["100k paged v0"], sim["1M paged v0"]
    target = lambda r: f"{float(r['target_wall_s']):g}"  # noqa: E731
    paper_scale = "; ".join([f"paged {wall['paper-scale paged']:.2f} s (target < {target(paper)} s)",
                             ", ".join(f"{label} {wall[run]:.2f} s" for run, label in SIM_BENCH_RUNS[1:4]),
                             f"{SIM_BENCH_RUNS[4][1]} {wall[SIM_BENCH_RUNS[4][0]]:.2f} s"])
    alloc = {(r["benchmark"], r["policy"], r["allocator"]): float(r["ops_per_s"]) / 1e6 for r in f.rows("bench_alloc")}
    contiguous = [v for (b, p, _), v in alloc.items() if b == "kv_cycle" and p != "paged"]
    engine = {r["system"].split(" ")[0]: r for r in f.rows("bench_engine_cpu", section="throughput")}
    tokens = {k: float(v["tokens_per_s"]) for k, v in engine.items()}
    workload = f.comments("bench_engine_cpu")["workload"]
    prompts, outputs = (re.search(rf"{w} (\d+-\d+)", workload).group(1) for w in ("prompt", "output"))
    concurrency = {r["system"]: r for r in f.rows("bench_engine_cpu", section="concurrency")}
    blocks, block_size = re.search(r"(\d+) blocks x (\d+) tokens", next(iter(concurrency.values()))["note"]).groups()
    held = ", ".join(f"{s} {r['max_concurrent_requests']}"
                     + (" (the whole workload)" if r["max_concurrent_requests"] == r["num_requests"] else "")
                     for s, r in concurrency.items())
    g = gpu_numbers(f)
    tps, n = g.tokens_per_s, g.num_requests
    caption = ("From `figures/bench_sim.csv`, `figures/bench_alloc.csv`, `figures/bench_engine_cpu.csv`, "
               "`figures/bench_attention_gpu.csv` and `figures/bench_engine_gpu.csv`:")
    return (_table(caption, ("command", "what", "result"),
                   ("sim", "`python -m sim bench`", "simulator wall time, paper-scale run (OPT-13B, A100-40GB, "
                    f"ShareGPT, {float(paper['rate']):g} req/s, 1 h, {int(paper['num_requests']):,} requests), the "
                    "paper's scheduler", paper_scale),
                   ("sim_100k", "", f"{int(big['num_requests']):,} requests (paged, ShareGPT, {float(big['rate']):g} "
                    "req/s)", f"v0 {wall['100k paged v0']:.1f} s, v1 {wall['100k paged v1']:.1f} s (target < "
                    f"{target(big)} s)"),
                   ("sim_1m", "", f"{int(huge['num_requests']):,} requests (paged, v0, the same rate), without the "
                    "per-step table (`step_table=False`)", f"{wall['1M paged v0']:.1f} s, peak memory "
                    f"{float(huge['peak_rss_mib']):,.0f} MiB (targets < {target(huge)} s, < "
                    f"{float(huge['target_peak_rss_mib']):,.0f} MiB)"),
                   *compiled_rows,
                   ("alloc", "`python -m sim bench-alloc`", "KV-manager operations per second (admission through the "
                    "contract, one-token growth, free)", f"BlockAllocator allocate/free "
                    f"{alloc['blocks', '', 'block']:.2f} M/s; paged {alloc['kv_cycle', 'paged', 'block']:.2f} M/s; "
                    f"contiguous {min(contiguous):.2f}-{max(contiguous):.2f} M/s"),
                   ("engine", "`python -m reference bench`", "engine vs HF `generate` (static padded batches of 16), "
                    f"{engine['engine']['num_requests']} mixed-length requests (prompts {prompts}, outputs {outputs} "
                    "tokens), SmolLM2, 1 torch thread each, same run", f"{tokens['engine']:.1f} vs {tokens['HF']:.1f} "
                    f"output tokens/s: {tokens['engine'] / tokens['HF']:.2f}x (target >= {ENGINE_TARGET:g}x)"),
                   ("concurrency", "", f"max concurrent requests at a fixed KV budget ({blocks} blocks of "
                    f"{block_size})", held),
                   ("kernels", "`python -m reference bench-kernels`", "GPU only: decode-kernel bandwidth vs a device "
                    "copy, paged vs identity block table (H100, above)", f"{g.bandwidth[0]:.2f}-{g.bandwidth[1]:.2f} "
                    f"of the copy at {_decode_words()}; shuffled / identity {g.paging[0]:.3f}-{g.paging[1]:.3f} at "
                    f"block sizes {g.paging_sizes[0]}-{g.paging_sizes[1]}"),
                   ("gpu", "`python -m reference bench-gpu`", "GPU only: the engine vs HF `generate` on SmolLM2's "
                    f"shape, {n} requests, {g.dtype} (H100, above)", f"{tps['engine']:,.0f} vs {tps['HF 16']:,.0f} "
                    f"output tokens/s ({tps['engine'] / tps['HF 16']:.1f}x); HF in one batch of {n}: "
                    f"{tps['HF all']:,.0f}")),)


def engine_profile(f: Files) -> tuple[Table, ...]:
    """Where the CPU engine's time goes on the two peer workloads (tools/engine_profile.py), and the bound it sets."""
    rows = []
    for name, label in (("engine_profile_cpu", "bench"), ("engine_profile_cpu_long", "long")):
        by = {r["section"]: r for r in f.rows(name) if r["section"] != "step"}
        total, decode = by["total"], by["decode_steps"]
        wall = float(total["wall_ms"])
        share = lambda key, total=total, wall=wall: f"{float(total[key]) / wall:.0%}"  # noqa: E731
        rows.append((label, label, f"{wall / 1e3:.1f} s", f"{share('gemm_ms')} ({float(total['gemm_gflops']):.0f} "
                     f"GFLOPS)", share("attention_ms"), share("other_ms"), share("outside_ms"),
                     f"{float(decode['weights_gbps']):.1f} / {float(decode['decode_kv_gbps']):.1f}",
                     f"{float(by['bound']['value']):.2f}x", f"{float(by['needed_cut']['value']):.0%}"))
    peak = float(f.one("engine_profile_cpu", section="gemm_peak")["value"])
    bandwidth = float(f.one("engine_profile_cpu", section="read_bandwidth")["value"])
    caption = (f"From `figures/engine_profile_cpu.csv` and `figures/engine_profile_cpu_long.csv` (this core: float32 "
               f"GEMM peak {peak:.0f} GFLOPS, memory read {bandwidth:.1f} GB/s):")
    return (_table(caption, ("workload", "wall", "GEMMs", "attention", "rest of the forward", "outside the forward",
                             "decode steps: weights / K/V read (GB/s)", "bound (wall / GEMMs)",
                             "a 1.25x speed-up must remove"), *rows),)


# --- the grader on a busy machine ---------------------------------------------------------------------------------
def grader_load(f: Files) -> tuple[Table, ...]:
    """Every lab's solution graded as the autograder does, quiet and with busy processes beside it
    (python tools/grade_under_load.py)."""
    rows, machine = f.rows("grader_load"), f.comments("grader_load").get("machine", "an unnamed machine")
    table = []
    for hogs in sorted({int(r["hogs"]) for r in rows}):
        graded = [r for r in rows if int(r["hogs"]) == hogs]
        full = sum(float(r["score"]) == float(r["max_score"]) for r in graded)
        slowest = max(graded, key=lambda r: float(r["seconds"]))
        slowness = [float(r["slowness"]) for r in graded]
        table.append((str(hogs), "nothing" if hogs == 0 else f"{hogs} busy processes",
                      f"{full} of {len(graded)}", f"{sum(float(r['seconds']) for r in graded):,.0f} s",
                      f"{slowest['lab']}, {float(slowest['seconds']):.0f} s",
                      f"{min(slowness):.1f}x to {max(slowness):.1f}x"))
    caption = (f"From `figures/grader_load.csv` (`python tools/grade_under_load.py`; {machine}; each solution "
               f"graded in a fresh process with the default limits, the capstone with the engine's compiled kernels "
               f"cleared first):")
    return (_table(caption, ("beside the grader", "solutions at full marks", "all graded in", "the slowest",
                             "slowness measured"), *table),)


BLOCKS: dict[str, Callable[[Files], tuple[Table, ...]]] = {
    "install": install,
    "memory-waste": memory_waste,
    "memory-map": memory_map,
    "figures": figure_rows,
    "chunked-prefill": chunked_prefill,
    "priority": priority,
    "disagg": disagg,
    "speculative": speculative,
    "spec-engine": spec_engine,
    "cpu-offload": cpu_offload,
    "offload-engine": offload_engine,
    "bench-hybrid": bench_hybrid,
    "serve-bench": serve_bench,
    "kv-dtype": kv_dtype,
    "kv-accuracy": kv_accuracy,
    "peer": peer,
    "peer-checks": peer_checks,
    "engine-profile": engine_profile,
    "gpu": gpu,
    "grader-load": grader_load,
    "benchmarks": benchmarks,
}


def make_block(name: str, files: Files | None = None) -> Block:
    return Block(name, BLOCKS[name](Files() if files is None else files))


def readme_blocks(files: Files | None = None) -> dict[str, str]:
    """{block name: the text between its markers}, every block, in README order."""
    files = Files() if files is None else files
    return {name: make_block(name, files).text() for name in BLOCKS}


# --- the README --------------------------------------------------------------------------------------------------
def block_span(text: str, name: str) -> tuple[int, int] | None:
    """Where block `name`'s text lies in README `text`, between its markers; None without both markers in order."""
    begin, end = markers(name)
    start = text.find(begin)
    stop = text.find(end, start + len(begin)) if start >= 0 else -1
    return None if stop < 0 else (start + len(begin), stop)


def missing_blocks(text: str, names=BLOCKS) -> list[str]:
    """The blocks (of `names`: this module's by default) whose two markers README `text` lacks (or has in the wrong
    order)."""
    return [name for name in names if block_span(text, name) is None]


def missing_line(readme: str | Path, missing: list[str]) -> str:
    first = markers(missing[0])
    others = f" (nor {', '.join(missing[1:])})" if missing[1:] else ""
    return f"{readme}: no {first[0]} ... {first[1]} block{others} (the markers are written by hand: --write fills them)"


def current_block(text: str, name: str) -> str:
    span = block_span(text, name)
    if span is None:
        raise ValueError(missing_line("README.md", [name]))
    return text[span[0]:span[1]].strip("\n")


def replace_blocks(text: str, blocks: dict[str, str], readme: str | Path = "README.md") -> str:
    """`text` with each block's markers holding its new text; ValueError (nothing replaced) naming `readme` if one
    has no markers."""
    absent = missing_blocks(text, blocks)
    if absent:
        raise ValueError(missing_line(readme, absent))
    for name, block in blocks.items():
        start, stop = block_span(text, name)
        text = f"{text[:start]}\n{block}\n{text[stop:]}"
    return text


def stale_blocks(text: str, blocks: dict[str, str]) -> list[str]:
    """The blocks of README `text` that are not `blocks` (those with no markers included)."""
    return [name for name, block in blocks.items() if block_span(text, name) is None or current_block(text, name) != block]


def pages(root: str | Path = ROOT) -> list[Path]:
    """Where the blocks live: README.md and every page under docs/ (the site `make docs` builds)."""
    root = Path(root)
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def read_pages(paths: list[Path] | None = None) -> dict[Path, str]:
    """{page: its text}, README.md and docs/*.md by default."""
    return {path: Path(path).read_text(encoding="utf-8") for path in (pages() if paths is None else paths)}


def _shown(path: Path) -> str:
    path = Path(path)
    return str(path.relative_to(ROOT)) if path.is_absolute() and path.is_relative_to(ROOT) else str(path)


def locate(texts: dict[Path, str], names) -> dict[str, list[Path]]:
    """{block name: the pages that carry its two markers (in order)}, for every name in `names`."""
    return {name: [path for path, text in texts.items() if block_span(text, name) is not None] for name in names}


def twice_line(found: dict[str, list[Path]]) -> str | None:
    """One line naming the blocks found on more than one page; None if every block is on at most one."""
    twice = {name: paths for name, paths in found.items() if len(paths) > 1}
    if not twice:
        return None
    return "; ".join(f"{markers(name)[0]} is on {' and '.join(map(_shown, paths))}" for name, paths in twice.items()) \
        + " (a block must be on exactly one page)"


def page_block(name: str, texts: dict[Path, str] | None = None) -> str:
    """Block `name`'s current text, on whichever page (README.md, docs/*.md) carries it; ValueError if none does or
    more than one does."""
    texts = read_pages() if texts is None else texts
    found = locate(texts, [name])
    if len(found[name]) != 1:
        raise ValueError(twice_line(found) or missing_line(PAGES_LABEL, [name]))
    return current_block(texts[found[name][0]], name)


def update_readme(readme: str | Path | None = None, files: Files | None = None) -> bool:
    """Rewrite the blocks from the committed files (atomically), on the page of each (README.md, docs/*.md), or all in
    the one file `readme`; True if any changed."""
    return _write(_targets(readme), BLOCKS, readme_blocks(files))[0] != []


def _targets(readme: str | Path | None) -> list[Path]:
    return pages() if readme is None else [Path(readme)]


def _problems(texts: dict[Path, str], names, label: str) -> tuple[dict[str, list[Path]], str | None]:
    """Where each block is, and one line saying what is wrong (a block on no page, or on two), or None."""
    found = locate(texts, names)
    missing = [name for name, paths in found.items() if not paths]
    return found, (missing_line(label, missing) if missing else twice_line(found))


def _write(paths: list[Path], names, blocks: dict[str, str]) -> tuple[list[Path], dict[Path, str]]:
    """Each page with its blocks replaced, the changed ones written together (atomically: all or none); the changed
    pages, and every page's text as read. ValueError (nothing written) if a block is on no page or on two."""
    from ..base.outfiles import atomic_files

    texts = read_pages(paths)
    label = _shown(paths[0]) if len(paths) == 1 else PAGES_LABEL
    found, problem = _problems(texts, names, label)
    if problem:
        raise ValueError(problem)
    new = {path: replace_blocks(text, {n: blocks[n] for n in names if found[n] == [path]}, _shown(path))
           for path, text in texts.items()}
    changed = [path for path in paths if new[path] != texts[path]]
    with atomic_files() as out:
        for path in changed:
            with out.open(path, encoding="utf-8") as f:
                f.write(new[path])
    return changed, texts


def print_blocks(blocks: dict[str, str]) -> str:
    return "\n\n".join(f"{markers(name)[0]}\n{block}\n{markers(name)[1]}" for name, block in blocks.items())


def readme_command(readme: str | Path | None, write: bool, check: bool, names,
                   make_blocks: Callable[[], dict[str, str]], command: str, done: str) -> int:
    """The `readme-numbers` command, for the blocks `names` that `make_blocks()` makes (this module's, or the engine's
    calibration blocks in reference/validation/readme_numbers.py): print them; or `write` them between their markers, on the page
    of each (README.md or docs/*.md; with `readme`, all in that one file), the changed pages together and atomically;
    or `check` them (exit status 1, one line, when a block is stale, on no page or on two; `done` is the line printed
    when none is). Bad input (no markers to write into, a page that cannot be read) is a ValueError / OSError for the
    caller's one `error:` line."""
    paths = _targets(readme)
    label = _shown(paths[0]) if readme is not None else PAGES_LABEL
    if write or check:  # the pages and their markers first, before reading the files
        texts = read_pages(paths)
        found, problem = _problems(texts, names, label)
        if problem and check:  # the check fails: no page carries the block (or two do)
            print(problem, file=sys.stderr)
            return 1
        if problem:  # nowhere to write: bad input, one `error:` line and exit 2 (as paper-table)
            raise ValueError(problem)
    blocks = make_blocks()
    if write:
        changed, _ = _write(paths, names, blocks)
        print(f"rewrote {', '.join(map(_shown, changed))}" if changed else f"unchanged: {label}")
    elif check:
        stale = [name for name in names if current_block(texts[found[name][0]], name) != blocks[name]]
        if stale:
            print(f"{label}: its blocks {', '.join(stale)} are not what the files give (run: {command} --write)",
                  file=sys.stderr)
            return 1
        print(f"{label}: {done}")
    else:
        print(print_blocks(blocks))
    return 0
