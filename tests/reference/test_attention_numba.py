"""Tests of the compiled CPU decode kernel (backend "numba", reference/attention/cpu_numba.py) against the oracle.

The caches come from test_attention.make_paged_kv: shuffled physical blocks, NaN in every slot no sequence owns
(the tail of each last block, spare blocks, padding columns): the kernel must never read one.

Tolerance: float32, 1e-5 (as for torch_batched): the kernel sums in float32 in another order (fastmath lets LLVM
reorder the dot products to vectorize them); float32 rounding over ~100 terms stays well below 1e-5.
"""

import pytest
import torch

from reference import LLM, SamplingParams
from reference.attention import cpu_numba, paged_decode_attention, paged_prefill_attention, store_kv
from reference.models import load_model
from tests.reference.test_attention import NUM_KV_HEADS, prefill_case
from tests.reference.test_attention_batched import GQA_HEADS, SEQ_LENS, TOL, decode_args

pytestmark = pytest.mark.skipif(not cpu_numba.available(), reason="needs numba")


@pytest.mark.parametrize("num_heads", GQA_HEADS)
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_decode_equals_oracle_despite_nan_in_unused_slots(block_size, num_heads):
    args = decode_args(SEQ_LENS, block_size, num_heads)
    assert args[1].isnan().any()
    kernel = paged_decode_attention(*args, backend="numba")
    assert not kernel.isnan().any()
    torch.testing.assert_close(kernel, paged_decode_attention(*args, backend="torch"), **TOL[torch.float32])


def test_decode_empty_sequence_gives_zeros():
    args = list(decode_args([9, 3], block_size=4, num_heads=6))
    args[4] = torch.tensor([9, 0], dtype=torch.int32)
    kernel = paged_decode_attention(*args, backend="numba")
    assert torch.equal(kernel[1], torch.zeros_like(kernel[1]))
    torch.testing.assert_close(kernel, paged_decode_attention(*args, backend="torch"), **TOL[torch.float32])


def test_decode_through_strided_cache_views_and_a_strided_query():
    query, key_cache, value_cache, block_tables, seq_lens, scale = decode_args(SEQ_LENS, 16, 6)
    kv_cache = torch.stack([key_cache, value_cache], dim=1)  # vLLM's [num_blocks, 2, block_size, H_kv, D]
    wide = torch.cat([query, query], dim=1)[:, ::2]
    wide[:] = query
    kernel = paged_decode_attention(
        wide, kv_cache[:, 0], kv_cache[:, 1], block_tables, seq_lens, scale, backend="numba"
    )
    oracle = paged_decode_attention(query, key_cache, value_cache, block_tables, seq_lens, scale, backend="torch")
    torch.testing.assert_close(kernel, oracle, **TOL[torch.float32])


def test_prefill_and_store_run_the_batched_torch_code():
    _, args = prefill_case([0, 9, 3, 40], [5, 1, 12, 3], 16, 6, head_dim=16)
    args = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)
    torch.testing.assert_close(
        paged_prefill_attention(*args, backend="numba"),
        paged_prefill_attention(*args, backend="torch"),
        **TOL[torch.float32],
    )
    cache = torch.zeros(4, 2, NUM_KV_HEADS, 8)
    kv = torch.ones(1, NUM_KV_HEADS, 8)
    store_kv(kv, kv, cache, cache, torch.tensor([3]), backend="numba")
    assert torch.equal(cache[1, 1], kv[0])


def test_other_dtypes_raise_one_clear_line():
    """float16 (bfloat16 runs: tests/reference/test_bf16_cpu.py). (The block-table value checks:
    test_attention_batched.test_bad_values_raise_like_the_oracle[numba].)"""
    query = torch.zeros(1, NUM_KV_HEADS, 8)
    half = torch.zeros(4, 2, NUM_KV_HEADS, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="backend 'numba' runs float32 or bfloat16 CPU tensors of one dtype"):
        paged_decode_attention(
            query.to(torch.float16),
            half,
            half.clone(),
            torch.tensor([[0]], dtype=torch.int32),
            torch.tensor([1], dtype=torch.int32),
            1.0,
            backend="numba",
        )


def test_the_kernel_follows_torch_thread_count_and_leaves_it_alone():
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            paged_decode_attention(*decode_args(SEQ_LENS, 16, 6), backend="numba")
            assert torch.get_num_threads() == threads  # numba's OpenMP layer used to reset it
            assert cpu_numba.numba.get_num_threads() == min(threads, cpu_numba.numba.config.NUMBA_NUM_THREADS)
    finally:
        torch.set_num_threads(before)


def test_engine_greedy_tokens_equal_the_oracle_backend_and_numba_is_the_cpu_default():
    loaded = load_model("random")
    prompts = [[5, 17, 99, 3, 42, 8, 11], [7, 7, 200, 31], [1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 12]]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    results = {}
    for backend in ("torch", "numba"):
        llm = LLM.from_loaded(*loaded, backend=backend, num_gpu_blocks=16, block_size=4)
        results[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert results["numba"] == results["torch"]
    if not torch.cuda.is_available():
        assert LLM.from_loaded(*loaded, num_gpu_blocks=4).backend == "numba"  # float32 on a CPU
        bf16 = load_model("random", dtype=torch.bfloat16)
        assert LLM.from_loaded(*bf16, num_gpu_blocks=4).backend == "numba"  # its bfloat16 reads: test_bf16_cpu.py
        fp16 = load_model("random", dtype=torch.float16)
        assert LLM.from_loaded(*fp16, num_gpu_blocks=4).backend == "torch_batched"  # the kernel has no float16


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_balance_deals_every_sequence_once_and_evens_the_load(workers):
    seq_lens = torch.tensor([190, 20, 20, 33, 0, 150, 7, 64, 64, 101, 5], dtype=torch.int32).numpy()
    order, starts = cpu_numba._kernel()[0](seq_lens, workers)
    assert sorted(order.tolist()) == list(range(len(seq_lens))) and starts[0] == 0 and starts[-1] == len(seq_lens)
    cost = seq_lens.astype(int) + cpu_numba.PER_SEQ_COST
    loads = [int(cost[order[starts[w] : starts[w + 1]]].sum()) for w in range(workers)]
    assert max(loads) - min(loads) <= cost.max()  # LPT: no bucket exceeds another by more than one sequence


def test_decode_on_two_threads_equals_oracle():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        args = decode_args(SEQ_LENS, 16, 6)
        torch.testing.assert_close(
            paged_decode_attention(*args, backend="numba"),
            paged_decode_attention(*args, backend="torch"),
            **TOL[torch.float32],
        )
    finally:
        torch.set_num_threads(before)
