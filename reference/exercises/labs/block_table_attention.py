"""Lab `block_table_attention`: one decode step of attention through a block table, written in numpy.

PagedAttention (Kwon et al., SOSP 2023, section 4.1) keeps each sequence's keys and values in fixed-size blocks
anywhere in one pool; the sequence's block table says where. A decode step does three things with it:

    slot_mapping(block_table, positions)   where each new token's K/V goes: block_table[p // bs] * bs + p % bs
                                           (vLLM: the step's `slot_mapping`; here reference/engine/batch.py)
    store_kv(caches, key, value, slots)    write them there (vLLM's reshape_and_cache; reference.attention.store_kv)
    decode_attention(query, caches, ...)   each sequence's new query attends over its whole context, read
                                           through its block table (vLLM's paged_attention_v1)

The student writes the three as methods of one class over numpy arrays. The oracle of every check is the
project's own code: `reference.engine.batch.ForwardBatch` (the slot mapping the engine builds) and
`reference.attention.torch_ref` (`store_kv_ref`, `paged_decode_attention_ref`), through `_paged_batches`.
"""
from __future__ import annotations

import numpy as np

from sim.exercises.referee import NO_RULES
from sim.exercises.registry import Exercise, MachineCheck
from sim.exercises.report import Story

TOL = 1e-4  # examples: float32 inputs; the student may sum in float64 or in another order (~1e-7 apart)


def _f32(values: list) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def _ints(found: object) -> object:
    """A list of ints if `found` is a list or array of integers (so a numpy answer compares), else as it is."""
    try:
        return [int(x) for x in found]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        return found


def expect_close(t: Story, what: str, found: object, expected: list, by_head: bool = False) -> None:
    """`found` (a numpy array or a torch tensor) equals `expected` within TOL, or the example fails saying both
    (`by_head`: only the first [seq, head] row that differs, for outputs too long to read whole)."""
    want = np.array(expected, dtype=np.float64)
    try:
        got = np.asarray(found.cpu() if hasattr(found, "cpu") else found, dtype=np.float64)
    except (TypeError, ValueError):
        got = None
    t.ensure(got is not None and got.shape == want.shape,
             f"{what}: expected an array of shape {want.shape}, found {found!r}")
    bad = ~np.isclose(got, want, rtol=TOL, atol=TOL)
    if by_head and bad.any():
        s, h = np.argwhere(bad)[0][:2]
        what, got, want = f"{what}, out[{s}, {h}] (seq {s}, query head {h})", got[s, h], want[s, h]
    t.ensure(not bad.any(), f"{what}: expected {np.round(want, 4).tolist()}, found {np.round(got, 4).tolist()}")


