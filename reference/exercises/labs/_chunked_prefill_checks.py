"""The property checks of lab `chunked_prefill`: random prompts, random chunkings, random non-contiguous block
tables, caches full of NaN; the oracle is reference/attention/torch_ref.py.

- "model": one prompt, `prefill` with random chunk sizes. It must write and attend chunk by chunk (its calls to
  `write_chunk` / `attend_chunk` are watched), its output must equal one-shot causal attention of the whole
  prompt (`paged_prefill_attention_ref`) and its cache the one `store_kv_ref` writes for the whole prompt.
- "rule": two prompts in one cache, their chunks interleaved as a batch would run them (`write_chunk` then
  `attend_chunk`, called here); each chunk's output against `paged_prefill_attention_ref` of that chunk alone.
- "long": as "model", with prompts up to 96 tokens and more heads.

Tolerance: float32 outputs within 1e-5 (absolute and relative): a chunked softmax sums in another order than a
one-shot one, which moves the last bits only. Caches must be equal exactly (writing copies numbers), NaN where
nothing was written.
"""
from __future__ import annotations

import unittest
from typing import Any, Callable

import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from reference.attention.torch_ref import paged_prefill_attention_ref, store_kv_ref
from sim.exercises.referee import tag_exercise_call
from sim.testing.blocks import machine_settings

from ._paged_batches import single_threaded

TOLERANCE = 1e-5
# shape -> (prompt lengths, block sizes, heads, head_dim)
SHAPES = {"model": ((1, 24), (1, 2, 4, 8), (1, 2), (1, 4)), "rule": ((1, 16), (1, 2, 4), (1, 2), (1, 4)),
          "long": ((24, 96), (4, 8, 16), (2, 4), (4, 8))}


def _chunks(draw: Callable, length: int, label: str) -> list[int]:
    sizes, left = [], length
    while left:
        sizes.append(draw(st.integers(1, left), label=f"{label} chunk"))
        left -= sizes[-1]
    return sizes


