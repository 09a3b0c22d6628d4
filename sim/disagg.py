"""Disaggregated prefill and decode: separate prefill and decode instances, the KV cache shipped between them.

DistServe (Zhong et al., "DistServe: Disaggregating Prefill and Decoding for Goodput-optimized Large Language Model
Serving", OSDI 2024) and Splitwise (Patel et al., ISCA 2024) serve a request in two places. A *prefill instance*
computes the prompt and samples the first token; the request's K/V then travels over a link to a *decode instance*,
which generates the rest. A decode step then never waits behind a long prompt (the interference that chunked prefill
only softens), and each side can be sized for its own latency target: time to first token (TTFT) on the prefill
side, time per output token (TPOT, here TBT) on the decode side.

Here every instance is one GPU running the lab's own serving system: its own `Scheduler` over its own KV manager
built by `make_kv_manager`, driven by the event loop (`sim.clock.loop.Simulator`), as `sim.run` builds one. A request goes

    arrival --router--> prefill instance i    prompt P, 1 output token: its first token ends the prefill
            --router--> decode instance j     arrives when that token is sampled; holds P + 1 tokens' blocks from
                                              the step that admits it (if memory is short it waits, as any request),
                                              in which step the P prompt tokens' K/V are *loaded* over the link
                                              (P x kv_bytes_per_token bytes / bandwidth + latency) instead of being
                                              computed; the first token is fed as a decode, and it samples the
                                              other output_len - 1 tokens

    decode instance's view of a request:  |<------- P: loaded over the link ------->|t1|  -> samples t2 .. t_O
                                           prompt_len = P + 1 (the first token's K/V is computed there)

The decode side's executor (`KVLoadingSimulator`) prices a step whose plan feeds loaded positions as the link's time
for them plus the forward pass over what is really computed. Nothing in the scheduler or the loop changes.

Metrics per request combine both sides: TTFT = the prefill instance's first token - arrival (DistServe: the first
token comes from the prefill phase; the transfer shows up in the gap to the second token); TBT = (last token - first
token) / (output_len - 1), the mean time per output token (DistServe's TPOT). Goodput (DistServe, section 2): the
requests per second that meet both SLOs; DistServe's per-GPU goodput is the highest rate at which at least 90% do,
divided by the GPUs (sim.figures.disagg reads it off a rate sweep).

The baseline (`colocated=True`) is the same number of GPUs as ordinary instances behind the same router, each serving
prompts and decodes alike (v1: chunked prefill mixed with decodes).

Modelling approximations (each named where it is made):
- routing is decided on arrival from what is known then (prompt lengths), not from the instances' live state: a
  state-aware router would need all instances on one clock (see `route`);
- a prefill instance frees the request's blocks when its first token is sampled: the K/V waiting for a decode
  instance is held in host memory (as Mooncake's KV store holds it), not in the prefill pool;
- a load is not overlapped with the decode step that admits it (conservative: DistServe and Splitwise overlap
  the transfer layer by layer), and loads of one step go one after another over one link per decode instance.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
import time
from dataclasses import dataclass, replace

import numpy as np

from .arguments import check_arguments
from .base.limits import MAX_TIME_S, is_int, is_real, require
from .base.request import Request
from .base.specs import GiB, get_gpu, get_model, kv_capacity_tokens
from .clock.cost import RooflineCostModel
from .clock.loop import LoopResult, Simulator
from .clock.metrics import Table, latency_summary, request_table, slo_summary
from .config import RunConfig
from .fast.loop import FastSimulator
from .kv import make_kv_manager, simulator_block_size
from .kv.base import SHARE_NAMES
from .scheduling.plan import ScheduledSeq, StepPlan
from .scheduling.scheduler import Scheduler
from .workloads.workload_source import workload_for

ROUTERS = ("least-work", "round-robin")
# One HDR InfiniBand port: 200 Gb/s = 25 GB/s each way, the A100 generation's network (a DGX A100 has eight, one per
# GPU); the paper-era link between two machines. Within one machine NVLink is 12x faster (sim.base.specs: 300 GB/s).
DEFAULT_LINK_BANDWIDTH = 25e9  # bytes/s
# Fixed seconds per transfer, however small: setting up the RDMA reads of one request's scattered blocks. An order of
# magnitude, stated, not measured by this project.
DEFAULT_LINK_LATENCY = 100e-6
DISAGG_WORKLOADS = ("sharegpt", "alpaca")  # the command's length distributions
MIN_LINK_BANDWIDTH = 1e3  # bytes/s: the largest request's K/V (tens of GB) then crosses in under MAX_TIME_S
MAX_INSTANCES = 64  # instances of each kind; each is a whole simulated GPU
# DistServe Table 1, the chatbot application (OPT-13B on ShareGPT): TTFT 0.25 s, TPOT 0.1 s, 90% attainment.
DISTSERVE_SLO_TTFT, DISTSERVE_SLO_TBT, DISTSERVE_ATTAINMENT = 0.25, 0.1, 0.9


@dataclass(frozen=True, kw_only=True, slots=True)
class KVLink:
    """The link a request's K/V crosses from its prefill instance to its decode instance."""

    bandwidth: float = DEFAULT_LINK_BANDWIDTH  # bytes/s one way; math.inf: instantaneous
    latency: float = DEFAULT_LINK_LATENCY  # seconds per transfer

    def __post_init__(self) -> None:
        real = isinstance(self.bandwidth, (int, float)) and not isinstance(self.bandwidth, bool)
        require(real and self.bandwidth >= MIN_LINK_BANDWIDTH, "link_bandwidth", self.bandwidth,
                f"bytes/s >= {MIN_LINK_BANDWIDTH:g}, or inf for an instantaneous link")
        require(is_real(self.latency) and 0 <= self.latency <= MAX_TIME_S, "link_latency", self.latency,
                f"seconds from 0 to {MAX_TIME_S:g}")

    def transfer_time(self, num_bytes: int) -> float:
        """Seconds to move one request's `num_bytes` (0 bytes: nothing moves, nothing is paid)."""
        return self.latency + num_bytes / self.bandwidth if num_bytes else 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterConfig:
    """How many instances of each kind, how requests reach them, and the link between them."""

    num_prefill: int = 1  # prefill instances (one GPU each)
    num_decode: int = 1  # decode instances (one GPU each)
    colocated: bool = False  # the baseline: num_prefill + num_decode ordinary instances, each doing both phases
    router: str = "least-work"  # see `route`
    link: KVLink = KVLink()

    def __post_init__(self) -> None:
        for name in ("num_prefill", "num_decode"):
            value = getattr(self, name)
            require(is_int(value) and 1 <= value <= MAX_INSTANCES, name, value, f"an integer from 1 to {MAX_INSTANCES}")
        require(self.router in ROUTERS, "router", self.router, ", ".join(ROUTERS))
        require(isinstance(self.colocated, bool), "colocated", self.colocated, "True or False")

    @property
    def num_gpus(self) -> int:
        return self.num_prefill + self.num_decode

    @property
    def name(self) -> str:
        """'1P3D' (DistServe's notation), or 'colocated x4'."""
        return f"colocated x{self.num_gpus}" if self.colocated else f"{self.num_prefill}P{self.num_decode}D"


