"""Solution to exercise 9: attention through a block table, in numpy
(notebooks/exercises/09_block_table_attention.ipynb).

PagedAttention (vLLM paper, section 4.1): a sequence's K/V live in blocks anywhere in the pool, and its block
table maps logical block i (tokens i*block_size .. (i+1)*block_size - 1) to a physical block. A decode step
computes where its new tokens go (the slot mapping), stores their K/V there, and then lets each sequence's one
new query attend over all its cached tokens, gathered through the block table.
"""
from __future__ import annotations

import numpy as np


class MyPagedAttention:
    def __init__(self, block_size: int):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size

    # --- the exercise ---------------------------------------------------------------------------
    def slot_mapping(self, block_table: list[int], positions: list[int]) -> list[int]:
        """The cache slot of each position: block_table[p // block_size] * block_size + p % block_size."""
        bs = self.block_size
        return [block_table[p // bs] * bs + p % bs for p in positions]

    def store_kv(self, key_cache: np.ndarray, value_cache: np.ndarray, key: np.ndarray, value: np.ndarray,
                 slot_mapping: list[int]) -> None:
        """Write token t's K/V ([num_kv_heads, head_dim] each) into slot slot_mapping[t] of the caches, in place."""
        for t, slot in enumerate(slot_mapping):
            block, offset = divmod(slot, self.block_size)
            key_cache[block, offset] = key[t]
            value_cache[block, offset] = value[t]

    def decode_attention(self, query: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray,
                         block_tables: list[list[int]], seq_lens: list[int], scale: float) -> np.ndarray:
        """out[s, h] = softmax(scale * q[s, h] . K_s^T) @ V_s over the seq_lens[s] tokens of sequence s."""
        num_seqs, num_heads, head_dim = query.shape
        group = num_heads // key_cache.shape[2]  # GQA: query head h reads KV head h // group
        out = np.zeros((num_seqs, num_heads, head_dim))
        for s, (table, seq_len) in enumerate(zip(block_tables, seq_lens)):
            num_blocks = -(-seq_len // self.block_size)  # the blocks that hold its tokens; later ones are spare
            keys = key_cache[table[:num_blocks]].reshape(-1, *key_cache.shape[2:])[:seq_len]  # [seq_len, kv, d]
            values = value_cache[table[:num_blocks]].reshape(-1, *value_cache.shape[2:])[:seq_len]
            for h in range(num_heads):
                scores = scale * (keys[:, h // group].astype(np.float64) @ query[s, h])  # [seq_len]
                weights = np.exp(scores - scores.max())  # the max subtracted: exp never overflows
                out[s, h] = (weights / weights.sum()) @ values[:, h // group]
        return out
