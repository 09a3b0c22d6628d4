"""The answer keys in notebooks/INSTRUCTORS.md: one for every prompt, and every number they quote recomputed.

- Coverage: every walkthrough (notebooks/0*.ipynb) with a "**Try:**" prompt has a "**Try:** answers (cell-NN: ..."
  part in its own section of the guide, naming the prompt's cell. Every lab (notebooks/exercises/*.ipynb) with a
  "Going further" cell has an entry headed by its file name in the section "## Answer keys for the labs' "Going
  further" prompts", with at least one list item per question the cell asks. A new prompt without a key fails here.
- Numbers: the keys come from running what each prompt asks, so every number they quote is recomputed here the same
  way (the simulator, seeded; the KV managers; the labs' solutions from notebooks/solutions/). Each must appear in
  the guide's sentence or list item found by a distinctive phrase. This is the project's rule: numbers in docs come
  from commands, never typed by hand.

The engine's answers (walkthrough 06, `policy="oracle"` and swap) are qualitative and are not run here: loading the
model takes longer than this whole file. No mocks. About 15 s on 2 cores.
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from functools import lru_cache
from pathlib import Path

import nbformat
import numpy as np
import pytest

import sim.api
from sim.kv import NewSequence, make_kv_manager

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
GUIDE = NOTEBOOKS / "INSTRUCTORS.md"
LABS_HEADING = '## Answer keys for the labs\' "Going further" prompts'
TRY, FURTHER = "**Try:**", "Going further"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


@lru_cache(maxsize=None)
def guide() -> str:
    return GUIDE.read_text()


def section(heading: str) -> str:
    """The guide's text from the `## ` heading that starts with `heading` to the next `## ` heading."""
    text = guide()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def item(phrase: str) -> str:
    """The list item or paragraph of the guide that holds `phrase`, its lines joined by single spaces."""
    text = guide()
    found = list(re.finditer(r"\s+".join(map(re.escape, phrase.split())), text))  # a phrase may span lines
    assert len(found) == 1, f"the phrase {phrase!r} must occur once in INSTRUCTORS.md, not {len(found)} times"
    at = found[0].start()
    starts = [text.rfind(sep, 0, at) for sep in ("\n- ", "\n\n")]
    start = max(starts)
    ends = [e for e in (text.find(sep, at) for sep in ("\n- ", "\n\n")) if e >= 0]
    return " ".join(text[start : min(ends)].split())


def states(phrase: str, *values: str) -> None:
    found = item(phrase)
    missing = [v for v in values if v not in found]
    assert not missing, f"INSTRUCTORS.md should state {missing} where it says {phrase!r}: {found}"


def prompt_cells(path: Path) -> list:
    nb = nbformat.read(path, as_version=4)
    return [c for c in nb.cells if c.cell_type == "markdown" and (TRY in c.source or FURTHER in c.source)]


