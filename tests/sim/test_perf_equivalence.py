"""The simulator's speed-ups change no result: runs equal a golden copy recorded before them, and each
fast path equals the slow, obvious computation it replaced.

`data/perf_golden.json` was recorded with the simulator as it was BEFORE the hot-path work (caching live
sequences, the closed-form decode-run length, sim/decode_run.py). Each case runs again here and must give the
same summary (every key but `wall_time_s`, which measures the machine) and the same per-request and per-step
tables, bit for bit (a SHA-256 of each column's bytes). No tolerance: the optimisations reorder no float sum.

The first four cases are the paper-scale run (OPT-13B on an A100-40GB, ShareGPT at 2 req/s) for every policy,
over 600 s of arrivals instead of 3600 s to keep the suite fast. The others are small, memory-starved pools
that exercise the paths the speed-ups touch: preemption of multi-sequence groups by recompute, swapping,
beam search, prefix caching and static batching.

NOTE: every case runs with a frozen copy of the roofline cost model as it stood when the golden copy was
recorded (`FrozenRoofline`) and the pool size spelled out, so the golden copy guards the scheduler, the KV
managers, the event loop and the metrics, and a deliberate change to sim/cost.py or sim/specs.py does not
break it.

Re-record (only when a result is MEANT to change): `python -m tests.sim.test_perf_equivalence --record`.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.api import run
from sim.kv.paged_runs import run_capacity as paged_run_capacity
from sim.kv.paged import PagedKVManager
from sim.plan import StepOutcome
from sim.request import Request
from sim.scheduler import Scheduler

GOLDEN = Path(__file__).parent / "data" / "perf_golden.json"


class FrozenRoofline:
    """sim.cost.RooflineCostModel("opt-13b", "a100-40gb") as recorded: its per-unit seconds, written out."""

    weights_s, kv_token_s, overhead_s = 0.020664748038585208, 6.585209003215434e-07, 0.002  # per step, per token
    token_flop_s, attn_flop_s = 0.00013732343247863248, 4.376068376068376e-09  # per new token, per context token
    swap_bandwidth = 25600000000.0  # bytes/s

    def step_time(self, num_prefill_tokens: int, num_decode_seqs: int, num_context_tokens: int) -> float:
        new_tokens = num_prefill_tokens + num_decode_seqs
        memory = self.weights_s + self.kv_token_s * (num_context_tokens + new_tokens)
        compute = self.token_flop_s * new_tokens + self.attn_flop_s * num_context_tokens
        return (memory if memory > compute else compute) + self.overhead_s

    def swap_time(self, num_bytes: int, num_blocks: int = 0) -> float:
        return num_bytes / self.swap_bandwidth


PAPER = {"model": "opt-13b", "gpu": "a100-40gb", "workload": "sharegpt", "rate": 2.0, "duration": 600.0, "seed": 0,
         "kv_slots": 15805}  # fmt: skip  (kv_slots: vLLM's rule for OPT-13B on one A100-40GB, as recorded)
SMALL = {"workload": "sharegpt", "rate": 4.0, "num_requests": 150, "duration": None, "seed": 5, "kv_slots": 4096}
CASES = {
    "paper-max": {**PAPER, "policy": "max"},
    "paper-pow2": {**PAPER, "policy": "pow2"},
    "paper-oracle": {**PAPER, "policy": "oracle"},
    "paper-paged": {**PAPER, "policy": "paged"},
    "paged-n3-recompute": {**SMALL, "policy": "paged", "n": 3, "kv_slots": 8192},
    "paged-n2-swap": {**SMALL, "policy": "paged", "n": 2, "kv_slots": 8192, "preemption": "swap",
                      "swap_space_gib": 0.5},  # fmt: skip
    "paged-beam": {**SMALL, "policy": "paged", "beam_width": 3, "workload": "alpaca", "kv_slots": 8192},
    "paged-prefix": {**SMALL, "policy": "paged", "prefix_len": 40, "num_prefixes": 2},
    "paged-static": {**SMALL, "policy": "paged", "scheduler": "static"},
    "oracle-n2": {**SMALL, "policy": "oracle", "n": 2, "kv_slots": 8192, "allocator": "first_fit"},
}


def fingerprint(case: str) -> dict:
    """The run's summary without wall_time_s, and a SHA-256 of every request and step column."""
    result = run(**CASES[case], cost_model=FrozenRoofline())
    summary = {k: v for k, v in result.summary.items() if k != "wall_time_s"}
    tables = {f"{kind}.{name}": hashlib.sha256(col.tobytes()).hexdigest()
              for kind, table in (("requests", result.requests), ("steps", result.steps))
              for name, col in table.columns.items()}  # fmt: skip
    # JSON round trip, so tuples and floats compare as they are stored (a float's repr round-trips exactly)
    return json.loads(json.dumps({"summary": summary, "tables": tables}))


@pytest.mark.parametrize("case", sorted(CASES))
def test_results_equal_the_golden_copy(case):
    golden = json.loads(GOLDEN.read_text())[case]
    found = fingerprint(case)
    assert found["summary"] == golden["summary"]
    assert found["tables"] == golden["tables"]


