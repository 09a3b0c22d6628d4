"""The claims: what each walkthrough's text says about its own output, one `Claim` per statement, by notebook.

Each claim ties one statement of a walkthrough's markdown ("the pool holds 800 KiB", "request 5 is the victim three
times", "paged stays flat up to 2 requests/s") to the output it describes; stated_numbers.py checks them against the
executed notebook. Its fields:

- `phrase`: the statement with its number, as it stands in a markdown cell of the notebook. Runs of whitespace
  compare as one space (rewrapping a paragraph keeps the claim), any other edit of the sentence breaks it: whoever
  changes the number in the text must change the claim, and so look at the output again.
- `cell` and `pattern`: the code cell whose source contains the snippet `cell` (exactly one cell: found by its
  code, not by its index, so inserting cells breaks nothing), and a regular expression (`re.MULTILINE`) over what
  it printed (its stdout streams and the text/plain of its results, in order). Every match's groups are read: as
  numbers where they are numbers (`15,805`, `2.98e-07`), True/False as booleans, anything else as its text.
- `read`: from the matches (a tuple of groups per match) to the value compared; by default all groups of all
  matches, one value alone or a tuple.
- the comparison: `stated` (equal within `tolerance`, element-wise for a tuple) or `within` (an inclusive range
  (low, high); for a tuple every element lies in it). A qualitative statement ("flat", "a little", "most of the
  time") is checked as a number with a threshold; `why` states the threshold and how the words became it.

What is left out, on purpose: numbers about the paper or the hardware (the paper's 20.4% - 38.2%, the A100's
memory), inputs the code sets and the text repeats (a pool of 128 slots, 200 s of arrivals), wall-clock times
("about a second each"), and numbers read off a picture that no cell of the notebook computes (notebook 7's last
cell shows figures/memory_managers.png, drawn from 600 s and 1800 s runs by `python -m sim figures`).
Where a statement's number appeared only in a plot, the cell prints it as well (notebook 5's sweep; notebook 3's
viewer line after its record()).
"""

from __future__ import annotations

import ast
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

INF = math.inf


@dataclass(frozen=True)
class Claim:
    """One statement of a walkthrough's text about a number its own output shows (module docstring)."""

    phrase: str
    cell: str
    pattern: str
    stated: Any = None
    within: tuple[float, float] | None = None
    tolerance: float = 0.0
    read: Callable[[list[tuple]], Any] | None = None
    why: str = ""
    engine: bool = False  # the cell runs the engine: the light install (no torch) prints a note instead, unchecked

    def __post_init__(self):
        if (self.stated is None) == (self.within is None):
            raise ValueError(f"a claim states a value or a range, not both or neither: {self.phrase!r}")

    def expectation(self) -> str:
        if self.within is not None:
            return f"{show(self.within[0])} to {show(self.within[1])}"
        shown = ", ".join(map(show, self.stated)) if isinstance(self.stated, (tuple, list)) else show(self.stated)
        return shown + (f" +- {show(self.tolerance)}" if self.tolerance else "")


def show(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(show(v) for v in value) + ")"
    return str(value)


def _ids(text) -> list[int]:
    """A printed list of block ids without its brackets ("3, 4" or a lone 7) as ints; None entries dropped."""
    return [int(t) for t in str(text).split(",") if t.strip() not in ("", "None")]


def _table(text) -> list[int | None]:
    return [None if t.strip() == "None" else int(t) for t in str(text).split(",")]


# ------------------------------------------------------------------------------------------ notebook-specific reads

SWEEP_RATES = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)  # notebook 5's RATES, the columns of its printed sweep
BEND_S_PER_TOKEN = 0.1  # notebook 5: a curve "bends up" once it rises this far above its 0.5 req/s value


def _sweep(matches) -> dict[str, tuple[list[float], list[float]]]:
    """Notebook 5's printed sweep: policy -> (normalized latency per rate, mean batch per rate)."""
    return {m[0]: (list(m[1:7]), list(m[7:13])) for m in matches}


def _bend_rate(latency: list[float]) -> float:
    """The first rate of the sweep at which the latency has risen BEND_S_PER_TOKEN above its first value."""
    return next((rate for rate, v in zip(SWEEP_RATES, latency) if v - latency[0] > BEND_S_PER_TOKEN), INF)


def _bends(matches) -> dict[str, float]:
    return {policy: _bend_rate(latency) for policy, (latency, _) in _sweep(matches).items()}


def _rows(matches, key=0) -> dict:
    """A printed table's rows (one match each) by the value of one column."""
    return {m[key]: m for m in matches}


def _steps_to_cover(sizes, total: int) -> int:
    """How many of these consecutive prompt pieces it takes to compute `total` tokens."""
    done = 0
    for count, size in enumerate(sizes, 1):
        done += size
        if done >= total:
            return count
    return INF


def _groups(text: str) -> list[tuple[str, list[int | None]]]:
    """Notebook 7's per-group block tables printed under one "N tokens:" line: (full / sliding 512, table)."""
    return [(name, _table(table)) for name, table in re.findall(r"^ +(full|sliding \d+): \[([^\]]*)\]", text, re.M)]


def _budget_table(matches) -> dict[str, tuple[int, int, int]]:
    """Notebook 8's budget sweep: "v0" / "v1, 512" -> (p50 TTFT, p99 TTFT, p99 largest gap), in ms."""
    return {m[0]: m[1:] for m in matches}


# ------------------------------------------------------------------------------------------------ the claims

_NB1_TABLE = 'busy[policy] = summary["memory_busy"]'
_NB1_LOAD = "for rate in (1.0, 2.0, 3.0):"
_NB1_KINDS = (
    r"^{} +MemoryBreakdown\(token_states=(\d+), reservation=(\d+), internal_fragmentation=(\d+), "
    r"external_fragmentation=(\d+), free=(\d+)\)"
)
SHARE_KEYS = ("token_states", "reservation", "internal_fragmentation", "external_fragmentation", "free")

_NB3_TABLE = 'scheduler="static"'
_NB3_ROW = r"^({}) +(\d+) +(\d+) +([\d.]+) +([\d.]+) +(\d+)$"
_NB3_ROWS = _NB3_ROW.format("continuous, recompute|continuous, swap|static batching")
_NB3_VIEWER = "snaps = viewer.record()"

_NB4_SAMPLES = "def without_sharing(n):"
_NB4_ROW = r"^ *(\d+) +([\d.]+) s/token +(\d+) +([\d.]+) s/token +(\d+) +([\d.]+) s/token +(\d+)$"


def _nb4(n: int, matches) -> tuple:
    """Notebook 4's row for n samples: (n, shared latency, its preemptions, unshared ..., oracle ...)."""
    return _rows(matches)[n]


_NB5_SWEEP = "sharegpt = sweep("
_NB5_ROWS = r"^(max|pow2|oracle|paged) +" + " +".join([r"([\d.]+)"] * 6) + r" +\| +" + " +".join([r"([\d.]+)"] * 6)
_NB5_ALPACA = 'workload="alpaca", rate=20.0'
_NB5_ALPACA_ROW = r"^(max|pow2|oracle|paged) +alpaca at 20 req/s: normalized latency ([\d.]+) s/token, mean batch (\d+)"
_NB5_TP = "cost.all_reduce_time(prompt + decodes)"
_NB5_TP_SHARE = r"^(opt-\d+b) on (\d) GPUs, (decode|prompt)[^:]*: step [\d.]+ ms, all-reduces [\d.]+ ms \((\d+)%\)"
_NB5_TP_RUN = r"^OPT-66B paged at ([\d.]+) req/s: ([\d.]+) s/token with all-reduces, ([\d.]+) without"


def _tp_share(ms, gpus: int, kind: str) -> float:
    """The all-reduces' share of a step (percent) printed for `gpus` GPUs and a step of `kind` (decode or prompt)."""
    return next(m[3] for m in ms if m[1] == gpus and m[2] == kind)


_LENGTH_AWARE = ("pow2", "oracle", "paged")

_NB6_ENGINE = 'llm = LLM("smollm2", block_size=8, num_gpu_blocks=48)'
_NB6_STEPS = 'b = llm.add_request("Once upon a time"'
_NB6_POOL = "free queue before c arrives"

_NB7_LOOKUP = 'for policy in ("radix", "paged"):'
_NB7_TREE = "show_tree(kv.tree.root)"
_NB7_TREE_TOP = r"the tree:\n\[[^\]]*\] (\d+) tokens, pages \[[^\]]*\], locks (\d+)\n +\[[^\]]*\] (\d+) tokens"
_NB7_CHAT = 'conversation = dict(workload="conversation"'
_NB7_CHAT_ROW = (
    r"^(hashed full blocks \(vLLM\)|radix tree \(SGLang\)) +(\d+) +([\d.]+)% +([\d,]+) +([\d.]+)"
    r" +([\d.]+)%$"
)
_NB7_TIER = "reload_s = RooflineCostModel"  # cell-off1: conversations with a CPU offload tier
_NB7_TIER_ROW = r"^ +(\d+) GiB +([\d.]+)% +([\d.]+)% +([\d,]+) +([\d.]+)s +([\d.]+)s +([\d.]+)s$"
_NB7_PAGES = "PAGES = (1, 4, 16, 64, 256, 1024, 2048)"
_NB7_PAGE_ROW = r"^(vattention, pages of +\d+ tokens|paged|oracle|max) *: token states ([\d.]+)% .*mean batch ([\d.]+)$"
_NB7_HYBRID = 'hybrid = make_kv_manager("hybrid"'
_NB7_GEMMA27 = 'gemma27 = get_model("gemma3-27b")'
_NB7_GEMMA27_ROW = r"^ *(\d+) +(paged|hybrid) +([\d.]+) GiB +([\d.]+) +(\d+) +([\d.]+)$"
_NB7_TINY = "tiny = random_model(TINY_GEMMA3_CONFIG, seed=1)"
_NB7_KV_BYTES = 'for kv_dtype in ("auto", "fp8", "int8"):'
_NB7_KV_RUN = 's = sim.run(scheduler="v0", rate=3.0, duration=120, kv_dtype=kv_dtype'
_NB7_KV_ENGINE = "tokens[kv_dtype] = list(llm.generate([prompt], params)"
_NB9_DISAGG_ONE = "one = [Request(0, 0.0, 500, 4)]"
_NB9_DISAGG = "splits = {"
_NB9_DISAGG_ROW = r"^(colocated x4|1P3D|2P2D) +(\d+) ms +(\d+) ms +([\d.]+)% +([\d.]+)%$"