def solution(name: str):
    spec = importlib.util.spec_from_file_location(f"solution_{name}", NOTEBOOKS / "solutions" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- coverage ----------------------------------------------------------------------------------------------------
COURSE = re.compile(r"\d\d_\w+\.ipynb")  # the course's notebooks: 01_name.ipynb (not *.nbconvert.ipynb, not scratch)
WALKTHROUGHS = [p for p in sorted(NOTEBOOKS.glob("0*.ipynb")) if COURSE.fullmatch(p.name) and prompt_cells(p)]
LABS = [p for p in sorted((NOTEBOOKS / "exercises").glob("*.ipynb")) if COURSE.fullmatch(p.name) and prompt_cells(p)]


def test_the_prompts_are_where_the_keys_expect_them():
    assert len(WALKTHROUGHS) >= 7 and len(LABS) >= 12, ([p.name for p in WALKTHROUGHS], [p.name for p in LABS])
    text = guide()
    assert text.index("## Before the first lab: installing") < text.index("## `01_contiguous_fragmentation.ipynb`")
    assert text.index("## A 3-hour lab") < text.index(LABS_HEADING) < text.index("## The thirteen labs")


@pytest.mark.parametrize("path", WALKTHROUGHS, ids=lambda p: p.stem)
def test_every_walkthrough_prompt_has_an_answer_in_its_section(path):
    part = section(f"## `{path.name}`")
    for cell in prompt_cells(path):
        assert f"**Try:** answers ({cell.id}:" in part, f"{path.name}: no '**Try:** answers ({cell.id}: ...' part"


def _questions(source: str) -> int:
    """The questions a "Going further" cell asks: its numbered or bulleted items, else one."""
    after = source.split(FURTHER, 1)[1]
    return max(1, len(re.findall(r"^(?:\d+\.|-) ", after, flags=re.M)))


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.stem)
def test_every_lab_prompt_has_an_entry_with_an_item_per_question(path):
    keys = section(LABS_HEADING)
    head = f"**`{path.name}`**"
    assert head in keys, f"{path.name}: no entry {head} in {LABS_HEADING!r}"
    entry = keys.split(head, 1)[1].split("\n**`", 1)[0]
    asked = sum(_questions(cell.source) for cell in prompt_cells(path))
    answered = len(re.findall(r"^- ", entry, flags=re.M))
    assert answered >= asked, f"{path.name}: {asked} questions, {answered} answers"


# --- walkthrough 01 (and lab 02): the allocator, the workload, REQUESTS --------------------------------------------
def _busy(**kw) -> dict:
    s = sim.api.run(scheduler="v0", rate=1.0, duration=200, seed=0, **kw).summary
    return s["memory_busy"]


def _serve(policy, requests, **kw):
    """Walkthrough 1's cell-03: admit each request, then let it generate 4 tokens; the manager and the refused ids."""
    kv = make_kv_manager(policy, 128, max_seq_len=48, block_size=1, **kw)
    refused = []
    for seq_id, (prompt_len, final_len) in enumerate(requests):
        if kv.allocate_slots([seq_id], [prompt_len], [NewSequence(prompt_len, final_len)]) is None:
            refused.append(seq_id)
            continue
        kv.allocate_slots([seq_id], [4])
    return kv, refused


def test_walkthrough_01_requests_allocator_and_alpaca():
    six = [(5, 12), (9, 30), (3, 7), (12, 20), (4, 10), (6, 14)]
    assert _serve("max", six)[1] == [2, 3, 4, 5]
    assert _serve("pow2", six)[1] == [4, 5] and _serve("oracle", six)[1] == []
    states(
        "With two more small requests", "`(4, 10), (6, 14)`", "`pow2` refuses both new ones", "`oracle` admits all six"
    )
    first_fit = {p: _serve(p, six[:4], allocator="first_fit")[0].breakdown() for p in ("max", "pow2", "oracle")}
    assert all(b.external_fragmentation == 0 for b in first_fit.values())
    states("all three rules show", "`external_fragmentation=0`")

    buddy = {p: _busy(policy=p, workload="sharegpt") for p in ("max", "pow2", "oracle")}
    ff = {p: _busy(policy=p, workload="sharegpt", allocator="first_fit") for p in ("max", "pow2", "oracle")}
    states(
        "the share of token states rises",
        *(pct(buddy[p]["token_states"]) for p in ("oracle", "pow2", "max")),
        *(pct(ff[p]["token_states"]) for p in ("oracle", "pow2")),
    )
    assert pct(ff["max"]["token_states"]) == pct(buddy["max"]["token_states"])
    # lab 02: the buddy allocator's rounding, and what is left of it with first fit
    states(
        "share of the busy memory counted as external fragmentation",
        *(pct(buddy[p]["external_fragmentation"]) for p in ("oracle", "pow2")),
        pct(ff["pow2"]["external_fragmentation"]),
    )
    assert ff["oracle"]["external_fragmentation"] == 0

    alpaca = {p: _busy(policy=p, workload="alpaca") for p in ("max", "paged")}
    states("token states on Alpaca", pct(alpaca["max"]["token_states"]), pct(alpaca["max"]["internal_fragmentation"]))
    states("`paged` falls a little", pct(alpaca["paged"]["token_states"]))


