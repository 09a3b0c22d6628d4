"""Scheduler invariants under random workloads and configurations, checked after every step.

Hypothesis draws a small memory-starved system (mode v1/v0/static, paged, radix or contiguous, a token budget,
chunked prefill on or off, recompute or swap, a victim policy) and a workload (prompts, outputs, parallel
samples, beam search, shared prompt prefixes, staggered arrivals), then drives the scheduler with the
simulator's outcome rule (a sequence finishes at its output_len) and random beam choices. After every step:

- the step respects the token budget (v1: every step; v0/static: prefill steps), except a group that runs alone
  over the budget because it cannot be chunked; and never runs more than max_num_seqs sequences;
- every entry's block table covers exactly the tokens computed after the step, `sample` is set exactly when an
  entry reaches the end of its sequence, decodes feed one token (with speculative decoding: one plus at most k draft
  tokens, never past the sequence's output);
- every live sequence has 0 <= num_computed_tokens <= num_tokens, and the KV manager holds exactly the computed
  tokens of every sequence that holds memory;
- every unfinished request is in exactly one queue (waiting, running, swapped); finished ones in none;
- a model of the K/V memory (`Contents`: which token each slot holds) executed as an executor does (swaps, all
  copies at once with every source read first, then the writes of the fed tokens) leaves every fed sequence's
  block table holding exactly its own tokens: a prefix-cache hit, a fork, a beam re-chosen from a beam, a swap
  or a recompute never makes attention read another sequence's K/V or a stale one; with speculative decoding (k
  drawn, each verify entry's accepted drafts drawn), a rejected draft's K/V is written where the verify step wrote it
  and never read by any later step;
- the KV manager's own invariants hold and the memory breakdown covers the pool exactly;
- nobody overtakes: a request admitted from the waiting queue comes before (in the queues' order: arrival, or
  (priority, arrival) with scheduling_policy="priority") every request still waiting (under FCFS, with the
  latest_arrival victim policy: another puts victims back in front in its own order); with the latest_arrival victim
  policy a preempted request comes after every request that runs on;
and when every request has finished, no block is left allocated (GPU or CPU).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from sim.base.request import Request
from sim.clock.cost import RooflineCostModel
from sim.clock.loop import Simulator
from sim.kv import always_caches_prefixes, has_prefix_cache, has_swap_space, make_kv_manager
from sim.scheduling.plan import StepOutcome
from sim.scheduling.scheduler import Scheduler, SchedulerConfig

BLOCK_SIZE = 4


def draw_mode(draw) -> str:
    return draw(st.sampled_from(["v1", "v0", "v1", "static"]))


def draw_config(draw, mode: str, preemption: str = "recompute", speculation: bool = False) -> SchedulerConfig:
    """The rest of a scheduler's configuration, drawn after its mode (the policy test files reuse it); `speculation`:
    also draw num_speculative_tokens (the executor must then report num_accepted)."""
    chunked = None if mode != "v1" else draw(st.sampled_from([None, False]))
    budget = draw(st.integers(4, 48)) if chunked is not False else draw(st.integers(40, 80))
    return SchedulerConfig(
        max_num_seqs=draw(st.integers(3, 8)),
        max_num_batched_tokens=budget,
        mode=mode,
        preemption=preemption,
        enable_chunked_prefill=chunked,
        victim=draw(st.sampled_from(["latest_arrival", "fewest_computed"])),
        scheduling_policy=draw(st.sampled_from(["fcfs", "fcfs", "priority"])),
        num_speculative_tokens=draw(st.sampled_from([0, 0, 1, 3])) if speculation else 0,
    )


@st.composite
def systems(draw):
    mode = draw_mode(draw)
    policy = draw(st.sampled_from(["paged", "oracle", "paged", "pow2", "paged", "paged", "radix"]))
    swap = has_swap_space(policy) and draw(st.booleans())
    config = draw_config(draw, mode, "swap" if swap else "recompute", speculation=True)
    optional_cache = has_prefix_cache(policy) and not always_caches_prefixes(policy)  # radix's is always on
    kv = make_kv_manager(
        policy,
        draw(st.integers(12, 28)) * BLOCK_SIZE,
        block_size=BLOCK_SIZE,
        max_seq_len=64,
        enable_prefix_caching=optional_cache and draw(st.booleans()),
        num_cpu_blocks=32 if swap else 0,
        watermark=draw(st.sampled_from([0.0, 0.05])),
    )
    return Scheduler(kv, config)


@st.composite
def workloads(draw):
    requests = []
    for i in range(draw(st.integers(3, 10))):
        prompt_len = draw(st.integers(1, 40))
        output_len = draw(st.integers(1, 24))
        kind = draw(st.sampled_from(["single", "single", "n", "beam"]))
        doc = draw(st.integers(0, 1))  # prompts open with one of two documents: prefix-cache hits
        shared = draw(st.integers(0, prompt_len))
        ids = [1000 * doc + t for t in range(shared)] + [10_000 * (i + 1) + t for t in range(shared, prompt_len)]
        requests.append(
            Request(
                i,
                float(i),
                prompt_len,
                output_len,
                n=2 if kind == "n" else 1,
                beam_width=3 if kind == "beam" else 1,
                prompt_token_ids=ids,
                priority=draw(st.sampled_from([0, 0, 1, 2])),
            )
        )
    return requests


def check_step(sched: Scheduler, plan, add_order: list[int]) -> None:
    cfg, kv = sched.config, sched.kv
    fed = [e for e in plan.entries if e.num_new_tokens]
    groups = {e.request_id for e in fed}
    budget_applies = cfg.mode == "v1" or plan.prefills
    alone_over_budget = not cfg.chunked and len(groups) == 1
    if budget_applies and not alone_over_budget:
        assert plan.num_batched_tokens <= cfg.max_num_batched_tokens, f"budget: {plan.num_batched_tokens} tokens"
    assert plan.num_seqs <= cfg.max_num_seqs
    if cfg.mode != "v1":
        assert not (plan.prefills and plan.decodes), "v0/static steps are prefill-only or decode-only"
    for e in plan.entries:
        if e.num_new_tokens == 0:  # a sibling sampling from its leader's logits: no table until forked
            assert e.block_table == [] and e.sample
            continue
        end = e.num_computed_tokens + e.num_new_tokens
        assert len(e.block_table) == -(-end // kv.block_size) and kv.num_tokens(e.seq_id) == end
        seq_tokens = sched.request(e.request_id).prompt_len + sched.num_generated(e.seq_id)
        verified = end - e.num_draft_tokens  # (drafts sit in lookahead slots past the sequence's tokens)
        assert e.sample == (verified == seq_tokens) and verified <= seq_tokens
    for e in plan.decodes:
        assert e.num_new_tokens == 1 + e.num_draft_tokens and e.num_draft_tokens <= cfg.num_speculative_tokens
        assert sched.num_generated(e.seq_id) + 1 + e.num_draft_tokens <= sched.request(e.request_id).output_len
    assert plan.num_draft_tokens == sum(e.num_draft_tokens for e in plan.entries)
    assert not any(e.num_draft_tokens for e in plan.prefills), "drafts only for decodes"


def check_order(sched: Scheduler, plan, added: list[int], waiting_before: set, running_before: set) -> None:
    """No overtaking at admission; the latest_arrival policy preempts from the end of the queues' order."""
    by_priority = sched.config.scheduling_policy == "priority"

    def key(rid: int) -> tuple[int, int]:
        return (sched.request(rid).priority if by_priority else 0, added.index(rid))

    latest = sched.config.victim == "latest_arrival"
    if by_priority or latest:  # (FCFS puts victims back in front in the order they were preempted, as vLLM does:
        # by another policy's order a later arrival may then head the queue)
        still_waiting = waiting_before & set(sched.waiting_request_ids())
        gone = waiting_before - set(sched.waiting_request_ids())
        for rid in gone - {r for r in waiting_before if sched.is_finished(r)}:
            assert all(key(rid) < key(w) for w in still_waiting), f"request {rid} overtook {sorted(still_waiting)}"
    if latest:
        running_on = running_before & set(sched.running_request_ids())
        for rid in plan.preempted:
            assert all(key(r) < key(rid) for r in running_on), f"preempted {rid} before a later request"


