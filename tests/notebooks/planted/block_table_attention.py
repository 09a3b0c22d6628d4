"""Attention through a block table with one rule broken (tests/notebooks/test_grader.py grades each)."""

from __future__ import annotations

import numpy as np


def slot_from_block_index(base):
    class SlotFromBlockIndex(base):
        def slot_mapping(self, block_table, positions):  # the logical block number, not the table's entry for it
            return [(p // self.block_size) * self.block_size + p % self.block_size for p in positions]

    return SlotFromBlockIndex


def stores_through_a_reshape(base):
    class StoresThroughAReshape(base):
        def store_kv(self, key_cache, value_cache, key, value, slot_mapping):
            # one fancy-indexed write into the caches flattened to [slots, heads, dim]: in place only while the cache
            # is contiguous in memory; reshape() of a view such as kv[:, 0] returns a copy and the write is lost
            key_cache.reshape(-1, *key_cache.shape[2:])[list(slot_mapping)] = key
            value_cache.reshape(-1, *value_cache.shape[2:])[list(slot_mapping)] = value

    return StoresThroughAReshape


def stores_one_run_of_slots(base):
    class StoresOneRunOfSlots(base):
        def store_kv(self, key_cache, value_cache, key, value, slot_mapping):
            # the tokens go to consecutive slots from the first one: right only while the blocks are contiguous
            first = slot_mapping[0]
            super().store_kv(key_cache, value_cache, key, value, list(range(first, first + len(slot_mapping))))

    return StoresOneRunOfSlots


def reads_whole_last_block(base):
    class ReadsWholeLastBlock(base):
        def decode_attention(self, query, key_cache, value_cache, block_tables, seq_lens, scale):
            # attends over every slot of the blocks it holds: the tail after seq_len included
            full = [-(-n // self.block_size) * self.block_size for n in seq_lens]
            return super().decode_attention(query, key_cache, value_cache, block_tables, full, scale)

    return ReadsWholeLastBlock


def _attend(block_size, query, key_cache, value_cache, block_tables, seq_lens, scale, kv_head, subtract_max):
    """The solution's decode attention with two of its choices open: which KV head a query head reads, and
    whether the softmax subtracts the max."""
    num_seqs, num_heads, head_dim = query.shape
    out = np.zeros((num_seqs, num_heads, head_dim))
    for s, (table, seq_len) in enumerate(zip(block_tables, seq_lens)):
        used = table[: -(-seq_len // block_size)]
        keys = key_cache[used].reshape(-1, *key_cache.shape[2:])[:seq_len]
        values = value_cache[used].reshape(-1, *value_cache.shape[2:])[:seq_len]
        for h in range(num_heads):
            scores = scale * (keys[:, kv_head(h)] @ query[s, h])
            with np.errstate(over="ignore", invalid="ignore"):  # the planted bug's overflow: NaN, no warning
                weights = np.exp(scores - scores.max() if subtract_max else scores)
                weights = weights / weights.sum()
            out[s, h] = weights @ values[:, kv_head(h)]
    return out


def gqa_modulo(base):
    class GqaModulo(base):
        def decode_attention(self, query, key_cache, value_cache, block_tables, seq_lens, scale):
            num_kv_heads = key_cache.shape[2]  # query head h reads KV head h % num_kv_heads, not h // group
            return _attend(
                self.block_size,
                query,
                key_cache,
                value_cache,
                block_tables,
                seq_lens,
                scale,
                lambda h: h % num_kv_heads,
                True,
            )

    return GqaModulo


def no_max_subtraction(base):
    class NoMaxSubtraction(base):
        def decode_attention(self, query, key_cache, value_cache, block_tables, seq_lens, scale):
            group = query.shape[1] // key_cache.shape[2]  # exp(score) straight away: inf once a score passes ~88
            return _attend(
                self.block_size,
                query,
                key_cache,
                value_cache,
                block_tables,
                seq_lens,
                scale,
                lambda h: h // group,
                False,
            )

    return NoMaxSubtraction


PLANTED = [
    (
        "slot-from-block-index",
        slot_from_block_index,
        (),
        ["slot_mapping([7, 2, 5], [0, 1, ..., 9]): expected [28, 29, 30, 31, 8, 9, 10, 11, 20, 21], found [0, 1, 2"],
    ),
    (
        "reads-whole-last-block",
        reads_whole_last_block,
        (),
        [
            "a context ending inside its last block",
            "the output (the mean of the 5 values): expected [[[2.0, 1.0]]], found [[[nan, nan]]]",
        ],
    ),
    (
        "gqa-modulo",
        gqa_modulo,
        (),
        [
            "every query head gets its KV head's value",
            "expected [[[1.0, 2.0], [1.0, 2.0], [3.0, 4.0], [3.0, 4.0]]], "
            "found [[[1.0, 2.0], [3.0, 4.0], [1.0, 2.0], [3.0, 4.0]]]",
        ],
    ),
    (
        "no-max-subtraction",
        no_max_subtraction,
        ("model", "rule"),
        ["✓ random batches", "✗ large scores", "decode_attention(query", "exp() overflows"],
    ),
    (
        "stores-through-a-reshape",
        stores_through_a_reshape,
        ("model",),
        [
            "✗ store_kv writes each token's K and V into its slot",
            "key_cache[2, 1] (slot 5: token 0) (the views of one array: write through them in place): expected [[1.0, 2.0]], "
            "found [[nan, nan]]",
            "✗ random batches",
            "(not contiguous in memory)",
            "FlashInfer's layout",
            "a write into the copy is lost",
        ],
    ),
    (
        "stores-one-run-of-slots",
        stores_one_run_of_slots,
        ("model",),
        [
            "✗ store_kv writes each token's K and V into its slot",
            "during the call store_kv(",
            "✗ random batches",
            "after store_kv of every sequence: key_cache[",
        ],
    ),
]