# --- walkthroughs 02, 03, 05: sim.run with the settings each prompt names ------------------------------------------
def test_walkthrough_02_block_size():
    runs = {
        bs: sim.api.run(
            scheduler="v0", policy="paged", workload="sharegpt", rate=2.0, duration=200, seed=0, block_size=bs
        ).summary
        for bs in (1, 4, 8, 16, 256)
    }
    assert all(0.98 <= runs[bs]["memory_busy"]["token_states"] < 0.995 for bs in (1, 4, 8, 16))  # "near 98-99%"
    states("of the busy memory at `block_size=256`", pct(runs[256]["memory_busy"]["token_states"]))
    states(
        "so `block_size=1` runs at",
        f"{runs[1]['normalized_latency_s_per_token']:.3f} s/token",
        f"{runs[1]['num_preemptions']} preemptions",
        f"{runs[16]['normalized_latency_s_per_token']:.3f} s/token at 16",
    )


def test_walkthrough_03_kv_slots_rate_and_swap():
    common = dict(model="opt-13b", gpu="a100-40gb", workload="sharegpt", rate=2.0, duration=90, seed=0, scheduler="v0")
    slots = {n: sim.api.run(**common, kv_slots=n).summary for n in (3000, 12000, 24000)}
    states(
        "and vanish with",
        f"{slots[3000]['num_preemptions']} at 3000",
        f"to {slots[12000]['num_preemptions']} with",
        f"{slots[24000]['normalized_latency_s_per_token']:.3f} s/token",
        f"({slots[24000]['mean_batch_size']:.1f})",
    )
    assert slots[24000]["num_preemptions"] == 0 and slots[12000]["num_preemptions"] > 0
    assert f"{slots[12000]['mean_batch_size']:.1f}" == f"{slots[24000]['mean_batch_size']:.1f}"  # the plateau
    busy = sim.api.run(**{**common, "rate": 4.0}, kv_slots=3000)
    end = busy.steps["time"][-1] + busy.steps["duration"][-1]
    states("At `rate=4.0` up to", f"{int(busy.steps['num_waiting'].max())} requests wait", f"{end:.0f} s")
    swap = {p: sim.api.run(**common, kv_slots=3000, block_size=1, preemption=p).summary for p in ("swap", "recompute")}
    states("with 1-token blocks", *(f"{swap[p]['normalized_latency_s_per_token']:.3f}" for p in ("swap", "recompute")))


def test_walkthrough_05_bigger_model_and_bursty_arrivals():
    def lat(policy, **kw):
        s = sim.api.run(scheduler="v0", policy=policy, seed=0, workload="sharegpt", duration=150, **kw).summary
        return s["normalized_latency_s_per_token"], s["mean_batch_size"]

    big = {p: lat(p, model="opt-66b", num_gpus=4, rate=1.0) for p in ("max", "pow2", "oracle", "paged")}
    states(
        "OPT-66B on 4 GPUs gives",
        *(f"{big[p][0]:.3f}" for p in ("max", "oracle", "paged")),
        f"{big['pow2'][0]:.3f}",
        f"{big['paged'][1]:.1f} requests",
        f"max's {big['max'][1]:.1f}",
        f"{lat('paged', model='opt-66b', num_gpus=4, rate=2.0)[0]:.3f} s/token",
    )
    assert big["max"][0] > big["pow2"][0] > big["oracle"][0] > big["paged"][0]
    for policy in ("oracle", "max", "paged"):
        calm, bursty = lat(policy, rate=1.0)[0], lat(policy, rate=1.0, arrival="gamma", burstiness=0.25)[0]
        states("With bursty arrivals at 1 req/s", f"{calm:.3f}", f"{bursty:.3f}")


