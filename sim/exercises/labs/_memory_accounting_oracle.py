"""The oracle of lab `memory_accounting`: pool states built by driving the project's own KV managers, and the
breakdown each manager reports for its state (`expected`), to which the student's answer is compared (`compare`).

`PagedPool` and `ContiguousPool` admit, grow, fork and free sequences through `PagedKVManager` and
`ContiguousKVManager`, and hand the state they end in to the student as plain arguments (`args`). The narrated
examples (memory_accounting.py) and the random programs (_memory_accounting_machines.py) share them. The module's
name starts with "_", so the lab loader does not take it for a lab.
"""
from __future__ import annotations

from typing import Any

from ...kv.base import SHARE_NAMES, NewSequence
from ...kv.contiguous import ContiguousKVManager
from ...kv.paged import PagedKVManager


class PagedPool:
    """A `PagedKVManager` and the true final length of each live sequence: the paged state the student reads."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.kv = PagedKVManager(num_blocks, block_size)
        self.final_lens: dict[int, int] = {}
        self.next_id = 0

    def admit(self, prompt_len: int, final_len: int) -> int | None:
        """A new sequence whose prompt is computed at once; its id, or None when the pool is full."""
        seq_id, self.next_id = self.next_id, self.next_id + 1
        if self.kv.allocate_slots([seq_id], [prompt_len], [NewSequence(prompt_len, final_len)]) is None:
            return None
        self.final_lens[seq_id] = final_len
        return seq_id

    def grow(self, seq_id: int, num_new_tokens: int) -> bool:
        return self.kv.allocate_slots([seq_id], [num_new_tokens]) is not None

    def fork(self, parent_id: int, final_len: int) -> int:
        """A child sharing every block of the parent (parallel sampling, beam search)."""
        child, self.next_id = self.next_id, self.next_id + 1
        self.kv.fork(parent_id, child, final_len)
        self.final_lens[child] = final_len
        return child

    def free(self, seq_id: int) -> None:
        self.kv.free(seq_id)
        del self.final_lens[seq_id]

    def args(self, waiting: bool) -> tuple:
        """The student's arguments: (block_size, num_blocks, [(block_table, num_tokens, final_len), ...], waiting)."""
        seqs = [(self.kv.block_table(s), self.kv.num_tokens(s), self.final_lens[s]) for s in self.kv.seq_ids]
        return self.kv.block_size, self.kv.num_blocks, seqs, waiting


class ContiguousPool:
    """A `ContiguousKVManager` at block size 1 over a buddy allocator, as the simulator runs the Orca baselines."""

    def __init__(self, num_slots: int, reserve: str, max_seq_len: int) -> None:
        self.kv = ContiguousKVManager(num_slots, 1, reserve, "buddy", max_seq_len)
        self.lens: dict[int, tuple[int, int]] = {}  # seq id -> (prompt_len, final_len)
        self.next_id = 0

    def admit(self, prompt_len: int, final_len: int) -> int | None:
        seq_id, self.next_id = self.next_id, self.next_id + 1
        if self.kv.allocate_slots([seq_id], [prompt_len], [NewSequence(prompt_len, final_len)]) is None:
            return None
        self.lens[seq_id] = (prompt_len, final_len)
        return seq_id

    def grow(self, seq_id: int, num_new_tokens: int) -> bool:
        return self.kv.allocate_slots([seq_id], [num_new_tokens]) is not None

    def free(self, seq_id: int) -> None:
        self.kv.free(seq_id)
        del self.lens[seq_id]

    def args(self, waiting: bool) -> tuple:
        """The student's arguments: (num_slots, reserve, max_seq_len, [(prompt_len, num_tokens, final_len)],
        waiting)."""
        seqs = [(p, self.kv.num_tokens(s), f) for s, (p, f) in self.lens.items()]
        return self.kv.num_slots, self.kv.policy, self.kv.max_seq_len, seqs, waiting


def expected(pool: PagedPool | ContiguousPool, waiting: bool) -> dict[str, int]:
    """The manager's own breakdown, as the five counts by name."""
    return dict(zip(SHARE_NAMES, pool.kv.breakdown(waiting).counts()))


def compare(what: str, found: Any, wanted: dict[str, int]) -> str | None:
    """None if `found` is the breakdown `wanted`, else one line naming each share that differs."""
    if not isinstance(found, dict) or set(found) != set(SHARE_NAMES):
        keys = sorted(found) if isinstance(found, dict) else type(found).__name__
        return f"{what}: expected a dict with the five keys {', '.join(SHARE_NAMES)}, found {keys}"
    wrong = [f"{name}: expected {wanted[name]}, found {found[name]!r}" for name in SHARE_NAMES
             if found[name] != wanted[name]]
    return f"{what}: " + "; ".join(wrong) if wrong else None
