"""Chunked prefill with one rule broken (tests/notebooks/test_grader.py grades each)."""

from __future__ import annotations

import torch


def not_causal_in_chunk(base):
    class NotCausalInChunk(base):
        def attend_chunk(self, block_table, start, query):  # masks nothing: a token sees the rest of its chunk
            end = start + query.shape[0]
            positions = torch.arange(end)
            blocks = torch.tensor(block_table)[positions // self.block_size]
            keys = self.key_cache[blocks, positions % self.block_size]
            values = self.value_cache[blocks, positions % self.block_size]
            probs = torch.softmax(torch.einsum("qhd,khd->hqk", query, keys) * self.scale, dim=-1)
            return torch.einsum("hqk,khd->qhd", probs, values)

    return NotCausalInChunk


def forgets_the_cache(base):
    class ForgetsTheCache(base):
        def attend_chunk(self, block_table, start, query):  # attends to its own chunk only, as if start were 0
            n = query.shape[0]
            positions = torch.arange(start, start + n)
            blocks = torch.tensor(block_table)[positions // self.block_size]
            keys = self.key_cache[blocks, positions % self.block_size]
            values = self.value_cache[blocks, positions % self.block_size]
            scores = torch.einsum("qhd,khd->hqk", query, keys) * self.scale
            hidden = torch.arange(n).view(1, n) > torch.arange(n).view(n, 1)
            probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
            return torch.einsum("hqk,khd->qhd", probs, values)

    return ForgetsTheCache


def reads_whole_blocks(base):
    class ReadsWholeBlocks(base):
        def attend_chunk(self, block_table, start, query):  # gathers whole blocks, masks the scores only
            n, end, bs = query.shape[0], start + query.shape[0], self.block_size
            blocks = torch.tensor(block_table[: -(-end // bs)])
            keys = self.key_cache[blocks].flatten(0, 1)  # the last block's unwritten slots come along
            values = self.value_cache[blocks].flatten(0, 1)
            scores = torch.einsum("qhd,khd->hqk", query, keys) * self.scale
            hidden = torch.arange(keys.shape[0]).view(1, -1) > torch.arange(start, end).view(n, 1)
            probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
            return torch.einsum("hqk,khd->qhd", probs, values)  # 0 * NaN is NaN

    return ReadsWholeBlocks


def scale_without_sqrt(base):
    class ScaleWithoutSqrt(base):
        def __init__(self, num_blocks, block_size, num_heads, head_dim):
            super().__init__(num_blocks, block_size, num_heads, head_dim)
            self.scale = 1.0 / head_dim  # 1 / d instead of 1 / sqrt(d): the examples' keys cannot tell

    return ScaleWithoutSqrt


def prefill_in_one_pass(base):
    class PrefillInOnePass(base):
        def prefill(self, block_table, query, key, value, chunk_sizes):  # ignores the chunks: right answer, no lab
            self.write_chunk(block_table, 0, key, value)
            return self.attend_chunk(block_table, 0, query)

    return PrefillInOnePass


PLANTED = [
    (
        "not-causal-in-chunk",
        not_causal_in_chunk,
        (),
        [
            "inside a chunk, token p sees tokens 0..p only",
            "attend_chunk of 5 tokens (token p: the mean of values 0..p): "
            "expected [1.0, 1.5, 3.0, 3.0, 4.0], found [4.0, 4.0, 4.0, 4.0, 4.0]",
        ],
    ),
    (
        "forgets-the-cache",
        forgets_the_cache,
        (),
        ["attend_chunk for tokens 2..3 (means of values 0..2 and 0..3): expected [3.0, 3.0], found [6.0, 4.5]"],
    ),
    (
        "reads-whole-blocks",
        reads_whole_blocks,
        (),
        ["attend_chunk([1], 0, query): expected [", "found [nan, nan, nan, nan, nan, nan]"],
    ),
    (
        "scale-without-sqrt",
        scale_without_sqrt,
        ("model",),  # passes every example: only random keys show it
        [
            "chunkings:",
            "against one-shot attention of the whole prompt: the output of token",
            "differs from torch_ref's",
        ],
    ),
    (
        "prefill-in-one-pass",
        prefill_in_one_pass,
        ("model",),
        ["must write then attend chunk by chunk: expected write_chunk(start 0,", "found write_chunk(start 0,"],
    ),
]