# --- walkthrough 07: history_limit -------------------------------------------------------------------------------
def test_walkthrough_07_history_limit():
    conv = dict(
        workload="conversation",
        rate=0.2,
        duration=300,
        enable_prefix_caching=True,
        seed=0,
        policy="paged",
        block_size=16,
    )
    found = {}
    for limit in (None, 1024):
        kw = dict(conv, history_limit=limit) if limit else conv
        s = sim.run(**kw).summary
        roomy = sim.run(kv_slots=200_000, **kw).summary
        found[limit] = (
            pct(s["prefix_cache_hit_rate_tokens"]),
            pct(roomy["prefix_cache_hit_rate_tokens"]),
            str(s["num_requests"]),
        )
    states("For hashed blocks of 16", *found[1024][:2], *found[None][:2], f"({found[1024][2]}, not {found[None][2]})")
    tree = sim.run(**{**conv, "policy": "radix", "history_limit": 1024}).summary
    assert pct(tree["prefix_cache_hit_rate_tokens"]) == found[1024][0]  # "The tree and the hashed blocks find the same"


# --- walkthrough 08: the SLO, chunking off, the budget -----------------------------------------------------------
def _slo_run(**kw):
    r = sim.api.run(workload="sharegpt", rate=2.0, duration=300, seed=0, slo_ttft=0.5, **kw)
    gaps = np.nan_to_num(r.requests["itl_max"], nan=0.0)
    return r.summary, f"{1e3 * np.percentile(gaps, 99):.0f} ms"


def test_walkthrough_08_slo_chunking_and_budget():
    tight = {
        name: _slo_run(slo_tbt=0.03, **kw)[0]
        for name, kw in (("v0", dict(scheduler="v0")), ("v1", dict(scheduler="v1", max_num_batched_tokens=512)))
    }
    states(
        "With the tighter TBT target",
        *(pct(tight[n]["slo_attainment"]) for n in ("v0", "v1")),
        *(f"{tight[n]['goodput_req_per_s']:.2f}" for n in ("v0", "v1")),
        f"{tight['v0']['throughput_req_per_s']:.2f}",
    )
    whole = _slo_run(scheduler="v1", enable_chunked_prefill=False, slo_tbt=0.035)[1]
    v0 = _slo_run(scheduler="v0", slo_tbt=0.035)[1]
    states(
        "without chunking, like v0's", whole, v0, _slo_run(scheduler="v1", max_num_batched_tokens=512, slo_tbt=0.035)[1]
    )
    budget = {b: _slo_run(scheduler="v1", max_num_batched_tokens=b, slo_tbt=0.035) for b in (128, 512, 2048, 4096)}
    states("Over the budget sweep", f"{budget[128][1]} at 128", f"{budget[2048][1]} at 2048")
    states(
        "not monotonically",
        f"{budget[128][0]['num_preemptions']} at a budget of 128",
        f"{budget[512][0]['num_preemptions']} at 512",
    )
    assert budget[2048][0]["num_preemptions"] == budget[4096][0]["num_preemptions"] == 0  # "none from 2048 up"


# --- the labs ----------------------------------------------------------------------------------------------------
def test_lab_04_two_prompts_sharing_a_prefix():
    kv = make_kv_manager("paged", 64, block_size=4, enable_prefix_caching=True)
    a = list(range(100, 110))
    b = a[:9] + [999, 998, 997]
    cached = {}
    for seq_id, ids in ((0, a), (1, b)):
        cached[seq_id] = kv.get_computed_tokens(ids, len(ids))
        new = NewSequence(len(ids), len(ids) + 5, ids, cached[seq_id])
        kv.allocate_slots([seq_id], [len(ids) - cached[seq_id]], [new])
    states(
        "`kv.get_computed_tokens` answers",
        f"answers {cached[1]}",
        f"is then {kv.allocator.num_prefix_hits}",
        f"`{kv.block_table(0)}`",
        f"`{kv.block_table(1)}`",
        f"computes {len(b) - cached[1]} tokens",
    )


