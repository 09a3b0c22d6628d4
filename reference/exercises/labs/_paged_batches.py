"""Random decode batches over a paged KV cache, and the project's torch oracle, for the two attention labs.

Labs `block_table_attention` (numpy) and `triton_decode` (a Triton kernel) are graded on the same kind of batch,
built the way a serving system leaves its cache (as tests/reference/test_attention.py builds them):

    pool of num_blocks physical blocks, handed out in a SHUFFLED order; a few spare blocks stay unused
    seq 0: seq_len 6, block_size 4 -> block_table [5, 2]       (its last block half full)
    seq 1: seq_len 3              -> block_table [0, 7]       (7: a spare block allocated for the next token)
    every slot that holds no token is NaN: a kernel that reads one returns NaN

Hypothesis draws the structure (sizes, lengths, the shuffle, which tables carry a spare block) and a seed; the
values come from `numpy.random.default_rng(seed)`, so a shrunk failure is a small batch with a readable story.
The oracle is the project's own: `reference.attention.torch_ref` (store_kv_ref, paged_decode_attention_ref),
imported here, lazily (this module is imported only when a check runs).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
from hypothesis import note
from hypothesis import strategies as st


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread while a check runs, then as it was (the student's kernel keeps its setting).

    Every tensor of these checks is tiny, so a second thread only costs: on 2 busy cores torch's threads wait for
    each other, and a softmax over [2, 24, 24] took 6 ms with 2 threads against 0.03 ms with 1 (chunked_prefill's
    grade spent ~50 of its ~90 s there)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def single_threaded(name: str, run_test: Callable[[Any], None]) -> type:
    """A TestCase whose runTest runs the hypothesis test `run_test` under `one_thread()` (the test's own source, and
    so its derandomized examples, unchanged)."""
    import unittest

    def runTest(self: unittest.TestCase) -> None:  # noqa: N802  (unittest's name)
        with one_thread():
            run_test(self)

    return type(name, (unittest.TestCase,), {"runTest": runTest})


@dataclass(frozen=True, slots=True)
class Shape:
    """The ranges one check draws from."""

    block_sizes: tuple[int, ...]
    kv_heads: tuple[int, ...]
    groups: tuple[int, ...]  # query heads per KV head (GQA); SmolLM2-135M has 9 over 3, a group of 3
    head_dims: tuple[int, ...]
    num_seqs: tuple[int, int]
    seq_len: tuple[int, int]
    logit_scale: float = 1.0  # the softmax scale is head_dim ** -0.5 times this: large makes scores overflow exp


@dataclass(slots=True)
class PagedBatch:
    block_size: int
    num_kv_heads: int
    num_heads: int
    head_dim: int
    num_blocks: int
    seq_lens: list[int]
    block_tables: list[list[int]]  # per sequence; may hold one spare block more than seq_len needs
    keys: list[np.ndarray]  # per sequence [seq_len, num_kv_heads, head_dim] float32, in token order
    values: list[np.ndarray]  # likewise
    query: np.ndarray  # [num_seqs, num_heads, head_dim] float32, one new token per sequence
    scale: float

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads


@st.composite
def paged_batches(draw: Callable, shape: Shape) -> PagedBatch:
    bs = draw(st.sampled_from(shape.block_sizes), label="block_size")
    kv = draw(st.sampled_from(shape.kv_heads), label="num_kv_heads")
    group = draw(st.sampled_from(shape.groups), label="query heads per KV head")
    dim = draw(st.sampled_from(shape.head_dims), label="head_dim")
    lens = draw(st.lists(st.integers(*shape.seq_len), min_size=shape.num_seqs[0], max_size=shape.num_seqs[1]),
                label="seq_lens")
    spare = draw(st.lists(st.booleans(), min_size=len(lens), max_size=len(lens)), label="a spare block at the end")
    needed = [-(-n // bs) + extra for n, extra in zip(lens, spare)]
    num_blocks = sum(needed) + 2  # two blocks no sequence holds: NaN
    order = draw(st.permutations(range(num_blocks)), label="physical blocks in allocation order")
    tables, at = [], 0
    for n in needed:
        tables.append(list(order[at : at + n]))
        at += n
    rng = np.random.default_rng(draw(st.integers(0, 2**16), label="seed"))

    def normal(*size: int) -> np.ndarray:
        return rng.standard_normal(size).astype(np.float32)

    return PagedBatch(bs, kv, kv * group, dim, num_blocks, lens, tables, [normal(n, kv, dim) for n in lens],
                      [normal(n, kv, dim) for n in lens], normal(len(lens), kv * group, dim),
                      float(dim**-0.5 * shape.logit_scale))


def tell(b: PagedBatch) -> None:
    """The batch as note() lines: what a shrunk failure prints before the broken rule."""
    note(f"block_size {b.block_size}, query heads {b.num_heads} over KV heads {b.num_kv_heads} (GQA group "
         f"{b.group}), head_dim {b.head_dim}, scale {b.scale:.4g}, a pool of {b.num_blocks} blocks")
    for i, (n, table) in enumerate(zip(b.seq_lens, b.block_tables)):
        used = -(-n // b.block_size)
        tail = n - (used - 1) * b.block_size
        extra = f" (block {table[used:]} is a spare: not read)" if len(table) > used else ""
        note(f"seq {i}: seq_len {n}, block_table {table}, its last block holds {tail} of {b.block_size}{extra}")


def slots_of(b: PagedBatch, i: int) -> list[int]:
    """Sequence i's cache slots, position by position, as the project's engine computes them
    (reference.engine.batch.ForwardBatch, the one place it builds a step's slot_mapping)."""
    from reference.engine.batch import ForwardBatch

    n = b.seq_lens[i]
    return ForwardBatch.build([([0] * n, 0, b.block_tables[i])], b.block_size).slot_mapping.tolist()


def oracle_caches(b: PagedBatch) -> tuple[Any, Any]:
    """(key_cache, value_cache) torch float32 [num_blocks, block_size, num_kv_heads, head_dim]: NaN everywhere,
    then every token stored in its slot by the project's `store_kv_ref`."""
    import torch

    from reference.attention.torch_ref import store_kv_ref

    shape = (b.num_blocks, b.block_size, b.num_kv_heads, b.head_dim)
    key_cache, value_cache = torch.full(shape, float("nan")), torch.full(shape, float("nan"))
    slots = [s for i in range(len(b.seq_lens)) for s in slots_of(b, i)]
    store_kv_ref(torch.from_numpy(np.concatenate(b.keys)), torch.from_numpy(np.concatenate(b.values)),
                 key_cache, value_cache, torch.tensor(slots, dtype=torch.int64))
    return key_cache, value_cache


def padded_tables(b: PagedBatch) -> Any:
    """The block tables as the kernels take them: int32 [num_seqs, max_blocks], short rows padded with a block no
    sequence holds (NaN: never read)."""
    import torch

    width = max(len(t) for t in b.block_tables)
    held = {blk for t in b.block_tables for blk in t}
    pad = min(set(range(b.num_blocks)) - held)
    return torch.tensor([t + [pad] * (width - len(t)) for t in b.block_tables], dtype=torch.int32)


def oracle_output(b: PagedBatch, key_cache: Any, value_cache: Any) -> np.ndarray:
    """[num_seqs, num_heads, head_dim]: the project's `paged_decode_attention_ref` on this batch."""
    import torch

    from reference.attention.torch_ref import paged_decode_attention_ref

    out = paged_decode_attention_ref(torch.from_numpy(b.query), key_cache, value_cache, padded_tables(b),
                                     torch.tensor(b.seq_lens, dtype=torch.int32), b.scale)
    return out.numpy()


def compare_output(call: str, b: PagedBatch, found: Any, expected: np.ndarray, tol: float, why: str) -> None:
    """Raise AssertionError naming the first (sequence, head) whose output differs from the oracle's."""
    shape = expected.shape
    try:
        found = np.asarray(found, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise AssertionError(f"{call} returned {type(found).__name__}: expected an array of shape {shape} "
                             f"(num_seqs, num_heads, head_dim)") from exc
    if found.shape != shape:
        raise AssertionError(f"{call} returned shape {found.shape}: expected {shape} (num_seqs, num_heads, head_dim)")
    bad = ~np.isclose(found, expected, rtol=tol, atol=tol)  # NaN is never close
    if not bad.any():
        return
    s, h, _ = np.argwhere(bad)[0]
    nan = ""
    if np.isnan(found[s, h]).any():
        top = max_score(b, s, h)
        nan = (f" (NaN: its largest score is {top:.4g}, and exp() overflows to inf above ~88 in float32, ~709 in "
               f"float64, unless the softmax subtracts the max first)" if top > 80 else
               " (NaN: every slot that holds no token is NaN here, so one of them was read)")
    raise AssertionError(f"{call}: out[{s}, {h}] (seq {s}, query head {h}, its KV head {h // b.group}): expected "
                         f"{_vec(expected[s, h])}, found {_vec(found[s, h])}{nan} [tolerance {tol:g}: {why}]")


def max_score(b: PagedBatch, s: int, h: int) -> float:
    """The largest scaled score q . k of sequence s, query head h."""
    return float((b.keys[s][:, h // b.group] @ b.query[s, h]).max() * b.scale)


def _vec(v: np.ndarray) -> str:
    return "[" + ", ".join(f"{x:.4g}" for x in v) + "]"
