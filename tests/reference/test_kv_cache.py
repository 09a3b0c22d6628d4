"""The paged KV cache tensors and the forward-batch metadata: budgets, block copies, swapping, slots."""

from __future__ import annotations

import pytest
import torch

from reference.attention import store_kv
from reference.engine.batch import ForwardBatch
from reference.engine.kv_cache import KVCache, kv_bytes_per_block

# SmolLM2-135M's KV shape: 30 layers, 3 KV heads of 64.
SMOL = dict(num_layers=30, block_size=16, num_kv_heads=3, head_dim=64)


def numbered_cache(num_blocks: int = 8, num_cpu_blocks: int = 4) -> KVCache:
    """A small cache whose every element says where it lives: value = layer * 1000 + block (+0.5 for V)."""
    kv = KVCache(
        num_layers=2,
        num_blocks=num_blocks,
        block_size=4,
        num_kv_heads=2,
        head_dim=3,
        num_cpu_blocks=num_cpu_blocks,
        fill_nan=True,
    )
    for layer in range(2):
        ids = torch.arange(num_blocks, dtype=torch.float32).view(-1, 1, 1, 1) + 1000 * layer
        kv.key_caches[layer][:] = ids
        kv.value_caches[layer][:] = ids + 0.5
    return kv


def block_ids(kv: KVCache, layer: int = 0) -> list[float]:
    """What each block of a numbered cache holds now (its original block id, if unchanged)."""
    return (kv.key_caches[layer][:, 0, 0, 0] - 1000 * layer).tolist()


def test_bytes_per_block_and_budget_arithmetic():
    # One block: K and V x 30 layers x 16 tokens x 3 heads x 64 dims x 4 bytes (float32).
    per_block = 2 * 30 * 16 * 3 * 64 * 4
    assert per_block == 737_280
    assert kv_bytes_per_block(dtype=torch.float32, **SMOL) == per_block
    assert kv_bytes_per_block(dtype=torch.bfloat16, **SMOL) == per_block // 2
    assert KVCache.num_blocks_for_budget(dtype=torch.float32, budget_bytes=10 * per_block + 5, **SMOL) == 10
    assert KVCache.num_blocks_for_budget(dtype=torch.float32, budget_bytes=per_block, **SMOL) == 1
    kv = KVCache(30, 2, 16, 3, 64)
    assert kv.bytes_per_block == per_block
    # A fraction of the host's free memory: on any test machine that holds at least one block.
    assert KVCache.num_blocks_for_budget(dtype=torch.float32, fraction_of_free_memory=0.01, **SMOL) >= 1


def test_a_budget_below_one_block_is_a_clear_error():
    with pytest.raises(
        ValueError,
        match=r"a KV budget of 1000 bytes holds no block: one block of 16 tokens "
        r"needs 737280 bytes across 30 layers",
    ):
        KVCache.num_blocks_for_budget(dtype=torch.float32, budget_bytes=1000, **SMOL)
    with pytest.raises(ValueError, match="exactly one of"):
        KVCache.num_blocks_for_budget(dtype=torch.float32, **SMOL)
    with pytest.raises(ValueError, match="fraction_of_free_memory"):
        KVCache.num_blocks_for_budget(dtype=torch.float32, fraction_of_free_memory=1.5, **SMOL)


def test_new_cache_is_nan_in_debug_mode_and_zero_otherwise():
    assert torch.isnan(KVCache(1, 2, 4, 1, 2, fill_nan=True).key_caches[0]).all()
    assert (KVCache(1, 2, 4, 1, 2).value_caches[0] == 0).all()
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        KVCache(1, 2, 0, 1, 2)


def test_copy_blocks_copies_every_layer_and_reads_before_writing():
    kv = numbered_cache()
    # Copy-on-write: block 4 becomes a copy of block 1, and block 1 a copy of block 2, in one call.
    # The second copy overwrites the first one's source: block 4 must still get block 1's OLD data.
    kv.copy_blocks([(1, 4), (2, 1)])
    for layer in range(2):
        assert block_ids(kv, layer) == [0, 2, 2, 3, 1, 5, 6, 7]
        assert (kv.value_caches[layer][4] == kv.key_caches[layer][4] + 0.5).all()
    kv.copy_blocks([])  # nothing to do
    with pytest.raises(ValueError, match="destination blocks must be in 0..7"):
        kv.copy_blocks([(0, 8)])
    with pytest.raises(ValueError, match="written once"):
        kv.copy_blocks([(0, 5), (1, 5)])


