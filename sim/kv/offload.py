"""A CPU offload tier for the prefix cache: evicted cached blocks go to CPU memory and come back on a hit.

vLLM's CPU offloading connector, LMCache and SGLang's hierarchical cache keep prefix blocks that the GPU pool
evicts in a second, larger pool in host memory. Without the tier, a cached block that the GPU's free queue hands
out again (sim/kv/blocks.py: `allocate` evicts it) is simply forgotten, and a later prompt with the same prefix
computes its K/V again. With it:

    GPU pool evicts block g (hash h)  -->  offload: copy g's K/V into a CPU block c, c cached under h
    a prompt's lookup misses h on the GPU but finds it here  -->  reload: a fresh GPU block g' gets c's K/V;
                                                                 the tokens count as cached, not computed

Each tier is least recently used first: the GPU's free queue as before (sim/kv/blocks.py), and here an ordered map
from hash to CPU block whose front is evicted when an offload finds no free CPU block (a hit or a repeated offload
moves its entry to the back). The tier is inclusive: a reloaded block keeps its CPU copy, so evicting it from the
GPU again copies nothing.

The tier only decides and counts; it holds no K/V. Every copy it decides is logged as a `TierCopy`, in the order
decided, and the executor takes the log once per step (`take_copies`): the simulator prices the reloads over PCIe
(sim/clock/loop.py), the engine copies the tensors (reference/engine/kv_cache.py), in that order. The order matters: a block
evicted from the GPU is copied out before a reload overwrites it, and a CPU block read by a reload cannot have
been overwritten before it, as long as the copies run as logged. CPU blocks hit by an admission are pinned
(`pin`) until it has reloaded them, so that the offloads its own allocations cause never take them.

NOTE: the tier's blocks are not GPU slots: the memory breakdown (the GPU pool's five shares) is unchanged by it.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TierCopy:
    """One block copy between the GPU pool and the CPU tier, in the order the executor must make them."""

    to_cpu: bool  # True: an offload (src a GPU block, dst a CPU block); False: a reload (src CPU, dst GPU)
    src: int
    dst: int


@dataclass(slots=True)
class OffloadStats:
    """What the tier did so far (the hits are counted by the manager's PrefixCacheStats)."""

    offloaded_blocks: int = 0  # GPU -> CPU copies
    reloaded_blocks: int = 0  # CPU -> GPU copies
    dropped_blocks: int = 0  # CPU blocks evicted (their hash forgotten) to make room for an offload


class CpuOffloadTier:
    """`num_blocks` CPU blocks caching the K/V of evicted GPU blocks by their prefix hash, least recently used first."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1 for an offload tier, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # a stack: block 0 handed out first
        self._lru: OrderedDict[int, int] = OrderedDict()  # hash -> CPU block; front = least recently used
        self._pinned: set[int] = set()  # hashes an admission is reloading: never evicted meanwhile
        self._log: list[TierCopy] = []
        self.stats = OffloadStats()

    @property
    def num_cached_blocks(self) -> int:
        return len(self._lru)

    def cached_block(self, block_hash: int) -> int | None:
        """The CPU block holding `block_hash`, or None; a peek (no LRU change)."""
        return self._lru.get(block_hash)

    def lru_order(self) -> list[int]:
        """The cached hashes, least recently used first (for tests and pictures)."""
        return list(self._lru)

    def offload(self, gpu_block: int, block_hash: int) -> None:
        """The GPU pool evicts `gpu_block`, cached under `block_hash`: keep its K/V here. Already here: only touched.
        Full: the least recently used unpinned block is dropped and reused; every block pinned: nothing is kept."""
        lru = self._lru
        if block_hash in lru:
            lru.move_to_end(block_hash)
            return
        if self._free:
            cpu_block = self._free.pop()
        else:
            victim = next((h for h in lru if h not in self._pinned), None)
            if victim is None:
                return
            cpu_block = lru.pop(victim)
            self.stats.dropped_blocks += 1
        lru[block_hash] = cpu_block
        self._log.append(TierCopy(True, gpu_block, cpu_block))
        self.stats.offloaded_blocks += 1

    def pin(self, block_hash: int) -> int:
        """A hit: touch the entry and keep it until `reload`; returns its CPU block."""
        self._lru.move_to_end(block_hash)
        self._pinned.add(block_hash)
        return self._lru[block_hash]

    def reload(self, block_hash: int, gpu_block: int) -> None:
        """Copy the pinned block of `block_hash` into `gpu_block` (the CPU copy stays: the tier is inclusive)."""
        self._pinned.discard(block_hash)
        self._log.append(TierCopy(False, self._lru[block_hash], gpu_block))
        self.stats.reloaded_blocks += 1

    def unpin_all(self) -> None:
        self._pinned.clear()

    def take_copies(self) -> list[TierCopy]:
        """The copies decided since the last call, in order (the log is emptied)."""
        log, self._log = self._log, []
        return log

    def check_invariants(self) -> None:
        """Every CPU block is free or cached, exactly once; nothing stays pinned between admissions."""
        held = list(self._lru.values())
        if sorted(held + self._free) != list(range(self.num_blocks)):
            raise RuntimeError(f"expected CPU blocks 0..{self.num_blocks - 1} each free or cached once, found cached "
                               f"{sorted(held)} and free {sorted(self._free)}")
        if self._pinned:
            raise RuntimeError(f"expected no pinned CPU blocks between admissions, found hashes {self._pinned}")
