"""The Triton kernels compiled for a real GPU, against the torch oracle and float64 dense attention.

Skipped without CUDA (the CPU suite runs the same kernels through Triton's interpreter at small sizes in
test_attention.py). Here: block sizes 1, 16, 32, 128; GQA groups 1, 3, 8; float16, bfloat16, float32; contexts
up to 32k tokens; caches built as test_attention.make_paged_kv builds them (shuffled physical blocks from a larger
pool, NaN in every slot no sequence owns, padding columns of the block tables pointing at NaN blocks).

Two checks per case:
- elementwise against the oracle (reference.attention.torch_ref) in the same dtype, with test_attention's TOL
  (the 16-bit outputs are rounded at the end; the kernel also rounds the softmax probabilities to 16 bits
  before P @ V, as FlashAttention does);
- ||out - exact|| / ||exact|| against float64 dense attention over each sequence's own contiguous K/V (no
  paging): float32 <= 1e-5 (rounding of ~1e-7 per operation over a few thousand terms), float16 <= 2e-3 and
  bfloat16 <= 1.6e-2 (about two units of rounding of the output dtype: 2**-10 and 2**-7 relative, doubled for
  the rounded probabilities).
"""

import pytest
import torch

from tests.reference.test_attention import TOL, decode_both, make_paged_kv, prefill_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
REL_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
HEAD_DIM = 128
NUM_KV_HEADS = 2  # test_attention's prefill_case uses 2 as well
DECODE_LENS = [1, 15, 16, 17, 300, 1000, 4097, 32768]


def relative_error(out: torch.Tensor, exact: torch.Tensor) -> float:
    assert not out.isnan().any(), "NaN in the output: a masked slot was read"
    return float((out.double() - exact).norm() / exact.norm())


def dense(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """float64 causal attention of the last len(query) positions over contiguous K/V: [q_len, heads, D]."""
    q, k, v = (t.to("cuda", torch.float64).transpose(0, 1) for t in (query, keys, values))
    q_len, seq_len = q.shape[1], k.shape[1]
    k_pos, q_pos = torch.arange(seq_len, device="cuda"), seq_len - q_len + torch.arange(q_len, device="cuda")
    mask = k_pos[None, :] <= q_pos[:, None]
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=HEAD_DIM**-0.5, enable_gqa=True
    ).transpose(0, 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("block_size", [1, 16, 32, 128])
def test_decode_equals_oracle_and_float64(block_size, group, dtype):
    kv = make_paged_kv(DECODE_LENS, block_size, NUM_KV_HEADS, HEAD_DIM, dtype=dtype, seed=block_size + group)
    num_heads = NUM_KV_HEADS * group
    for num_splits in (None, 1, 7):
        out, ref, query = decode_both(kv, num_heads, HEAD_DIM, dtype, num_splits=num_splits)
        torch.testing.assert_close(out, ref, **TOL[dtype])
        exact = torch.cat([dense(query[i : i + 1], k, v) for i, (k, v) in enumerate(zip(kv["keys"], kv["values"]))])
        assert relative_error(out, exact) <= REL_TOL[dtype], (num_splits, relative_error(out, exact))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("block_size", [1, 16, 32, 128])
def test_prefill_equals_oracle_and_float64(block_size, group, dtype):
    # a whole prompt, one token over a cached prefix, a chunk over a long prefix, a chunk past one block
    ctx_before, q_lens = [0, 500, 8000, 17], [300, 1, 257, 129]
    kv, args = prefill_case(ctx_before, q_lens, block_size, NUM_KV_HEADS * group, HEAD_DIM, dtype, seed=group)
    from reference.attention import paged_prefill_attention

    out = paged_prefill_attention(*args)
    torch.testing.assert_close(out, paged_prefill_attention(*args, backend="torch"), **TOL[dtype])
    query, starts = args[0], args[4].tolist()
    exact = torch.cat(
        [dense(query[starts[i] : starts[i + 1]], k, v) for i, (k, v) in enumerate(zip(kv["keys"], kv["values"]))]
    )
    assert relative_error(out, exact) <= REL_TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [1, 16, 32, 128])
def test_store_kv_is_a_bit_exact_scatter(block_size, dtype):
    from reference.attention import store_kv

    gen = torch.Generator().manual_seed(block_size)
    num_blocks, num_tokens = 8192 // block_size + 3, 5000
    key = torch.randn(num_tokens, 8, HEAD_DIM, generator=gen).to(dtype).cuda()
    value = torch.randn(num_tokens, 8, HEAD_DIM, generator=gen).to(dtype).cuda()
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::11] = -1  # skipped tokens (the one sentinel)
    caches = []
    for backend in ("triton", "torch"):
        kc = torch.full((num_blocks, block_size, 8, HEAD_DIM), float("nan"), dtype=dtype, device="cuda")
        vc = torch.full_like(kc, float("nan"))
        store_kv(key, value, kc, vc, slots.cuda(), backend=backend)
        caches.append((kc, vc))
    for a, b in zip(*caches):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    assert int((~caches[0][0].flatten(0, 1).isnan().all(-1).all(-1)).sum()) == int((slots >= 0).sum())


def test_engine_triton_backend_equals_torch_backend_on_the_gpu():
    # A small random Llama in float32 on the GPU: the engine with the compiled kernels (chunked prefill and
    # decode through block tables) gives the same greedy tokens as with the per-sequence torch oracle.
    from reference import LLM, SamplingParams
    from reference.models import random_model

    model = random_model(device="cuda", dtype=torch.float32, max_position_embeddings=2048)
    prompts = [
        torch.randint(0, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        for n in (5, 40, 300, 900)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs = {}
    for backend in ("triton", "torch"):
        llm = LLM.from_loaded(model, block_size=16, num_gpu_blocks=256, backend=backend, max_num_batched_tokens=256)
        outs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert outs["triton"] == outs["torch"]