def _nb7_chat(matches) -> dict[tuple[str, int], tuple]:
    """(cache, block size) -> (hit rate %, prompt tokens computed, mean batch, hit rate % in a pool never evicting)."""
    return {("paged" if m[0].startswith("hashed") else "radix", m[1]): m[2:] for m in matches}


def _nb7_pages(matches) -> dict[str, tuple[float, float]]:
    """ "vattention 1" ... "vattention 2048", "paged", "oracle", "max" -> (token states %, mean batch)."""
    return {" ".join(re.sub(r"[,]|pages of|tokens", "", m[0]).split()): m[1:] for m in matches}


def _nb7_gemma27(matches) -> dict[tuple[int, str], tuple]:
    """(prompt, pool) -> (KV GiB per running request, mean batch, preemptions, req/s)."""
    return {(m[0], m[1]): m[2:] for m in matches}


_NB8_V0 = "v0_sampled, v0_computed = by_hand("
_NB8_V1 = "v1_sampled, v1_computed = by_hand("
_NB8_PER_REQUEST = "gap = {name: max(b - a for a, b"
_NB8_STALL = "def stall_requests():"
_NB8_BUDGETS = "BUDGETS = (128, 256, 512, 1024, 2048, 4096)"
_NB8_BUDGET_ROW = r"^(v0|v1, \d+) +(\d+) +(\d+) +(\d+)$"
_NB8_CHUNKED = 'chunks = [new for record in engines["chunked"].step_log'
_NB8_SLO = "SLO = dict(slo_ttft=0.5, slo_tbt=0.035)"
_NB8_SLO_ROW = r"^ *([\d.]+) +(v0|v1-512) +([\d.]+) +([\d.]+)% +([\d.]+) +([\d.]+)%$"
_NB9_BY_HAND = "def serve(policy: str) -> None:"
_NB9_STEP = r"^ *(fcfs|priority) step +(\d+): (.*?) +waiting (\[.*\])$"
_NB9_LOAD = 'trace = dict(workload="sharegpt", rate=2.5, duration=600, seed=0, priority_share=0.2)'
_NB9_LOAD_ROW = r"^ *(fcfs|priority) +(\d) +(\d+) +([\d.]+)s +([\d.]+)s +([\d.]+) +([\d.]+)$"


def _classes(matches) -> dict[tuple[str, int], tuple]:
    """Notebook 9's load table: (policy, class) -> (requests, mean TTFT, p99 TTFT, s/token, throughput)."""
    return {(m[0], m[1]): m[2:] for m in matches}


def _event_step(matches, policy: str, event: str) -> int | None:
    """Notebook 9's by-hand run: the step at which `event` ("admits r3", "r3 finishes", ...) happened under `policy`."""
    return next((m[1] for m in matches if m[0] == policy and event in m[2].split(", ")), None)


def _stall(system: str, request: str, column: int) -> str:
    """A pattern for one number of notebook 8's stall table: system "v0" or "v1, budget 512", column 1 TTFT,
    2 mean ITL, 3 largest gap (the other columns match without a group)."""
    cells = [r"TTFT +(\d+) ms", r"mean ITL +([\d.]+) ms", r"largest gap +(\d+) ms"]
    cells = [c if i + 1 == column else c.replace("(", "").replace(")", "") for i, c in enumerate(cells)]
    return rf"^{re.escape(system)}\n(?:  r.*\n)*?  {request} \(prompt +\d+\): {cells[0]}, {cells[1]}, {cells[2]}"


def _slo(matches) -> dict[tuple[float, str], tuple]:
    """(rate, scheduler) -> (throughput, attainment %, goodput, % of requests whose largest gap <= 100 ms)."""
    return {(m[0], m[1]): m[2:] for m in matches}


