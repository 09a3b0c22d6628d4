"""Solution to lab 7: attention for a prompt computed in chunks through a paged KV cache
(notebooks/exercises/07_chunked_prefill.ipynb).

Chunked prefill (vLLM v1; Sarathi-Serve): the chunk of tokens start .. start + n - 1 first writes its K/V into
the sequence's blocks (token p goes to block block_table[p // block_size], slot p % block_size), then each of its
queries attends to positions 0..p, read back through the block table: the earlier chunks' K/V and the causal
part of the chunk itself. Token p sees the same keys however the prompt is cut, so chunking changes nothing.
"""
from __future__ import annotations

import torch


class MyChunkedPrefill:
    def __init__(self, num_blocks: int, block_size: int, num_heads: int, head_dim: int):
        shape = (num_blocks, block_size, num_heads, head_dim)
        # NaN marks a slot nobody wrote: an attention that reads one returns NaN, so the mistake shows
        self.key_cache = torch.full(shape, float("nan"))  # [num_blocks, block_size, num_heads, head_dim]
        self.value_cache = torch.full(shape, float("nan"))  # [num_blocks, block_size, num_heads, head_dim]
        self.block_size = block_size
        self.scale = head_dim**-0.5

    def write_chunk(self, block_table: list[int], start: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """Write the K/V of tokens start .. start + n - 1 (key, value: [n, num_heads, head_dim]) into the cache."""
        for i in range(key.shape[0]):
            block, slot = block_table[(start + i) // self.block_size], (start + i) % self.block_size
            self.key_cache[block, slot] = key[i]
            self.value_cache[block, slot] = value[i]

    def attend_chunk(self, block_table: list[int], start: int, query: torch.Tensor) -> torch.Tensor:
        """Causal attention of tokens start .. start + n - 1 (query: [n, num_heads, head_dim]) over positions
        0 .. start + n - 1 of the cache; returns [n, num_heads, head_dim]."""
        n, end = query.shape[0], start + query.shape[0]
        positions = torch.arange(end)
        blocks = torch.tensor(block_table)[positions // self.block_size]
        keys = self.key_cache[blocks, positions % self.block_size]  # [end, H, D]: only written slots
        values = self.value_cache[blocks, positions % self.block_size]  # [end, H, D]
        scores = torch.einsum("qhd,khd->hqk", query, keys) * self.scale  # [H, n, end]
        hidden = positions.view(1, end) > torch.arange(start, end).view(n, 1)  # key after the query: masked
        probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
        return torch.einsum("hqk,khd->qhd", probs, values)

    def prefill(self, block_table: list[int], query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                chunk_sizes: list[int]) -> torch.Tensor:
        """A whole prompt (query, key, value: [L, num_heads, head_dim]) in chunks of `chunk_sizes` tokens (they
        sum to L), each written then attended; returns the outputs of all L tokens, [L, num_heads, head_dim]."""
        outputs, start = [], 0
        for n in chunk_sizes:
            self.write_chunk(block_table, start, key[start : start + n], value[start : start + n])
            outputs.append(self.attend_chunk(block_table, start, query[start : start + n]))
            start += n
        return torch.cat(outputs)