def test_lab_05_four_beams_sharing_a_prompt():
    after = {}
    for policy, kw in (("paged", dict(block_size=16)), ("oracle", dict(block_size=1))):
        kv = make_kv_manager(policy, 2048, max_seq_len=2048, **kw)
        kv.allocate_slots([0], [100], [NewSequence(100, 150)])
        for child in (1, 2, 3):
            kv.fork(0, child, 150)
        fork = kv.breakdown()
        for _ in range(10):
            kv.allocate_slots([0, 1, 2, 3], [1, 1, 1, 1])
        after[policy] = (fork, kv.breakdown())
    (paged, paged10), (oracle, _) = after["paged"], after["oracle"]
    busy = ("token_states", "reservation", "internal_fragmentation", "external_fragmentation")
    used = {p: sum(getattr(after[p][0], kind) for kind in busy) for p in after}  # slots in use after the forks
    states(
        "Paged counts the shared prompt once",
        f"`token_states={paged.token_states}, reservation={paged.reservation}`",
        f"{used['paged'] // 16} blocks",
        f"`token_states={oracle.token_states}`",
        f"`reservation={oracle.reservation}`",
        f"`external_fragmentation={oracle.external_fragmentation}`",
        f"{used['oracle']} slots in use against {used['paged']}",
        f"`token_states={paged10.token_states}`",
    )


def test_lab_06_long_prefill_token_threshold():
    """The key's threshold plans come from the solution's schedule() with one changed line, driven by a loop that
    first reproduces the project's scheduler on the notebook's example (so the loop is not a model of its own)."""
    from sim.base.request import Request
    from sim.exercises.labs.token_budget import RequestState, oracle_plan, snapshot
    from sim.scheduling.plan import StepOutcome
    from sim.scheduling.scheduler import Scheduler, SchedulerConfig

    base = solution("token_budget").MyTokenBudget

    class Capped(base):
        threshold = None

        def schedule(self, requests, num_free_blocks):
            budget, free, plan = self.max_num_batched_tokens, num_free_blocks, {}

            def cut(r):  # the changed line: a prompt's chunk is also capped by the threshold
                missing = r.num_tokens - r.num_computed_tokens
                prompt = self.threshold and r.num_computed_tokens < r.prompt_len
                return min(missing, budget, self.threshold) if prompt else min(missing, budget)

            running = [r for r in requests if r.status == "running"]
            for r in running:
                tokens = cut(r)
                if tokens == 0:
                    break
                free -= self.num_new_blocks(r.num_computed_tokens, tokens)
                plan[r.request_id], budget = tokens, budget - tokens
            num_seqs = len(running)
            for r in (r for r in requests if r.status == "waiting"):
                tokens = cut(r)
                blocks = self.num_new_blocks(r.num_computed_tokens, tokens)
                if tokens == 0 or num_seqs == self.max_num_seqs or blocks > free:
                    break
                plan[r.request_id] = tokens
                budget, free, num_seqs = budget - tokens, free - blocks, num_seqs + 1
            return plan

    example = [(3, 4), (14, 2), (6, 2)]

    def plans(threshold, steps=4):
        policy = Capped(4, 8, 4)
        policy.threshold = threshold
        reqs = [
            dict(id=i, prompt=p, out=o, tokens=p, computed=0, made=0, status="waiting")
            for i, (p, o) in enumerate(example)
        ]
        out = []
        for _ in range(steps):
            live = [r for r in reqs if r["status"] != "done"]
            held = sum(math.ceil(r["computed"] / 4) for r in live)
            plan = policy.schedule(
                [RequestState(r["id"], r["status"], r["tokens"], r["computed"], r["prompt"]) for r in live], 8 - held
            )
            out.append(plan)
            for r in live:
                if r["id"] in plan:
                    r["status"], r["computed"] = "running", r["computed"] + plan[r["id"]]
                    if r["computed"] == r["tokens"]:  # all its tokens computed: it samples one more
                        r["made"], r["tokens"] = r["made"] + 1, r["tokens"] + 1
                        r["status"] = "done" if r["made"] == r["out"] else "running"
        return out

    kv = make_kv_manager("paged", 8 * 4, block_size=4)
    sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=4))
    for rid, (prompt_len, output_len) in enumerate(example):
        sched.add_request(Request(rid, 0.0, prompt_len=prompt_len, output_len=output_len))
    real = []
    for _ in range(4):
        requests = snapshot(sched)
        plan = sched.schedule()
        real.append(oracle_plan(plan, requests))
        sched.finish_step(plan, StepOutcome())
    assert plans(None) == real  # the loop replays the notebook's printed example
    capped = plans(4)
    states("a threshold of 4 gives the plans", *(f"`{p}`" for p in capped))


