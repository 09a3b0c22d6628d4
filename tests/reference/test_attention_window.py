"""Sliding-window attention (Gemma 3's local layers) through block tables whose early entries are freed.

The hybrid KV manager gives a sliding layer's blocks back to the pool once every query's window has passed them, so a
table's first entries may name any block, here block 0, filled with NaN: a backend that reads one poisons its row.
The oracle (torch_ref) is itself checked against attention written position by position; every backend against it,
for batches whose sequences differ enough in length that torch_batched splits them into several length groups.
"""

from __future__ import annotations

import pytest
import torch

from reference.attention import paged_decode_attention, paged_prefill_attention

BS, KV_HEADS, HEADS, DIM, WINDOW = 4, 2, 4, 16, 6


def cache_and_tables(lens: list[int], firsts: list[int], seed: int = 0):
    """A cache with NaN in block 0 and every unused slot, tables pointing at shuffled blocks from each sequence's
    first read position's block on (0 before it, as a freed block)."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 1 + sum(-(-n // BS) for n in lens)
    keys = torch.full((num_blocks, BS, KV_HEADS, DIM), float("nan"))
    values = keys.clone()
    free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    width = max(-(-n // BS) for n in lens)
    tables = torch.zeros((len(lens), width), dtype=torch.int32)
    for i, (n, first) in enumerate(zip(lens, firsts)):
        for j in range(first // BS, -(-n // BS)):
            block = free.pop()
            tables[i, j] = block
            used = min(BS, n - j * BS)
            keys[block, :used] = torch.randn((used, KV_HEADS, DIM), generator=gen)
            values[block, :used] = torch.randn((used, KV_HEADS, DIM), generator=gen)
    return keys, values, tables


def brute(query, keys, values, table, positions, scale):
    """Each query row at its position over the keys of positions p - WINDOW + 1 .. p, one position at a time."""
    out = []
    for row, p in zip(query, positions):
        ks, vs = [], []
        for pos in range(max(0, p - WINDOW + 1), p + 1):
            block = int(table[pos // BS])
            ks.append(keys[block, pos % BS].repeat_interleave(HEADS // KV_HEADS, 0))
            vs.append(values[block, pos % BS].repeat_interleave(HEADS // KV_HEADS, 0))
        k, v = torch.stack(ks, 1), torch.stack(vs, 1)  # [heads, n, dim]
        probs = torch.softmax(torch.einsum("hd,hnd->hn", row, k) * scale, -1)
        out.append(torch.einsum("hn,hnd->hd", probs, v))
    return torch.stack(out)


LENS = [1, 3, 6, 7, 13, 17, 40, 41]  # short ones inside the window, long ones far past it (several length groups)


@pytest.mark.parametrize("backend", ["torch", "torch_batched", "numba", "triton"])
def test_decode_reads_only_the_window(backend):
    firsts = [max(0, n - WINDOW) for n in LENS]
    keys, values, tables = cache_and_tables(LENS, firsts)
    query = torch.randn((len(LENS), HEADS, DIM), generator=torch.Generator().manual_seed(1))
    lens = torch.tensor(LENS, dtype=torch.int32)
    out = paged_decode_attention(query, keys, values, tables, lens, 0.3, backend=backend, window=WINDOW)
    expected = torch.cat([brute(query[i : i + 1], keys, values, tables[i], [n - 1], 0.3) for i, n in enumerate(LENS)])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "torch_batched", "triton"])
def test_prefill_chunks_read_only_their_windows(backend):
    q_lens = [1, 3, 6, 2, 13, 5, 20, 1]  # a chunk of each sequence, over a cached prefix or not
    firsts = [max(0, n - q - WINDOW + 1) for n, q in zip(LENS, q_lens)]
    keys, values, tables = cache_and_tables(LENS, firsts, seed=2)
    starts = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    query = torch.randn((sum(q_lens), HEADS, DIM), generator=torch.Generator().manual_seed(3))
    out = paged_prefill_attention(
        query, keys, values, tables, starts, torch.tensor(LENS, dtype=torch.int32), 0.3, backend=backend, window=WINDOW
    )
    expected = torch.cat(
        [
            brute(query[starts[i] : starts[i + 1]], keys, values, tables[i], range(n - q, n), 0.3)
            for i, (n, q) in enumerate(zip(LENS, q_lens))
        ]
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_a_window_covering_the_context_is_full_attention():
    lens = [5, 9]
    keys, values, tables = cache_and_tables(lens, [0, 0], seed=4)
    query = torch.randn((2, HEADS, DIM), generator=torch.Generator().manual_seed(5))
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    full = paged_decode_attention(query, keys, values, tables, seq_lens, 0.3, backend="torch")
    wide = paged_decode_attention(query, keys, values, tables, seq_lens, 0.3, backend="torch_batched", window=9)
    torch.testing.assert_close(wide, full, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("window", [0, -1, 2.5, True])
def test_bad_window_is_one_line(window):
    keys, values, tables = cache_and_tables([3], [0])
    with pytest.raises(ValueError, match="window must be None"):
        paged_decode_attention(
            torch.zeros((1, HEADS, DIM)),
            keys,
            values,
            tables,
            torch.tensor([3], dtype=torch.int32),
            0.3,
            backend="torch",
            window=window,
        )
