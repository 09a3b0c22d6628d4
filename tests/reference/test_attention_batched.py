"""Tests of the vectorized torch backend ("torch_batched") against the per-sequence torch oracle.

The caches come from test_attention.make_paged_kv: physical blocks in a shuffled order from a pool
larger than needed, every slot that holds no token NaN (the tail of each last block, the spare
blocks, the padding columns of the block tables). The batched version pads every sequence to the
longest one; a padding position that read its slot and leaked through a mask (``0 * NaN``) fails here.

Tolerances (torch.testing.assert_close, |actual - expected| <= atol + rtol * |expected|):
- float32, 1e-5: both compute in float32 but round differently (one padded batched matmul with the
  scale folded into the queries vs the oracle's per-sequence einsum, scaled after); float32 rounding
  (~1.2e-7 per operation) over ~100 terms stays well below.
- bfloat16, 2e-2: both round a float32 result to bfloat16 at the end; 1 ulp near 2 is 1.6e-2.
"""

import pytest
import torch

from reference import LLM, SamplingParams
from reference.attention import cpu_numba, paged_decode_attention, paged_prefill_attention, store_kv, torch_batched
from reference.models import load_model
from tests.reference.test_attention import NUM_KV_HEADS, make_paged_kv, prefill_case

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
GQA_HEADS = [NUM_KV_HEADS * g for g in (1, 3, 4)]  # query heads for GQA ratios 1, 3, 4
SEQ_LENS = [1, 37, 5, 64, 16, 2]  # mixed: a lone token, partial last blocks, exact multiples of 16 and 32


def both(op, args):
    """(torch_batched, torch oracle) results of one public op on the same arguments."""
    return op(*args, backend="torch_batched"), op(*args, backend="torch")


def decode_args(seq_lens, block_size, num_heads, dtype=torch.float32, head_dim=16, seed=0):
    kv = make_paged_kv(seq_lens, block_size, NUM_KV_HEADS, head_dim, dtype, seed, device="cpu")
    query = torch.randn(len(seq_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(seed + 1))
    return (query.to(dtype), kv["key_cache"], kv["value_cache"], kv["block_tables"], kv["seq_lens"], head_dim**-0.5)


# --- decode --------------------------------------------------------------------------------------------


@pytest.fixture(params=["one_group", "length_groups"])
def grouping(request, monkeypatch):
    """Run a test twice: with the default slack (these small batches form one group) and with none, which
    cuts them into length-sorted groups whose rows are not contiguous (see test_length_groups_...)."""
    if request.param == "length_groups":
        monkeypatch.setattr(torch_batched, "GROUP_SLACK", 0)
    return request.param


def test_length_groups_sort_longest_first_and_cut_when_padding_doubles_the_work(monkeypatch):
    monkeypatch.setattr(torch_batched, "GROUP_SLACK", 0)
    # Decode (one query each), SEQ_LENS sorted: 64, 37, 16 pad to 3 x 64 = 192 pairs for 117 useful ones;
    # adding 5 would make 256 for 122 (more than double), so 5, 2, 1 start a second group.
    assert torch_batched._length_groups([1] * 6, SEQ_LENS, 6) == [[3, 1, 4], [2, 5, 0]]
    # A budget of one score puts every sequence in a group of its own (the very-long-prompt path).
    monkeypatch.setattr(torch_batched, "SCORE_BUDGET", 1)
    assert torch_batched._length_groups([5, 1, 12], [5, 10, 15], 6) == [[2], [0], [1]]
    # With the default slack, small batches stay one group: the fixed cost of a group outweighs the padding.
    monkeypatch.undo()
    assert torch_batched._length_groups([1] * 6, SEQ_LENS, 6) == [[3, 1, 4, 2, 5, 0]]


@pytest.mark.parametrize("num_heads", GQA_HEADS)
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_decode_equals_oracle_despite_nan_in_unused_slots(block_size, num_heads, grouping):
    args = decode_args(SEQ_LENS, block_size, num_heads)
    assert args[1].isnan().any()  # the caches do hold NaN outside the sequences' tokens
    batched, oracle = both(paged_decode_attention, args)
    assert not batched.isnan().any()
    torch.testing.assert_close(batched, oracle, **TOL[torch.float32])


def test_decode_bfloat16_equals_oracle():
    batched, oracle = both(paged_decode_attention, decode_args(SEQ_LENS, 16, 6, dtype=torch.bfloat16))
    assert batched.dtype == torch.bfloat16
    torch.testing.assert_close(batched, oracle, **TOL[torch.bfloat16])


def test_decode_through_strided_cache_views_and_a_strided_query():
    # vLLM keeps K and V of a layer in one tensor [num_blocks, 2, block_size, H_kv, D]: the caches are then
    # views that cannot be flattened to rows, which takes the (block, offset) indexing path.
    query, key_cache, value_cache, block_tables, seq_lens, scale = decode_args(SEQ_LENS, 16, 6)
    kv_cache = torch.stack([key_cache, value_cache], dim=1)  # [num_blocks, 2, block_size, H_kv, D]
    wide = torch.cat([query, query], dim=1)[:, ::2]  # the same values with a head stride of 2 * head_dim
    wide[:] = query
    batched = paged_decode_attention(
        wide, kv_cache[:, 0], kv_cache[:, 1], block_tables, seq_lens, scale, backend="torch_batched"
    )
    oracle = paged_decode_attention(query, key_cache, value_cache, block_tables, seq_lens, scale, backend="torch")
    torch.testing.assert_close(batched, oracle, **TOL[torch.float32])


def test_decode_empty_sequence_gives_zeros_and_leaves_the_others_alone(grouping):
    args = list(decode_args([9, 3], block_size=4, num_heads=6))
    args[4] = torch.tensor([9, 0], dtype=torch.int32)  # sequence 1 now has nothing to attend to
    batched, oracle = both(paged_decode_attention, args)
    assert torch.equal(batched[1], torch.zeros_like(batched[1]))
    torch.testing.assert_close(batched, oracle, **TOL[torch.float32])


# --- prefill -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ctx_before", [[0, 0, 0, 0], [0, 9, 3, 40]], ids=["no_prefix", "cached_prefix"])
@pytest.mark.parametrize("num_heads", GQA_HEADS)
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_prefill_equals_oracle(block_size, num_heads, ctx_before, grouping):
    _, args = prefill_case(ctx_before, [5, 1, 12, 3], block_size, num_heads, head_dim=16)
    args = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)
    batched, oracle = both(paged_prefill_attention, args)
    assert not batched.isnan().any()
    torch.testing.assert_close(batched, oracle, **TOL[torch.float32])


