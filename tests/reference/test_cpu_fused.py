"""Tests of the fused CPU loops (reference/models/cpu_fused.py) against the torch path they replace.

Tolerances: RoPE and the K/V store are exact (the same products and sums in the same order, no fastmath), so they
are compared with torch.equal. RMSNorm sums 576 squares in another order than torch's vectorized mean, and silu
uses another exp (~3 units in the last place), so both are compared at float32 rounding: 1e-6 relative to values
of order 1-10, 100x the observed differences (~5e-7) and far below what could move a greedy token.
"""

import pytest
import torch

from reference import LLM, SamplingParams
from reference.models import cpu_fused, load_model
from reference.models.layers import apply_rope, rms_norm, rope_cos_sin, rope_inv_freq

pytestmark = pytest.mark.skipif(not cpu_fused.available(), reason="needs numba")
TOL = dict(rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("rows", [1, 7, cpu_fused.PARALLEL_ROWS, 300])  # serial and parallel loops
def test_add_rms_norm_adds_in_place_and_normalizes_like_torch(rows):
    torch.manual_seed(rows)
    h, delta, weight = torch.randn(rows, 576) * 3, torch.randn(rows, 576), torch.randn(576)
    expected_h = h + delta
    got_h = h.clone()
    out = cpu_fused.add_rms_norm(got_h, delta, weight, 1e-5)
    assert torch.equal(got_h, expected_h)  # one float32 sum per element: exact
    torch.testing.assert_close(out, rms_norm(expected_h.clone(), weight, 1e-5), **TOL)
    torch.testing.assert_close(cpu_fused.add_rms_norm(h.clone(), None, weight, 1e-5), rms_norm(h, weight, 1e-5), **TOL)


@pytest.mark.parametrize("rows", [1, 9, 300])
def test_silu_mul_equals_torch_including_large_and_tiny_gates(rows):
    torch.manual_seed(rows)
    gate_up = torch.randn(rows, 2 * 96) * 4
    gate_up[0, :4] = torch.tensor([-200.0, -88.0, 90.0, 0.0])  # exp's clamps at both ends, and zero
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(cpu_fused.silu_mul(gate_up), torch.nn.functional.silu(gate) * up, **TOL)


@pytest.mark.parametrize("tokens", [1, 5, 100])
def test_rope_store_rotates_exactly_and_writes_only_kept_slots(tokens):
    torch.manual_seed(tokens)
    heads, kv_heads, dim = 6, 2, 16
    qkv = torch.randn(tokens, heads + 2 * kv_heads, dim)
    cos, sin = rope_cos_sin(torch.arange(tokens) * 13 + 5, rope_inv_freq(dim, 10000.0, None), torch.float32)
    expected = apply_rope(qkv[:, : heads + kv_heads], cos, sin)
    key_cache, value_cache = torch.full((20, 8, kv_heads, dim), float("nan")), torch.zeros(20, 8, kv_heads, dim)
    slots = torch.randperm(160)[:tokens]
    slots[0] = -1  # the skip sentinel: token 0 is rotated but not stored
    q = cpu_fused.rope_store(qkv.clone(), cos, sin, heads, kv_heads, key_cache, value_cache, slots)
    assert torch.equal(q, expected[:, :heads])
    kept = slots >= 0
    assert torch.equal(key_cache.view(-1, kv_heads, dim)[slots[kept]], expected[kept, heads:])
    assert torch.equal(value_cache.view(-1, kv_heads, dim)[slots[kept]], qkv[kept, heads + kv_heads :])
    assert key_cache.isnan().sum() == (160 - int(kept.sum())) * kv_heads * dim  # nothing else written


def test_rope_store_refuses_a_slot_past_the_cache():
    qkv = torch.zeros(3, 4, 8)
    cos, sin = torch.ones(3, 8), torch.zeros(3, 8)
    cache = torch.zeros(2, 4, 1, 8)
    with pytest.raises(ValueError, match=r"slot_mapping\[1\] = 8 is outside the cache \(allowed: 0..7\)"):
        cpu_fused.rope_store(qkv, cos, sin, 2, 1, cache, cache.clone(), torch.tensor([0, 8, 1]))


def test_engine_on_the_fused_path_matches_the_torch_path_and_keeps_the_thread_count():
    loaded = load_model("random")
    prompts = [[5, 17, 99, 3, 42, 8, 11] * 12, [7, 7, 200, 31], [1], list(range(70))]  # 84 + 75 rows: parallel
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)
    before = torch.get_num_threads()
    try:
        results = {}
        for threads in (1, 2):
            for backend in ("torch_batched", "numba"):
                llm = LLM.from_loaded(*loaded, backend=backend, num_gpu_blocks=64, block_size=4)
                torch.set_num_threads(threads)  # after the engine's start, which picks one thread by default
                outs = [o.outputs[0] for o in llm.generate(prompts, params)]
                results[threads, backend] = outs
                assert torch.get_num_threads() == threads  # numba's OpenMP start-up used to leave it at 2
            fused, plain = results[threads, "numba"], results[threads, "torch_batched"]
            assert [o.token_ids for o in fused] == [o.token_ids for o in plain]
            for a, b in zip(fused, plain):
                assert a.cumulative_logprob == pytest.approx(b.cumulative_logprob, abs=1e-4)
    finally:
        torch.set_num_threads(before)


def test_the_fused_path_refuses_other_dtypes_with_one_line():
    """float16 (bfloat16 has loops of its own: tests/reference/test_bf16_cpu.py)."""
    llm = LLM.from_loaded(*load_model("random", dtype=torch.float16), backend="torch_batched", num_gpu_blocks=8)
    with pytest.raises(ValueError, match="backend 'numba' runs float32 or bfloat16 models and caches on a CPU"):
        llm.model._check_fused(llm.kv_cache)
    bf16 = LLM.from_loaded(*load_model("random", dtype=torch.bfloat16), backend="numba", num_gpu_blocks=8)
    bf16.model._check_fused(bf16.kv_cache)
    assert bf16.model._fused("numba") and not llm.model._fused("numba")
