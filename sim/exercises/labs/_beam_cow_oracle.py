"""The oracle of lab `beam_cow`: each beam's true token list, kept beside the student's block tables (`Beams`),
and what must hold after every call (`audit`): each beam read back through its table equals its true tokens, and
every block's reference count equals the number of tables holding it.

The narrated examples (beam_cow.py) and the random programs (_beam_cow_machines.py) both drive the student's class
through `Beams`. The module's name starts with "_", so the lab loader does not take it for a lab.
"""
from __future__ import annotations

from typing import Any

from ..report import Story


def read_back(obj: Any, beam: int) -> list:
    """The beam's tokens, read through its block table from the fake KV store."""
    table, bs = obj.block_tables[beam], obj.block_size
    return [obj.kv[table[i // bs]][i % bs] for i in range(obj.num_tokens[beam])]


def audit(obj: Any, truth: dict[int, list[int]]) -> str | None:
    """None if the student's tables and the allocator agree with the true token lists, else what broke."""
    if sorted(obj.block_tables) != sorted(truth):
        return f"live beams: expected {sorted(truth)}, found {sorted(obj.block_tables)}"
    owners: dict[int, int] = {}
    for beam, tokens in truth.items():
        table, bs = obj.block_tables[beam], obj.block_size
        if obj.num_tokens[beam] != len(tokens) or len(table) != -(-len(tokens) // bs):
            return (f"beam {beam}: expected {len(tokens)} tokens in {-(-len(tokens) // bs)} block(s), found "
                    f"num_tokens {obj.num_tokens[beam]} and block table {table}")
        found = read_back(obj, beam)
        if found != tokens:
            return f"beam {beam} read back through its block table {table}: expected {tokens}, found {found}"
        for b in table:
            owners[b] = owners.get(b, 0) + 1
    alloc = obj.allocator
    for b in range(alloc.num_blocks):
        if alloc.ref_count(b) != owners.get(b, 0):
            return (f"ref_count({b}): expected {owners.get(b, 0)} (the block tables holding it), "
                    f"found {alloc.ref_count(b)}")
    return None


class Beams:
    """The student's tables and the true token lists, driven together by a story or a random program."""

    def __init__(self, obj: Any, t: Story | None = None) -> None:
        self.obj, self.t, self.truth = obj, t, {}

    def _call(self, method: str, *args: Any) -> Any:
        return self.t.do(self.obj, method, *args) if self.t else getattr(self.obj, method)(*args)

    def _check(self, after: str) -> None:
        problem = audit(self.obj, self.truth)
        if problem:
            raise AssertionError(f"after {after}: {problem}")

    def new_beam(self, beam: int, tokens: list[int]) -> None:
        self._call("new_beam", beam)
        self.truth[beam] = []
        for token in tokens:
            self.append(beam, token)

    def fork(self, parent: int, child: int) -> None:
        free = self.obj.allocator.num_free_blocks
        self._call("fork", parent, child)
        self.truth[child] = list(self.truth[parent])
        self._check(f"fork({parent}, {child})")
        if self.obj.allocator.num_free_blocks != free:
            raise AssertionError(f"fork({parent}, {child}): a fork takes no block: expected {free} free blocks, "
                                 f"found {self.obj.allocator.num_free_blocks}")

    def append(self, beam: int, token: int) -> int | None:
        obj, bs = self.obj, self.obj.block_size
        n, table, free = len(self.truth[beam]), list(obj.block_tables[beam]), obj.allocator.num_free_blocks
        shared = n % bs and obj.allocator.ref_count(table[-1]) > 1
        need = 1 if n % bs == 0 or shared else 0
        call = f"append_slot({beam}, {token})"
        slot = self._call("append_slot", beam, token)
        if need > free:
            if slot is not None or list(obj.block_tables[beam]) != table:
                raise AssertionError(f"{call} with no free block: expected None and nothing changed, found {slot!r} "
                                     f"and block table {obj.block_tables[beam]}")
            self._check(f"the refused {call}")
            return None
        self.truth[beam].append(token)
        self._check(call)
        after = list(obj.block_tables[beam])  # a table may be any sequence (a tuple, say): the spec fixes its contents
        if after[: n // bs] != table[: n // bs]:
            raise AssertionError(f"{call}: a full block is never copied or moved: expected the table to start with "
                                 f"{table[: n // bs]}, found {after}")
        used = free - obj.allocator.num_free_blocks
        if used != need:
            why = "a new block" if n % bs == 0 else ("a copy of the shared last block" if shared else "no new block")
            raise AssertionError(f"{call} with {n} tokens ({'shared' if shared else 'own'} last block): needs {why}; "
                                 f"expected {need} block(s) taken, found {used}")
        expected_slot = after[n // bs] * bs + n % bs
        if slot != expected_slot:
            raise AssertionError(f"{call}: expected the slot written, {after[n // bs]} * {bs} + {n % bs} = "
                                 f"{expected_slot}, found {slot!r}")
        return slot

    def free(self, beam: int) -> None:
        self._call("free", beam)
        del self.truth[beam]
        self._check(f"free({beam})")
        if not self.truth and self.obj.allocator.num_free_blocks != self.obj.allocator.num_blocks:
            raise AssertionError(f"free({beam}), the last beam: no block may leak: expected "
                                 f"{self.obj.allocator.num_blocks} free blocks, found "
                                 f"{self.obj.allocator.num_free_blocks}")