def test_swap_out_and_back_in_restores_the_blocks():
    kv = numbered_cache()
    kv.swap_out([(3, 0), (6, 2)])  # preempt: device blocks 3 and 6 go to CPU blocks 0 and 2
    assert kv.cpu_key_caches[1][0, 0, 0, 0].item() == 1003
    assert kv.cpu_value_caches[1][2, 0, 0, 0].item() == 1006.5
    assert torch.isnan(kv.cpu_key_caches[0][1]).all()  # CPU block 1 was never written
    for layer in range(2):  # the device blocks are freed and reused by someone else
        kv.key_caches[layer][[3, 6]] = -1.0
        kv.value_caches[layer][[3, 6]] = -1.0
    kv.swap_in([(0, 5), (2, 1)])  # resume: into whatever device blocks are free now
    for layer in range(2):
        assert block_ids(kv, layer)[5] == 3 and block_ids(kv, layer)[1] == 6
        assert (kv.value_caches[layer][5] == 1000 * layer + 3.5).all()
    with pytest.raises(ValueError, match="destination blocks must be in 0..3"):
        kv.swap_out([(0, 4)])
    with pytest.raises(ValueError, match="source blocks must be in 0..3"):
        kv.swap_in([(4, 0)])


def test_build_packs_prefills_then_decodes_with_their_slots():
    # The docstring's example: A prefills 4 tokens, B 3, then C and D decode one token each.
    block_size = 4
    batch = ForwardBatch.build(
        [
            ([10, 11, 12, 13], 0, [7]),  # A: positions 0..3 in block 7 -> slots 28..31
            ([20, 21, 22], 2, [5, 1]),  # B: positions 2..4 (2 cached) -> 22, 23, then block 1 -> 4
            ([30], 9, [2, 0, 6]),  # C: position 9 -> block_table[2] = 6, offset 1 -> slot 25
            ([40], 1, [3]),  # D: position 1 -> slot 13
        ],
        block_size,
    )
    assert batch.input_ids.tolist() == [10, 11, 12, 13, 20, 21, 22, 30, 40]
    assert batch.positions.tolist() == [0, 1, 2, 3, 2, 3, 4, 9, 1]
    assert batch.slot_mapping.tolist() == [28, 29, 30, 31, 22, 23, 4, 25, 13]
    assert batch.logits_indices.tolist() == [3, 6, 7, 8]
    assert batch.num_prefill_tokens == 7 and batch.num_seqs == 4 and batch.max_seq_len == 10
    assert batch.prefill.query_start_loc.tolist() == [0, 4, 7]
    assert batch.prefill.seq_lens.tolist() == [4, 5]
    assert batch.prefill.block_tables.tolist() == [[7, 0], [5, 1]]  # A's row padded with block 0
    assert batch.decode.seq_lens.tolist() == [10, 2]
    assert batch.decode.block_tables.tolist() == [[2, 0, 6], [3, 0, 0]]
    assert batch.prefill.block_tables.dtype == torch.int32 and batch.slot_mapping.dtype == torch.int64


def test_build_rejects_bad_batches():
    with pytest.raises(ValueError, match="prefill sequences must come before decode"):
        ForwardBatch.build([([1], 3, [0]), ([1, 2], 0, [1])], 4)
    with pytest.raises(ValueError, match="6 tokens need 2 blocks of 4, but the block table has 1"):
        ForwardBatch.build([([1, 2], 4, [0])], 4)
    with pytest.raises(ValueError, match="at least one sequence"):
        ForwardBatch.build([], 4)
    with pytest.raises(ValueError, match="must not be empty"):
        ForwardBatch.build([([], 0, [0])], 4)


def test_slot_mapping_writes_land_where_read_tokens_finds_them():
    kv = KVCache(num_layers=1, num_blocks=6, block_size=4, num_kv_heads=2, head_dim=3, fill_nan=True)
    table = [4, 0, 3]  # non-contiguous on purpose
    batch = ForwardBatch.build([(list(range(10)), 0, table)], block_size=4)
    keys = torch.randn(10, 2, 3, generator=torch.Generator().manual_seed(0))
    store_kv(keys, -keys, kv.key_caches[0], kv.value_caches[0], batch.slot_mapping, backend="torch")
    read_k, read_v = kv.read_tokens(0, table, 10)
    assert torch.equal(read_k, keys) and torch.equal(read_v, -keys)
    assert torch.isnan(kv.key_caches[0][3, 2:]).all()  # the last block's tail was never written
    assert torch.isnan(kv.key_caches[0][[1, 2, 5]]).all()  # blocks outside the table untouched
