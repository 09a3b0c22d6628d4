"""Tests of reference.attention: every Triton kernel against the torch oracle, the oracle against SDPA.

The caches are built the way a serving system leaves them: physical blocks handed out in a shuffled
order from a pool larger than needed, every slot that holds no token filled with NaN (the unused tail
of each last block, the spare blocks, the padding columns of the block tables point at NaN blocks).
A kernel that reads one slot it should not, or multiplies a masked NaN by 0, returns NaN and fails.

Tolerances (torch.testing.assert_close, |actual - expected| <= atol + rtol * |expected|):
- float32, 1e-5: the kernels sum in a different order (tiles, online softmax rescaling, split merge)
  than the oracle's one softmax; float32 rounding (~1.2e-7 per operation) over ~100 terms stays well below.
- float16, 5e-3 / bfloat16, 2e-2: both results are rounded to the 16-bit dtype at the end (1 ulp of an
  output near 2 is 2e-3 in float16, 1.6e-2 in bfloat16), and on the GPU the kernel also rounds the
  softmax probabilities to 16 bits before P @ V, as FlashAttention does.

Without CUDA the kernels run through Triton's CPU interpreter (slow), so shapes here are small.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():  # must happen before triton is imported (reference.attention does too)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from reference.attention import (  # noqa: E402
    paged_decode_attention,
    paged_prefill_attention,
    store_kv,
)
from reference.attention.torch_ref import gather_kv, store_kv_ref  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=5e-3, rtol=5e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
NUM_KV_HEADS = 2
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def make_paged_kv(seq_lens, block_size, num_kv_heads, head_dim, dtype=torch.float32, seed=0, device=DEVICE):
    """Contiguous random K/V per sequence, scattered into NaN-filled paged caches via shuffled blocks."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 5  # a pool larger than needed: 5 spare blocks stay NaN
    order = torch.randperm(num_blocks, generator=gen).tolist()  # physical blocks in shuffled order
    spare = order[sum(blocks_per_seq) :]
    width = max(blocks_per_seq) + 1  # one padding column more than any sequence needs
    block_tables = torch.tensor([spare[0]] * width * len(seq_lens)).reshape(len(seq_lens), width)
    keys, values, slots = [], [], []
    for i, (n, nb) in enumerate(zip(seq_lens, blocks_per_seq)):
        block_tables[i, :nb] = torch.tensor(order[:nb], dtype=torch.long)
        order = order[nb:]  # padding columns keep pointing at a spare (NaN) block
        keys.append(torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype))
        values.append(torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype))
        slots += [int(block_tables[i, p // block_size]) * block_size + p % block_size for p in range(n)]
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(shape, float("nan"), dtype=dtype)
    value_cache = torch.full(shape, float("nan"), dtype=dtype)
    store_kv_ref(torch.cat(keys), torch.cat(values), key_cache, value_cache, torch.tensor(slots))
    return dict(
        key_cache=key_cache.to(device),
        value_cache=value_cache.to(device),
        block_tables=block_tables.to(torch.int32).to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        keys=keys,
        values=values,
    )


def decode_both(kv, num_heads, head_dim, dtype, seed=1, **kwargs):
    """(triton, torch) decode outputs for random queries."""
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(len(kv["keys"]), num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    args = (query, kv["key_cache"], kv["value_cache"], kv["block_tables"], kv["seq_lens"], head_dim**-0.5)
    return paged_decode_attention(*args, **kwargs), paged_decode_attention(*args, backend="torch"), query


def prefill_case(ctx_before, q_lens, block_size, num_heads, head_dim, dtype=torch.float32, seed=0):
    """A packed prefill batch: sequence i has ctx_before[i] cached tokens and q_lens[i] new ones."""
    kv = make_paged_kv([c + q for c, q in zip(ctx_before, q_lens)], block_size, NUM_KV_HEADS, head_dim, dtype, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    query = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    starts = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32).to(DEVICE)
    args = (query, kv["key_cache"], kv["value_cache"], kv["block_tables"], starts, kv["seq_lens"], head_dim**-0.5)
    return kv, args


# --- the oracle itself, anchored to dense attention on the contiguous K/V -------------------------------


@pytest.mark.parametrize("num_heads", [2, 6])
def test_oracle_decode_equals_dense_sdpa(num_heads):
    kv = make_paged_kv([1, 21, 40], block_size=8, num_kv_heads=NUM_KV_HEADS, head_dim=16, device="cpu")
    query = torch.randn(3, num_heads, 16, generator=torch.Generator().manual_seed(3))
    out = paged_decode_attention(
        query, kv["key_cache"], kv["value_cache"], kv["block_tables"], kv["seq_lens"], 0.25, backend="torch"
    )
    for i, (k, v) in enumerate(zip(kv["keys"], kv["values"])):
        # float64 dense attention over the sequence's own contiguous K/V, no paging involved.
        dense = torch.nn.functional.scaled_dot_product_attention(
            query[i, :, None].double(),
            k.transpose(0, 1).double(),
            v.transpose(0, 1).double(),
            scale=0.25,
            enable_gqa=True,
        )  # [num_heads, 1, head_dim]
        torch.testing.assert_close(out[i], dense[:, 0].float(), **TOL[torch.float32])


def test_oracle_prefill_equals_dense_sdpa_with_bottom_right_causal_mask():
    kv, args = prefill_case([0, 9, 3], [5, 1, 12], block_size=4, num_heads=6, head_dim=16)
    args = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)
    out = paged_prefill_attention(*args, backend="torch")
    query, starts = args[0], args[4].tolist()
    for i, (k, v) in enumerate(zip(kv["keys"], kv["values"])):
        q = query[starts[i] : starts[i + 1]].transpose(0, 1).double()  # [num_heads, q_len, D]
        q_len, seq_len = q.shape[1], k.shape[0]
        # New token j is at position seq_len - q_len + j and sees keys 0..that position.
        mask = torch.arange(seq_len)[None, :] <= (seq_len - q_len + torch.arange(q_len))[:, None]
        dense = torch.nn.functional.scaled_dot_product_attention(
            q, k.transpose(0, 1).double(), v.transpose(0, 1).double(), attn_mask=mask, scale=0.25, enable_gqa=True
        )
        torch.testing.assert_close(out[starts[i] : starts[i + 1]], dense.transpose(0, 1).float(), **TOL[torch.float32])


def test_gather_kv_returns_tokens_in_logical_order():
    kv = make_paged_kv([7], block_size=2, num_kv_heads=1, head_dim=4, device="cpu")
    assert torch.equal(gather_kv(kv["key_cache"], kv["block_tables"][0], 7), kv["keys"][0])


# --- store_kv ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [1, 16])
def test_store_kv_writes_exactly_the_mapped_slots(block_size, dtype):
    num_tokens = 9
    num_blocks = 20 // block_size + 2  # at least twice as many slots as tokens
    gen = torch.Generator().manual_seed(0)
    key = torch.randn(num_tokens, NUM_KV_HEADS, 16, generator=gen).to(dtype).to(DEVICE)
    value = torch.randn(num_tokens, NUM_KV_HEADS, 16, generator=gen).to(dtype).to(DEVICE)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 5]] = -1  # tokens 2 and 5 are skipped (the one sentinel)
    caches = {}
    for backend in ("triton", "torch"):
        kc = torch.full((num_blocks, block_size, NUM_KV_HEADS, 16), float("nan"), dtype=dtype, device=DEVICE)
        vc = torch.full_like(kc, float("nan"))
        store_kv(key, value, kc, vc, slots.to(DEVICE), backend=backend)
        caches[backend] = (kc, vc)
    for kc_t, kc_r in zip(caches["triton"], caches["torch"]):
        torch.testing.assert_close(kc_t, kc_r, rtol=0, atol=0, equal_nan=True)  # a copy: bit-exact
    kc, vc = (c.flatten(0, 1).cpu() for c in caches["triton"])  # [num_slots, H_kv, D]
    written = torch.zeros(kc.shape[0], dtype=torch.bool)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(kc[slot], key[t].cpu()) and torch.equal(vc[slot], value[t].cpu())
            written[slot] = True
    assert kc[~written].isnan().all() and vc[~written].isnan().all()  # nothing else touched


# --- decode --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_heads", [2, 6, 8])  # GQA group 1, 3, 4 over 2 KV heads
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_decode_triton_equals_oracle(block_size, num_heads):
    kv = make_paged_kv([1, 33, 70], block_size, NUM_KV_HEADS, head_dim=16, seed=block_size)
    out, ref, _ = decode_both(kv, num_heads, 16, torch.float32)
    torch.testing.assert_close(out, ref, **TOL[torch.float32])


def test_decode_split_kv_equals_no_split():
    # max_context = 6 blocks * 16 = 96 tokens: 2 splits of 64, 3 of 32, and with 5 splits the ranges
    # round up to 32 tokens, so splits 3 and 4 are empty for every sequence (lse = -inf, weight 0).
    kv = make_paged_kv([1, 40, 77], block_size=16, num_kv_heads=NUM_KV_HEADS, head_dim=32, seed=5)
    whole, ref, query = decode_both(kv, 8, 32, torch.float32, num_splits=1)
    torch.testing.assert_close(whole, ref, **TOL[torch.float32])
    for num_splits in (2, 3, 5):
        split, _, _ = decode_both(kv, 8, 32, torch.float32, num_splits=num_splits)
        torch.testing.assert_close(split, whole, **TOL[torch.float32])


def test_num_splits_grows_with_context_and_shrinks_with_batch():
    from reference.attention.triton_decode import choose_num_splits

    assert choose_num_splits(num_seqs=1, num_kv_heads=8, max_context=32768) == 32  # capped at MAX_SPLITS
    assert choose_num_splits(num_seqs=1, num_kv_heads=8, max_context=1024) == 4  # >= 256 tokens per split
    assert choose_num_splits(num_seqs=16, num_kv_heads=8, max_context=32768) == 4  # 512 programs in all
    assert choose_num_splits(num_seqs=256, num_kv_heads=8, max_context=32768) == 1  # batch fills the GPU


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_16bit_inputs(dtype):
    kv = make_paged_kv([5, 50], block_size=16, num_kv_heads=NUM_KV_HEADS, head_dim=32, dtype=dtype)
    for num_splits in (1, 2):
        out, ref, _ = decode_both(kv, 6, 32, dtype, num_splits=num_splits)
        assert out.dtype == dtype
        torch.testing.assert_close(out, ref, **TOL[dtype])


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_single_token_returns_its_value_exactly_despite_nan_neighbours(num_splits):
    # One token in a 32-slot block whose other 31 slots are NaN: softmax over one score is exactly 1,
    # so the output is that token's V bit for bit. A kernel that loaded the NaN slots and "masked" them
    # only in the scores would compute 0 * NaN = NaN in P @ V; masked loads must read 0.0 instead.
    kv = make_paged_kv([1, 1], block_size=32, num_kv_heads=NUM_KV_HEADS, head_dim=16)
    out, _, _ = decode_both(kv, 4, 16, torch.float32, num_splits=num_splits)
    for i, v in enumerate(kv["values"]):
        assert torch.equal(out[i].cpu(), v[0].repeat_interleave(2, dim=0))  # heads 0,1 -> KV 0; 2,3 -> KV 1


def test_decode_empty_sequence_gives_zeros():
    kv = make_paged_kv([3, 1], block_size=4, num_kv_heads=NUM_KV_HEADS, head_dim=16)
    kv["seq_lens"][1] = 0
    for num_splits in (1, 2):
        out, ref, _ = decode_both(kv, 2, 16, torch.float32, num_splits=num_splits)
        assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.equal(ref[1], out[1])


# --- prefill -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_heads", [2, 6, 8])
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_prefill_triton_equals_oracle_with_and_without_cached_prefix(block_size, num_heads):
    # Sequences: a fresh prompt (no prefix), one new token after 20 cached (a decode-like chunk),
    # 18 new after 7 cached (chunked prefill / prefix-cache hit, spans 2 query tiles), 1 token alone.
    _, args = prefill_case([0, 20, 7, 0], [5, 1, 18, 1], block_size, num_heads, head_dim=16, seed=block_size)
    torch.testing.assert_close(
        paged_prefill_attention(*args), paged_prefill_attention(*args, backend="torch"), **TOL[torch.float32]
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_16bit_inputs(dtype):
    _, args = prefill_case([0, 13], [9, 20], block_size=16, num_heads=6, head_dim=32, dtype=dtype)
    out = paged_prefill_attention(*args)
    assert out.dtype == dtype
    torch.testing.assert_close(out, paged_prefill_attention(*args, backend="torch"), **TOL[dtype])


def test_prefill_first_token_returns_its_value_exactly():
    # Token 0 of a fresh prompt sees only itself; the rest of its 32-slot block is NaN.
    kv, args = prefill_case([0], [1], block_size=32, num_heads=2, head_dim=16)
    assert torch.equal(paged_prefill_attention(*args)[0].cpu(), kv["values"][0][0])


# --- argument checks -----------------------------------------------------------------------------------


def test_bad_arguments_raise_value_error_naming_the_problem():
    kv = make_paged_kv([4], block_size=4, num_kv_heads=NUM_KV_HEADS, head_dim=16)
    q = torch.zeros(1, 6, 16, device=DEVICE)
    base = dict(
        query=q,
        key_cache=kv["key_cache"],
        value_cache=kv["value_cache"],
        block_tables=kv["block_tables"],
        seq_lens=kv["seq_lens"],
        scale=0.25,
    )
    cases = [
        (dict(block_tables=kv["block_tables"].long()), "block_tables dtype"),
        (dict(query=torch.zeros(1, 5, 16, device=DEVICE)), "multiple of num_kv_heads"),
        (dict(query=torch.zeros(1, 6, 8, device=DEVICE)), "head_dim"),
        (dict(query=q.half()), "query dtype"),
        (dict(value_cache=kv["value_cache"][:, :2]), "value_cache shape"),
        (dict(scale=0.0), "scale"),
        (dict(backend="cuda"), "backend"),
        (dict(num_splits=0), "num_splits"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            paged_decode_attention(**{**base, **change})
    with pytest.raises(ValueError, match="outside the cache"):
        store_kv(
            q[:, :2], q[:, :2], kv["key_cache"], kv["value_cache"], torch.tensor([99], device=DEVICE), backend="torch"
        )


# --- the benchmark script ------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU paths of the script")
def test_bench_without_gpu_refuses_in_one_line(capsys):
    from reference.attention import bench

    assert bench.main([]) == 2  # asked for what cannot run here: a refusal, not a silent success
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU paths of the script")
def test_bench_cpu_smoke_runs_and_writes_csv(tmp_path):
    from reference.attention import bench
    from reference.attention.bench_plot import read_table

    out = tmp_path / "bench.csv"
    assert bench.main(["--cpu-smoke", "--repeats", "1", "--out", str(out)]) == 0
    rows, comments = read_table(out)
    assert "versions" in comments and "command" in comments
    experiments = [r["experiment"] for r in rows]
    assert experiments.count("decode") == 4 and experiments.count("paging") == 4  # 2x2 and 2 sizes x 2 tables
    assert all(float(r["time_us"]) > 0 and float(r["fraction_of_copy"]) > 0 for r in rows)


# --- the same comparisons at realistic sizes on a GPU ---------------------------------------------------


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 64])
def test_gpu_decode_and_prefill_equal_oracle(block_size, dtype):
    # Llama-3-8B attention shape (32 query heads over 8 KV heads, head_dim 128), contexts up to 3000.
    seq_lens = [1, 17, 300, 1024, 2999]
    kv = make_paged_kv(seq_lens, block_size, num_kv_heads=8, head_dim=128, dtype=dtype)
    for num_splits in (None, 1, 7):
        out, ref, _ = decode_both(kv, 32, 128, dtype, num_splits=num_splits)
        torch.testing.assert_close(out, ref, **TOL[dtype])
    _, args = prefill_case([0, 500, 1000], [300, 1, 700], block_size, 32, 128, dtype)
    torch.testing.assert_close(
        paged_prefill_attention(*args), paged_prefill_attention(*args, backend="torch"), **TOL[dtype]
    )


@pytest.mark.gpu
@gpu
def test_gpu_store_kv_equals_oracle():
    gen = torch.Generator().manual_seed(0)
    key = torch.randn(3000, 8, 128, generator=gen).to(torch.bfloat16).cuda()
    value = torch.randn(3000, 8, 128, generator=gen).to(torch.bfloat16).cuda()
    slots = torch.randperm(400 * 16, generator=gen)[:3000]
    slots[::7] = -1
    caches = []
    for backend in ("triton", "torch"):
        kc = torch.full((400, 16, 8, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
        vc = torch.full_like(kc, float("nan"))
        store_kv(key, value, kc, vc, slots.cuda(), backend=backend)
        caches.append((kc, vc))
    for a, b in zip(*caches):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def test_strided_views_work_without_copies():
    # vLLM keeps K and V of a layer in one tensor [num_blocks, 2, block_size, H_kv, D]; the caches are
    # then non-contiguous views (same strides), and store_kv must write through them in place.
    ref = make_paged_kv([9, 30], block_size=8, num_kv_heads=NUM_KV_HEADS, head_dim=16)
    kv_cache = torch.full((ref["key_cache"].shape[0], 2, *ref["key_cache"].shape[1:]), float("nan"), device=DEVICE)
    key_cache, value_cache = kv_cache[:, 0], kv_cache[:, 1]
    slots = [int(ref["block_tables"][i, p // 8]) * 8 + p % 8 for i, n in enumerate([9, 30]) for p in range(n)]
    store_kv(
        torch.cat(ref["keys"]).to(DEVICE),
        torch.cat(ref["values"]).to(DEVICE),
        key_cache,
        value_cache,
        torch.tensor(slots, device=DEVICE),
    )
    torch.testing.assert_close(key_cache, ref["key_cache"], rtol=0, atol=0, equal_nan=True)
    wide = torch.randn(2, 12, 16, device=DEVICE)
    query = wide[:, ::2]  # [2, 6, 16] with a head stride of 32
    args = (key_cache, value_cache, ref["block_tables"], ref["seq_lens"], 0.25)
    torch.testing.assert_close(
        paged_decode_attention(query, *args),
        paged_decode_attention(query.contiguous(), *args, backend="torch"),
        **TOL[torch.float32],
    )
