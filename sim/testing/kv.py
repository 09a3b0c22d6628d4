"""A reusable hypothesis state machine for any KV manager that follows the `sim.kv.base.KVManager` protocol.

It admits sequence groups (1-3 sequences sharing a prompt), grows sequences, forks them, frees them and,
for managers with CPU swap space, swaps groups out and in, while a model tracks each live sequence's
token count and true final length. It knows nothing about blocks, so the same machine checks the paged
manager and the contiguous baselines. After every step:

- the manager's own `check_invariants()` passes;
- the memory breakdown covers the pool exactly (five non-negative counts summing to `num_slots`);
- `token_states` lies between the longest live sequence and the sum of all of them (sharing may count
  a prompt once; it can never count less than one whole sequence);
- every refused action (`None`) left block tables, `num_free_blocks` and the breakdown unchanged;
- check-first answers (`can_admit`, `can_append`, `can_swap_*`) agree with what the action then does.

    TestPaged = make_kv_manager_test(lambda: PagedKVManager(8, 4, enable_prefix_caching=True))
"""
from __future__ import annotations

import sys
from typing import Any, Callable

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from .blocks import machine_settings

NUM_DOCUMENTS = 3  # prompts start with a prefix of one of these token streams, so prefix caches get hits


class KVManagerMachine(RuleBasedStateMachine):
    """Model: live sequence id -> [num_tokens, final_len], and which sequences are swapped out."""

    factory: Callable[[], Any]  # builds the manager under test; set by make_kv_manager_test

    def __init__(self) -> None:
        super().__init__()
        self.kv = type(self).factory()
        self.seqs: dict[int, list[int]] = {}
        self.swapped: set[int] = set()
        self.next_id = 0
        self.can_swap = hasattr(self.kv, "swap_out") and getattr(self.kv, "num_cpu_blocks", 0) > 0
        self.max_len = max(2, min(self.kv.num_slots, getattr(self.kv, "max_seq_len", None) or self.kv.num_slots))
        note(f"start: {self.kv!r}, policy {self.kv.policy}, {self.kv.num_slots} slots")

    # --- helpers --------------------------------------------------------------------------------
    def on_gpu(self) -> list[int]:
        return [s for s in self.seqs if s not in self.swapped]

    def growable(self) -> list[int]:
        return [s for s in self.on_gpu() if self.seqs[s][0] < self.seqs[s][1]]

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def snapshot(self) -> tuple:
        tables = tuple((s, tuple(self.kv.block_table(s)), self.kv.num_tokens(s)) for s in sorted(self.seqs))
        return tables, self.kv.num_free_blocks, self.kv.breakdown()

    def expect_unchanged(self, before: tuple, what: str) -> None:
        after = self.snapshot()
        assert after == before, f"{what} returned None, so it must change nothing:\n before {before}\n after  {after}"

    # --- rules ----------------------------------------------------------------------------------
    @rule(data=st.data(), n=st.integers(1, 3), with_ids=st.booleans())
    def admit(self, data: st.DataObject, n: int, with_ids: bool) -> None:
        prompt_len = data.draw(st.integers(1, max(1, self.max_len // 2)), label="prompt_len")
        final_len = st.integers(prompt_len, self.max_len)
        final_lens = data.draw(st.lists(final_len, min_size=n, max_size=n), label="final_lens")
        token_ids = None
        if with_ids:
            doc = data.draw(st.integers(0, NUM_DOCUMENTS - 1), label="document")
            shared = data.draw(st.integers(0, prompt_len), label="shared prefix")
            tail = 1_000_000 * (self.next_id + 1)  # tokens after the shared prefix are this request's own
            token_ids = [doc * 10_000 + i for i in range(shared)] + [tail + i for i in range(shared, prompt_len)]
        ok = self.kv.can_admit(prompt_len, final_lens, token_ids)
        before = self.snapshot()
        seq_ids = [self.new_id() for _ in range(n)]
        cached = self.kv.admit(seq_ids, prompt_len, final_lens, token_ids)
        note(f"admit({seq_ids}, prompt_len={prompt_len}, final_lens={final_lens}) -> cached {cached}")
        assert ok == (cached is not None), f"can_admit said {ok} but admit returned {cached}"
        if cached is None:
            self.expect_unchanged(before, "admit")
            return
        assert 0 <= cached <= prompt_len - 1, f"admit: expected 0..{prompt_len - 1} cached tokens, found {cached}"
        for seq_id, final_len in zip(seq_ids, final_lens):
            self.seqs[seq_id] = [prompt_len, final_len]

    @precondition(lambda self: self.growable())
    @rule(data=st.data())
    def append(self, data: st.DataObject) -> None:
        seq_id = data.draw(st.sampled_from(self.growable()), label="seq")
        num_tokens, final_len = self.seqs[seq_id]
        k = data.draw(st.integers(1, min(final_len - num_tokens, 2 * self.kv.block_size + 1)), label="num_tokens")
        ok = self.kv.can_append(seq_id, k)
        before = self.snapshot()
        copies = self.kv.append_slots(seq_id, k)
        note(f"append_slots({seq_id}, {k}) at {num_tokens} tokens -> copies {copies}")
        assert ok == (copies is not None), f"can_append said {ok} but append_slots returned {copies}"
        if copies is None:
            self.expect_unchanged(before, "append_slots")
            return
        self.seqs[seq_id][0] += k

    @precondition(lambda self: self.on_gpu())
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent = data.draw(st.sampled_from(self.on_gpu()), label="parent")
        num_tokens, final_len = self.seqs[parent]
        child_final = data.draw(st.integers(num_tokens, final_len), label="child final_len")
        child = self.new_id()
        before = self.snapshot()
        copies = self.kv.fork(parent, child, child_final)
        note(f"fork({parent} -> {child}, final_len={child_final}) -> copies {copies}")
        if copies is None:
            self.expect_unchanged(before, "fork")
            return
        self.seqs[child] = [num_tokens, child_final]

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.seqs)), label="seq")
        self.kv.free(seq_id)
        note(f"free({seq_id}){' (swapped out)' if seq_id in self.swapped else ''}")
        del self.seqs[seq_id]
        self.swapped.discard(seq_id)

    @precondition(lambda self: self.can_swap and self.on_gpu())
    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        group = data.draw(st.lists(st.sampled_from(self.on_gpu()), min_size=1, max_size=3, unique=True), label="seqs")
        self._swap(group, out=True)

    @precondition(lambda self: self.can_swap and self.swapped)
    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        swapped = st.sampled_from(sorted(self.swapped))
        group = data.draw(st.lists(swapped, min_size=1, max_size=3, unique=True), label="seqs")
        self._swap(group, out=False)

    def _swap(self, group: list[int], out: bool) -> None:
        name = "swap_out" if out else "swap_in"
        ok = getattr(self.kv, "can_" + name)(group)
        before = self.snapshot()
        tables_before = {b for s in group for b in self.kv.block_table(s)}
        copies = getattr(self.kv, name)(group)
        note(f"{name}({group}) -> copies {copies}")
        assert ok == (copies is not None), f"can_{name} said {ok} but {name} returned {copies}"
        if copies is None:
            self.expect_unchanged(before, name)
            return
        tables_after = {b for s in group for b in self.kv.block_table(s)}
        srcs, dsts = {src for src, _ in copies}, {dst for _, dst in copies}
        assert len(copies) == len(srcs) == len(dsts), f"{name}: each block must be copied once, found {copies}"
        assert srcs == tables_before and dsts == tables_after, (
            f"{name}: expected copies from exactly {sorted(tables_before)} to exactly {sorted(tables_after)}, "
            f"found {copies}"
        )
        for s in group:
            assert self.kv.is_swapped(s) == out, f"{name}: is_swapped({s}) expected {out}"
            (self.swapped.add if out else self.swapped.discard)(s)

    @precondition(lambda self: self.seqs)
    @rule()
    def free_everything(self) -> None:
        note(f"free everything: {sorted(self.seqs)}")
        self.release_all()

    def release_all(self) -> None:
        for seq_id in sorted(self.seqs):
            self.kv.free(seq_id)
        self.seqs.clear()
        self.swapped.clear()
        kv, b = self.kv, self.kv.breakdown()
        free = kv.num_free_blocks
        assert free == kv.num_blocks, f"all freed: expected {kv.num_blocks} free blocks, found {free}"
        assert b.free == kv.num_slots, f"all freed: expected breakdown.free == {kv.num_slots}, found {b}"

    # --- invariants -----------------------------------------------------------------------------
    @invariant()
    def memory_adds_up(self) -> None:
        kv = self.kv
        kv.check_invariants()
        n, size, free = kv.num_blocks, kv.block_size, kv.num_free_blocks
        assert kv.num_slots == n * size, f"num_slots: expected {n} x {size}, found {kv.num_slots}"
        assert 0 <= free <= n, f"num_free_blocks: expected 0..{n}, found {free}"
        b = kv.breakdown()
        counts = [b.token_states, b.reservation, b.internal_fragmentation, b.external_fragmentation, b.free]
        assert min(counts) >= 0 and b.total == kv.num_slots, f"breakdown must split {kv.num_slots} slots, found {b}"
        # 1e-9: five float divisions of integers, each off by at most one ulp
        assert abs(sum(b.shares().values()) - 1.0) < 1e-9, f"shares sum to {sum(b.shares().values())}"
        waiting = kv.breakdown(waiting=True)
        assert waiting == b.with_waiting(), f"breakdown(waiting=True): expected {b.with_waiting()}, found {waiting}"
        for seq_id, (num_tokens, _) in self.seqs.items():
            found = kv.num_tokens(seq_id)
            assert found == num_tokens, f"sequence {seq_id}: expected {num_tokens} tokens, found {found}"
        lengths = [self.seqs[s][0] for s in self.on_gpu()]
        low, high = max(lengths, default=0), sum(lengths)
        assert low <= b.token_states <= high, (
            f"token_states: expected between {low} (longest live sequence) and {high} (all of them), "
            f"found {b.token_states}"
        )

    def teardown(self) -> None:
        # NOTE: as in BlockAllocatorMachine, check the final release only when no step has failed.
        if sys.exc_info()[0] is None:
            self.release_all()
            self.kv.check_invariants()


def make_kv_manager_test(
    factory: Callable[[], Any], max_examples: int = 500, stateful_step_count: int = 30, derandomize: bool = True
) -> type:
    """A unittest.TestCase class running `KVManagerMachine` on managers built by `factory()`.

    Assign the result to a module-level name starting with `Test` so pytest collects it.
    """
    machine = type("KVManagerMachine", (KVManagerMachine,), {"factory": staticmethod(factory)})
    machine.TestCase.settings = machine_settings(max_examples, stateful_step_count, derandomize)
    return machine.TestCase