@st.composite
def prompts(draw: Callable, shape: str, count: int) -> dict[str, Any]:
    lengths, sizes, heads, dims = SHAPES[shape]
    case = {"block_size": draw(st.sampled_from(sizes), label="block_size"),
            "num_heads": draw(st.integers(*heads), label="num_heads"),
            "head_dim": draw(st.integers(*dims), label="head_dim"),
            "seed": draw(st.integers(0, 2**16), label="seed")}
    case["lengths"] = [draw(st.integers(*lengths), label="prompt length") for _ in range(count)]
    case["chunks"] = [_chunks(draw, n, f"prompt {i}") for i, n in enumerate(case["lengths"])]
    bs = case["block_size"]
    needed = [-(-n // bs) for n in case["lengths"]]
    case["num_blocks"] = sum(needed) + draw(st.integers(0, 3), label="spare blocks")
    ids = draw(st.permutations(range(case["num_blocks"])), label="block ids")  # non-contiguous tables
    case["tables"] = [ids[sum(needed[:i]) : sum(needed[: i + 1])] for i in range(count)]
    case["order"] = draw(st.permutations([i for i, c in enumerate(case["chunks"]) for _ in c]), label="chunk order")
    return case


def _tensors(case: dict, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(case["seed"] + 1000 * i)
    shape = (case["lengths"][i], case["num_heads"], case["head_dim"])
    return tuple(torch.randn(*shape, generator=g) for _ in range(3))  # query, key, value: [L, H, D]


def _caches(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (case["num_blocks"], case["block_size"], case["num_heads"], case["head_dim"])
    return torch.full(shape, float("nan")), torch.full(shape, float("nan"))


def _slots(table: list[int], start: int, n: int, bs: int) -> torch.Tensor:
    return torch.tensor([table[p // bs] * bs + p % bs for p in range(start, start + n)], dtype=torch.int64)


def oracle_chunk(case: dict, caches, table: list[int], start: int, q, k, v) -> torch.Tensor:
    """Store the chunk's K/V with store_kv_ref, then its attention with paged_prefill_attention_ref."""
    n = q.shape[0]
    store_kv_ref(k, v, *caches, _slots(table, start, n, case["block_size"]))
    width = max(-(-(start + n) // case["block_size"]), 1)
    return paged_prefill_attention_ref(q, *caches, torch.tensor([table[:width]], dtype=torch.int32),
                                       torch.tensor([0, n], dtype=torch.int32),
                                       torch.tensor([start + n], dtype=torch.int32), case["head_dim"] ** -0.5)


def expect_close(what: str, found: Any, expected: torch.Tensor, first: int = 0) -> None:
    """`found` equals `expected` ([n, H, D]) within the tolerance; else name the first bad token and by how much."""
    if not isinstance(found, torch.Tensor) or found.shape != expected.shape:
        shape = tuple(found.shape) if isinstance(found, torch.Tensor) else type(found).__name__
        raise AssertionError(f"{what}: expected a tensor of shape {tuple(expected.shape)} [tokens, heads, head_dim], "
                             f"found {shape}")
    bad = ~torch.isclose(found.float(), expected, atol=TOLERANCE, rtol=TOLERANCE)
    if bad.any():
        row = int(bad.flatten(1).any(1).nonzero()[0])
        if found[row].isnan().any():
            raise AssertionError(f"{what}: the output of token {first + row} is NaN: it read a cache slot that "
                                 f"was never written (unwritten slots hold NaN). Read only positions 0..p "
                                 f"through the block table, never a whole last block")
        diff = (found[row].float() - expected[row]).abs().max().item()
        raise AssertionError(f"{what}: the output of token {first + row} differs from torch_ref's by {diff:.3g} "
                             f"(tolerance {TOLERANCE})")


def expect_cache(what: str, found: torch.Tensor, expected: torch.Tensor, tables: list[list[int]], bs: int) -> None:
    """The caches must be equal exactly, NaN included (a slot nobody wrote must stay NaN)."""
    same = (found == expected) | (found.isnan() & expected.isnan())
    if not same.all():
        block, slot = (int(x) for x in (~same).flatten(2).any(2).nonzero()[0])
        owner = [(i, t.index(block) * bs + slot) for i, t in enumerate(tables) if block in t]
        where = f"token {owner[0][1]} of prompt {owner[0][0]}" if owner else "a block no table holds"
        state = "NaN (never written)" if found[block, slot].isnan().all() else "other numbers"
        raise AssertionError(f"{what}: slot {slot} of block {block} ({where}) holds {state}, not what "
                             f"store_kv_ref writes there for the whole prompt")


def _named(call: str, method: Callable[..., Any], *args: Any) -> Any:
    """method(*args); should it raise, the feedback names `call` (the referee would print every tensor in full)."""
    try:
        return method(*args)
    except Exception as exc:  # noqa: BLE001  (tagged, then passed on unchanged)
        tag_exercise_call(exc, call)
        raise


def _watched(obj: Any, log: list[tuple[str, int, int]]) -> None:
    """Record the chunk calls prefill makes on its own object (instance attributes shadow the methods)."""
    for name, at in (("write_chunk", 2), ("attend_chunk", 2)):
        method = getattr(obj, name)

        def watch(*args: Any, _method=method, _name=name, _at=at) -> Any:
            log.append((_name, args[1], len(args[_at])))
            return _method(*args)

        setattr(obj, name, watch)


def _describe(case: dict, n: int) -> None:
    note(f"block_size {case['block_size']}, {case['num_heads']} head(s), head_dim {case['head_dim']}, "
         f"{case['num_blocks']} blocks (unwritten slots hold NaN)")
    for i in range(n):
        note(f"prompt {i}: {case['lengths'][i]} tokens, block_table {case['tables'][i]}, chunks {case['chunks'][i]}")


def one_prompt(make: Callable[..., Any], case: dict) -> None:
    _describe(case, 1)
    q, k, v = _tensors(case, 0)
    bs, table, chunks = case["block_size"], case["tables"][0], case["chunks"][0]
    student = make(case["num_blocks"], bs, case["num_heads"], case["head_dim"])
    log: list[tuple[str, int, int]] = []
    _watched(student, log)
    call = f"prefill({table}, query, key, value, {chunks})"
    out = _named(call, student.prefill, table, q, k, v, chunks)
    starts = [sum(chunks[:i]) for i in range(len(chunks))]
    calls = [(name, s, n) for s, n in zip(starts, chunks) for name in ("write_chunk", "attend_chunk")]
    if log != calls:
        show = lambda c: ", ".join(f"{name}(start {s}, {n} tokens)" for name, s, n in c)  # noqa: E731
        raise AssertionError(f"{call} must write then attend chunk by chunk: expected {show(calls)}; found "
                             f"{show(log) or 'no call'}")
    caches = _caches(case)
    store_kv_ref(k, v, *caches, _slots(table, 0, len(q), bs))
    expected = paged_prefill_attention_ref(q, *caches, torch.tensor([table], dtype=torch.int32),
                                           torch.tensor([0, len(q)], dtype=torch.int32),
                                           torch.tensor([len(q)], dtype=torch.int32), case["head_dim"] ** -0.5)
    expect_close(f"{call}, against one-shot attention of the whole prompt", out, expected)
    expect_cache(f"{call}: key_cache", student.key_cache, caches[0], [table], bs)
    expect_cache(f"{call}: value_cache", student.value_cache, caches[1], [table], bs)


def two_prompts(make: Callable[..., Any], case: dict) -> None:
    _describe(case, 2)
    tensors, caches = [_tensors(case, i) for i in range(2)], _caches(case)
    student = make(case["num_blocks"], case["block_size"], case["num_heads"], case["head_dim"])
    done, position = [0, 0], [0, 0]
    for i in case["order"]:
        table, n, start = case["tables"][i], case["chunks"][i][done[i]], position[i]
        q, k, v = (x[start : start + n] for x in tensors[i])
        note(f"prompt {i}: write_chunk({table}, {start}, key, value) then attend_chunk({table}, {start}, query), "
             f"{n} token(s)")
        _named(f"write_chunk({table}, {start}, key, value)", student.write_chunk, table, start, k, v)
        expected = oracle_chunk(case, caches, table, start, q, k, v)
        call = f"attend_chunk({table}, {start}, query)"
        expect_close(f"{call} of prompt {i}", _named(call, student.attend_chunk, table, start, q), expected, start)
        done[i], position[i] = done[i] + 1, start + n
    expect_cache("key_cache after both prompts", student.key_cache, caches[0], case["tables"], case["block_size"])
    expect_cache("value_cache after both prompts", student.value_cache, caches[1], case["tables"], case["block_size"])


def chunk_check(shape: str) -> Callable[[Callable[..., Any], int, int], type]:
    count = 2 if shape == "rule" else 1

    def build(make: Callable[..., Any], max_examples: int, steps: int) -> type:
        @settings(machine_settings(max_examples, steps), report_multiple_bugs=False)
        @given(case=prompts(shape, count))
        def run_test(self: unittest.TestCase, case: dict) -> None:
            (two_prompts if count == 2 else one_prompt)(make, case)

        return single_threaded(f"ChunkedPrefill_{shape}", run_test)

    return build
