"""Results pinned: runs equal a golden copy, so a change meant to be invisible (speed work, a refactor) is.

`data/golden.json` holds, per case, the run's summary (every key but the machine's `wall_time_s` and the
implementation counter `num_events`) and a SHA-256 of every per-request and per-step column. No tolerance.

The paper-scale cases are OPT-13B on an A100-40GB, ShareGPT at 2 req/s, over 600 s of arrivals instead of 3600 s
to keep the suite fast, for every policy, under the paper's scheduler (v0); the others are small, memory-starved
pools that exercise preemption of multi-sequence groups by recompute, swapping, beam search, prefix caching and
static batching, under v0 and under v1 (token budget, chunked prefill).

History: when the scheduler was rebuilt in vLLM v1's shape, every v0 case equalled the copy recorded before,
bit for bit, except two deliberate changes: `oracle-n2` (a group's prompt is computed once by its leader and
copied into its siblings' runs, instead of computed once per sibling) and `paged-prefix` (a request re-admitted
after a preemption by recompute may hit the prefix cache, and the token budget counts the tokens computed after
prefix-cache hits, as vLLM v1 does). The v1 cases were added then. When the step table gained the blocks swapped
out, swapped in and copied per step (for `--chrome-trace`), the copy was re-recorded after checking that every
earlier column's hash and every summary were unchanged; so again when the request table gained each request's
priority (priority scheduling), which added the case `v1-paged-priority`.

NOTE: every case runs with a frozen copy of the roofline cost model as it stood when the golden copy was
recorded (`FrozenRoofline`) and the pool size spelled out, so the golden copy guards the scheduler, the KV
managers, the event loop and the metrics, and a deliberate change to sim/clock/cost.py or sim/base/specs.py does not
break it.

Re-record (only when a result is MEANT to change, saying why in the commit): `python -m tests.sim.test_golden --record`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from sim.api import run

GOLDEN = Path(__file__).parent / "data" / "golden.json"


class FrozenRoofline:
    """sim.clock.cost.RooflineCostModel("opt-13b", "a100-40gb") as recorded: its per-unit seconds, written out."""

    weights_s, kv_token_s, overhead_s = 0.020664748038585208, 6.585209003215434e-07, 0.002  # per step, per token
    token_flop_s, attn_flop_s = 0.00013732343247863248, 4.376068376068376e-09  # per new token, per context token
    swap_bandwidth = 25600000000.0  # bytes/s

    def step_time(
        self,
        num_prefill_tokens: int,
        num_decode_seqs: int,
        num_context_tokens: int,
        num_prefill_pairs: int = 0,
        num_shared_context_tokens: int = 0,
    ) -> float:
        new_tokens = num_prefill_tokens + num_decode_seqs
        memory = self.weights_s + self.kv_token_s * (num_context_tokens + new_tokens)
        compute = self.token_flop_s * new_tokens + self.attn_flop_s * num_context_tokens
        return (memory if memory > compute else compute) + self.overhead_s

    def swap_time(self, num_bytes: int, num_blocks: int = 0) -> float:
        return num_bytes / self.swap_bandwidth


PAPER = {
    "model": "opt-13b",
    "gpu": "a100-40gb",
    "workload": "sharegpt",
    "rate": 2.0,
    "duration": 600.0,
    "seed": 0,
    "kv_slots": 15805,
    "scheduler": "v0",
}  # (kv_slots: vLLM's rule for OPT-13B on one A100-40GB)
SMALL = {
    "workload": "sharegpt",
    "rate": 4.0,
    "num_requests": 150,
    "duration": None,
    "seed": 5,
    "kv_slots": 4096,
    "scheduler": "v0",
}
V1 = {"scheduler": "v1", "max_num_batched_tokens": 512}
CASES = {
    "paper-max": {**PAPER, "policy": "max"},
    "paper-pow2": {**PAPER, "policy": "pow2"},
    "paper-oracle": {**PAPER, "policy": "oracle"},
    "paper-paged": {**PAPER, "policy": "paged"},
    "paged-n3-recompute": {**SMALL, "policy": "paged", "n": 3, "kv_slots": 8192},
    "paged-n2-swap": {
        **SMALL,
        "policy": "paged",
        "n": 2,
        "kv_slots": 8192,
        "preemption": "swap",
        "swap_space_gib": 0.5,
    },
    "paged-beam": {**SMALL, "policy": "paged", "beam_width": 3, "workload": "alpaca", "kv_slots": 8192},
    "paged-prefix": {**SMALL, "policy": "paged", "prefix_len": 40, "num_prefixes": 2},
    "paged-static": {**SMALL, "policy": "paged", "scheduler": "static"},
    "oracle-n2": {**SMALL, "policy": "oracle", "n": 2, "kv_slots": 8192, "allocator": "first_fit"},
    "v1-paper-paged": {**PAPER, "policy": "paged", "scheduler": "v1"},
    "v1-paper-oracle": {**PAPER, "policy": "oracle", "scheduler": "v1"},
    "v1-paged-n3-recompute": {**SMALL, **V1, "policy": "paged", "n": 3, "kv_slots": 8192},
    "v1-paged-n2-swap": {
        **SMALL,
        **V1,
        "policy": "paged",
        "n": 2,
        "kv_slots": 8192,
        "preemption": "swap",
        "swap_space_gib": 0.5,
    },
    "v1-paged-beam": {**SMALL, **V1, "policy": "paged", "beam_width": 3, "workload": "alpaca", "kv_slots": 8192},
    "v1-paged-prefix": {**SMALL, **V1, "policy": "paged", "prefix_len": 40, "num_prefixes": 2},
    "v1-paged-fewest-computed": {**SMALL, **V1, "policy": "paged", "victim": "fewest_computed"},
    "v1-oracle-n2": {**SMALL, **V1, "policy": "oracle", "n": 2, "kv_slots": 8192, "allocator": "first_fit"},
    "v1-paged-priority": {**SMALL, **V1, "policy": "paged", "scheduling_policy": "priority", "priority_share": 0.3},
}


def fingerprint(case: str) -> dict:
    """The run's summary without wall_time_s and num_events, and a SHA-256 of every request and step column."""
    result = run(**CASES[case], cost_model=FrozenRoofline())
    summary = {k: v for k, v in result.summary.items() if k not in ("wall_time_s", "num_events")}
    tables = {
        f"{kind}.{name}": hashlib.sha256(col.tobytes()).hexdigest()
        for kind, table in (("requests", result.requests), ("steps", result.steps))
        for name, col in table.columns.items()
    }
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
    for case in (
        "paged-n3-recompute",
        "paged-n2-swap",
        "paged-prefix",
        "v1-paged-n3-recompute",
        "v1-paged-prefix",
        "v1-paged-priority",
    ):
        assert golden[case]["summary"]["num_preemptions"] > 0, case
    assert golden["v1-paged-prefix"]["summary"]["prefix_cache_hit_rate_tokens"] > 0


def record() -> None:
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps({case: fingerprint(case) for case in sorted(CASES)}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        raise SystemExit("usage: python -m tests.sim.test_golden --record")
    record()
