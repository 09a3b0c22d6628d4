"""The property checks of lab `triton_decode`: tiny random decode batches, the student's kernel against the
project's torch oracle.

Each check draws a batch (`_paged_batches`: shuffled physical blocks, spare blocks, NaN in every slot that holds
no token, GQA), fills the caches with the project's `store_kv_ref`, and compares with `paged_decode_attention_ref`
first the student's `online_softmax_step` folding sequence 0's blocks on the host, then their kernel (through
the given launch wrapper `forward`).

Shapes: "model" (block sizes 1 to 4, a power of two or not, up to 2 sequences and 4 query heads), "rule" (scores
in the thousands: exp() overflows unless the running max is subtracted), "long" (17 to 40 tokens: many blocks,
so the running max is raised and the sums rescaled many times). Every batch is tiny: Triton's CPU interpreter
is slow. The lab (triton_decode.py) passes in how many batches a check may run (its CAPS) and where the tensors go
(its `device`).
"""
from __future__ import annotations

import unittest
from typing import Any, Callable

import numpy as np
from hypothesis import given, settings

from sim.exercises.referee import NO_RULES, Referee
from sim.testing.blocks import machine_settings

from ._paged_batches import (
    PagedBatch,
    Shape,
    compare_output,
    oracle_caches,
    oracle_output,
    padded_tables,
    paged_batches,
    single_threaded,
    tell,
)

SHAPES = {
    "model": Shape((1, 2, 3, 4), (1, 2), (1, 2), (2, 4), (1, 2), (1, 6)),
    "rule": Shape((2, 4), (1,), (1, 2), (4,), (1, 1), (2, 8), logit_scale=1000.0),
    "long": Shape((4, 8), (1,), (1, 2), (4,), (1, 2), (17, 40)),
}
# NOTE: the kernel and the oracle both compute in float32, in a different order (block by block, rescaled):
# ordinary scores agree to ~1e-6; scores in the thousands carry float32 rounding of ~1e-4 into the weights.
TOL = {"model": (1e-4, "float32, summed in another order"), "rule": (2e-3, "float32 rounding of scores near 1000"),
       "long": (1e-4, "float32, summed in another order")}


def fold_on_host(student: Any, b: PagedBatch, expected: np.ndarray, shape: str) -> None:
    """The student's online_softmax_step, folding sequence 0's blocks for query head 0, must end at the oracle's."""
    keys, values = b.keys[0][:, 0].astype(np.float64), b.values[0][:, 0].astype(np.float64)
    scores = keys @ b.query[0, 0].astype(np.float64) * b.scale
    bs, dim = b.block_size, b.head_dim
    state = (float("-inf"), 0.0, np.zeros(dim))
    for start in range(0, len(scores), bs):
        state = student.online_softmax_step(*state, scores[start : start + bs], values[start : start + bs])
        if not (isinstance(state, (tuple, list)) and len(state) == 3):  # a list of the three is the same answer
            raise AssertionError(f"online_softmax_step returned {state!r}: expected the three values (m, l, acc)")
    found = np.asarray(state[2], dtype=np.float64) / state[1]
    tol, why = TOL[shape]
    if not np.allclose(found, expected[0, 0], rtol=tol, atol=tol):
        raise AssertionError(f"online_softmax_step, folding seq 0's {-(-len(scores) // bs)} blocks of {bs} for query "
                             f"head 0: acc / l: expected {_vec(expected[0, 0])}, found {_vec(found)} [tolerance "
                             f"{tol:g}: {why}]")


def _vec(v: np.ndarray) -> str:
    return "[" + ", ".join(f"{x:.4g}" for x in v) + "]"


def run_batch(student: Any, b: PagedBatch, shape: str, on: str) -> None:
    """The batch `b` through the student's host step and kernel, its tensors on device `on` ("cuda" or "cpu")."""
    import torch

    key_cache, value_cache = oracle_caches(b)
    expected = oracle_output(b, key_cache, value_cache)
    fold_on_host(student, b, expected, shape)
    tables = padded_tables(b)
    call = (f"forward(query {list(b.query.shape)}, caches {list(key_cache.shape)}, block_tables "
            f"{tables.tolist()}, seq_lens {b.seq_lens}, scale {b.scale:.4g})")
    out = student.forward(torch.from_numpy(b.query.copy()).to(on), key_cache.to(on), value_cache.to(on),
                          tables.to(on), torch.tensor(b.seq_lens, dtype=torch.int32, device=on), b.scale)
    compare_output(call, b, out.cpu() if hasattr(out, "cpu") else out, expected, *TOL[shape])


def batch_check(shape: str, cap: int, device: Callable[[], str]) -> Callable[[Callable[..., Any], int, int], type]:
    """A builder of the check `shape`: at most `cap` batches, whatever max_examples asks, on the device that
    `device()` names."""

    def build(make: Callable[..., Any], max_examples: int, steps: int) -> type:
        @settings(machine_settings(min(max_examples, cap), steps), report_multiple_bugs=False)
        @given(b=paged_batches(SHAPES[shape]))
        def run_test(self: unittest.TestCase, b: PagedBatch) -> None:
            tell(b)
            run_batch(Referee(make(), NO_RULES), b, shape, device())

        return single_threaded(f"TritonDecode_{shape}", run_test)

    return build