CLAIMS: dict[str, list[Claim]] = {
    "01_contiguous_fragmentation": [
        Claim(
            "2 (K, V) x 40 layers x 5120 numbers x 2 bytes = **800 KiB**",
            "kv_capacity_tokens(opt, a100, 1)",
            r"KV cache of one token for opt-13b: (\d+) KiB",
            stated=800,
        ),
        Claim(
            "one request may grow to 2048 tokens (1.56 GiB)",
            "kv_capacity_tokens(opt, a100, 1)",
            r"one request of (\d+) tokens: ([\d.]+) GiB",
            stated=(2048, 1.56),
        ),
        Claim(
            "With `max`, only two of the four requests fit at all",
            "served = {policy: serve(policy, block_size=1)",
            r"^max: request (\d+) does not fit",
            read=lambda ms: 4 - len(ms),
            stated=2,
            why="four requests are offered; the cell prints each one `max` rejects",
        ),
        Claim(
            "each reserves 48 slots, which the buddy allocator rounds up to 64",
            "served = {policy: serve(policy, block_size=1)",
            r"^max +MemoryBreakdown\(token_states=(\d+), reservation=(\d+), internal_fragmentation=(\d+), "
            r"external_fragmentation=(\d+)",
            read=lambda ms: (sum(ms[0][:3]) / 2, sum(ms[0]) / 2),
            stated=(48, 64),
            why="the two runs hold token states + reservation + internal fragmentation (48 each); the allocator's "
            "rounding adds the external fragmentation (64 each)",
        ),
        Claim(
            "With `max`, **internal fragmentation** (pale, ////) takes more of the pool than any other kind",
            "served = {policy: serve(policy, block_size=1)",
            _NB1_KINDS.format("max"),
            read=lambda ms: max(zip(ms[0], SHARE_KEYS))[1],
            stated="internal_fragmentation",
            why="the largest of the five counts max's breakdown prints",
        ),
        Claim(
            "`pow2` wastes less inside each run, but the buddy allocator's rounding appears as **external "
            "fragmentation**",
            "served = {policy: serve(policy, block_size=1)",
            _NB1_KINDS.format("max") + r"\n" + _NB1_KINDS.format("pow2")[1:],
            read=lambda ms: (ms[0][2] - ms[0][7], ms[0][8]),
            within=(1, INF),
            why="(pow2's internal fragmentation below max's, in slots; pow2's external fragmentation)",
        ),
        Claim(
            "Even the `oracle`, who knows every output length, keeps **reservation**",
            "served = {policy: serve(policy, block_size=1)",
            _NB1_KINDS.format("oracle"),
            read=lambda ms: ms[0][1],
            within=(1, INF),
        ),
        Claim(
            "then request 1, whose run is 30 slots long, finishes",
            'allocator="first_fit"',
            r"after request 1 left: +\[\((\d+), (\d+)\)",
            read=lambda ms: ms[0][1],
            stated=30,
            why="the hole it leaves is the first free run printed after it left: (start, length)",
        ),
        Claim(
            "any free block fits any request (no external fragmentation)",
            'serve("paged", block_size=4)',
            r"external_fragmentation=(\d+)",
            stated=0,
        ),
        Claim(
            "at most `block_size - 1` slots per sequence",
            'serve("paged", block_size=4)',
            r"^block tables: \{(.*)\}\nMemoryBreakdown\(token_states=\d+, reservation=(\d+), "
            r"internal_fragmentation=(\d+)",
            read=lambda ms: (ms[0][1] + ms[0][2]) / ms[0][0].count(": ["),
            within=(0, 3),
            why="blocks of 4 slots: the empty slots (reservation + internal fragmentation) per running sequence "
            "(one per block table) are at most 3 on average",
        ),
        Claim(
            "while vLLM wastes under 4%",
            _NB1_TABLE,
            r"^paged +token states +([\d.]+)%",
            read=lambda ms: 100 - ms[0][0],
            within=(0, 4),
            why="waste: the busy memory not holding token states",
        ),
        Claim(
            "`max` and `pow2` land in that range here",
            _NB1_TABLE,
            r"^max +token states +([\d.]+)%",
            within=(20.4, 38.2),
            why="the range: the paper's 20.4% - 38.2% the sentence before states",
        ),
        Claim(
            "`max` and `pow2` land in that range here",
            _NB1_TABLE,
            r"^pow2 +token states +([\d.]+)%",
            within=(20.4, 38.2),
        ),
        Claim("the `oracle` above it", _NB1_TABLE, r"^oracle +token states +([\d.]+)%", within=(38.2, 100)),
        Claim(
            "Under more load it is:",
            _NB1_LOAD,
            r"^oracle at (\d) req/s: .*external frag\. +([\d.]+)%",
            read=lambda ms: _rows(ms)[3][1] - _rows(ms)[1][1],
            within=(0.1, 100),
            why="the oracle's external fragmentation is larger at 3 req/s than at 1",
        ),
        Claim(
            "Once a request waits most of the time",
            _NB1_LOAD,
            r"^oracle at 3 req/s: a request waits +(\d+)% of the time",
            within=(50, 100),
            why="most of the time: over half of it, at the highest rate (3 req/s)",
        ),
        Claim(
            "its share of token states comes down close to the paper's 38.2%",
            _NB1_LOAD,
            r"^oracle at 3 req/s: .*token states +([\d.]+)%",
            stated=38.2,
            tolerance=2.0,
            why="close: within 2 percentage points, at 3 req/s where a request waits most of the time",
        ),
        Claim(
            "there a request waits only a small share of the time",
            _NB1_LOAD,
            r"^oracle at 1 req/s: a request waits +(\d+)% of the time",
            within=(0, 10),
            why="a small share: under 10% of the time, at 1 req/s",
        ),
    ],
    "02_paging": [
        Claim(
            "Seq 0 now has 12 tokens and the block table `[0, 1, 4]`",
            "for step in range(1, 7):",
            r"^decode step 6\b.*?seq 0: +(\d+) tokens -> \[(\d+), (\d+), (\d+)\]",
            stated=(12, 0, 1, 4),
        ),
        Claim(
            "So a sequence never holds more than `block_size - 1` empty slots",
            "for step in range(1, 7):",
            r"seq \d: +(\d+) tokens -> \[([^\]]*)\]",
            read=lambda ms: max(len(_ids(t)) * 4 - n for n, t in ms),
            within=(0, 3),
            why="blocks of 4 slots: on every printed line, blocks x 4 - tokens <= 3",
        ),
        Claim(
            "Seq 0 (blocks `[0, 1, 4]`) finishes, and seq 2 arrives with a 9-token prompt: 3 blocks",
            "kv.free(0)",
            r"^admit seq 2 .*seq 2: +(\d+) tokens -> \[([^\]]*)\]",
            read=lambda ms: (ms[0][0], len(_ids(ms[0][1]))),
            stated=(9, 3),
        ),
        Claim(
            "So below seq 2 gets seq 0's old blocks, last one first",
            "kv.free(0)",
            r"^admit seq 2 .*seq 2: +\d+ tokens -> \[([^\]]*)\]",
            read=lambda ms: tuple(_ids(ms[0][0])),
            stated=(4, 1, 0),
            why="seq 0 held [0, 1, 4] (the text): last one first is 4, 1, 0",
        ),
        Claim(
            "out of memory is an answer: `allocate_slots` returns `None` and changes nothing",
            "while kv.can_allocate_slots([2], [1]):",
            r"can_allocate_slots\(\[2\], \[1\]\): (\w+) \| allocate_slots\(\[2\], \[1\]\) -> (\w+)",
            stated=(False, "None"),
        ),
    ],
    "03_batching_and_preemption": [
        Claim(
            "Step 0 admits all three prompts in one prefill",
            'SchedulerConfig(mode="v0", preemption="recompute")',
            r"^step +0 +(.*?) +free blocks",
            read=lambda ms: tuple(re.findall(r"r(\d):prefill", ms[0][0])),
            stated=("0", "1", "2"),
            why="the requests whose prompt step 0 computes",
        ),
        Claim(
            "At step 7 the pool is empty: request 2, the latest arrival, is **preempted**",
            'SchedulerConfig(mode="v0", preemption="recompute")',
            r"^step +(\d+) .*preempted \[(\d+)\]",
            stated=(7, 2),
        ),
        Claim(
            "it comes back with a prefill of 17 tokens — its 10 prompt tokens plus the 7 it had generated",
            'SchedulerConfig(mode="v0", preemption="recompute")',
            r"r2:prefill\((\d+)\)",
            read=lambda ms: (ms[1][0], ms[0][0], ms[1][0] - ms[0][0]),
            stated=(17, 10, 7),
            why="r2's two prefills: its prompt at step 0, its recompute after the preemption",
        ),
        Claim(
            "each run goes on until its last request has finished, so it lasts longer than 90 s",
            _NB3_TABLE,
            _NB3_ROWS,
            read=lambda ms: tuple(m[5] for m in ms),
            within=(90.001, INF),
            why="the last column (last request done at) of each of the three runs",
        ),
        Claim(
            "Continuous batching keeps the batch — and the pool — full and serves the same requests much sooner",
            _NB3_TABLE,
            _NB3_ROWS,
            read=lambda ms: _rows(ms)["static batching"][5] / max(m[5] for m in ms if m[0] != "static batching"),
            within=(1.2, INF),
            why="much sooner: static batching's last request is done at least 20% later",
        ),
        Claim(
            "Recompute and swap perform alike here (their lines almost coincide, and so do their rows of the table)",
            _NB3_TABLE,
            _NB3_ROWS,
            read=lambda ms: max(
                abs(a / b - 1)
                for a, b in zip(_rows(ms)["continuous, swap"][1:], _rows(ms)["continuous, recompute"][1:])
            ),
            within=(0, 0.05),
            why="alike: every column of the two rows within 5% of each other",
        ),
        Claim(
            "Static batching preempts too",
            _NB3_TABLE,
            _NB3_ROW.format("static batching"),
            read=lambda ms: ms[0][2],
            within=(1, INF),
        ),
        Claim(
            "With a budget of 8 tokens per step, request 0's 8-token prompt takes the whole first step",
            'SchedulerConfig(mode="v1", max_num_batched_tokens=8',
            r"^step +0 +r0:prefill\((\d+)\) +free blocks",
            stated=8,
            why="and nothing else runs in step 0",
        ),
        Claim(
            "Every step now computes at most 8 tokens",
            'SchedulerConfig(mode="v1", max_num_batched_tokens=8',
            r"^step +\d+ +(.*?) +free blocks",
            read=lambda ms: max(sum(map(int, re.findall(r"\((\d+)\)", m[0]))) for m in ms),
            within=(1, 8),
        ),
        Claim(
            "so it is served in chunks over three steps before it samples",
            'SchedulerConfig(mode="v1", max_num_batched_tokens=8',
            r"r2:(?:chunk|prefill)\((\d+)\)",
            read=lambda ms: _steps_to_cover([m[0] for m in ms], 10),
            stated=3,
            why="the steps r2's first pieces take to cover its 10-token prompt",
        ),
        Claim(
            "request 2, the latest arrival, is preempted as before",
            'SchedulerConfig(mode="v1", max_num_batched_tokens=8',
            r"preempted \[(\d+)\]",
            stated=2,
        ),
        Claim(
            "at step 10 the scheduler preempts the latest admitted, request 6",
            _NB3_VIEWER,
            r"preempted \(step: request\): \{(\d+): (\d+),",
            stated=(10, 6),
        ),
        Claim(
            "Request 5 is the victim three times (steps 18, 34, 36)",
            _NB3_VIEWER,
            r"preempted \(step: request\): (\{.*\})",
            read=lambda ms: tuple(s for s, r in ast.literal_eval(ms[0][0]).items() if r == 5),
            stated=(18, 34, 36),
        ),
        Claim(
            "After step 9 seven requests hold every block",
            _NB3_VIEWER,
            r"after step 9: requests running (\d+) free slots (\d+)",
            stated=(7, 0),
        ),
        Claim("at step 35 it is let in again", _NB3_VIEWER, r"request 5 runs after step 35: (\w+)", stated=True),
        Claim(
            "320 of the 384 slots at step 0",
            _NB3_VIEWER,
            r"step 0: slots of each kind \{'tokens': (\d+), 'reserved': (\d+), 'internal': (\d+), "
            r"'external': (\d+), 'free': (\d+)\}",
            read=lambda ms: (ms[0][3], sum(ms[0])),
            stated=(320, 384),
        ),
        Claim(
            "where the budget of 64 tokens admits only two prompts",
            _NB3_VIEWER,
            r"prompts admitted in step 0: (\d+)",
            stated=2,
        ),
    ],
    "04_sharing": [
        Claim(
            "all three sequences get the **same** block table, and each block has 3 owners",
            "kv.fork(0, 1, final_len=18)",
            r"seq (\d): +10 tokens, block table \[([^\]]*)\], owners \[([^\]]*)\]",
            read=lambda ms: (len(ms), len({m[1] for m in ms}), tuple(sorted({o for m in ms for o in _ids(m[2])}))),
            stated=(3, 1, (3,)),
            why="(sequences, distinct block tables, the owner counts seen)",
        ),
        Claim(
            "Three samples share blocks `[0, 1, 2]`",
            "kv.fork(0, 1, final_len=18)",
            r"seq \d: +10 tokens, block table \[([^\]]*)\]",
            read=lambda ms: tuple(tuple(_ids(m[0])) for m in ms),
            stated=((0, 1, 2),) * 3,
        ),
        Claim(
            "Block 2 holds prompt tokens 8-9 and has two empty slots",
            "kv.fork(0, 1, final_len=18)",
            r"seq 0: +(\d+) tokens, block table \[\d+, \d+, (\d+)\]",
            read=lambda ms: (ms[0][1], 3 * 4 - ms[0][0]),
            stated=(2, 2),
            why="(seq 0's third block, its empty slots: 3 blocks of 4 - the tokens)",
        ),
        Claim(
            "Sequence 0 got block 3 (a copy of block 2), sequence 1 got block 4",
            "copies = kv.allocate_slots([s], [1]).copies",
            r"seq (\d) appends one token -> copy-on-write \[\((\d+), (\d+)\)\]",
            read=tuple,
            stated=((0, 2, 3), (1, 2, 4)),
            why="(sequence, source block, copy) for every copy printed",
        ),
        Claim(
            "and sequence 2 — by then the only owner of block 2 — writes in place",
            "copies = kv.allocate_slots([s], [1]).copies",
            r"seq 2: +11 tokens, block table \[\d+, \d+, (\d+)\], owners \[\d+, \d+, (\d+)\]",
            stated=(2, 1),
        ),
        Claim(
            "The prompt's full blocks 0 and 1 stay shared",
            "copies = kv.allocate_slots([s], [1]).copies",
            r"seq \d: +11 tokens, block table \[(\d+), (\d+), \d+\], owners \[(\d+), (\d+),",
            read=lambda ms: tuple(sorted(set(ms))),
            stated=((0, 1, 3, 3),),
            why="every sequence: blocks 0 and 1 first, 3 owners each",
        ),
        Claim(
            "the child shares every block of its parent (`fork` takes no new block)",
            "kv.fork(0, 3, final_len=16)",
            r"seq ([03]): +11 tokens, block table \[([^\]]*)\]",
            read=lambda ms: (len(ms), len({m[1] for m in ms})),
            stated=(2, 1),
            why="parent seq 0 and child seq 3 print one and the same block table",
        ),
        Claim(
            "The saving grows with the beam width",
            "for k in (2, 4, 6):",
            r"saves (\d+)%",
            read=lambda ms: min(b[0] - a[0] for a, b in zip(ms, ms[1:])),
            within=(1, INF),
            why="each wider beam saves at least one point more",
        ),
        Claim(
            "The second prompt's first three blocks are the first prompt's (12 tokens whose K/V need not be computed)",
            "system_prompt = list(range(100, 112))",
            r"^first prompt: +cached tokens \d+ block table \[(\d+), (\d+), (\d+),.*\n"
            r"^second prompt: cached tokens (\d+) block table \[(\d+), (\d+), (\d+),",
            read=lambda ms: (ms[0][3], ms[0][:3] == ms[0][4:7]),
            stated=(12, True),
        ),
        Claim(
            "so a third prompt still hits them after both requests have finished",
            "system_prompt = list(range(100, 112))",
            r"third prompt: +cached tokens (\d+)",
            stated=12,
            why="them: the three cached blocks of the system prompt, 12 tokens",
        ),
        Claim(
            "Freed cached blocks count as free, but keep their contents",
            "system_prompt = list(range(100, 112))",
            r"block 0 still cached: (\w+) \| free blocks: (\d+)",
            stated=(True, 16),
            why="the pool's 16 blocks (64 slots in blocks of 4) are all free",
        ),
        Claim(
            "With one sample the three serve this light load alike",
            _NB4_SAMPLES,
            _NB4_ROW,
            read=lambda ms: max(_nb4(1, ms)[1::2]) / min(_nb4(1, ms)[1::2]),
            within=(1, 1.2),
            why="alike: the three latencies at n = 1 within 20% of each other",
        ),
        Claim(
            "already fill its pool: requests queue and its latency climbs",
            _NB4_SAMPLES,
            _NB4_ROW,
            read=lambda ms: _nb4(2, ms)[5] / _nb4(1, ms)[5],
            within=(3, INF),
            why="climbs: the oracle's latency at n = 2 is at least 3x its one at n = 1",
        ),
        Claim(
            "while the paged pool stays close to its one-sample latency, with or without sharing",
            _NB4_SAMPLES,
            _NB4_ROW,
            read=lambda ms: (_nb4(2, ms)[1] / _nb4(1, ms)[1], _nb4(2, ms)[3] / _nb4(1, ms)[3]),
            within=(0, 2),
            why="close: under 2x its one-sample value (the oracle climbs past 3x)",
        ),
        Claim(
            "its latency climbs far above its one-sample value",
            _NB4_SAMPLES,
            _NB4_ROW,
            read=lambda ms: (_nb4(4, ms)[1] / _nb4(1, ms)[1], _nb4(4, ms)[3] / _nb4(1, ms)[3]),
            within=(5, INF),
            why="far above: at n = 4 at least 5x its one-sample latency, with and without sharing",
        ),
        Claim(
            "and it preempts requests many times, with or without sharing",
            _NB4_SAMPLES,
            _NB4_ROW,
            read=lambda ms: (_nb4(4, ms)[2], _nb4(4, ms)[4]),
            within=(10, INF),
            why="many times: at least 10 preemptions at n = 4, with and without sharing",
        ),
        Claim(
            "Sharing the prompt does lower the paged latency, but only a little",
            _NB4_SAMPLES,
            _NB4_ROW,
            read=lambda ms: _nb4(4, ms)[1] / _nb4(4, ms)[3],
            within=(0.8, 0.999),
            why="a little: at n = 4 sharing's latency is lower than without it, by under 20%",
        ),
        Claim(
            "So most of the oracle's gap is not the missing sharing but its contiguous runs",
            _NB4_SAMPLES,
            _NB4_ROW,
            read=lambda ms: (_nb4(4, ms)[5] - _nb4(4, ms)[3]) / (_nb4(4, ms)[5] - _nb4(4, ms)[1]),
            within=(0.5, 1),
            why="most: over half of the oracle's gap to shared paging at n = 4 remains against paging without sharing",
        ),
    ],
    "05_reproducing_the_paper": [
        Claim(
            "`paged` keeps going well beyond, flat up to 2 requests/s",
            _NB5_SWEEP,
            _NB5_ROWS,
            read=lambda ms: _sweep(ms)["paged"][0][3] / _sweep(ms)["paged"][0][0],
            within=(0, 1.5),
            why="flat: paged's normalized latency at 2 req/s under 1.5x its value at 0.5 req/s",
        ),
        Claim(
            "and bending up only past 2.5",
            _NB5_SWEEP,
            _NB5_ROWS,
            read=lambda ms: _bends(ms)["paged"],
            stated=3.0,
            why=f"bends up: rises over {BEND_S_PER_TOKEN} s/token (a tenth of the plot's axis) above "
            "its value at 0.5 req/s; the sweep's first rate past 2.5 is 3.0",
        ),
        Claim(
            "`max` reserves 2048 slots per request and saturates first",
            _NB5_SWEEP,
            _NB5_ROWS,
            read=lambda ms: [p for p, r in _bends(ms).items() if r == min(_bends(ms).values())],
            stated=["max"],
            why="the one policy whose curve bends up (as above) at the lowest rate",
        ),
        Claim(
            "`pow2` reserves less but bends up nearly with it",
            _NB5_SWEEP,
            _NB5_ROWS,
            read=lambda ms: _bends(ms)["pow2"] - _bends(ms)["max"],
            within=(0, 0.5),
            why="nearly with it: at most one step of the sweep (0.5 req/s) after max",
        ),
        Claim(
            "`oracle` lasts longer",
            _NB5_SWEEP,
            _NB5_ROWS,
            read=lambda ms: _bends(ms)["oracle"] - _bends(ms)["pow2"],
            within=(0.5, INF),
        ),
        Claim(
            "`paged` keeps going well beyond",
            _NB5_SWEEP,
            _NB5_ROWS,
            read=lambda ms: _bends(ms)["paged"] - _bends(ms)["oracle"],
            within=(1.0, INF),
            why="well beyond: paged bends up at least 1 req/s later than the oracle",
        ),
        Claim(
            "at the same rate, paging fits more requests in a batch",
            _NB5_SWEEP,
            _NB5_ROWS,
            read=lambda ms: tuple(
                _sweep(ms)["paged"][1][i] / max(b[i] for p, (_, b) in _sweep(ms).items() if p != "paged")
                for i in range(1, 6)
            ),
            within=(1.01, INF),
            why="at every rate from 1 req/s (at 0.5 all four batch alike): paged's mean batch "
            "above every other policy's",
        ),
        Claim(
            "batch dozens of requests",
            _NB5_ALPACA,
            _NB5_ALPACA_ROW,
            read=lambda ms: tuple(_rows(ms)[p][2] for p in _LENGTH_AWARE),
            within=(24, INF),
            why="dozens: a mean batch of at least 24 for pow2, oracle and paged",
        ),
        Claim(
            "and their normalized latency stays low",
            _NB5_ALPACA,
            _NB5_ALPACA_ROW,
            read=lambda ms: tuple(_rows(ms)[p][1] for p in _LENGTH_AWARE),
            within=(0, 0.1),
            why="low: under 0.1 s/token, as below saturation on ShareGPT",
        ),
        Claim(
            "so it batches only a handful",
            _NB5_ALPACA,
            _NB5_ALPACA_ROW,
            read=lambda ms: _rows(ms)["max"][2],
            within=(1, 10),
            why="a handful: a mean batch of 10 or fewer",
        ),
        Claim(
            "its normalized latency is far higher than the others'",
            _NB5_ALPACA,
            _NB5_ALPACA_ROW,
            read=lambda ms: _rows(ms)["max"][1] / max(_rows(ms)[p][1] for p in _LENGTH_AWARE),
            within=(10, INF),
            why="far higher: at least 10x the highest of the other three",
        ),
        Claim(
            "Your own trace: 200 requests at 3 req/s",
            "write_jsonl(mine, path)",
            r"^(?:oracle|paged) +(\d+) requests, throughput",
            stated=(200, 200),
            why="both policies serve all 200 requests of the trace",
        ),
        Claim(
            "the all-reduces take 3% of the decode step on 2 GPUs",
            _NB5_TP,
            _NB5_TP_SHARE,
            read=lambda ms: _tp_share(ms, 2, "decode"),
            stated=3,
        ),
        Claim("and 9% on 8", _NB5_TP, _NB5_TP_SHARE, read=lambda ms: _tp_share(ms, 8, "decode"), stated=9),
        Claim(
            "and 13% of OPT-175B's 2,048-token prompt",
            _NB5_TP,
            _NB5_TP_SHARE,
            read=lambda ms: _tp_share(ms, 8, "prompt"),
            stated=13,
        ),
        Claim(
            "Not the same share",
            _NB5_TP,
            _NB5_TP_SHARE,
            read=lambda ms: tuple(_tp_share(ms, n, "prompt") - _tp_share(ms, n, "decode") for n in (2, 4, 8)),
            within=(1, INF),
            why="not the same: on 2, 4 and 8 GPUs the prompt's share is above the decode step's",
        ),
        Claim(
            "so from 2 to 8 GPUs the decode step's share grows",
            _NB5_TP,
            _NB5_TP_SHARE,
            read=lambda ms: (
                _tp_share(ms, 4, "decode") - _tp_share(ms, 2, "decode"),
                _tp_share(ms, 8, "decode") - _tp_share(ms, 4, "decode"),
            ),
            within=(1, INF),
            why="grows: each larger setup's decode share above the smaller one's",
        ),
        Claim(
            "at 1.5 req/s OPT-66B's normalized latency is 0.077 s/token with the all-reduces against 0.058 without",
            _NB5_TP,
            _NB5_TP_RUN,
            read=lambda ms: next((m[1], m[2]) for m in ms if m[0] == 1.5),
            stated=(0.077, 0.058),
        ),
    ],
    "06_real_engine": [
        Claim(
            "SmolLM2-135M has 30 layers, 9 query heads and 3 KV heads of 64 dimensions",
            _NB6_ENGINE,
            r"model: (\d+) layers, (\d+) query heads, (\d+) KV heads\nK cache of layer 0: "
            r"\(\d+, \d+, (\d+), (\d+)\)",
            stated=(30, 9, 3, 3, 64),
            why="(layers, query heads, KV heads; the K cache's KV heads and head dim)",
        ),
        Claim("The pool has 48 blocks of 8 slots", _NB6_ENGINE, r"K cache of layer 0: \((\d+), (\d+),", stated=(48, 8)),
        Claim(
            'Request `b` asks for 2 samples of the 4-token prompt "Once upon a time": one block of 8 slots',
            _NB6_STEPS,
            r"request 2 seq \d+: +4 tokens, blocks \[(\d+)\]",
            read=len,
            stated=2,
            why="request b (id 2) prints two sequences of 4 tokens, each in a single block",
        ),
        Claim(
            "`b`'s copy-on-write took block 3",
            _NB6_STEPS,
            r"copy-on-write \[\((\d+), (\d+)\)\]",
            stated=(2, 3),
            why="(b's shared block 2, its copy)",
        ),
        Claim(
            "its two samples then opened 4 and 5, one each: tables [3, 4] and [2, 5] above",
            _NB6_STEPS,
            r"request 2 seq \d+: +\d+ tokens, blocks \[([^\]]*)\]",
            read=lambda ms: (tuple(_ids(ms[-2][0])), tuple(_ids(ms[-1][0]))),
            stated=((3, 4), (2, 5)),
            why="b's two tables as the cell last prints them",
        ),
        Claim(
            "Request `a` held blocks `[1, 0, 6]` when it finished",
            _NB6_STEPS,
            r"request 1 seq \d+: +\d+ tokens, blocks \[([^\]]*)\]",
            read=lambda ms: tuple(_ids(ms[-1][0])),
            stated=(1, 0, 6),
            why="a (id 1): its table as the cell last prints it",
        ),
        Claim(
            "`c` holds 5 blocks",
            _NB6_POOL,
            r"^request 3 seq \d+: blocks \[([^\]]*)\]",
            read=lambda ms: len(_ids(ms[0][0])),
            stated=5,
        ),
        Claim(
            "`c` takes the blocks that `a` left behind first",
            _NB6_POOL,
            r"^request 3 seq \d+: blocks \[([^\]]*)\]",
            read=lambda ms: tuple(_ids(ms[0][0])[:3]),
            stated=(6, 0, 1),
            why="a held [1, 0, 6] (the text), freed tail block first",
        ),
        Claim(
            "draw which sequence holds each of the 48 physical blocks",
            _NB6_POOL,
            r"free blocks after every request finished: (\d+) of (\d+)",
            stated=(48, 48),
        ),
        Claim(
            "The two agree to float32 rounding",
            "out_triton = paged_decode_attention(",
            r"max \|triton - torch\|: ([-+.\deE]+)",
            within=(0, 1e-5),
            why="float32 rounding: within 1e-5 on values of order 1",
        ),
        Claim("and no NaN leaks in", "out_triton = paged_decode_attention(", r"any NaN: (\w+)", stated=False),
    ],
    "07_after_the_paper": [
        Claim(
            "at 16 both stop at the last full block before the prompts part (tokens 32-36 share a block with "
            "tokens that differ)",
            _NB7_LOOKUP,
            r"^(?:radix|paged) at block size 16: finds (\d+)",
            stated=(32, 32),
        ),
        Claim(
            "At size 1 a hashed block is one token, so it matches per token too",
            _NB7_LOOKUP,
            r"^(?:radix|paged) at block size +1: finds (\d+) of the (\d+) shared",
            stated=(37, 37, 37, 37),
        ),
        Claim("A third prompt sharing 20 tokens", _NB7_TREE, r"third prompt finds (\d+) tokens", stated=20),
        Claim(
            "The 37-token edge was split after 20",
            _NB7_TREE,
            _NB7_TREE_TOP,
            read=lambda ms: (ms[0][0], ms[0][0] + ms[0][2]),
            stated=(20, 37),
            why="the root's edge and its child: 20 tokens, 37 together",
        ),
        Claim(
            "(the second and third prompts run)",
            _NB7_TREE,
            _NB7_TREE_TOP,
            read=lambda ms: ms[0][1],
            stated=2,
            why="locks of the shared 20-token edge: the two running sequences",
        ),
        Claim(
            "so the first prompt's tail `[1 2 3 4 5]` goes first",
            _NB7_TREE,
            r"\[1 2 3 4 5\] (\d+) tokens, pages \[[^\]]*\], locks (\d+)",
            stated=(5, 0),
            why="its edge of 5 tokens has no lock",
        ),
        Claim("(`[4 4 4]` is there)", _NB7_TREE, r"\[4 4 4\] (\d+) tokens", stated=3),
        Claim(
            "so about 2.6 turns per session are served (the last line)",
            _NB7_CHAT,
            r"^(\d+) requests in (\d+) sessions",
            read=lambda ms: ms[0][0] / ms[0][1],
            stated=2.6,
            tolerance=0.05,
        ),
        Claim(
            "In a pool that never evicts, the two caches find exactly the same",
            _NB7_CHAT,
            _NB7_CHAT_ROW,
            read=lambda ms: tuple(_nb7_chat(ms)[("paged", b)][3] - _nb7_chat(ms)[("radix", b)][3] for b in (1, 16, 64)),
            stated=(0, 0, 0),
        ),
        Claim(
            "Large blocks lose the partly filled last block of every turn",
            _NB7_CHAT,
            _NB7_CHAT_ROW,
            read=lambda ms: tuple(_nb7_chat(ms)[(c, 1)][3] - _nb7_chat(ms)[(c, 64)][3] for c in ("paged", "radix")),
            within=(0.1, INF),
            why="in the pool that never evicts, blocks of 64 find less than pages of 1",
        ),
        Claim(
            "the histories outgrow memory and hits fall to about 60%",
            _NB7_CHAT,
            _NB7_CHAT_ROW,
            read=lambda ms: tuple(m[2] for m in ms),
            within=(55, 65),
            why="about 60%: every hit rate in the A100's pool within 5 points of it",
        ),
        Claim(
            "and the tree keeps a little more",
            _NB7_CHAT,
            _NB7_CHAT_ROW,
            read=lambda ms: tuple(_nb7_chat(ms)[("radix", b)][0] - _nb7_chat(ms)[("paged", b)][0] for b in (1, 16, 64)),
            within=(0.1, 3),
            why="a little more: the tree's hit rate above the hashed cache's by up to 3 points, at every size",
        ),
        Claim(
            "so steps are slower and batches larger",
            _NB7_CHAT,
            _NB7_CHAT_ROW,
            read=lambda ms: tuple(_nb7_chat(ms)[(c, 1)][2] / _nb7_chat(ms)[(c, 16)][2] for c in ("paged", "radix")),
            within=(1.05, INF),
            why="larger: the mean batch at pages of 1 at least 5% above blocks of 16",
        ),
        Claim(
            "The GPU column does not move",
            _NB7_TIER,
            _NB7_TIER_ROW,
            read=lambda ms: max(m[1] for m in ms) - min(m[1] for m in ms),
            within=(0, 0.1),
            why="does not move: the GPU hit rates with no tier, 4 and 64 GiB within 0.1 point of each other",
        ),
        Claim(
            "With 64 GiB it hands back all that a pool that never evicts finds",
            _NB7_TIER,
            r"never evicts finds ([\d.]+)%|^ +64 GiB +([\d.]+)% +([\d.]+)%",
            read=lambda ms: abs(ms[1][1] + ms[1][2] - ms[0][0]),
            within=(0, 0.15),
            why="all: the 64 GiB row's GPU and tier hit rates add up to the never-evicting pool's within rounding",
        ),
        Claim(
            "and the time to first token falls, most at the tail",
            _NB7_TIER,
            _NB7_TIER_ROW,
            read=lambda ms: (1 - ms[-1][5] / ms[0][5], (1 - ms[-1][6] / ms[0][6]) - (1 - ms[-1][5] / ms[0][5])),
            within=(0.01, INF),
            why="falls: the mean TTFT with 64 GiB at least 1% below no tier; most at the tail: "
            "the p99's relative drop larger than the mean's by at least a point",
        ),
        Claim(
            "a page of 640 KiB holds 64 tokens",
            "P = page_tokens(opt, page_kib=640)",
            r"pages of (\d+) tokens; admit",
            stated=64,
        ),
        Claim(
            "(page 3 to seq 0, page 4 to seq 1)",
            "P = page_tokens(opt, page_kib=640)",
            r"^30 more tokens each.*\n +seq 0: .*pages mapped \[([^\]]*)\].*\n +seq 1: .*pages mapped \[([^\]]*)\]",
            read=lambda ms: (_ids(ms[0][0])[-1], _ids(ms[0][1])[-1]),
            stated=(3, 4),
            why="the page each sequence took last, when 30 more tokens came",
        ),
        Claim(
            "as the page grows a sequence holds more unfilled slots",
            _NB7_PAGES,
            _NB7_PAGE_ROW,
            read=lambda ms: max(b[1] - a[1] for a, b in zip(ms[:7], ms[1:7])),
            within=(-INF, 0),
            why="vAttention's share of token states never rises from one page size to the next",
        ),
        Claim(
            "Small pages behave like paging",
            _NB7_PAGES,
            _NB7_PAGE_ROW,
            read=lambda ms: (
                abs(_nb7_pages(ms)["vattention 1"][0] - _nb7_pages(ms)["paged"][0]),
                abs(_nb7_pages(ms)["vattention 1"][1] / _nb7_pages(ms)["paged"][1] - 1) * 100,
            ),
            within=(0, 10),
            why="like: at pages of 1 token, token states within 10 points and the mean batch within 10% of paged's",
        ),
        Claim(
            "pages of 2048 tokens like `max`",
            _NB7_PAGES,
            _NB7_PAGE_ROW,
            read=lambda ms: (
                abs(_nb7_pages(ms)["vattention 2048"][0] - _nb7_pages(ms)["max"][0]),
                abs(_nb7_pages(ms)["vattention 2048"][1] / _nb7_pages(ms)["max"][1] - 1) * 100,
            ),
            within=(0, 10),
            why="like: token states within 10 points and the mean batch within 10% of max's",
        ),
        Claim(
            "The bytes of 2048 all-layer token slots make 16 pages of 18 layers (paged) or 96 of 3 (hybrid)",
            _NB7_HYBRID,
            r"^600 tokens: pool in use \d+ of (\d+) pages .*: \d+ of (\d+) \(",
            stated=(96, 16),
        ),
        Claim(
            "At 1,400 tokens (11 blocks of 128)",
            _NB7_HYBRID,
            r"^1400 tokens: .*every layer full \(paged\): (\d+) of",
            stated=11,
        ),
        Claim(
            "(Gemma-3-270m: 6 groups of 3 layers, one full, five sliding)",
            _NB7_HYBRID,
            r"^600 tokens: .*\n((?: {4}.*\n?)+)",
            read=lambda ms: tuple(sorted(Counter(name for name, _ in _groups(ms[0][0])).items())),
            stated=(("full", 1), ("sliding 512", 5)),
            why="the group tables printed under 600 tokens (W = 512)",
        ),
        Claim(
            "so blocks 0 and 1 (positions 0-255) returned to the pool for any group",
            _NB7_HYBRID,
            r"^1000 tokens: .*\n((?: {4}.*\n?)+)",
            read=lambda ms: tuple(
                sorted(
                    {tuple(i for i, b in enumerate(t) if b is None) for name, t in _groups(ms[0][0]) if name != "full"}
                )
            ),
            stated=((0, 1),),
            why="at 1000 tokens every sliding group's table has None for its blocks 0 and 1",
        ),
        Claim(
            "(page 25, a sliding group's first block, became the full group's eighth)",
            _NB7_HYBRID,
            r"^600 tokens: .*\n((?: {4}.*\n)+)(?:.*\n)*?^1000 tokens: .*\n((?: {4}.*\n?)+)",
            read=lambda ms: (
                _groups(ms[0][1])[0][1][7],
                _groups(ms[0][1])[0][1][7] in [t[0] for n, t in _groups(ms[0][0]) if n != "full"],
            ),
            stated=(25, True),
            why="(the full group's eighth block at 1000 tokens, a sliding group's first at 600)",
        ),
        Claim(
            "at 4K and 8K the paged pool runs out, batches less, preempts",
            _NB7_GEMMA27,
            _NB7_GEMMA27_ROW,
            read=lambda ms: tuple(_nb7_gemma27(ms)[(p, "paged")][2] for p in (4096, 8192)),
            within=(1, INF),
            why="preempts: paged's preemptions at 4K and 8K",
        ),
        Claim(
            "at 4K and 8K the paged pool runs out, batches less, preempts",
            _NB7_GEMMA27,
            _NB7_GEMMA27_ROW,
            read=lambda ms: tuple(
                _nb7_gemma27(ms)[(p, "paged")][1] / _nb7_gemma27(ms)[(p, "hybrid")][1] for p in (4096, 8192)
            ),
            within=(0, 0.9),
            why="batches less: paged's mean batch under 90% of hybrid's at 4K and 8K",
        ),
        Claim(
            "and at 8K serves a third as much",
            _NB7_GEMMA27,
            _NB7_GEMMA27_ROW,
            read=lambda ms: _nb7_gemma27(ms)[(8192, "paged")][3] / _nb7_gemma27(ms)[(8192, "hybrid")][3],
            stated=1 / 3,
            tolerance=0.05,
            why="req/s, paged over hybrid at 8K",
        ),
        Claim(
            "(8 blocks x 6 = 48 layer-blocks)",
            _NB7_TINY,
            r"after the prompt and one decode: (\d+) layer-blocks",
            read=lambda ms: ms[0][0],
            stated=48,
            why="the first of the two runs is paged",
        ),
        Claim(
            "8 x 2 + 3 x 2 x 2 = 28 layer-blocks",
            _NB7_TINY,
            r"after the prompt and one decode: (\d+) layer-blocks",
            read=lambda ms: ms[1][0],
            stated=28,
            why="the second of the two runs is hybrid",
        ),
        Claim(
            "hybrid keeps the full group's 8 pages",
            _NB7_TINY,
            r"group \d \(window None\): \[([^\]]*)\]",
            read=lambda ms: len(_ids(ms[0][0])),
            stated=8,
        ),
        Claim(
            "the 3 pages from the block holding position 23 on",
            _NB7_TINY,
            r"group \d \(window \d+\): \[([^\]]*)\]",
            read=lambda ms: tuple((len(_ids(m[0])), _table(m[0]).index(_ids(m[0])[0])) for m in ms),
            stated=((3, 5), (3, 5)),
            why="each sliding group: (pages held, index of the first) - blocks of 4: position 23 is in block 5",
        ),
        Claim(
            "and the greedy tokens are the same",
            _NB7_TINY,
            r"greedy tokens: \[([^\]]*)\]",
            read=lambda ms: (len(ms), ms[0] == ms[1]),
            stated=(2, True),
        ),
        Claim(
            "(6 layers: 2 full, 4 sliding over 8 tokens, so 3 groups of 2 layers)",
            _NB7_TINY,
            r"^hybrid: .*layer -> group \(([^)]*)\)",
            read=lambda ms: tuple(Counter(_ids(ms[0][0])).values()),
            stated=(2, 2, 2),
        ),
        Claim("fp8 exactly doubles the slots", _NB7_KV_BYTES, r"^fp8 *: .*token slots \(([\d.]+)x\)", stated=2.0),
        Claim(
            "int8's scales take 4 of every 132 bytes",
            _NB7_KV_BYTES,
            r"^(?:auto|fp8|int8) *: (\d+) bytes per token",
            read=lambda ms: (ms[2][0] - ms[1][0], ms[2][0]),
            stated=(4, 132),
            why="int8's bytes per token and head, less fp8's (the scale), and int8's",
        ),
        Claim("so it holds 1.94x", _NB7_KV_BYTES, r"^int8 *: .*token slots \(([\d.]+)x\)", stated=1.94),
        Claim(
            "Both batch about as much",
            _NB7_KV_RUN,
            r"mean batch ([\d.]+),",
            read=lambda ms: ms[1][0] / ms[0][0],
            within=(0.9, 1.1),
            why="about as much: int8's mean batch within 10% of the 16-bit pool's",
        ),
        Claim(
            "the 16-bit pool gets there by running out of memory and preempting",
            _NB7_KV_RUN,
            r"(\d+) preemptions",
            read=lambda ms: ms[0][0],
            within=(1, INF),
            why="the 16-bit run (the first line) preempts",
        ),
        Claim(
            "its latency is several times int8's",
            _NB7_KV_RUN,
            r"normalized latency ([\d.]+) s/token",
            read=lambda ms: ms[0][0] / ms[1][0],
            within=(3, INF),
            why="several times: the 16-bit pool's normalized latency at least 3x int8's",
        ),
        Claim(
            "A block costs 3.76x fewer bytes",
            _NB7_KV_ENGINE,
            r"([\d,]+) bytes per block",
            read=lambda ms: ms[0][0] / ms[1][0],
            stated=3.76,
            tolerance=0.005,
            engine=True,
        ),
        Claim("and the text is the same", _NB7_KV_ENGINE, r"same tokens: (\w+)", stated=True, engine=True),
        Claim(
            "the largest moved by about 0.6 to 0.8 here",
            _NB7_KV_ENGINE,
            r"largest logit error ([\d.]+)",
            within=(0.55, 0.85),
            engine=True,
            why="float32 sums differ in their last bits across CPUs and thread "
            "counts, and a rounding to int8 can turn that into one step of a K/V element (reference/validation/kv_accuracy.py):"
            " 0.76 on a 2-core Intel Xeon, 0.62 on a 2-core AMD EPYC, 0.66 there with the AVX-only paths forced (LESSER_CPU); "
            "'about' allows 0.05 either side",
        ),
    ],
    "08_from_the_paper_to_v1": [
        Claim(
            "In v0, step 2 is a prefill step of 22 tokens and r0 and r1 sample nothing in it",
            _NB8_V0,
            r"^step 2 +tokens +(\d+) of +\d+ +(.*)$",
            read=lambda ms: (ms[0][0], "r0" in ms[0][1] or "r1" in ms[0][1]),
            stated=(22, False),
        ),
        Claim(
            "r2's prompt gets what is left of each budget, 6 tokens, for three steps; the fourth step finishes it "
            "with `prefill(2)` and it samples",
            _NB8_V1,
            r"r2:(chunk|prefill)\((\d+)\)",
            read=tuple,
            stated=(("chunk", 6), ("chunk", 6), ("chunk", 6), ("prefill", 2)),
        ),
        Claim(
            "r0 and r1 decode in every step",
            _NB8_V1,
            r"^(step \d+ +tokens .*)$",
            read=lambda ms: all("r0:decode" in m[0] and "r1:decode" in m[0] for m in ms[1:8]),
            stated=True,
            why="in v1 every step after r0's and r1's prefill (step 0), until r0's last token (8 in all)",
        ),
        Claim(
            "In v1 the running requests are served first (2 decode tokens)",
            _NB8_V1,
            r"^(step +\d+ +tokens .*r2:chunk.*)$",
            read=lambda ms: tuple(m[0].count(":decode") for m in ms),
            within=(2, 2),
            why="every step that computes a chunk of r2 also decodes r0 and r1",
        ),
        Claim(
            "r2's first token comes at step 5 rather than 2",
            _NB8_PER_REQUEST,
            r"^r2: .*first token at step (\d+) in v0, (\d+) in v1",
            read=lambda ms: (ms[0][1], ms[0][0]),
            stated=(5, 2),
        ),
        Claim(
            "so r3's first token also comes at step 5",
            _NB8_PER_REQUEST,
            r"^r3: .*first token at step \d+ in v0, (\d+) in v1",
            stated=5,
        ),
        Claim(
            "every prompt token and every sampled token but the last is fed exactly once, chunked or not",
            _NB8_PER_REQUEST,
            r"^r\d: tokens computed v0 +(\d+), v1 +(\d+) \(prompt \+ output - 1 = +(\d+)\)",
            read=lambda ms: (len(ms), max(max(abs(v0 - n), abs(v1 - n)) for v0, v1, n in ms)),
            stated=(4, 0),
            why="(requests, largest difference from prompt + output - 1 in either mode)",
        ),
        Claim(
            "Counted in steps, r0's largest gap in v0 is only 2",
            _NB8_PER_REQUEST,
            r"^r0: .*largest gap in steps: v0 (\d+)",
            stated=2,
        ),
        Claim(
            "r0 decodes at about 24 ms per token",
            _NB8_STALL,
            _stall("v0", "r0", 2),
            stated=24,
            tolerance=1,
            why="about: its mean ITL in v0 within 1 ms",
        ),
        Claim(
            "(274 ms for 1800 tokens)",
            _NB8_STALL,
            _stall("v0", "r0", 3),
            stated=274,
            why="r0's largest gap in v0: the 1800-token prefill step",
        ),
        Claim(
            "(72 ms, a step of 510 prompt tokens and 2 decodes)",
            _NB8_STALL,
            _stall("v1, budget 512", "r0", 3),
            stated=72,
        ),
        Claim(
            "The mean ITL barely moves (24.4 against 24.1 ms)",
            _NB8_STALL,
            _stall("v0", "r0", 2) + r"(?:.*\n)*?" + _stall("v1, budget 512", "r0", 2)[1:],
            stated=(24.4, 24.1),
            why="r0's mean ITL, v0 against v1",
        ),
        Claim(
            "(TTFT 274 against 267 ms)",
            _NB8_STALL,
            _stall("v0", "r2", 1) + r"(?:.*\n)*?" + _stall("v1, budget 512", "r2", 1)[1:],
            read=lambda ms: (ms[0][1], ms[0][0]),
            stated=(274, 267),
            why="the long prompt r2: v1 against v0",
        ),
        Claim(
            "The p99 of the largest gap grows with the budget",
            _NB8_BUDGETS,
            _NB8_BUDGET_ROW,
            read=lambda ms: min(b[3] - a[3] for a, b in zip(ms[1:], ms[2:])),
            within=(0, INF),
            why="v1's p99 largest gap never falls from one budget to the next",
        ),
        Claim(
            "about 70 ms per 512 tokens",
            _NB8_BUDGETS,
            _NB8_BUDGET_ROW,
            read=lambda ms: (_budget_table(ms)["v1, 2048"][2] - _budget_table(ms)["v1, 512"][2]) / 3,
            stated=70,
            tolerance=10,
            why="from 512 to 2048 tokens (three times 512), within 10 ms",
        ),
        Claim(
            "and levels off once the budget exceeds the longest prompts",
            _NB8_BUDGETS,
            _NB8_BUDGET_ROW,
            read=lambda ms: _budget_table(ms)["v1, 4096"][2] / _budget_table(ms)["v1, 2048"][2],
            within=(0.9, 1.1),
            why="levels off: the p99 gap at 4096 within 10% of the one at 2048",
        ),
        Claim(
            "still below v0's, whose prefill steps may hold several prompts at once",
            _NB8_BUDGETS,
            _NB8_BUDGET_ROW,
            read=lambda ms: max(v[2] for k, v in _budget_table(ms).items() if k != "v0") / _budget_table(ms)["v0"][2],
            within=(0, 0.99),
            why="every budget's p99 gap below v0's",
        ),
        Claim(
            "at 128 tokens the p99 doubles against 2048",
            _NB8_BUDGETS,
            _NB8_BUDGET_ROW,
            read=lambda ms: _budget_table(ms)["v1, 128"][1] / _budget_table(ms)["v1, 2048"][1],
            stated=2,
            tolerance=0.25,
            why="the p99 TTFT, 128 over 2048: 2 within 0.25",
        ),
        Claim(
            "budgets of 256-512 buy almost all of the smooth streaming",
            _NB8_BUDGETS,
            _NB8_BUDGET_ROW,
            read=lambda ms: tuple(
                (_budget_table(ms)["v1, 2048"][2] - _budget_table(ms)[f"v1, {b}"][2])
                / (_budget_table(ms)["v1, 2048"][2] - _budget_table(ms)["v1, 128"][2])
                for b in (256, 512)
            ),
            within=(0.8, 1.0),
            why="almost all: at least 80% of the drop in p99 gap from 2048 down to 128",
        ),
        Claim(
            "for a few percent of first-token time",
            _NB8_BUDGETS,
            _NB8_BUDGET_ROW,
            read=lambda ms: tuple(
                _budget_table(ms)[f"v1, {b}"][1] / _budget_table(ms)["v1, 2048"][1] - 1 for b in (256, 512)
            ),
            within=(0, 0.1),
            why="a few percent: the p99 TTFT at 256 and 512 under 10% above the one at 2048",
        ),
        Claim(
            "4 tokens beside the end of the short prompts, then 6 beside their two decodes",
            _NB8_CHUNKED,
            r"chunked: \[([^\]]*)\]",
            read=lambda ms: (_ids(ms[0][0])[0], *sorted(set(_ids(ms[0][0])[1:]))),
            stated=(4, 6),
            why="the first chunk, then every later one",
            engine=True,
        ),
        Claim(
            "Every token and every prompt log-probability agrees",
            _NB8_CHUNKED,
            r"same as whole: (\w+); prompt log-probabilities within 1e-5: (\w+)",
            read=lambda ms: (len(ms), all(a and b for a, b in ms)),
            stated=(3, True),
            engine=True,
        ),
        Claim(
            "At 2 req/s both schedulers finish about 1.84 requests per second",
            _NB8_SLO,
            _NB8_SLO_ROW,
            read=lambda ms: (_slo(ms)[(2.0, "v0")][0], _slo(ms)[(2.0, "v1-512")][0]),
            stated=(1.84, 1.84),
            tolerance=0.02,
        ),
        Claim(
            "At 1 and 1.5 req/s both schedulers meet these targets for (nearly) every request: goodput equals "
            "throughput",
            _NB8_SLO,
            _NB8_SLO_ROW,
            read=lambda ms: tuple(v[0] - v[2] for (rate, _), v in _slo(ms).items() if rate < 2),
            within=(0, 0.02),
            why="(nearly): throughput - goodput at most 0.02 req/s",
        ),
        Claim(
            "although 39% and 52% of v0's requests have a stall over 100 ms",
            _NB8_SLO,
            _NB8_SLO_ROW,
            read=lambda ms: (100 - _slo(ms)[(1.0, "v0")][3], 100 - _slo(ms)[(1.5, "v0")][3]),
            stated=(39, 52),
            tolerance=0.5,
            why="100% - the share whose largest gap is <= 100 ms, rounded",
        ),
        Claim(
            "v0's goodput falls to 1.14 req/s while v1's holds at 1.71",
            _NB8_SLO,
            _NB8_SLO_ROW,
            read=lambda ms: (_slo(ms)[(2.0, "v0")][2], _slo(ms)[(2.0, "v1-512")][2]),
            stated=(1.14, 1.71),
        ),
        Claim(
            "Past capacity (2.5 req/s) both collapse",
            _NB8_SLO,
            _NB8_SLO_ROW,
            read=lambda ms: tuple(v[2] / v[0] for (rate, _), v in _slo(ms).items() if rate == 2.5),
            within=(0, 0.25),
            why="collapse: goodput under a quarter of the throughput",
        ),
    ],
    "09_serving_policies": [
        Claim(
            "FCFS admits r2 (the earlier arrival)",
            _NB9_BY_HAND,
            _NB9_STEP,
            read=lambda ms: _event_step(ms, "fcfs", "admits r2"),
            stated=1,
            why="at step 1, when it arrives",
        ),
        Claim(
            "preempts the latest arrival, r2 itself",
            _NB9_BY_HAND,
            _NB9_STEP,
            read=lambda ms: _event_step(ms, "fcfs", "preempts r2"),
            stated=2,
            why="at step 2",
        ),
        Claim(
            "both come back when r0 and r1 finish at step 16",
            _NB9_BY_HAND,
            _NB9_STEP,
            read=lambda ms: (_event_step(ms, "fcfs", "r0 finishes"), _event_step(ms, "fcfs", "r1 finishes")),
            stated=(16, 16),
        ),
        Claim(
            "Priority admits r3 at step 1",
            _NB9_BY_HAND,
            _NB9_STEP,
            read=lambda ms: _event_step(ms, "priority", "admits r3"),
            stated=1,
        ),
        Claim(
            "At step 2 the victim is r1",
            _NB9_BY_HAND,
            _NB9_STEP,
            read=lambda ms: _event_step(ms, "priority", "preempts r1"),
            stated=2,
        ),
        Claim(
            "r1 goes back into the waiting queue in its place, in front of r2",
            _NB9_BY_HAND,
            _NB9_STEP,
            read=lambda ms: next(m[3] for m in ms if m[0] == "priority" and m[1] == 2),
            stated="[1, 2]",
        ),
        Claim(
            "r3 finishes at step 16 instead of 32",
            _NB9_BY_HAND,
            _NB9_STEP,
            read=lambda ms: (_event_step(ms, "priority", "r3 finishes"), _event_step(ms, "fcfs", "r3 finishes")),
            stated=(16, 32),
        ),
        Claim(
            "Under FCFS the two classes wait alike, about 22 s for the first token",
            _NB9_LOAD,
            _NB9_LOAD_ROW,
            read=lambda ms: (_classes(ms)["fcfs", 0][1], _classes(ms)["fcfs", 1][1]),
            stated=(22, 22),
            tolerance=1,
            why="both classes' mean TTFT under FCFS, within 1 s of 22",
        ),
        Claim(
            "Under priority class 0 waits 0.35 s on average (p99 2.4 s)",
            _NB9_LOAD,
            _NB9_LOAD_ROW,
            read=lambda ms: _classes(ms)["priority", 0][1:3],
            stated=(0.35, 2.4),
        ),
        Claim(
            "and class 1 pays for it: 26 s instead of 22",
            _NB9_LOAD,
            _NB9_LOAD_ROW,
            read=lambda ms: (_classes(ms)["priority", 1][1], _classes(ms)["fcfs", 1][1]),
            stated=(26, 22),
            tolerance=0.5,
            why="class 1's mean TTFT under priority and under FCFS, rounded to the second",
        ),
        Claim(
            "The throughput barely moves (2.29 against 2.28 req/s)",
            _NB9_LOAD,
            _NB9_LOAD_ROW,
            read=lambda ms: (_classes(ms)["fcfs", 0][4], _classes(ms)["priority", 0][4]),
            stated=(2.29, 2.28),
        ),
        Claim(
            "The first token does not wait for the link",
            _NB9_DISAGG_ONE,
            r"first token at ([\d.]+) ms",
            read=lambda ms: (len(ms), ms[0][0] == ms[1][0]),
            stated=(2, True),
            why="the same first-token time over the instantaneous link and over 25 GB/s",
        ),
        Claim(
            "over 25 GB/s it grows by the transfer of 500 tokens of 800 KiB each, 16.5 ms",
            _NB9_DISAGG_ONE,
            r"second ([\d.]+) ms later .*K/V moved in ([\d.]+) ms",
            read=lambda ms: (ms[1][1], round(ms[1][0] - ms[0][0], 1)),
            stated=(16.5, 16.5),
            tolerance=0.1,
            why="the transfer printed, and the second gap over 25 GB/s minus the instantaneous link's (0.1 ms: "
            "both printed to 0.1 ms)",
        ),
        Claim(
            "With DistServe's targets the three are alike, about 99% each",
            _NB9_DISAGG,
            _NB9_DISAGG_ROW,
            read=lambda ms: tuple(m[3] for m in ms),
            within=(98.5, 99.9),
            why="about 99%: each cluster's share meeting both with TTFT 0.25 s within half a point of 99",
        ),
        Claim(
            "so 2P2D meets both for 94.4% against the colocated 91.5%",
            _NB9_DISAGG,
            _NB9_DISAGG_ROW,
            read=lambda ms: ({m[0]: m[4] for m in ms}["2P2D"], {m[0]: m[4] for m in ms}["colocated x4"]),
            stated=(94.4, 91.5),
        ),
    ],
    "10_speculative_decoding": [
        Claim(
            "12 tokens in `[0, 1, 2]`, 9 blocks free",
            "num_lookahead_tokens=[5]",
            r"^during the verify: +\[0, 1, 2\] tokens (\d+) free blocks (\d+)$",
            stated=(12, 9),
        ),
        Claim(
            "all 12 slots count as token states",
            "num_lookahead_tokens=[5]",
            r"^token states during the verify: (\d+)$",
            stated=12,
        ),
        Claim(
            "The rollback left 8 tokens in `[0, 1]`",
            "kv.rollback(0, 6 + 1 + 1)",
            r"^after the rollback: \[0, 1\] tokens (\d+) free blocks",
            stated=8,
        ),
        Claim("(10 free again)", "kv.rollback(0, 6 + 1 + 1)", r"^after the rollback: .* free blocks (\d+)$", stated=10),
        Claim(
            "k = 4 gives 3.36 tokens per step and k = 8 only 4.33",
            "expected_tokens_per_step(0.8, k)",
            r"^alpha 0\.8, k = [48]: ([\d.]+) tokens per step expected",
            stated=(3.36, 4.33),
        ),
        Claim(
            "the draws agree with the formula",
            "expected_tokens_per_step(0.8, k)",
            r"([\d.]+) tokens per step expected, ([\d.]+) drawn",
            read=lambda ms: max(abs(a - b) for a, b in ms),
            within=(0, 0.05),
            why="'agree': every mean of 20,000 seeded draws within 0.05 tokens of the formula (its standard error "
            "is under 0.01)",
        ),
        Claim(
            "0.372 s/token without speculation against 0.010 with k = 4",
            "runs = {0: sim.run(",
            r"^k = \d: ([\d.]+) s/token",
            stated=(0.372, 0.010),
        ),
        Claim(
            "the mean batch down from 24.2 to 10.2", "runs = {0: sim.run(", r"mean batch ([\d.]+)", stated=(24.2, 10.2)
        ),
        Claim("no preemption left", "runs = {0: sim.run(", r"^k = 4: .* (\d+) preemptions", stated=0),
        Claim("0.26% of the pool on average", "runs = {0: sim.run(", r"drafts hold ([\d.]+)% of the pool", stated=0.26),
        Claim(
            "the same tokens in 21 steps instead of 40",
            "num_speculative_tokens=k)",
            r"^plain: (\d+) steps; n-gram k = 4: (\d+) steps.*identical tokens: (\w+)$",
            read=lambda ms: (ms[0][1], ms[0][0], ms[0][2]),
            stated=(21, 40, True),
            engine=True,
        ),
        Claim(
            "every draft is accepted",
            "num_speculative_tokens=k)",
            r"(\d+) of (\d+) drafts accepted",
            read=lambda ms: ms[0][0] == ms[0][1],
            stated=True,
            engine=True,
        ),
    ],
}
