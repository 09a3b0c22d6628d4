"""/metrics: Prometheus text under vLLM's names (vllm/v1/metrics/loggers.py, vLLM 0.32), so vLLM's dashboards work.

Every series carries vLLM's labels `model_name` (the served name) and `engine` ("0": one engine). Gauges come from
the engine's snapshot after each step; the rest from the requests' outputs, as vLLM's IterationStats counts them:

    vllm:num_requests_running / _waiting       gauges: the scheduler's queues
    vllm:kv_cache_usage_perc                   gauge: the share of the KV pool's blocks in use (1 = all)
    vllm:prefix_cache_queries / _hits          counters: prompt tokens looked up in the prefix cache, and found
    vllm:num_preemptions                       counter: preemptions (recompute or swap)
    vllm:prompt_tokens / generation_tokens     counters: a request's prompt when its first token is out; tokens sampled
    vllm:request_success{finished_reason}      counter: requests ended, by why: stop, length, abort (the client left, or
                                               the server stopped), error (a failed step aborted it)
    vllm:time_to_first_token_seconds           histogram: arrival to first token
    vllm:inter_token_latency_seconds           histogram: EVERY gap between two token steps of a request
    vllm:request_time_per_output_token_seconds histogram: per finished request, its decode time / (tokens - 1)
    vllm:e2e_request_latency_seconds, request_queue_time_seconds, request_prefill_time_seconds,
    request_decode_time_seconds, request_inference_time_seconds   histograms of a finished request's phases
    vllm:request_prompt_tokens, request_generation_tokens, request_max_num_generation_tokens, request_params_n,
    request_params_max_tokens, request_num_preemptions, request_prefill_kv_computed_tokens, iteration_tokens_total

Counters are written with Prometheus' `_total` suffix (as prometheus_client writes vLLM's). vLLM's published Grafana
dashboard still queries two older names that vLLM 0.32 no longer writes: `vllm:gpu_cache_usage_perc` (now
kv_cache_usage_perc) and `vllm:time_per_output_token_seconds` (now inter_token_latency_seconds); they are written too,
the same values, so that dashboard draws every panel. The lab's own series, under `lab:`, add what vLLM's lack: the
requests swapped to CPU memory and the KV blocks in use and in all (the pool page's counts).

Two info series (a gauge set to 1, the settings as labels, as vLLM writes them) tell a client what a simulation of
this server needs (reference/validation/server_facts.py reads them): vLLM's `vllm:cache_config_info` (block_size,
num_gpu_blocks, cache_dtype, enable_prefix_caching, under vLLM's CacheConfig names) and the lab's
`lab:scheduler_config_info` (max_num_batched_tokens, max_num_seqs, the scheduler; vLLM publishes no such series).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from reference.engine.outputs import EngineSnapshot, RequestOutput

# vLLM's bucket families (vllm/v1/metrics/buckets.py), seconds or counts
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM's FinishReason, each written from start


def request_tokens_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's 1-2-5 series up to max_model_len: 1, 2, 5, 10, 20, 50, ..."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


@dataclass(slots=True)
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative
    total: float = 0.0
    num: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break
        self.total += value
        self.num += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip(self.buckets, self.counts or [0] * len(self.buckets)):
            running += count
            out.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {running}')
        return out + [f'{name}_bucket{{{labels},le="+Inf"}} {self.num}', f"{name}_sum{{{labels}}} {self.total!r}",
                      f"{name}_count{{{labels}}} {self.num}"]


@dataclass(slots=True)
class _Request:
    """What the metrics keep of a request while it runs."""

    n: int
    max_tokens: int
    last_token_time: float | None = None  # its latest token step, on the engine's clock
    generated: int = 0  # output tokens so far (all samples)


HISTOGRAMS = {  # name: (help, bucket family)
    "time_to_first_token_seconds": ("Histogram of time to first token in seconds.", "ttft"),
    "inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.", "itl"),
    "time_per_output_token_seconds": ("The inter-token latencies again, under the name vLLM's Grafana dashboard "
                                      "queries (vLLM 0.32 writes inter_token_latency_seconds).", "itl"),
    "request_time_per_output_token_seconds": ("Histogram of time_per_output_token_seconds per request.", "itl"),
    "e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.", "latency"),
    "request_queue_time_seconds": ("Histogram of time spent in WAITING phase for request.", "latency"),
    "request_inference_time_seconds": ("Histogram of time spent in RUNNING phase for request.", "latency"),
    "request_prefill_time_seconds": ("Histogram of time spent in PREFILL phase for request.", "latency"),
    "request_decode_time_seconds": ("Histogram of time spent in DECODE phase for request.", "latency"),
    "request_prompt_tokens": ("Number of prefill tokens processed.", "tokens"),
    "request_generation_tokens": ("Number of generation tokens processed.", "tokens"),
    "request_max_num_generation_tokens": ("Histogram of maximum number of requested generation tokens.", "tokens"),
    "request_params_n": ("Histogram of the n request parameter.", "n"),
    "request_params_max_tokens": ("Histogram of the max_tokens request parameter.", "tokens"),
    "request_num_preemptions": ("Histogram of the number of times a request was preempted.", "preemptions"),
    "request_prefill_kv_computed_tokens": ("Histogram of new KV tokens computed during prefill (excluding cached "
                                           "tokens).", "tokens"),
    "iteration_tokens_total": ("Histogram of number of tokens per engine_step.", "iteration"),
}


class ServerMetrics:
    """The server's Prometheus series. Observed on the engine's thread, written out on the server's: one lock."""

    def __init__(self, model_name: str, max_model_len: int,
                 config_info: dict[str, dict[str, str]] | None = None) -> None:
        self.labels = f'model_name="{_escape(model_name)}",engine="0"'
        self.config_info = config_info or {}  # LLM.config_info(): the info series' labels
        families = {"ttft": TTFT_BUCKETS, "itl": ITL_BUCKETS, "latency": LATENCY_BUCKETS, "n": N_BUCKETS,
                    "tokens": request_tokens_buckets(max_model_len), "preemptions": PREEMPTIONS_BUCKETS,
                    "iteration": ITERATION_TOKENS_BUCKETS}
        self.histograms = {name: Histogram(families[family]) for name, (_, family) in HISTOGRAMS.items()}
        self.finished = dict.fromkeys(FINISH_REASONS, 0)
        self.prompt_tokens = 0
        self.snapshot: EngineSnapshot | None = None
        self._requests: dict[str, _Request] = {}
        self._last_step = -1
        self._lock = threading.Lock()

    # --- observing (the engine thread) --------------------------------------------------------------------------
    def request_added(self, request_id: str, params) -> None:
        with self._lock:
            self._requests[request_id] = _Request(params.n, params.max_tokens)

    def request_ended(self, request_id: str, reason: str) -> None:
        """A request that ends without finishing: "abort" or "error" (vLLM counts both in request_success)."""
        with self._lock:
            if self._requests.pop(request_id, None) is not None:
                self.finished[reason] += 1

    def observe_engine(self, snap: EngineSnapshot) -> None:
        with self._lock:
            self.snapshot = snap
            if snap.last_step is not None and snap.last_step.step > self._last_step:
                self._last_step = snap.last_step.step
                self.histograms["iteration_tokens_total"].observe(snap.last_step.num_batched_tokens)

    def observe_output(self, out: RequestOutput) -> None:
        """One step's output of a request: its new token step's gap, and everything about it once finished."""
        with self._lock:
            state, m = self._requests.get(out.request_id), out.metrics
            if state is None or m is None or m.last_token_time is None:
                return
            h = self.histograms
            if m.last_token_time != state.last_token_time:  # this step gave it tokens
                if state.last_token_time is None:
                    h["time_to_first_token_seconds"].observe(m.ttft)
                    self.prompt_tokens += len(out.prompt_token_ids)
                else:
                    gap = m.last_token_time - state.last_token_time
                    h["inter_token_latency_seconds"].observe(gap)
                    h["time_per_output_token_seconds"].observe(gap)
                state.last_token_time = m.last_token_time
            if out.finished:
                self._finished(out, state)

    def _finished(self, out: RequestOutput, state: _Request) -> None:
        del self._requests[out.request_id]
        m, h = out.metrics, self.histograms
        reasons = [c.finish_reason for c in out.outputs]
        self.finished[reasons[0] if reasons and reasons[0] in self.finished else "stop"] += 1
        lengths = [len(c.token_ids) for c in out.outputs]
        decode = m.last_token_time - m.first_token_time
        for name, value in (("e2e_request_latency_seconds", m.e2e_latency), ("request_queue_time_seconds",
                            m.time_in_queue), ("request_prefill_time_seconds", m.first_token_time -
                            m.first_scheduled_time), ("request_decode_time_seconds", decode),
                            ("request_inference_time_seconds", m.last_token_time - m.first_scheduled_time),
                            ("request_time_per_output_token_seconds", decode / (m.num_token_steps - 1)
                             if m.num_token_steps > 1 else 0.0),
                            ("request_prompt_tokens", len(out.prompt_token_ids)),
                            ("request_generation_tokens", sum(lengths)),
                            ("request_max_num_generation_tokens", max(lengths, default=0)),
                            ("request_params_n", state.n), ("request_params_max_tokens", state.max_tokens),
                            ("request_num_preemptions", m.num_preemptions),
                            ("request_prefill_kv_computed_tokens", len(out.prompt_token_ids) - out.num_cached_tokens)):
            h[name].observe(value)

    # --- the text (the server's thread) -------------------------------------------------------------------------
    def text(self) -> str:
        with self._lock:
            s, labels = self.snapshot, self.labels
            used = s.num_blocks - s.num_free_blocks
            usage = used / s.num_blocks if s.num_blocks else 0.0
            lines: list[str] = []

            def series(name: str, kind: str, what: str, value: float) -> None:
                lines.extend((f"# HELP {name} {what}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {value!r}"))

            series("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                   s.num_running)
            series("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", s.num_waiting)
            series("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage)
            series("vllm:gpu_cache_usage_perc", "gauge", "kv_cache_usage_perc again, under the name vLLM's Grafana "
                   "dashboard queries.", usage)
            for name, what, value in (
                    ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                     s.prefix_cache.queried_tokens),
                    ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                     s.prefix_cache.hit_tokens),
                    ("num_preemptions", "Cumulative number of preemption from the engine.", s.num_preemptions),
                    ("prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens),
                    ("generation_tokens", "Number of generation tokens processed.", s.stats.num_generated_tokens)):
                series(f"vllm:{name}_total", "counter", what, value)
            lines += ["# HELP vllm:request_success_total Count of successfully processed requests.",
                      "# TYPE vllm:request_success_total counter"]
            lines += [f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {count}'
                      for reason, count in self.finished.items()]
            for name, (what, _) in HISTOGRAMS.items():
                lines += [f"# HELP vllm:{name} {what}", f"# TYPE vllm:{name} histogram"]
                lines += self.histograms[name].lines(f"vllm:{name}", labels)
            series("lab:num_requests_swapped", "gauge", "Requests preempted by swapping, their blocks in CPU memory.",
                   s.num_swapped)
            series("lab:kv_cache_blocks_used", "gauge", "KV blocks held by requests (or cached and shared).", used)
            series("lab:kv_cache_blocks_total", "gauge", "KV blocks in the pool.", s.num_blocks)
            for name, key, what in (("vllm:cache_config_info", "cache_config", "Information of the LLMEngine CacheConfig"),
                                    ("lab:scheduler_config_info", "scheduler_config", "The scheduler's settings "
                                     "(vLLM publishes none): its token budget per step and sequences at most.")):
                if key in self.config_info:
                    lines.extend((f"# HELP {name} {what}", f"# TYPE {name} gauge",
                                  info_line(name, {**self.config_info[key], "engine": "0"})))
            return "\n".join(lines) + "\n"


def info_line(name: str, labels: dict[str, str]) -> str:
    """One series of an info, as vLLM writes one (a gauge set to 1, the settings as labels, values escaped)."""
    pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{name}{{{pairs}}} 1.0"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
