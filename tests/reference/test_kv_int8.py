"""The 8-bit KV cache (reference/attention/quant.py): int8 K/V with a float32 scale per token and KV head.

What is claimed, and how each claim is checked:
- the round trip: |dequantize(quantize(x)) - x| <= absmax / 254 per element (half the step absmax / 127), for any
  rows (hypothesis);
- every backend's store writes the same int8 rows and scales (exactly: the Triton kernel rounds half to even as
  torch.round does);
- every backend's int8 attention IS float attention over the dequantized K/V: equal to the float32 oracle run on the
  dequantized cache within the float32 tolerance of tests/reference/test_attention.py (1e-5: the same math summed in
  another order), so a scale read from the wrong slot or left out fails;
- and so it is within the quantization's own bound of float attention over the original K/V: a key error of at
  most s_k / 2 per element moves each score by at most eps = scale * ||q||_1 * max s_k / 2, which scales each
  softmax weight by a factor in [exp(-2 eps), exp(2 eps)], so the output moves by at most
  (exp(2 eps) - 1) * max |v| from the keys plus max s_v / 2 from the values (plus the 1e-5 of float32 rounding).

The caches are built as tests/reference/test_attention.py builds them (shuffled blocks, spare blocks and the tails
of last blocks never written): the int8 pools hold 0 there and their scales NaN, so a read of an unowned slot gives
NaN. Triton runs under its CPU interpreter: its cases are tiny.

The engine: `python -m reference kv-accuracy --quick` generates greedily with both caches on two short prompts of
make peer; the tokens must be identical while the logits do move (so the int8 path really ran).
"""

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

if not torch.cuda.is_available():  # before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from reference.attention import paged_decode_attention, paged_prefill_attention, store_kv  # noqa: E402
from reference.attention.quant import dequantize_int8, quantize_int8  # noqa: E402
from reference.engine.kv_cache import KVCache, kv_bytes_per_block  # noqa: E402

from .test_attention import NUM_KV_HEADS, make_paged_kv  # noqa: E402

BACKENDS = ("torch", "torch_batched", "numba", "triton")
FLOAT32_TOL = dict(atol=1e-5, rtol=1e-5)  # test_attention.py's float32 tolerance (summation order only)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # where Triton runs: compiled on CUDA, else interpreted


def on(backend: str, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """The tensors where `backend` runs: Triton on CUDA when there is one, every other backend on the CPU."""
    device = DEVICE if backend == "triton" else "cpu"
    return [t.to(device) for t in tensors]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 6),
    head_dim=st.integers(1, 40),
    magnitude=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**31 - 1),
    zero_row=st.booleans(),
)
def test_round_trip_error_is_at_most_half_a_step(rows, head_dim, magnitude, seed, zero_row):
    x = torch.randn(rows, head_dim, generator=torch.Generator().manual_seed(seed)) * magnitude
    if zero_row:
        x[0] = 0.0
    q, scale = quantize_int8(x)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (rows,)
    assert int(q.abs().max()) <= 127
    absmax = x.abs().amax(dim=-1)
    error = (dequantize_int8(q, scale) - x).abs()
    # half a step, plus float32's rounding of x / scale and q * scale (a few ulp of absmax)
    assert (error <= (absmax / 254 + 4e-7 * absmax)[:, None]).all()
    nonzero = absmax > 0
    assert (q.abs().amax(dim=-1)[nonzero] == 127).all()  # each row's largest element uses the full range
    assert (q[~nonzero] == 0).all()


