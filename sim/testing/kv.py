"""A reusable hypothesis state machine for any KV manager that follows the KV contract (sim/kv/base.py).

It admits sequences with a first chunk of random size (some with siblings to fork later, some with prompt token
ids so prefix caches get hits), grows random groups of sequences by random chunk sizes, forks, frees, runs
plain decode steps in bulk and, for managers with CPU swap space, swaps groups out and in, while a model tracks
each live sequence's token count and true final length. It knows nothing about blocks, so the same machine
checks the paged manager and the contiguous baselines. After every step:

- the manager's own `check_invariants()` passes;
- the memory breakdown covers the pool exactly (five non-negative counts summing to `num_slots`), and
  `slot_segments()` tells the same story slot by slot;
- `token_states` lies between the longest live sequence and the sum of all of them (sharing may count
  a prompt once; it can never count less than one whole sequence); a hybrid pool's bounds are given
  (`token_bounds`: a slot per KV cache group, none for K/V that left a sliding window);
- every refused action (`None`) left block tables, `num_free_blocks` and the breakdown unchanged;
- check-first answers (`can_allocate_slots`, `can_swap_*`) agree with what the action then does;
- a bulk decode run (the fast plane's arithmetic for the manager, sim.fast.runs.kv_runs: `max_decode_steps`,
  `advance_decodes`) equals stepping one token at a time, one allocate_slots per group of sequences, and is as long
  as stepping allows; asked with `waiting=True`, no step of it leaves more
  blocks free than at its start (and it is as long as that allows);
- every sequence has a table in each KV cache group (`windows`, `group_tables`), covering its tokens; a full-attention
  group's has no freed (None) entry, and a one-group manager's is its `block_table`.

    TestPaged = make_kv_manager_test(lambda: PagedKVManager(8, 4, enable_prefix_caching=True))
"""
from __future__ import annotations

import copy
import sys
from typing import Any, Callable

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ..fast.runs import kv_runs
from ..kv.base import NewSequence, cdiv
from .blocks import machine_settings

NUM_DOCUMENTS = 3  # prompts start with a prefix of one of these token streams, so prefix caches get hits


