"""The engine's run as a Chrome trace (Perfetto, chrome://tracing): the same picture as `python -m sim run
--chrome-trace`, drawn by sim/views/chrome_trace.py from the engine's step log instead of the simulator's tables.

Time is wall-clock seconds since the engine was built. Per step (reference.engine.outputs.StepRecord): when it began,
how long it took (copies, forward pass, sampling), what it computed, what it preempted, swapped and copied, and
the pool's five shares after it. Per request: arrival (add_request), its first step, the step that gave it its
first token, and the step it finished in; a request still running when the trace is written has its open span
cut at the last step's end.
"""
from __future__ import annotations

import math
from pathlib import Path

from sim.kv.base import SHARE_NAMES
from sim.views.chrome_trace import write_trace


def engine_rows(llm) -> tuple[list[dict], list[dict]]:
    """(steps, requests) rows for sim.views.chrome_trace.trace_events from `llm.step_log` and `llm.arrivals`."""
    steps, first_step, first_token, finish, preemptions = [], {}, {}, {}, {}
    for record in llm.step_log:
        end = record.start_s + record.step_time_s
        steps.append({
            "time": record.start_s, "duration": record.step_time_s, "num_prefill_seqs": len(record.prefills),
            "num_decode_seqs": len(record.decodes), "num_prefill_tokens": sum(p[3] for p in record.prefills),
            "num_batched_tokens": record.num_batched_tokens, "num_running": record.num_running_requests,
            "num_waiting": record.num_waiting, "num_preempted": len(record.preempted),
            "num_swapped_out_blocks": len(record.blocks_to_swap_out),
            "num_swapped_in_blocks": len(record.blocks_to_swap_in), "num_copied_blocks": len(record.blocks_to_copy),
            **dict(zip(SHARE_NAMES, record.memory.counts())),
        })
        for rid, *_ in record.prefills:
            first_step.setdefault(rid, record.start_s)
        for rid in record.sampled_request_ids:
            first_token.setdefault(rid, end)
        for rid in record.finished_request_ids:
            finish[rid] = end
        for rid in record.preempted:
            preemptions[rid] = preemptions.get(rid, 0) + 1
    nan = math.nan
    requests = [{"request_id": rid, "arrival_time": arrival, "first_scheduled_time": first_step.get(rid, nan),
                 "first_token_time": first_token.get(rid, nan), "finish_time": finish.get(rid, nan),
                 "prompt_len": prompt_len, "output_len": max_tokens, "num_preemptions": preemptions.get(rid, 0)}
                for rid, (arrival, prompt_len, max_tokens) in llm.arrivals.items()]
    return steps, requests


def write_chrome_trace(llm, path: str | Path, *, title: str | None = None) -> None:
    """Write the engine's timeline so far to `path` (JSON in the Trace Event format; atomically)."""
    title = title or f"engine: {llm.kv_manager.__class__.__name__}, {llm.backend} backend, on {llm.device}"
    write_trace(path, *engine_rows(llm), title=title)