@dataclass(slots=True)
class DisaggResult:
    summary: dict  # the cluster's summary: latencies, SLO attainment, goodput (see run_cluster)
    requests: Table  # per request, both sides combined: sim.clock.metrics.REQUEST_COLUMNS
    instances: list[dict]  # per instance: role, requests served, steps, busy seconds, KV loads


def route(works: list[int], num_instances: int, router: str) -> list[int]:
    """The instance of each request, in the order given (arrival order for prefill, first-token order for decode).

    round-robin: request k goes to instance k % num_instances.
    least-work:  to the instance given the fewest prompt tokens so far (ties: the lowest index), a balance of work
                 that needs only what a router knows on arrival (not the output length).
    NOTE: neither reads an instance's live queue; a state-aware "least loaded now" router needs every instance on one
    clock, which the loop (one Simulator per instance, run to its end) does not offer.
    """
    require(router in ROUTERS, "router", router, ", ".join(ROUTERS))
    if router == "round-robin":
        return [k % num_instances for k in range(len(works))]
    heap = [(0, i) for i in range(num_instances)]
    chosen = []
    for work in works:
        assigned, i = heap[0]
        heapq.heapreplace(heap, (assigned + work, i))
        chosen.append(i)
    return chosen


class KVLoadingSimulator(FastSimulator):
    """A decode instance: the event loop, with a step's price changed for the prompt positions whose K/V arrives
    over the link. `loaded[request_id]` = those positions (0 .. P - 1); the first time a plan feeds one of them it
    is priced as the link's time for its bytes, not compute. A position fed again (the request was preempted by
    recompute and its K/V dropped) is computed, as the instance then must. Everything else is sim.clock.loop's."""

    def __init__(self, *args, link: KVLink, kv_bytes_per_token: int, loaded: dict[int, int], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.link, self.kv_bytes_per_token, self.loaded = link, kv_bytes_per_token, loaded
        self.loaded_upto: dict[int, int] = {}  # request id -> positions below this have come over the link
        self.transfer_s = 0.0  # link seconds booked, in all
        self.num_transfers = 0  # entries that loaded K/V (a chunked prompt loads in several)

    def price(self, plan: StepPlan) -> float:
        prefills, link_s, loads = [], 0.0, 0
        for entry in plan.prefills:
            start, end = entry.num_computed_tokens, entry.num_computed_tokens + entry.num_new_tokens
            done, size = self.loaded_upto.get(entry.request_id, 0), self.loaded.get(entry.request_id, 0)
            load = max(0, min(end, size) - start) if start == done else 0  # (the load goes on where it stopped)
            if start < done:  # fed again from the start: preempted, its K/V dropped; recomputed here, never reloaded
                self.loaded_upto[entry.request_id] = size
            if load:
                self.loaded_upto[entry.request_id] = start + load
                link_s += self.link.transfer_time(load * self.kv_bytes_per_token)
                self.num_transfers += 1
                loads += 1
                # the loaded positions come first in the entry (they are the prompt's); what follows is computed
                entry = ScheduledSeq(entry.seq_id, entry.request_id, start + load, entry.num_new_tokens - load,
                                     entry.block_table, entry.sample)
            if entry.num_new_tokens or not load:  # (a chunk wholly loaded computes nothing)
                prefills.append(entry)
        if not loads:
            return super().price(plan)
        self.transfer_s += link_s
        computed = replace(plan, prefills=prefills)  # (a plan's subclass keeps what it adds: sim.fast.epoch.EpochStep)
        return super().price(computed) + link_s


def _instance(config: RunConfig, requests: list[Request], loading: dict | None = None) -> tuple[LoopResult, Simulator]:
    """Serve `requests` on one instance (one GPU) built as sim.run builds it: the pool vLLM's rule leaves, the KV
    manager, the scheduler and the roofline of `config`. `loading`: KVLoadingSimulator's keywords (a decode
    instance), else an ordinary instance."""
    c = config
    model, gpu = get_model(c.model), get_gpu(c.gpu)
    num_slots = c.kv_slots if c.kv_slots is not None else kv_capacity_tokens(model, gpu, c.num_gpus)
    block_size = simulator_block_size(c.policy, c.block_size, model=model, num_gpus=c.num_gpus, page_kib=c.page_kib)
    num_cpu_blocks = int(c.num_gpus * c.swap_space_gib * GiB // (block_size * model.kv_bytes_per_token))
    kv = make_kv_manager(c.policy, num_slots, block_size=block_size, max_seq_len=model.max_seq_len,
                         allocator=c.allocator, enable_prefix_caching=False, num_cpu_blocks=num_cpu_blocks,
                         watermark=c.watermark, model=model)
    scheduler = Scheduler(kv, c.scheduler_config(model.max_seq_len))
    cost = RooflineCostModel(model, gpu, c.num_gpus, block_size=scheduler.kv.gather_block_size)
    kind = FastSimulator if loading is None else KVLoadingSimulator
    simulator = kind(scheduler, cost, requests, block_bytes=block_size * model.kv_bytes_per_token, seed=c.seed,
                     jump=c.jump, step_table=False, **(loading or {}))
    return simulator.run(), simulator


def _check(c: RunConfig) -> None:
    """What this cluster model does not cover, refused in one line each, before the workload is drawn."""
    require(c.trace is None, "trace", c.trace, "None here: give requests or a synthetic workload")
    require(c.workload != "conversation" or c.requests is not None, "workload", c.workload,
            "a single-turn workload (sharegpt, alpaca, fixed, uniform): a conversation's turns share a prefix cache "
            "that one instance holds")
    require(c.enable_prefix_caching is not True, "enable_prefix_caching", c.enable_prefix_caching,
            "None or False: each instance has its own cache, and the K/V that moves is the whole prompt's")
    require(c.cost_model is None, "cost_model", c.cost_model, "None: every instance is priced by the roofline")
    require(c.num_gpus == 1, "num_gpus", c.num_gpus, "1: each instance is one GPU")
    require(c.n == 1 and c.beam_width == 1, "n and beam_width", (c.n, c.beam_width),
            "1 and 1: one sequence per request, the transfer ships one sequence's K/V")
    require(c.prefix_len == 0, "prefix_len", c.prefix_len, "0: each instance has its own prefix cache")
    for name in ("block_allocator", "on_step"):
        require(getattr(c, name) is None, name, getattr(c, name), "None: a cluster builds its instances' own")
    require(not c.validate, "validate", c.validate, "False")


def _check_requests(c: RunConfig, requests: list[Request]) -> None:
    """Requests this cluster model does not cover (a list given as `requests`), refused in one line each."""
    for r in requests:
        if r.num_seqs > 1 or r.prefix_len:
            raise ValueError(f"request {r.request_id}: n={r.n}, beam_width={r.beam_width}, prefix_len={r.prefix_len} "
                             "(allowed: one sequence, no shared prefix: the transfer ships one sequence's K/V)")
        if r.prompt_len + r.output_len > get_model(c.model).max_seq_len:
            raise ValueError(f"request {r.request_id}: prompt_len + output_len = {r.prompt_len + r.output_len} "
                             f"(allowed: at most the context of {get_model(c.model).max_seq_len:,} tokens)")


def run_cluster(config: RunConfig | None = None, /, *, cluster: ClusterConfig = ClusterConfig(),
                **settings) -> DisaggResult:
    """Serve one workload on a cluster of instances: disaggregated (cluster.num_prefill prefill + num_decode decode
    instances) or, with cluster.colocated, the same number of ordinary instances behind the same router.

    `config` / `settings`: every instance's settings and the workload, as sim.run takes them (model, gpu, policy,
    block_size, scheduler, workload, rate, duration, num_requests, seed, slo_ttft, slo_tbt, requests, ...); `rate`
    is the whole cluster's. Not covered (refused): traces, conversations, prefix caching, parallel sampling and beam
    search, calibrated cost models, tensor parallelism within an instance.
    """
    started = time.perf_counter()
    if config is None:
        config = RunConfig(**settings)
    elif settings:
        config = dataclasses.replace(config, **settings)
    if not isinstance(cluster, ClusterConfig):
        raise TypeError(f"run_cluster: cluster must be a sim.disagg.ClusterConfig, got {type(cluster).__name__}")
    kind = check_arguments(config)
    _check(config)
    requests, _ = workload_for(config, kind, get_model(config.model))  # (a trace is refused above)
    requests = sorted(requests, key=lambda r: (r.arrival_time, r.request_id))
    _check_requests(config, requests)
    if cluster.colocated:
        combined, instances, transfers = _colocated(config, cluster, requests)
    else:
        combined, instances, transfers = _disaggregated(config, cluster, requests)
    table = request_table(requests, combined)
    table.columns["num_tokens"] = combined["token_steps"]  # tokens sampled for it, on both sides (one a step)
    finished = ~np.isnan(table["finish_time"])
    start = requests[0].arrival_time
    span = float(np.nanmax(table["finish_time"]) - start) if finished.any() else 0.0
    norm = table["normalized_latency"][finished]
    summary = {
        "cluster": cluster.name, "colocated": cluster.colocated, "num_prefill": 0 if cluster.colocated else
        cluster.num_prefill, "num_decode": 0 if cluster.colocated else cluster.num_decode,
        "num_gpus": cluster.num_gpus, "router": cluster.router,
        "link_bandwidth_gb_s": cluster.link.bandwidth / 1e9, "link_latency_s": cluster.link.latency,
        "model": config.model, "gpu": config.gpu, "policy": config.policy, "scheduler": config.scheduler,
        "workload": "requests" if config.requests is not None else config.workload,
        "rate": config.rate if config.requests is None else None, "seed": config.seed,
        "num_requests": len(requests), "num_finished": int(finished.sum()),
        "throughput_req_per_s": int(finished.sum()) / span if span > 0 else 0.0,
        "normalized_latency_s_per_token": float(norm.mean()) if len(norm) else None,
        "num_preemptions": int(table["num_preemptions"].sum()), "sim_time_s": span,
        "num_transfers": transfers[0], "mean_transfer_s": transfers[1] / transfers[0] if transfers[0] else 0.0,
        **latency_summary(table), **slo_summary(table, span, config.slo_ttft, config.slo_tbt),
        "wall_time_s": time.perf_counter() - started,
    }
    return DisaggResult(summary, table, instances)


def _colocated(c: RunConfig, cluster: ClusterConfig, requests: list[Request]):
    """Each request whole on one of num_gpus ordinary instances, by the router."""
    where = route([r.prompt_len for r in requests], cluster.num_gpus, cluster.router)
    times = _empty_times(len(requests))
    index = {r.request_id: k for k, r in enumerate(requests)}
    instances = []
    for i in range(cluster.num_gpus):
        mine = [r for r, w in zip(requests, where) if w == i]
        result, simulator = _instance(c, mine)
        instances.append(_instance_row("colocated", i, mine, result, simulator))
        rows = result.requests
        for k, rid in enumerate(rows["request_id"].tolist()):
            j = index[rid]
            times["first_scheduled"][j] = rows["first_scheduled_time"][k]
            times["first_token"][j] = rows["first_token_time"][k]
            times["finish"][j] = rows["finish_time"][k]
            times["preemptions"][j] = rows["num_preemptions"][k]
            times["max_gap"][j] = rows["itl_max"][k] if not math.isnan(rows["itl_max"][k]) else 0.0
            times["token_steps"][j] = simulator.times.token_steps[simulator.index[rid]]
    return times, instances, (0, 0.0)


def _disaggregated(c: RunConfig, cluster: ClusterConfig, requests: list[Request]):
    """Prefill instances first (they depend on nothing after them), then the decode instances, whose arrivals are
    the prefill instances' first tokens."""
    model = get_model(c.model)
    times = _empty_times(len(requests))
    index = {r.request_id: k for k, r in enumerate(requests)}
    instances = []
    where = route([r.prompt_len for r in requests], cluster.num_prefill, cluster.router)
    for i in range(cluster.num_prefill):
        mine = [dataclasses.replace(r, output_len=1) for r, w in zip(requests, where) if w == i]
        result, simulator = _instance(c, mine)
        instances.append(_instance_row("prefill", i, mine, result, simulator))
        rows = result.requests
        for k, rid in enumerate(rows["request_id"].tolist()):
            j = index[rid]
            times["first_scheduled"][j] = rows["first_scheduled_time"][k]
            times["first_token"][j] = times["finish"][j] = rows["first_token_time"][k]
            times["preemptions"][j] = rows["num_preemptions"][k]
            times["token_steps"][j] = simulator.times.token_steps[simulator.index[rid]]
    # Decode: every request with more to generate, in the order its first token came (ties: arrival order).
    later = sorted((r for r in requests if r.output_len > 1), key=lambda r: (times["first_token"][index[r.request_id]],
                                                                           index[r.request_id]))
    where = route([r.prompt_len for r in later], cluster.num_decode, cluster.router)
    transfers, transfer_s = 0, 0.0
    for i in range(cluster.num_decode):
        mine = [Request(r.request_id, float(times["first_token"][index[r.request_id]]), r.prompt_len + 1,
                        r.output_len - 1) for r, w in zip(later, where) if w == i]
        loading = {"link": cluster.link, "kv_bytes_per_token": model.kv_bytes_per_token,
                   "loaded": {r.request_id: r.prompt_len - 1 for r in mine}}
        result, simulator = _instance(c, mine, loading)
        transfers, transfer_s = transfers + simulator.num_transfers, transfer_s + simulator.transfer_s
        instances.append(_instance_row("decode", i, mine, result, simulator))
        rows = result.requests
        for k, rid in enumerate(rows["request_id"].tolist()):
            j = index[rid]
            first = times["first_token"][j]
            # the gap from the first token (prefill side) to the second (the decode side's first), then its own
            gap = rows["first_token_time"][k] - first
            own = rows["itl_max"][k]
            times["max_gap"][j] = max(gap, 0.0 if math.isnan(own) else own)
            times["finish"][j] = rows["finish_time"][k]
            times["preemptions"][j] += rows["num_preemptions"][k]
            times["token_steps"][j] += simulator.times.token_steps[simulator.index[rid]]
    return times, instances, (transfers, transfer_s)


def _empty_times(count: int) -> dict[str, np.ndarray]:
    """The per-request times sim.clock.metrics.request_table reads, NaN until filled."""
    nan = np.full(count, np.nan)
    return {"first_scheduled": nan.copy(), "first_token": nan.copy(), "last_token": nan.copy(),
            "max_gap": np.zeros(count), "token_steps": np.zeros(count, dtype=np.int64),
            "finish": nan.copy(), "preemptions": np.zeros(count, dtype=np.int64)}


def _instance_row(role: str, i: int, requests: list[Request], result: LoopResult, simulator: Simulator) -> dict:
    """One instance's record: its work, its link time, and what its KV pool still holds at the end (nothing, when
    every request freed its blocks)."""
    num_steps, running, busy = result.step_totals
    kv = simulator.kv
    held = dict(zip(SHARE_NAMES, kv.breakdown(False).counts()))
    loading = isinstance(simulator, KVLoadingSimulator)
    return {"role": role, "instance": i, "num_requests": len(requests), "num_steps": num_steps,
            "mean_batch_size": running / num_steps if num_steps else 0.0, "busy_s": busy or 0.0,
            "num_transfers": simulator.num_transfers if loading else 0,
            "transfer_s": simulator.transfer_s if loading else 0.0,
            "kv_slots_held_at_end": kv.num_slots - held["free"], "live_seqs_at_end": len(kv.seq_ids)}


# --- `python -m sim disagg` -------------------------------------------------------------------------------------
def add_arguments(parser) -> None:
    from .base.specs import GPUS, MODELS
    from .config import MODES
    from .config import RUN_DEFAULTS as D

    parser.add_argument("--prefill", type=int, default=1, help="prefill instances, one GPU each (default: 1)")
    parser.add_argument("--decode", type=int, default=1, help="decode instances, one GPU each (default: 1)")
    parser.add_argument("--colocated", action="store_true", help="the baseline: PREFILL + DECODE ordinary instances, "
                        "each serving prompts and decodes, behind the same router")
    parser.add_argument("--router", default="least-work", metavar="{" + ",".join(ROUTERS) + "}",
                        help="which instance gets a request: the fewest prompt tokens given so far, or in turn "
                        "(default: least-work)")
    parser.add_argument("--link-bandwidth", type=float, default=DEFAULT_LINK_BANDWIDTH / 1e9, metavar="GB/S",
                        help="K/V link, GB/s one way; inf: instantaneous (default: %(default)g, one HDR InfiniBand "
                        "port)")
    parser.add_argument("--link-latency", type=float, default=DEFAULT_LINK_LATENCY, metavar="SECONDS",
                        help="fixed seconds per transfer (default: %(default)g)")
    parser.add_argument("--model", default=D["model"], metavar="{" + ",".join(MODELS) + "}",
                        help="model spec (default: %(default)s)")
    parser.add_argument("--gpu", default=D["gpu"], metavar="{" + ",".join(GPUS) + "}",
                        help="every instance's GPU (default: %(default)s)")
    parser.add_argument("--policy", default=D["policy"],
                        help="KV cache policy of every instance (default: %(default)s)")
    parser.add_argument("--scheduler", default=D["scheduler"], metavar="{" + ",".join(MODES) + "}",
                        help="every instance's scheduler (default: %(default)s)")
    parser.add_argument("--workload", default=D["workload"], metavar="{" + ",".join(DISAGG_WORKLOADS) + "}",
                        help="request lengths (default: %(default)s)")
    parser.add_argument("--rate", type=float, default=D["rate"],
                        help="the cluster's arrivals, req/s (default: %(default)s)")
    parser.add_argument("--duration", type=float, default=D["duration"],
                        help="seconds of arrivals (default: %(default)s)")
    parser.add_argument("--num-requests", type=int, help="exactly this many requests (instead of --duration)")
    parser.add_argument("--seed", type=int, default=D["seed"], help="workload seed (default: %(default)s)")
    parser.add_argument("--slo-ttft", type=float, default=DISTSERVE_SLO_TTFT, metavar="SECONDS",
                        help="time-to-first-token target (default: %(default)g, DistServe's chatbot on OPT-13B)")
    parser.add_argument("--slo-tbt", type=float, default=DISTSERVE_SLO_TBT, metavar="SECONDS",
                        help="mean time-between-tokens target (default: %(default)g, DistServe's TPOT)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--requests-csv", metavar="PATH", help="also write the per-request table (both sides combined)")


def run_from_args(args) -> int:
    import json

    from .base.outfiles import check_outputs

    check_outputs({"--requests-csv": args.requests_csv}, {})
    for flag, value in (("--prefill", args.prefill), ("--decode", args.decode)):
        require(1 <= value <= MAX_INSTANCES, flag, value, f"an integer from 1 to {MAX_INSTANCES}")
    require(args.router in ROUTERS, "--router", args.router, ", ".join(ROUTERS))
    # NOTE: fixed and uniform lengths need flags (--prompt-len, ...) that disagg does not take
    require(args.workload in DISAGG_WORKLOADS, "--workload", args.workload, ", ".join(DISAGG_WORKLOADS))
    for dest in ("link_bandwidth", "link_latency"):
        if args.colocated and dest in getattr(args, "typed", ()):
            flag = "--" + dest.replace("_", "-")
            raise ValueError(f"{flag} {getattr(args, dest):g}: means nothing with --colocated, whose instances move "
                             f"no K/V (allowed: without --colocated)")
    require(args.link_bandwidth * 1e9 >= MIN_LINK_BANDWIDTH, "--link-bandwidth", args.link_bandwidth,
            f"GB/s >= {MIN_LINK_BANDWIDTH / 1e9:g}, or inf")
    require(is_real(args.link_latency) and 0 <= args.link_latency <= MAX_TIME_S, "--link-latency", args.link_latency,
            f"seconds from 0 to {MAX_TIME_S:g}")
    link = KVLink(bandwidth=args.link_bandwidth * 1e9, latency=args.link_latency)
    cluster = ClusterConfig(num_prefill=args.prefill, num_decode=args.decode, colocated=args.colocated,
                            router=args.router, link=link)
    result = run_cluster(cluster=cluster, model=args.model, gpu=args.gpu, policy=args.policy, scheduler=args.scheduler,
                         workload=args.workload, rate=args.rate, duration=args.duration, num_requests=args.num_requests,
                         seed=args.seed, slo_ttft=args.slo_ttft, slo_tbt=args.slo_tbt)
    if args.requests_csv:
        result.requests.to_csv(args.requests_csv)
    s = result.summary
    if args.json:
        print(json.dumps({**s, "instances": result.instances}, indent=2))
        return 0
    print(f"{s['cluster']} ({s['num_gpus']} x {s['gpu']}, {s['model']}, {s['router']} router"
          + ("" if s["colocated"] else f", K/V link {s['link_bandwidth_gb_s']:g} GB/s") + ")")
    print(f"  requests      {s['num_finished']:,} of {s['num_requests']:,} finished in {s['sim_time_s']:.1f} s")
    print(f"  TTFT          p50 {_ms(s['p50_ttft_s'])}  p90 {_ms(s['p90_ttft_s'])}  (SLO {_ms(s['slo_ttft_s'])})")
    print(f"  TBT (mean)    p50 {_ms(s['p50_itl_mean_s'])}  p90 {_ms(s['p90_itl_mean_s'])}  "
          f"(SLO {_ms(s['slo_tbt_s'])})")
    print(f"  SLO attained  {s['slo_attainment']:.1%}   goodput {s['goodput_req_per_s']:.2f} req/s "
          f"({s['goodput_req_per_s'] / s['num_gpus']:.2f} per GPU)")
    if not s["colocated"]:
        print(f"  K/V transfers {s['num_transfers']:,}, {_ms(s['mean_transfer_s'])} each on average")
    for row in result.instances:
        print(f"  {row['role']:>9} {row['instance']}: {row['num_requests']:,} requests, mean batch "
              f"{row['mean_batch_size']:.1f}, busy {row['busy_s']:.1f} s")
    return 0


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"
