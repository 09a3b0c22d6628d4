"""The property checks of lab `block_table_attention`: random decode batches, each step against the project's code.

Each check draws a batch (`_paged_batches`: shuffled physical blocks, spare blocks, NaN in every slot that holds
no token, GQA) and runs the student's three methods in the order a decode step does, each judged on its own:

    slot_mapping    every sequence in two calls (its first tokens, then the rest), against the slot mapping
                    the engine builds (reference.engine.batch.ForwardBatch)
    store_kv        every sequence's K/V into NaN caches, against the caches `store_kv_ref` fills; the caches
                    are drawn as separate arrays or as the two halves of one [num_blocks, 2, block_size, ...] array
                    (FlashInfer's layout: views that are NOT contiguous in memory, so a store that writes through
                    a reshape() of the cache writes into a copy)
    decode_attention on the oracle's caches, against `paged_decode_attention_ref`

Shapes: "model" (small batches, every GQA ratio), "rule" (scores in the thousands: exp() overflows, in float32
and in float64, unless the softmax subtracts the max first), "long" (contexts of 20 to 160 tokens).
"""
from __future__ import annotations

import unittest
from typing import Any, Callable

import numpy as np
from hypothesis import given, note, settings
from hypothesis import strategies as st

from sim.exercises.referee import NO_RULES, Referee
from sim.testing.blocks import machine_settings

from ._paged_batches import (
    PagedBatch,
    Shape,
    compare_output,
    oracle_caches,
    oracle_output,
    paged_batches,
    single_threaded,
    slots_of,
    tell,
)

SHAPES = {
    "model": Shape((1, 2, 3, 4, 8), (1, 2, 3), (1, 2, 3), (1, 2, 4, 8), (1, 4), (1, 20)),
    "rule": Shape((2, 4), (1, 3), (1, 3), (4, 8), (1, 3), (2, 12), logit_scale=1000.0),
    "long": Shape((4, 8, 16), (1, 3), (1, 3), (8, 16), (2, 6), (20, 160)),
}
# NOTE: the oracle computes in float32; a student's numpy may sum in float64 or in another order. Ordinary scores
# agree to ~1e-6. Scores in the thousands carry float32 rounding of ~1e-4 into the softmax weights.
TOL = {"model": (1e-4, "float32, summed in another order"), "rule": (2e-3, "float32 rounding of scores near 1000"),
       "long": (1e-4, "float32, summed in another order")}


def check_slots(student: Any, b: PagedBatch) -> None:
    for i, table in enumerate(b.block_tables):
        expected, n = slots_of(b, i), b.seq_lens[i]
        cut = (n + 1) // 2
        for positions in (list(range(cut)), list(range(cut, n))):
            if not positions:
                continue
            found = student.slot_mapping(list(table), positions)
            try:
                found = [int(s) for s in found]
            except (TypeError, ValueError):
                pass
            want = expected[positions[0] : positions[-1] + 1]
            if found != want:
                raise AssertionError(f"slot_mapping({table}, {positions}) (seq {i}, block_size {b.block_size}): "
                                     f"expected {want}, found {found}")


def _empty_caches(b: PagedBatch, interleaved: bool) -> tuple[np.ndarray, np.ndarray]:
    """NaN caches [num_blocks, block_size, num_kv_heads, head_dim]: two arrays, or (`interleaved`) the K and V halves
    of one array [num_blocks, 2, block_size, num_kv_heads, head_dim], views not contiguous in memory."""
    shape = (b.num_blocks, b.block_size, b.num_kv_heads, b.head_dim)
    if not interleaved:
        return np.full(shape, np.nan, np.float32), np.full(shape, np.nan, np.float32)
    kv = np.full((b.num_blocks, 2, *shape[1:]), np.nan, np.float32)
    return kv[:, 0], kv[:, 1]


NOT_CONTIGUOUS = ("the caches are key_cache = kv[:, 0], value_cache = kv[:, 1] of one array kv [num_blocks, 2, "
                  "block_size, num_kv_heads, head_dim] (FlashInfer's layout), so NOT contiguous in memory: store "
                  "through them in place (cache[block, offset] = ...); reshape() of such an array returns a copy, "
                  "and a write into the copy is lost")


def check_store(student: Any, b: PagedBatch, interleaved: bool = False) -> tuple[Any, Any]:
    """The student stores every sequence into NaN caches (`interleaved`: views not contiguous in memory); they must
    equal the oracle's. Returns the oracle's."""
    expected = oracle_caches(b)
    found = _empty_caches(b, interleaved)
    for i in range(len(b.seq_lens)):
        student.store_kv(found[0], found[1], b.keys[i].copy(), b.values[i].copy(), slots_of(b, i))
    owners = {s: (i, p) for i in range(len(b.seq_lens)) for p, s in enumerate(slots_of(b, i))}
    pairs = (("key_cache", found[0], expected[0].numpy()), ("value_cache", found[1], expected[1].numpy()))
    for name, got, want in pairs:
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        bad = np.argwhere(~same.all(axis=3))
        if len(bad):
            block, offset, head = bad[0]
            slot = int(block) * b.block_size + int(offset)
            what = "token {1} of seq {0}".format(*owners[slot]) if slot in owners else "no token (it must stay NaN)"
            lost = interleaved and np.isnan(got[block, offset, head]).all()
            raise AssertionError(f"after store_kv of every sequence: {name}[{block}, {offset}, {head}] (slot {slot}, "
                                 f"KV head {head}) holds {what}: expected {_vec(want[block, offset, head])}, "
                                 f"found {_vec(got[block, offset, head])}"
                                 + (f" ({NOT_CONTIGUOUS})" if lost else ""))
    return expected


def check_decode(student: Any, b: PagedBatch, caches: tuple[Any, Any], shape: str, interleaved: bool = False
                 ) -> None:
    expected = oracle_output(b, *caches)
    call = (f"decode_attention(query {list(b.query.shape)}, caches {list(caches[0].shape)}, block_tables "
            f"{b.block_tables}, seq_lens {b.seq_lens}, scale {b.scale:.4g})")
    key_cache, value_cache = _empty_caches(b, interleaved)  # the same layout the store wrote into
    key_cache[...], value_cache[...] = caches[0].numpy(), caches[1].numpy()
    found = student.decode_attention(b.query.copy(), key_cache, value_cache, [list(t) for t in b.block_tables],
                                     list(b.seq_lens), b.scale)
    compare_output(call, b, found, expected, *TOL[shape])


def _vec(v: np.ndarray) -> str:
    return "[" + ", ".join(f"{x:.4g}" for x in v) + "]"


def batch_check(shape: str) -> Callable[[Callable[..., Any], int, int], type]:
    def build(make: Callable[..., Any], max_examples: int, steps: int) -> type:
        @settings(machine_settings(max_examples, steps), report_multiple_bugs=False)
        @given(b=paged_batches(SHAPES[shape]), interleaved=st.booleans())
        def run_test(self: unittest.TestCase, b: PagedBatch, interleaved: bool) -> None:
            tell(b)
            if interleaved:
                note("the caches: key_cache = kv[:, 0], value_cache = kv[:, 1] of one array kv [num_blocks, 2, "
                     "block_size, num_kv_heads, head_dim] (not contiguous in memory)")
            student = Referee(make(b.block_size), NO_RULES)
            check_slots(student, b)
            caches = check_store(student, b, interleaved)
            check_decode(student, b, caches, shape, interleaved)

        return single_threaded(f"BlockTableAttention_{shape}", run_test)

    return build