def test_golden_cases_do_real_work():
    """The golden copy covers what it claims: preemptions, swaps and waiting happen in the small pools."""
    golden = json.loads(GOLDEN.read_text())
    assert set(golden) == set(CASES)
    assert golden["paper-paged"]["summary"]["num_requests"] > 1000
    for case in ("paged-n3-recompute", "paged-n2-swap", "paged-prefix"):
        assert golden[case]["summary"]["num_preemptions"] > 0, case


# --- each fast path against the computation it replaced ----------------------------------------------------
@given(st.lists(st.integers(1, 40), min_size=1, max_size=8), st.integers(1, 8), st.integers(0, 30))
def test_paged_run_capacity_is_the_largest_run_that_fits(tokens, block_size, num_free_blocks):
    def need(k):  # blocks that k more tokens per sequence open, summed (the binary search's old predicate)
        return sum(-(-(n + k) // block_size) - -(-n // block_size) for n in tokens)

    k = paged_run_capacity(tokens, block_size, num_free_blocks)
    assert need(k) <= num_free_blocks < need(k + 1)


def _history(kv: PagedKVManager, rng: np.random.Generator, num_seqs: int) -> list[int]:
    """Admit sequences of random prompt lengths and free every third, so the free queue is shuffled."""
    live = []
    for seq_id in range(num_seqs):
        prompt_len = int(rng.integers(1, 12))
        if kv.admit([seq_id], prompt_len, [prompt_len + 40]) is not None:
            live.append(seq_id)
        if seq_id % 3 == 2 and live:
            kv.free(live.pop(int(rng.integers(len(live)))))
    return live


@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.integers(0, 13), st.integers(8, 40))
def test_append_decode_steps_equals_appending_token_by_token(seed, block_size, num_steps, num_blocks):
    bulk, stepped = PagedKVManager(num_blocks, block_size), PagedKVManager(num_blocks, block_size)
    ids = _history(bulk, np.random.default_rng(seed), 8)
    assert _history(stepped, np.random.default_rng(seed), 8) == ids
    before = [bulk.block_table(i) for i in ids]
    result = bulk.append_decode_steps(ids, num_steps)
    if result is None:  # out of memory: nothing changed
        assert [bulk.block_table(i) for i in ids] == before
        return
    assert result == []
    for _ in range(num_steps):  # one decode step: one token per sequence, in order
        for seq_id in ids:
            assert stepped.append_slots(seq_id, 1) == []
    bulk.check_invariants()
    for seq_id in ids:
        assert bulk.block_table(seq_id) == stepped.block_table(seq_id)
        assert bulk.num_tokens(seq_id) == stepped.num_tokens(seq_id)
    # the free queues hold the same blocks in the same order: the next allocations agree
    assert bulk.allocator.allocate(bulk.num_free_blocks) == stepped.allocator.allocate(stepped.num_free_blocks)


def _preempted_sampling_group() -> Scheduler:
    """Request 0 grows to fill the pool; request 1 (n = 2) is preempted by recompute and waits, too big to return."""
    sched = Scheduler(PagedKVManager(12, 4))
    sched.add_request(Request(0, 0.0, prompt_len=8, output_len=40))
    sched.add_request(Request(1, 0.0, prompt_len=8, output_len=10, n=2))
    while sched.waiting_request_ids() != [1] or not sched.num_preemptions:
        plan = sched.schedule()
        sched.finish_step(plan, StepOutcome())
    return sched


def test_decode_runs_go_on_while_a_preempted_sampling_group_cannot_return():
    """A multi-sequence group preempted by recompute used to stop every run while it waited ("unsure"); its
    need is exact (each sequence re-admitted alone), so runs go on, and stepping confirms it stays out."""
    jumped, stepped = _preempted_sampling_group(), _preempted_sampling_group()
    k = jumped.decode_run_length(1000)
    assert k > 20
    jumped.advance_decode_run(k)
    for _ in range(k):
        plan = stepped.schedule()
        assert not plan.prefills and not plan.preempted and plan.request_ids() == [0]
        stepped.finish_step(plan, StepOutcome())
    for sched in (jumped, stepped):
        sched.kv.check_invariants()
    assert jumped.kv.block_table(0) == stepped.kv.block_table(0) and jumped.num_generated(0) == stepped.num_generated(0)
    assert jumped.waiting_request_ids() == stepped.waiting_request_ids() == [1]


@pytest.mark.parametrize("first, second", [(5, 3), (5, 5), (5, 9), (1000, 7), (1000, 2000), (3, 1000)])
def test_a_remembered_run_length_equals_a_fresh_answer(first, second):
    """decode_run_length remembers its last answer; asking again with another max_steps gives what a scheduler
    that never asked before answers (both bounds: the run's own, by memory, and max_steps)."""
    asked_twice, fresh = _preempted_sampling_group(), _preempted_sampling_group()
    asked_twice.decode_run_length(first)
    assert asked_twice.decode_run_length(second) == fresh.decode_run_length(second)


def record() -> None:
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps({case: fingerprint(case) for case in sorted(CASES)}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        raise SystemExit("usage: python -m tests.sim.test_perf_equivalence --record")
    record()