def quantized_case(seq_lens, block_size=4, head_dim=16, seed=0):
    """(float kv from make_paged_kv, int8 caches and NaN-filled scales written by the oracle's store, slots)."""
    kv = make_paged_kv(seq_lens, block_size, NUM_KV_HEADS, head_dim, seed=seed, device="cpu")
    slots = []
    for i, n in enumerate(seq_lens):
        slots += [int(kv["block_tables"][i, p // block_size]) * block_size + p % block_size for p in range(n)]
    keys, values = torch.cat(kv["keys"]), torch.cat(kv["values"])
    q = int8_caches(kv["key_cache"].shape)
    store_kv(keys, values, q[0], q[1], torch.tensor(slots), backend="torch", **scales_of(q))
    return kv, q, keys, values, torch.tensor(slots)


def int8_caches(shape):
    """(key_cache, value_cache, k_scale, v_scale): int8 zeros, and NaN scales (an unowned slot reads as NaN)."""
    return (
        torch.zeros(shape, dtype=torch.int8),
        torch.zeros(shape, dtype=torch.int8),
        torch.full(shape[:3], float("nan")),
        torch.full(shape[:3], float("nan")),
    )


def scales_of(q):
    return {"k_scale": q[2], "v_scale": q[3]}


def dequantized(q):
    """The float32 caches the int8 ones stand for (NaN where no token was stored)."""
    return dequantize_int8(q[0], q[2]), dequantize_int8(q[1], q[3])


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_store_writes_the_same_int8_rows_and_scales(backend):
    kv, expected, keys, values, slots = quantized_case([5, 9])
    q = on(backend, *int8_caches(kv["key_cache"].shape))
    store_kv(*on(backend, keys, values), q[0], q[1], *on(backend, slots), backend=backend, **scales_of(q))
    q = [t.cpu() for t in q]
    assert torch.equal(q[0], expected[0]) and torch.equal(q[1], expected[1])
    for scales, want in ((q[2], expected[2]), (q[3], expected[3])):  # NaN where no token was stored, in both
        assert torch.allclose(scales, want, rtol=0, atol=0, equal_nan=True)
    quantized_keys, key_scales = quantize_int8(keys)  # and those are the rows' own quantization
    assert torch.equal(q[0].view(-1, NUM_KV_HEADS, 16)[slots], quantized_keys)
    assert torch.equal(q[2].view(-1, NUM_KV_HEADS)[slots], key_scales)


def quantization_bound(query, keys, values, scale):
    """The module docstring's bound on |int8 attention - float attention| (every sequence and head at once)."""
    step_k = keys.abs().amax(dim=-1).max() / 127
    step_v = values.abs().amax(dim=-1).max() / 127
    eps = scale * query.abs().sum(dim=-1).max() * step_k / 2
    return float((math.exp(2 * eps) - 1) * values.abs().max() + step_v / 2) + 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_is_float_attention_over_the_dequantized_cache(backend):
    kv, q, keys, values, _ = quantized_case([1, 6, 13], seed=3)
    query = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(7))  # GQA: 4 query heads over 2
    tables, lens, scale = kv["block_tables"], kv["seq_lens"], 16**-0.5
    here = on(backend, query, *q, tables, lens)
    out = paged_decode_attention(*here[:3], *here[5:], scale, backend=backend, **scales_of(here[1:5])).cpu()
    assert not out.isnan().any()
    on_dequantized = paged_decode_attention(query, *dequantized(q), tables, lens, scale, backend="torch")
    torch.testing.assert_close(out, on_dequantized, **FLOAT32_TOL)
    exact = paged_decode_attention(query, kv["key_cache"], kv["value_cache"], tables, lens, scale, backend="torch")
    assert (out - exact).abs().max() <= quantization_bound(query, keys, values, scale)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_is_float_attention_over_the_dequantized_cache(backend):
    # sequence 0: 3 cached tokens + 4 new; sequence 1: 6 new, no cached prefix
    kv, q, keys, values, _ = quantized_case([7, 6], seed=5)
    query = torch.randn(10, 4, 16, generator=torch.Generator().manual_seed(9))
    starts = torch.tensor([0, 4, 10], dtype=torch.int32)
    tables, lens, scale = kv["block_tables"], kv["seq_lens"], 16**-0.5
    here = on(backend, query, *q, tables, starts, lens)
    out = paged_prefill_attention(*here[:3], *here[5:], scale, backend=backend, **scales_of(here[1:5])).cpu()
    assert not out.isnan().any()
    on_dequantized = paged_prefill_attention(query, *dequantized(q), tables, starts, lens, scale, backend="torch")
    torch.testing.assert_close(out, on_dequantized, **FLOAT32_TOL)
    exact = paged_prefill_attention(
        query, kv["key_cache"], kv["value_cache"], tables, starts, lens, scale, backend="torch"
    )
    assert (out - exact).abs().max() <= quantization_bound(query, keys, values, scale)


def test_decode_window_reads_only_the_window_of_an_int8_cache():
    kv, q, *_ = quantized_case([13], seed=11)
    query = torch.randn(1, 4, 16, generator=torch.Generator().manual_seed(2))
    args = (kv["block_tables"], kv["seq_lens"], 0.25)
    q[2][kv["block_tables"][0, 0]] = float("nan")  # the first block lies wholly before a window of 5: never read
    for backend in ("torch_batched", "numba"):
        out = paged_decode_attention(query, q[0], q[1], *args, backend=backend, window=5, **scales_of(q))
        torch.testing.assert_close(
            out, paged_decode_attention(query, *dequantized(q), *args, backend="torch", window=5), **FLOAT32_TOL
        )


def test_scales_are_required_with_an_int8_cache_and_refused_without_one():
    kv, q, *_ = quantized_case([5])
    query = torch.randn(1, 4, 16)
    args = (kv["block_tables"], kv["seq_lens"], 0.25)
    with pytest.raises(ValueError, match="int8 cache needs k_scale"):
        paged_decode_attention(query, q[0], q[1], *args, backend="torch")
    with pytest.raises(ValueError, match="belong to an int8 cache"):
        paged_decode_attention(query, kv["key_cache"], kv["value_cache"], *args, backend="torch", **scales_of(q))
    with pytest.raises(ValueError, match=r"k_scale must be \[num_blocks, block_size, num_kv_heads\]"):
        paged_decode_attention(query, q[0], q[1], *args, backend="torch", k_scale=q[2][:, :2], v_scale=q[3])


# --- the cache: bytes per block, and scales that travel with their blocks ---------------------------------------


def test_an_int8_block_costs_head_dim_plus_4_bytes_per_token_and_head():
    smol = dict(num_layers=30, block_size=16, num_kv_heads=3, head_dim=64)
    f32 = kv_bytes_per_block(dtype=torch.float32, **smol)
    int8 = kv_bytes_per_block(dtype=torch.float32, kv_dtype="int8", **smol)
    assert int8 == 2 * 30 * 16 * 3 * (64 + 4) and f32 == 2 * 30 * 16 * 3 * 64 * 4
    assert kv_bytes_per_block(dtype=torch.bfloat16, kv_dtype="int8", **smol) == int8  # the model's dtype no matter
    budget = 1 << 28  # the same bytes hold 256 / 68 = 3.76x the blocks of float32 (1.88x of bfloat16)
    blocks = {
        d: KVCache.num_blocks_for_budget(dtype=torch.float32, budget_bytes=budget, kv_dtype=d, **smol)
        for d in ("auto", "int8")
    }
    assert blocks == {"auto": budget // f32, "int8": budget // int8} and blocks["int8"] >= 3.7 * blocks["auto"]
    cache = KVCache(2, 3, 4, 2, 8, kv_dtype="int8")
    assert cache.key_caches[0].dtype == torch.int8 and cache.key_scales[0].shape == (3, 4, 2)
    assert cache.bytes_per_block == sum(
        t[0].numel() * t.element_size()
        for t in (*cache.key_caches, *cache.value_caches, *cache.key_scales, *cache.value_scales)
    )
    with pytest.raises(ValueError, match="kv_dtype must be one of auto, int8"):
        KVCache(2, 3, 4, 2, 8, kv_dtype="fp8")


def test_copy_and_swap_move_the_scales_with_their_blocks():
    cache = KVCache(1, 4, 2, 1, 4, kv_dtype="int8", num_cpu_blocks=2, fill_nan=True)
    k, v = torch.randn(4, 1, 4), torch.randn(4, 1, 4)
    store_kv(
        k, v, cache.key_caches[0], cache.value_caches[0], torch.tensor([0, 1, 2, 3]), backend="torch", **cache.scales(0)
    )  # blocks 0 and 1
    before = cache.read_tokens(0, [0, 1], 4)
    cache.copy_blocks([(0, 3)])  # copy-on-write: block 3 becomes block 0
    torch.testing.assert_close(cache.read_tokens(0, [3, 1], 4), before, rtol=0, atol=0)
    cache.swap_out([(0, 1), (1, 0)])
    cache.swap_in([(1, 2), (0, 0)])  # block 0 comes back as block 2, block 1 as block 0
    torch.testing.assert_close(cache.read_tokens(0, [2, 0], 4), before, rtol=0, atol=0)
    assert (before[0] - k).abs().max() <= k.abs().max() / 254 + 1e-6


# --- the engine: an option, refused in one line when bad; greedy output on short prompts --------------------------


def test_engine_kv_dtype_is_checked_with_the_settings():
    from reference.engine.config import EngineConfig

    assert EngineConfig().kv_dtype == "auto"
    with pytest.raises(ValueError, match=r"kv_dtype must be one of auto, int8 .*got 'fp8'"):
        EngineConfig(kv_dtype="fp8")


def test_kv_accuracy_quick_int8_engine_keeps_greedy_tokens_on_short_prompts(tmp_path):
    """`python -m reference kv-accuracy --quick`: SmolLM2, a raw and a chat prompt of make peer, 8 greedy tokens
    each, generated by the engine with a float32 and with an int8 cache."""
    import csv

    from reference.cli import main

    out = tmp_path / "kv_accuracy.csv"
    assert main(["kv-accuracy", "--quick", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[1] == f"# command: python -m reference kv-accuracy --quick --out {out}"
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    assert [r["prompt"] for r in rows] == ["0", "1", "all"] and [r["kind"] for r in rows[:2]] == ["raw", "chat"]
    assert all(r["identical"] == "True" and r["first_difference"] == "" for r in rows[:2])
    assert rows[2]["identical"] == "2 of 2"
    for r in rows[:2]:  # the int8 cache really is another cache (its logits move), yet picks the same tokens
        assert float(r["max_abs_logit_error"]) > 0 and float(r["mean_kl"]) > 0
        assert float(r["argmax_agreement"]) == 1.0
    smol = dict(num_layers=30, block_size=1, num_kv_heads=3, head_dim=64, dtype=torch.float32)
    assert int(rows[2]["kv_bytes_per_token_float32"]) == kv_bytes_per_block(**smol) == 46080
    assert int(rows[2]["kv_bytes_per_token_int8"]) == kv_bytes_per_block(**smol, kv_dtype="int8") == 12240
    assert int(rows[2]["blocks_per_gib_int8"]) == 2**30 // (16 * 12240)


def test_cli_refuses_a_bad_kv_dtype_in_one_line(capsys):
    from reference.cli import main

    assert main(["generate", "Hi", "--kv-dtype", "fp4"]) == 2  # in-process: main prints the line, returns the status
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("error: --kv-dtype 'fp4' (allowed: auto")


def test_the_simulator_prices_the_bytes_the_engine_allocates():
    """The KV managers' ModelSpec (reference.engine.kv_groups.model_spec) counts an int8 token as the cache does, so a
    vAttention page or a hybrid pool the engine sizes holds what the tensors hold."""
    from reference.engine.kv_groups import model_spec
    from reference.models import TINY_CONFIG as C

    for kv_dtype in ("auto", "int8"):
        spec = model_spec(C, torch.float32, kv_dtype=kv_dtype)
        assert spec.kv_bytes_per_token == kv_bytes_per_block(
            C.num_layers, 1, C.num_kv_heads, C.head_dim, torch.float32, kv_dtype
        )


@pytest.mark.parametrize("backend", ["torch", "numba"])
def test_hybrid_groups_keep_their_scales(backend):
    """Gemma 3 at toy size (random weights, sliding window 8) under the hybrid manager, whose cache tensors are
    places in KV cache groups: int8 K/V with their scales there, and the same greedy tokens as float32 here."""
    from reference import LLM, SamplingParams
    from reference.models.loader import TINY_GEMMA3_CONFIG, random_model

    tiny = random_model(TINY_GEMMA3_CONFIG, seed=1)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    out = {}
    for kv_dtype in ("auto", "int8"):
        llm = LLM(tiny, policy="hybrid", block_size=4, num_gpu_blocks=32, kv_dtype=kv_dtype, backend=backend)
        assert len(llm.kv_cache.key_scales) == (llm.kv_cache.num_layers if kv_dtype == "int8" else 0)
        out[kv_dtype] = llm.generate([{"prompt_token_ids": list(range(3, 33))}], params)[0].outputs[0].token_ids
    assert out["int8"] == out["auto"]