def test_lab_08_caps():
    nb = nbformat.read(NOTEBOOKS / "exercises" / "08_victim_policy.ipynb", as_version=4)
    code = next(c.source for c in nb.cells if c.id == "cell-02")
    space: dict = {}
    exec(code.split("\nfor name, victim in")[0], space)  # REQUESTS and serve(), without the printing loop
    policy = solution("victim_policy").MyVictimPolicy
    lost = {k: space["serve"](policy(k).victim) for k in (1, 2, 3)}
    builtin = {name: space["serve"](space[name])[1] for name in ("latest_arrival", "fewest_computed")}
    states(
        "(`serve(MyVictimPolicy(k).victim)`",
        f"`cap 1` throws away {lost[1][1]}",
        f"`cap 2` {lost[2][1]}",
        f"`cap 3` {lost[3][1]}",
        f"{builtin['latest_arrival']} for `latest_arrival`",
        f"{builtin['fewest_computed']} for `fewest_computed`",
        f"r4 is preempted {lost[1][0][4]} times",
    )


def test_lab_09_bytes_per_decode_step():
    import dataclasses

    from sim.base.specs import MODELS

    smol = MODELS["smollm2-135m"]
    assert (smol.num_layers, smol.num_kv_heads, smol.head_dim, smol.dtype_bytes) == (30, 3, 64, 2)
    mha = dataclasses.replace(smol, num_kv_heads=smol.num_heads)
    states(
        "one decode step reads",
        f"{smol.kv_bytes_per_token:,} bytes per token",
        f"{1000 * smol.kv_bytes_per_token:,} bytes",
        f"about {1000 * smol.kv_bytes_per_token / 2**20:.0f} MiB",
        f"would read {1000 * mha.kv_bytes_per_token:,} bytes",
    )


def test_lab_10_flash_decoding_merge():
    def partial(scores, values):
        m = max(scores)
        weights = np.exp(np.array(scores, float) - m)
        return float(weights @ np.array(values, float) / weights.sum()), m + math.log(weights.sum())

    o1, lse1 = partial([1, 2], [10, 20])
    o2, lse2 = partial([5, 0, 3], [30, 40, 50])
    lse = math.log(math.exp(lse1) + math.exp(lse2))
    out = math.exp(lse1 - lse) * o1 + math.exp(lse2 - lse) * o2
    whole = partial([1, 2, 5, 0, 3], [10, 20, 30, 40, 50])[0]
    assert abs(out - whole) < 1e-9
    states(
        "split after token 2.",
        f"`o_1 = {o1:.4f}`",
        f"`lse_1 = {lse1:.4f}`",
        f"`o_2 = {o2:.4f}`",
        f"`lse_2 = {lse2:.4f}`",
        f"`lse = {lse:.4f}`",
        f"= {out:.4f}`",
    )


def test_lab_11_block_size_and_hits():
    from sim.exercises.labs.prefix_economics import ProjectPrefixCache, conversation_trace, replay

    trace = conversation_trace(100, seed=0)  # the notebook's trace
    hits = {bs: replay(ProjectPrefixCache(32768 // bs, bs), trace) for bs in (1, 64)}
    states("*Block size.* A turn's prompt", "32,768 slots", f"{pct(hits[1])} at block size 1", f"{pct(hits[64])} at 64")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