def _caches(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return np.full(shape, np.nan, np.float32), np.full(shape, np.nan, np.float32)


def _decode(t: Story, att, query, key_cache, value_cache, tables, seq_lens, scale) -> object:
    t.say(f"decode_attention(query {list(query.shape)}, key_cache/value_cache {list(key_cache.shape)}, "
          f"block_tables {tables}, seq_lens {seq_lens}, scale {scale})")
    return att.decode_attention(query, key_cache, value_cache, tables, seq_lens, scale)


# --- narrated examples ------------------------------------------------------------------------------------------
def slots_follow_the_table(make, t: Story) -> None:
    """slot_mapping: token p lives in block block_table[p // block_size], at offset p % block_size"""
    att = make(4)
    t.say("block_size 4, block_table [7, 2, 5]: tokens 0-3 in block 7, 4-7 in block 2, 8-9 in block 5")
    t.expect("slot_mapping([7, 2, 5], [0, 1, ..., 9])",
             _ints(t.do(att, "slot_mapping", [7, 2, 5], list(range(10)))), [28, 29, 30, 31, 8, 9, 10, 11, 20, 21])
    t.expect("slot_mapping([7, 2, 5], [9, 4]): the slots of the positions given, in their order",
             _ints(t.do(att, "slot_mapping", [7, 2, 5], [9, 4])), [21, 8])


def store_writes_its_slots(make, t: Story) -> None:
    """store_kv writes each token's K and V into its slot, in place, and touches no other slot"""
    att = make(2)
    key = _f32([[[1, 2]], [[3, 4]], [[5, 6]]])
    t.say("a pool of 3 blocks of 2 slots (1 KV head, head_dim 2), all NaN; three tokens go to slots [5, 0, 2]")
    for interleaved in (False, True):
        if interleaved:
            kv = np.full((3, 2, 2, 1, 2), np.nan, np.float32)
            key_cache, value_cache = kv[:, 0], kv[:, 1]
            t.say("again, into caches that are views of ONE array kv [3 blocks, 2 (K, V), 2 slots, 1, 2] (FlashInfer's "
                  "layout): key_cache = kv[:, 0], value_cache = kv[:, 1], NOT contiguous in memory, so reshape() "
                  "of them returns a copy")
        else:
            key_cache, value_cache = _caches(3, 2, 1, 2)
        t.say("store_kv(key_cache, value_cache, key [[1, 2]], [[3, 4]], [[5, 6]], value = -key, [5, 0, 2])")
        att.store_kv(key_cache, value_cache, key, -key, [5, 0, 2])
        layout = " (the views of one array: write through them in place)" if interleaved else ""
        for token, (block, offset) in enumerate(((2, 1), (0, 0), (1, 0))):
            slot = block * 2 + offset
            t.expect(f"key_cache[{block}, {offset}] (slot {slot}: token {token}){layout}",
                     key_cache[block, offset].tolist(), key[token].tolist())
            t.expect(f"value_cache[{block}, {offset}] (slot {slot}: token {token}){layout}",
                     value_cache[block, offset].tolist(), (-key[token]).tolist())
        untouched = [b * 2 + o for b in range(3) for o in range(2) if np.isnan(key_cache[b, o]).all()]
        t.expect(f"the key_cache slots still NaN (no token was stored there){layout}", untouched, [1, 3, 4])


def one_token_gqa(make, t: Story) -> None:
    """one cached token: every query head gets its KV head's value (GQA: heads 0-1 read KV head 0, 2-3 KV head 1)"""
    att = make(2)
    key_cache, value_cache = _caches(2, 2, 2, 2)
    key_cache[1, 0], value_cache[1, 0] = _f32([[1, 0], [0, 1]]), _f32([[1, 2], [3, 4]])
    t.say("2 KV heads, 4 query heads; the sequence's one token sits in block 1, offset 0: V = [1, 2] for KV "
          "head 0, [3, 4] for KV head 1")
    query = _f32([[[0.5, -1], [2, 0], [1, 1], [-3, 0.25]]])
    out = _decode(t, att, query, key_cache, value_cache, [[1]], [1], 1.0)
    expect_close(t, "the output (a softmax over one token is 1: its value)", out, [[[1, 2], [1, 2], [3, 4], [3, 4]]])


def scale_before_softmax(make, t: Story) -> None:
    """the scores q.k are multiplied by `scale` before the softmax"""
    att = make(2)
    key_cache, value_cache = _caches(2, 2, 1, 2)
    key_cache[1, :, 0], value_cache[1, :, 0] = _f32([[2, 0], [0, 0]]), _f32([[1, 0], [0, 1]])
    t.say("two tokens in block 1: keys [2, 0] and [0, 0], values [1, 0] and [0, 1]; query [1, 0]")
    t.say("scale 0.5: scores [1, 0], softmax [e / (e + 1), 1 / (e + 1)] = [0.7311, 0.2689]")
    out = _decode(t, att, _f32([[[1, 0]]]), key_cache, value_cache, [[1]], [2], 0.5)
    expect_close(t, "the output", out, [[[0.7311, 0.2689]]])


def last_block_partly_filled(make, t: Story) -> None:
    """a context ending inside its last block: the slots after it (and a spare block) hold NaN and are not read"""
    att = make(4)
    key_cache, value_cache = _caches(3, 4, 1, 2)
    for p in range(5):
        block, offset = (2, 0)[p // 4], p % 4
        key_cache[block, offset], value_cache[block, offset] = _f32([[0, 0]]), _f32([[p, 1]])
    t.say("seq_len 5, block_table [2, 0, 1]: tokens 0-3 in block 2, token 4 in block 0 (offset 0); block 1 is a "
          "spare allocated for later tokens; every other slot is NaN")
    t.say("all keys are 0, so every token gets weight 1/5; token p has value [p, 1]")
    out = _decode(t, att, _f32([[[1, 1]]]), key_cache, value_cache, [[2, 0, 1]], [5], 1.0)
    expect_close(t, "the output (the mean of the 5 values)", out, [[[2, 1]]])


def batch_of_tables(make, t: Story) -> None:
    """a batch: each sequence reads its own blocks, as many tokens as its own seq_len"""
    att = make(2)
    key_cache, value_cache = _caches(4, 2, 1, 1)
    key_cache[:] = 0.0
    value_cache[:, :, 0, 0] = _f32([[10, 20], [1, 2], [30, 40], [3, 0]])
    t.say("block_size 2, all keys 0 (equal weights); values per block: 0: [10, 20], 1: [1, 2], 2: [30, 40], "
          "3: [3, 0]")
    t.say("seq 0: block_table [1, 3], seq_len 3 (values 1, 2, 3); seq 1: block_table [2], seq_len 1 (value 30)")
    out = _decode(t, att, _f32([[[1]], [[1]]]), key_cache, value_cache, [[1, 3], [2]], [3, 1], 1.0)
    expect_close(t, "the output (each sequence's mean value: 2 and 30)", out, [[[2]], [[30]]])


EXAMPLES = (slots_follow_the_table, store_writes_its_slots, one_token_gqa, scale_before_softmax,
            last_block_partly_filled, batch_of_tables)


def _probe(*shape: int) -> np.ndarray:
    """A read-only array of zeros: a probe call (unfinished.py) must change nothing, even in a written method."""
    a = np.zeros(shape, np.float32)
    a.setflags(write=False)
    return a


_PROBE_CACHE, _PROBE_ROWS = _probe(1, 1, 1, 1), _probe(1, 1, 1)


def _lazy(shape: str):
    def build(make, max_examples: int, steps: int) -> type:
        from ._block_table_attention_checks import batch_check

        return batch_check(shape)(make, max_examples, steps)

    return build


EXERCISE = Exercise(
    "attention through a block table: slot mapping, storing K/V, decode attention (paper section 4.1)",
    "YourClass(block_size)", "MyPagedAttention",
    (1,), {"slot_mapping": ([0], [0]), "store_kv": (_PROBE_CACHE, _PROBE_CACHE, _PROBE_ROWS, _PROBE_ROWS, [0]),
           "decode_attention": (_PROBE_ROWS, _PROBE_CACHE, _PROBE_CACHE, [[0]], [1], 1.0)},
    ("slot_mapping", "store_kv", "decode_attention"), NO_RULES, EXAMPLES,
    (
        MachineCheck("model", "random batches: {n} batches, slot mapping, store and decode against "
                     "reference.attention.torch_ref", _lazy("model"), 4.0, "visible"),
        MachineCheck("rule", "large scores: {n} batches whose scores overflow exp() unless the max is subtracted",
                     _lazy("rule"), 3.0, "hidden"),
        MachineCheck("long", "long contexts: {n} batches of up to 6 sequences of 20 to 160 tokens",
                     _lazy("long"), 2.0, "hidden", scale=2),
    ),
    "09_block_table_attention", "block_table_attention",
)
