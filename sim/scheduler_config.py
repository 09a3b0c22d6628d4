"""The scheduler's configuration: its mode, token budget, sequence cap, preemption and victim policy (see
sim/scheduler.py for what each mode does). It checks itself: a bad value raises ValueError naming the field."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .preemption import victim_policy

MODES = ("v1", "v0", "static")
PREEMPTION_MODES = ("recompute", "swap")
DEFAULT_BUDGET = {"v1": 2048, "v0": 2560, "static": 2560}  # max_num_batched_tokens when none is given


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 256  # running sequences at most
    max_num_batched_tokens: int | None = None  # tokens fed in one step at most (None: DEFAULT_BUDGET[mode])
    mode: str = "v1"  # "v1" | "v0" | "static" (see the module docstring)
    preemption: str = "recompute"  # "recompute" | "swap" (swap falls back to recompute when CPU memory is short)
    enable_chunked_prefill: bool | None = None  # None: on in v1; v0 and static never chunk
    victim: str | Callable = "latest_arrival"  # who is preempted: a name of sim.preemption.VICTIM_POLICIES or a function

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.max_num_batched_tokens is None:
            object.__setattr__(self, "max_num_batched_tokens", DEFAULT_BUDGET[self.mode])
        if not isinstance(self.max_num_seqs, int) or self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be an integer >= 1, got {self.max_num_seqs}")
        if not isinstance(self.max_num_batched_tokens, int) or self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be an integer >= 1, got {self.max_num_batched_tokens}")
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(f"preemption must be one of {', '.join(PREEMPTION_MODES)}, got {self.preemption!r}")
        if self.enable_chunked_prefill and self.mode != "v1":
            raise ValueError(f"enable_chunked_prefill needs mode 'v1' (mode {self.mode!r} runs whole prompts)")
        victim_policy(self.victim)  # raises for an unknown name

    @property
    def chunked(self) -> bool:
        return self.mode == "v1" and self.enable_chunked_prefill is not False