class KVManagerMachine(RuleBasedStateMachine):
    """Model: live sequence id -> [num_tokens, final_len, prompt_len]; siblings waiting to be forked; swapped ids."""

    factory: Callable[[], Any]  # builds the manager under test; set by make_kv_manager_test
    runs: Callable[[Any], Any]  # the manager's bulk decode arithmetic (sim.fast.runs.kv_runs); set there too
    token_bounds: Callable[[int], tuple[int, int]]  # (fewest, most) token-state slots of a sequence of n tokens

    def __init__(self) -> None:
        super().__init__()
        self.kv = type(self).factory()
        self.seqs: dict[int, list[int]] = {}
        self.forks: dict[int, list[int]] = {}  # seq id -> final lengths of siblings reserved at its admission
        self.swapped: set[int] = set()
        self.next_id = 0
        self.can_swap = self.kv.num_cpu_blocks > 0
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
        kv = self.kv
        tables = tuple((s, tuple(map(tuple, kv.group_tables(s))), kv.num_tokens(s)) for s in sorted(self.seqs))
        return tables, self.kv.num_free_blocks, self.kv.breakdown()

    def expect_unchanged(self, before: tuple, what: str) -> None:
        after = self.snapshot()
        assert after == before, f"{what} returned None, so it must change nothing:\n before {before}\n after  {after}"

    def chunk(self, data: st.DataObject, most: int, label: str) -> int:
        return data.draw(st.integers(0, min(most, 2 * self.kv.block_size + 1)), label=label)

    # --- rules ----------------------------------------------------------------------------------
    @rule(data=st.data(), siblings=st.integers(0, 2), with_ids=st.booleans())
    def admit(self, data: st.DataObject, siblings: int, with_ids: bool) -> None:
        prompt_len = data.draw(st.integers(1, max(1, self.max_len // 2)), label="prompt_len")
        final_len = st.integers(prompt_len, self.max_len)
        final, *forks = data.draw(st.lists(final_len, min_size=siblings + 1, max_size=siblings + 1), label="final_lens")
        token_ids = None
        if with_ids:
            doc = data.draw(st.integers(0, NUM_DOCUMENTS - 1), label="document")
            shared = data.draw(st.integers(0, prompt_len), label="shared prefix")
            tail = 1_000_000 * (self.next_id + 1)  # tokens after the shared prefix are this sequence's own
            token_ids = [doc * 10_000 + i for i in range(shared)] + [tail + i for i in range(shared, prompt_len)]
        cached = self.kv.get_computed_tokens(token_ids, prompt_len)
        assert 0 <= cached <= prompt_len - 1, f"get_computed_tokens: expected 0..{prompt_len - 1}, found {cached}"
        first = cached + self.chunk(data, prompt_len - cached, "first chunk")
        new = [NewSequence(prompt_len, final, token_ids, cached, tuple(forks))]
        seq_id = self.new_id()
        ok = self.kv.can_allocate_slots([seq_id], [first - cached], new)
        before = self.snapshot()
        allocation = self.kv.allocate_slots([seq_id], [first - cached], new)
        note(f"admit {seq_id}: prompt {prompt_len}, final {final}, forks {forks}, cached {cached}, "
             f"first chunk {first - cached} -> {allocation}")
        assert ok == (allocation is not None), f"can_allocate_slots said {ok} but allocate_slots returned {allocation}"
        if allocation is None:
            self.expect_unchanged(before, "allocate_slots (admission)")
            return
        assert allocation.copies == [], f"an admission copies nothing, found {allocation.copies}"
        self.seqs[seq_id] = [first, final, prompt_len]
        self.forks[seq_id] = list(forks)

    @precondition(lambda self: self.growable())
    @rule(data=st.data())
    def grow(self, data: st.DataObject) -> None:
        group = data.draw(st.lists(st.sampled_from(self.growable()), min_size=1, max_size=3, unique=True), label="seqs")
        counts = [self.chunk(data, self.seqs[s][1] - self.seqs[s][0], f"tokens for {s}") for s in group]
        ok = self.kv.can_allocate_slots(group, counts)
        before = self.snapshot()
        allocation = self.kv.allocate_slots(group, counts)
        note(f"allocate_slots({group}, {counts}) -> {allocation}")
        assert ok == (allocation is not None), f"can_allocate_slots said {ok} but allocate_slots returned {allocation}"
        if allocation is None:
            self.expect_unchanged(before, "allocate_slots")
            return
        for s, k in zip(group, counts):
            self.seqs[s][0] += k

    @precondition(lambda self: any(self.seqs[s][1] - self.seqs[s][0] >= 2 for s in self.growable()))
    @rule(data=st.data())
    def speculate(self, data: st.DataObject) -> None:
        """A verify step: each sequence of a group gets its fed token plus lookahead slots for drafts, then keeps a
        random number of them (rollback). The end state must be the one a plain allocation of the kept tokens gives
        (token counts, free blocks, breakdown), and a bad rollback or a growth before the rollback must raise."""
        roomy = [s for s in self.growable() if self.seqs[s][1] - self.seqs[s][0] >= 2]
        group = data.draw(st.lists(st.sampled_from(roomy), min_size=1, max_size=3, unique=True), label="seqs")
        drafts = [data.draw(st.integers(1, self.seqs[s][1] - self.seqs[s][0] - 1), label=f"drafts for {s}")
                  for s in group]
        ok = self.kv.can_allocate_slots(group, [1] * len(group), num_lookahead_tokens=drafts)
        before = self.snapshot()
        plain = copy.deepcopy(self.kv)  # where the same step without drafts would leave the pool
        allocation = self.kv.allocate_slots(group, [1] * len(group), num_lookahead_tokens=drafts)
        note(f"allocate_slots({group}, 1 each, num_lookahead_tokens={drafts}) -> {allocation}")
        assert ok == (allocation is not None), f"can_allocate_slots said {ok} but allocate_slots returned {allocation}"
        if allocation is None:
            self.expect_unchanged(before, "allocate_slots")
            return
        for s, d in zip(group, drafts):
            assert self.kv.num_tokens(s) == self.seqs[s][0] + 1 + d, "lookahead slots are the sequence's tokens"
        self.kv.check_invariants()  # the drafts' K/V are token states while they exist
        try:
            self.kv.allocate_slots(group[:1], [1])
            raise AssertionError("a sequence grew before its lookahead slots were rolled back")
        except RuntimeError:
            pass
        during = self.snapshot()
        for bad in (self.seqs[group[0]][0], self.seqs[group[0]][0] + 2 + drafts[0]):
            try:
                self.kv.rollback(group[0], bad)
                raise AssertionError(f"rollback({group[0]}, {bad}) was accepted")
            except ValueError:
                pass
            assert self.snapshot() == during, "a refused rollback changed the pool"
        kept = [data.draw(st.integers(0, d), label=f"accepted for {s}") for s, d in zip(group, drafts)]
        for s, a in zip(group, kept):
            self.kv.rollback(s, self.seqs[s][0] + 1 + a)
            self.seqs[s][0] += 1 + a
        note(f"rollback: accepted {kept}")
        if plain.allocate_slots(group, [1 + a for a in kept]) is not None:  # (the drafts' copies may have evicted)
            for s in group:
                assert self.kv.num_tokens(s) == plain.num_tokens(s)
            assert (self.kv.num_free_blocks, self.kv.breakdown()) == (plain.num_free_blocks, plain.breakdown()), (
                f"after rollback: free {self.kv.num_free_blocks}, {self.kv.breakdown()}; a plain allocation of the "
                f"kept tokens: free {plain.num_free_blocks}, {plain.breakdown()}")

    @precondition(lambda self: self.on_gpu())
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent = data.draw(st.sampled_from(self.on_gpu()), label="parent")
        num_tokens, final_len, prompt_len = self.seqs[parent]
        reserved = [f for f in self.forks[parent] if f >= num_tokens]
        choice = st.sampled_from(reserved) if reserved else st.integers(max(num_tokens, prompt_len), final_len)
        child_final = data.draw(choice, label="child final_len")
        child = self.new_id()
        before = self.snapshot()
        copies = self.kv.fork(parent, child, child_final)
        note(f"fork({parent} -> {child}, final_len={child_final}) -> copies {copies}")
        if copies is None:
            assert not reserved, "a fork into a run reserved at admission cannot run out of memory"
            self.expect_unchanged(before, "fork")
            return
        if child_final in self.forks[parent]:
            self.forks[parent].remove(child_final)
        self.seqs[child] = [num_tokens, child_final, prompt_len]
        self.forks[child] = []

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.seqs)), label="seq")
        self.kv.free(seq_id)
        note(f"free({seq_id}){' (swapped out)' if seq_id in self.swapped else ''}")
        del self.seqs[seq_id], self.forks[seq_id]
        self.swapped.discard(seq_id)

    @precondition(lambda self: self.growable())
    @rule(data=st.data(), waiting=st.booleans())
    def decode_run(self, data: st.DataObject, waiting: bool) -> None:
        """max_decode_steps + advance_decodes equal stepping k times, each step one allocate_slots(group, [1, ...]) per
        group of sequences in order, and k is all that stepping allows without a copy (or up to the limit); with
        `waiting`, no step leaves more blocks free than at the start, and k is all that allows."""
        ids = data.draw(st.lists(st.sampled_from(self.growable()), min_size=1, max_size=4, unique=True), label="seqs")
        cuts = data.draw(st.lists(st.booleans(), min_size=len(ids) - 1, max_size=len(ids) - 1), label="group cuts")
        groups = [[ids[0]]]  # as a step allocates them: one allocate_slots per group (the scheduler's requests)
        for seq_id, cut in zip(ids[1:], cuts):
            if cut:
                groups.append([])
            groups[-1].append(seq_id)
        room = min(self.seqs[s][1] - self.seqs[s][0] for s in ids)
        limit = data.draw(st.integers(1, room), label="limit")
        free = self.kv.num_free_blocks
        runs = type(self).runs(self.kv)
        k = runs.max_decode_steps(groups, limit, waiting)
        assert 0 <= k <= limit, f"max_decode_steps: expected 0..{limit}, found {k}"
        stepped = copy.deepcopy(self.kv)

        def step(kv) -> bool:  # one step as the caller allocates it; False where it needs a copy or finds no memory
            for group in groups:
                allocation = kv.allocate_slots(group, [1] * len(group))
                if allocation is None or allocation.copies:
                    return False
            return True

        expected = []
        for j in range(k):
            assert step(stepped), f"step {j + 1} of a run of {k}: expected room and no copy"
            assert not waiting or stepped.num_free_blocks <= free, (
                f"max_decode_steps(waiting=True) allowed {k} steps, but step {j + 1} leaves "
                f"{stepped.num_free_blocks} blocks free, more than the {free} at the start")
            expected.append(stepped.breakdown().counts())
        if k < limit:  # the run stops where stepping needs a copy, finds no memory, or (waiting) frees more
            one_more = copy.deepcopy(stepped)
            fits = step(one_more) and not (waiting and one_more.num_free_blocks > free)
            assert not fits, f"max_decode_steps said {k} < {limit}, but step {k + 1} fits"
        if k == 0:
            return
        found = runs.advance_decodes(groups, k)
        note(f"advance_decodes({groups}, {k}){' (waiting)' if waiting else ''}")
        assert found == expected, f"advance_decodes counts: expected {expected}, found {found}"
        for s in ids:
            assert self.kv.group_tables(s) == stepped.group_tables(s), f"seq {s}: tables differ from stepping"
            self.seqs[s][0] += k

    @precondition(lambda self: self.can_swap and self.on_gpu())
    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        group = data.draw(st.lists(st.sampled_from(self.on_gpu()), min_size=1, max_size=3, unique=True), label="seqs")
        ok = self.kv.can_swap_out(group)
        self._swap(group, ok, out=True)

    @precondition(lambda self: self.can_swap and self.swapped)
    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        swapped = st.sampled_from(sorted(self.swapped))
        group = data.draw(st.lists(swapped, min_size=1, max_size=3, unique=True), label="seqs")
        counts = [self.chunk(data, self.seqs[s][1] - self.seqs[s][0], f"tokens after swap-in for {s}") for s in group]
        ok = self.kv.can_swap_in(group, counts)
        self._swap(group, ok, out=False)
        if ok:  # can_swap_in promised room for the growth too
            allocation = self.kv.allocate_slots(group, counts)
            assert allocation is not None, f"can_swap_in({group}, {counts}) was True, but the growth found no room"
            for s, k in zip(group, counts):
                self.seqs[s][0] += k

    def _swap(self, group: list[int], ok: bool, out: bool) -> None:
        name = "swap_out" if out else "swap_in"
        before = self.snapshot()
        tables_before = {b for s in group for b in self.kv.block_table(s)}
        copies = getattr(self.kv, name)(group)
        note(f"{name}({group}) -> copies {copies}")
        if copies is None:  # NOTE: can_swap_in also asks room for the growth after it, so only True binds
            assert not ok, f"can_{name} said True but {name} returned None"
            self.expect_unchanged(before, name)
            return
        if out:
            assert ok, f"can_swap_out said False but swap_out returned {copies}"
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
        self.forks.clear()
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
        counts = list(b.counts())
        assert min(counts) >= 0 and b.total == kv.num_slots, f"breakdown must split {kv.num_slots} slots, found {b}"
        # 1e-9: five float divisions of integers, each off by at most one ulp
        assert abs(sum(b.shares().values()) - 1.0) < 1e-9, f"shares sum to {sum(b.shares().values())}"
        waiting = kv.breakdown(waiting=True)
        assert waiting == b.with_waiting(), f"breakdown(waiting=True): expected {b.with_waiting()}, found {waiting}"
        by_kind = [0] * 5
        for _, lo, hi, kind in kv.slot_segments():
            by_kind[kind] += hi - lo
        by_kind[4] = kv.num_slots - sum(by_kind[:4])
        assert by_kind == counts, f"slot_segments count {by_kind}, the breakdown {counts}"
        windows = kv.windows
        assert len(windows) >= 1, f"windows: expected one per KV cache group, found {windows}"
        for seq_id, (num_tokens, _, _) in self.seqs.items():
            found = kv.num_tokens(seq_id)
            assert found == num_tokens, f"sequence {seq_id}: expected {num_tokens} tokens, found {found}"
            tables = kv.group_tables(seq_id)
            assert len(tables) == len(windows) and all(len(t) == cdiv(num_tokens, size) for t in tables), (
                f"sequence {seq_id}: expected {len(windows)} group table(s) of {cdiv(num_tokens, size)} entries for "
                f"{num_tokens} tokens, found {tables}")
            assert all(None not in t for t, w in zip(tables, windows) if w is None), (
                f"sequence {seq_id}: a full-attention group's table frees nothing, found {tables}")
            assert len(windows) > 1 or tables == [kv.block_table(seq_id)], (
                f"sequence {seq_id}: one group's table is the block table {kv.block_table(seq_id)}, found {tables}")
        bounds = [type(self).token_bounds(self.seqs[s][0]) for s in self.on_gpu()]
        low, high = max((lo for lo, _ in bounds), default=0), sum(hi for _, hi in bounds)
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
    factory: Callable[[], Any], max_examples: int = 500, stateful_step_count: int = 30, derandomize: bool = True,
    token_bounds: Callable[[int], tuple[int, int]] | None = None, runs: Callable[[Any], Any] = kv_runs,
) -> type:
    """A unittest.TestCase class running `KVManagerMachine` on managers built by `factory()`.

    `token_bounds(n)`: the fewest and the most token-state slots a sequence of n tokens accounts for (default n and n;
    a hybrid pool counts a slot per KV cache group, and none for K/V out of a sliding window). `runs(kv)`: the bulk
    decode arithmetic the decode_run rule checks (default: the fast plane's for the manager).
    Assign the result to a module-level name starting with `Test` so pytest collects it.
    """
    bounds = staticmethod(token_bounds or (lambda n: (n, n)))
    machine = type("KVManagerMachine", (KVManagerMachine,), {"factory": staticmethod(factory), "token_bounds": bounds,
                                                             "runs": staticmethod(runs)})
    machine.TestCase.settings = machine_settings(max_examples, stateful_step_count, derandomize)
    return machine.TestCase