def test_prefill_with_a_sequence_of_no_new_tokens_equals_oracle(grouping):
    kv = make_paged_kv([6, 4, 7], 4, NUM_KV_HEADS, 16, device="cpu")
    query = torch.randn(9, 6, 16, generator=torch.Generator().manual_seed(2))
    starts = torch.tensor([0, 6, 6, 9], dtype=torch.int32)  # sequence 1 runs no new token this step
    args = (query, kv["key_cache"], kv["value_cache"], kv["block_tables"], starts, kv["seq_lens"], 0.25)
    batched, oracle = both(paged_prefill_attention, args)
    torch.testing.assert_close(batched, oracle, **TOL[torch.float32])


# --- store_kv ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [1, 16])
def test_store_kv_writes_what_the_oracle_writes(block_size):
    gen = torch.Generator().manual_seed(0)
    num_blocks, num_tokens = 40 // block_size + 2, 9
    key = torch.randn(num_tokens, NUM_KV_HEADS, 16, generator=gen)
    value = torch.randn(num_tokens, NUM_KV_HEADS, 16, generator=gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 5]] = -1  # tokens 2 and 5 are skipped (the one sentinel)
    caches = {}
    for backend in ("torch_batched", "torch"):
        k_cache = torch.full((num_blocks, block_size, NUM_KV_HEADS, 16), float("nan"))
        v_cache = torch.full_like(k_cache, float("nan"))
        store_kv(key, value, k_cache, v_cache, slots, backend=backend)
        caches[backend] = (k_cache, v_cache)
    for batched, oracle in zip(caches["torch_batched"], caches["torch"]):
        assert torch.equal(batched.isnan(), oracle.isnan())  # the same slots written, the rest untouched
        assert torch.equal(batched.nan_to_num(), oracle.nan_to_num())  # with the same bits


@pytest.mark.parametrize(
    "backend",
    ["torch_batched", pytest.param("numba", marks=pytest.mark.skipif(not cpu_numba.available(), reason="needs numba"))],
)
def test_bad_values_raise_like_the_oracle(backend):
    """The numba kernel reads the block tables itself: it gets the same value checks (once per step)."""
    cache = torch.zeros(4, 2, NUM_KV_HEADS, 8)
    kv = torch.zeros(1, NUM_KV_HEADS, 8)
    with pytest.raises(ValueError, match=r"slot_mapping\[0\] = 8 is outside the cache"):
        store_kv(kv, kv, cache, cache.clone(), torch.tensor([8]), backend=backend)
    query = torch.zeros(1, NUM_KV_HEADS, 8)
    with pytest.raises(ValueError, match="needs 2 blocks but the block table has 1 columns"):
        paged_decode_attention(
            query,
            cache,
            cache.clone(),
            torch.tensor([[0]], dtype=torch.int32),
            torch.tensor([3], dtype=torch.int32),
            1.0,
            backend=backend,
        )
    with pytest.raises(ValueError, match=r"block table entries must be in 0..3"):
        paged_decode_attention(
            query,
            cache,
            cache.clone(),
            torch.tensor([[9]], dtype=torch.int32),
            torch.tensor([1], dtype=torch.int32),
            1.0,
            backend=backend,
        )


# --- the engine ----------------------------------------------------------------------------------------


def test_engine_greedy_tokens_equal_the_oracle_backend():
    loaded = load_model("random")
    prompts = [[5, 17, 99, 3, 42, 8, 11], [7, 7, 200, 31], [1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 12]]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    results = {}
    for backend in ("torch", "torch_batched"):
        llm = LLM.from_loaded(*loaded, backend=backend, num_gpu_blocks=16, block_size=4)
        assert llm.backend == backend
        results[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert results["torch_batched"] == results["torch"]
