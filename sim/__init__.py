"""sim: PagedAttention's serving system as a model with a simulated clock (pure Python + numpy).

What a student types comes from here:

    from sim import BlockAllocator, make_kv_manager, NewSequence, Scheduler, SchedulerConfig, Request, run

    alloc = BlockAllocator(num_blocks=8, block_size=16)          # physical blocks, ref counts, prefix cache
    kv = make_kv_manager("paged", 1024, block_size=16)           # the KV contract, one policy behind it
    result = run(scheduler="v1", rate=2, duration=600)           # one simulated serving run
    result.summary["p99_ttft_s"], result.requests, result.steps

docs/ARCHITECTURE.md draws the layers; each module's docstring names the paper or system it follows.
"""
import os as _os

if _os.environ.get("LAB_FAST"):  # the optional compiled build (`make fast`; sim/compiled.py): never by default
    from .compiled import enable as _enable

    _enable(_os.environ["LAB_FAST"])
from .api import SimResult, run
from .base.request import Request
from .config import MODES, RunConfig, SchedulerConfig
from .kv import POLICIES, Allocation, KVManager, MemoryBreakdown, NewSequence, make_kv_manager
from .kv.blocks import BlockAllocator
from .scheduling.plan import ScheduledSeq, StepOutcome, StepPlan
from .scheduling.preemption import VICTIM_POLICIES
from .scheduling.scheduler import Scheduler
from .workloads.workload import generate_requests

__all__ = ["Allocation", "BlockAllocator", "KVManager", "MODES", "MemoryBreakdown", "NewSequence", "POLICIES",
           "Request", "RunConfig", "ScheduledSeq", "Scheduler", "SchedulerConfig", "SimResult", "StepOutcome", "StepPlan",
           "VICTIM_POLICIES", "generate_requests", "make_kv_manager", "run"]