class Contents:
    """What every slot of the KV memory holds, as token labels: a prompt token is ("t", its id) so equal prompt
    prefixes are the same K/V (prefix caching); a generated token is ("g", seq_id, index), unique. `history`
    holds each sequence's tokens; the memory is written by executing plans the way reference/engine/kv_cache.py does."""

    def __init__(self, block_size: int):
        self.bs, self.gpu, self.cpu, self.history = block_size, {}, {}, {}

    def add(self, sched: Scheduler, request: Request) -> None:
        ids = request.prompt_token_ids
        for seq_id in sched.seq_ids(request.request_id):
            self.history[seq_id] = [("t", t) for t in ids]

    def execute(self, plan, accepted: dict[int, int] | None = None, sched: Scheduler | None = None) -> None:
        """`accepted`: a verify entry's accepted drafts (seq id -> count; `sched` gives its generated count): its
        drafts are written as the tokens they will turn out to be, ("g", seq, index), or, rejected, as ("x", seq, p),
        a label no sequence's history ever holds; attention in the verify step is checked up to its last sampled
        token (its drafts read each other, as verification does)."""
        empty = [None] * self.bs
        for gpu, cpu in plan.blocks_to_swap_out:
            self.cpu[cpu] = list(self.gpu.get(gpu, empty))
        for cpu, gpu in plan.blocks_to_swap_in:
            self.gpu[gpu] = list(self.cpu[cpu])
        sources = {src: list(self.gpu.get(src, empty)) for src, _ in plan.blocks_to_copy}  # read all, then write
        for src, dst in plan.blocks_to_copy:
            self.gpu[dst] = list(sources[src])
        fed = [e for e in plan.entries if e.num_new_tokens]
        for e in fed:
            for p in range(e.num_computed_tokens, e.num_computed_tokens + e.num_new_tokens):
                self.gpu.setdefault(e.block_table[p // self.bs], list(empty))[p % self.bs] = self.label(
                    e, p, accepted, sched
                )
        for e in fed:  # what attention reads: every position up to the newest token
            end = e.num_computed_tokens + e.num_new_tokens - e.num_draft_tokens
            read = [self.gpu.get(e.block_table[p // self.bs], empty)[p % self.bs] for p in range(end)]
            assert read == self.history[e.seq_id][:end], f"seq {e.seq_id} reads K/V that is not its own"

    def label(self, e, p: int, accepted: dict[int, int] | None, sched: Scheduler | None):
        """What entry `e` writes at position p: its token, or for a draft the token it will be if accepted, else a
        label no history holds."""
        verified = e.num_computed_tokens + e.num_new_tokens - e.num_draft_tokens
        if p < verified:
            return self.history[e.seq_id][p]
        if p - verified < accepted[e.seq_id]:  # an accepted draft: the token it will be
            return ("g", e.seq_id, sched.num_generated(e.seq_id) + p - verified)
        return ("x", e.seq_id, p)  # a rejected draft's K/V

    def sampled(self, sched: Scheduler, plan, accepted: dict[int, int] | None = None) -> None:
        for e in plan.entries:
            if e.sample:  # its token, and before it the drafts it accepted (a verify entry)
                g = sched.num_generated(e.seq_id)
                kept = accepted.get(e.seq_id, 0) if accepted else 0
                self.history[e.seq_id] += [("g", e.seq_id, g + j) for j in range(kept + 1)]

    def beams(self, parents: dict[int, list[int]], new_ids: dict[int, list[int]]) -> None:
        for rid, ids in new_ids.items():
            for parent, child in zip(parents[rid], ids):
                if child != parent:  # a fork: the parent's computed tokens, then a token of its own
                    self.history[child] = self.history[parent][:-1] + [("g", child, len(self.history[parent]))]


def check_state(sched: Scheduler, added: list[int]) -> None:
    kv = sched.kv
    kv.check_invariants()
    b = kv.breakdown()
    assert b.total == kv.num_slots and min(b.counts()) >= 0
    queues = [sched.waiting_request_ids(), sched.running_request_ids(), sched.swapped_request_ids()]
    placed = [r for q in queues for r in q]
    assert len(placed) == len(set(placed)), f"a request in two queues: {queues}"
    unfinished = [r for r in added if not sched.is_finished(r)]
    assert sorted(placed) == sorted(unfinished), f"queues {queues} vs unfinished {unfinished}"
    for rid in unfinished:
        request, status = sched.request(rid), sched.group_status(rid)
        for seq_id in sched.seq_ids(rid):
            tokens = request.prompt_len + sched.num_generated(seq_id)
            computed = sched.num_computed_tokens(seq_id)
            assert 0 <= computed <= tokens
            if status.value == "running" and seq_id in kv.seq_ids:
                assert kv.num_tokens(seq_id) == computed, f"seq {seq_id}: KV holds what was computed"


@settings(max_examples=300, deadline=None)
@given(
    sched=systems(),
    requests=workloads(),
    gaps=st.lists(st.integers(0, 3), min_size=10, max_size=10),
    seed=st.integers(0, 2**32 - 1),
)
def test_scheduler_invariants_hold_after_every_step(sched, requests, gaps, seed):
    """`gaps[i]`: steps between the arrivals of requests i and i + 1 (0: together)."""
    rng = np.random.default_rng(seed)  # beam choices
    pending, added, steps, due = list(requests), [], 0, 0
    memory = Contents(sched.kv.block_size)
    while pending or sched.has_unfinished():
        while pending and steps >= due:
            request = pending.pop(0)
            due = steps + gaps[request.request_id]
            try:
                sched.add_request(request)
            except ValueError:  # never servable here (over the budget unchunked, or the pool): refused whole
                continue
            added.append(request.request_id)
            memory.add(sched, request)
        if not sched.has_unfinished():
            if pending:
                steps = due  # nothing to run until the next arrival
                continue
            break
        waiting_before, running_before = set(sched.waiting_request_ids()), set(sched.running_request_ids())
        plan = sched.schedule()
        check_order(sched, plan, added, waiting_before, running_before)
        check_step(sched, plan, added)
        accepted = {e.seq_id: int(rng.integers(0, e.num_draft_tokens + 1)) for e in plan.decodes if e.num_draft_tokens}
        memory.execute(plan, accepted, sched)
        finished = {
            e.seq_id
            for e in plan.entries
            if e.sample
            and sched.num_generated(e.seq_id) + 1 + accepted.get(e.seq_id, 0) >= sched.request(e.request_id).output_len
        }
        beams = {}
        for rid in plan.request_ids():
            sampled = [e.seq_id for e in plan.entries if e.request_id == rid and e.sample]
            if sched.request(rid).beam_width > 1 and sampled and not set(sampled) & finished:
                beams[rid] = [int(i) for i in rng.choice(sampled, size=len(sampled))]
        memory.sampled(sched, plan, accepted)
        result = sched.finish_step(plan, StepOutcome(finished, beams, accepted))
        memory.beams(beams, result.new_beam_seq_ids)
        check_state(sched, added)
        steps += 1
        assert steps < 5_000, "no progress"
    kv = sched.kv
    event(f"mode {sched.config.mode}, preempted: {sched.num_preemptions > 0}, steps > 20: {steps > 20}")
    event(f"speculative tokens {sched.config.num_speculative_tokens}")
    assert kv.num_free_blocks == kv.num_blocks, "every request finished: no GPU block may stay allocated"
    cpu = getattr(kv, "cpu_allocator", None)
    assert cpu is None or cpu.num_free_blocks == cpu.num_blocks, "no CPU block may stay allocated"


def test_a_ten_thousand_token_prompt_is_served_in_chunks_of_the_budget():
    """vLLM v1 with a budget of 512: a 10,000-token prompt arriving while four requests decode is computed in
    chunks over many steps that keep decoding the others; without chunking it is refused in one line."""
    kv = make_kv_manager("paged", 12_000, block_size=16)
    sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=512))
    requests = [Request(i, 0.0, 50, 400) for i in range(4)] + [Request(4, 1.0, 10_000, 8)]
    result = Simulator(sched, RooflineCostModel("opt-13b", "a100-40gb"), requests, block_bytes=1).run()
    steps = result.steps
    assert (steps["num_batched_tokens"] <= 512).all()
    long_steps = steps["num_prefill_tokens"] > 200
    assert long_steps.sum() >= -(-10_000 // 512)
    assert (steps["num_decode_seqs"][long_steps] == 4).all(), "the decodes go on while the prompt is computed"
    assert int(steps["num_prefill_tokens"].sum()) == 4 * 50 + 10_000
    assert not np.isnan(result.requests["finish_time"]).any()
    unchunked = Scheduler(make_kv_manager("paged", 12_000, block_size=16), SchedulerConfig(mode="v0"))
    with pytest.raises(ValueError, match=r"prompt_len 10000 is over max_num_batched_tokens \(allowed: <= 2560"):
        unchunked.add_request(Request(0, 0.0, 10_000, 8))
