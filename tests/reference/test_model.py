"""Our paged forward pass against Hugging Face transformers (the minGPT-style end-to-end check).

The real SmolLM2-135M-Instruct (embedded GGUF, dequantized to float32) runs through our Llama code
with K/V in a paged cache whose block tables are random and non-contiguous; transformers runs the
same weights. Logits, cached K/V, greedy token ids and decoded text must agree.

Tolerance: float32 everywhere, so only the order of summations differs (HF uses SDPA, we use the
gather-then-einsum oracle). Over 30 layers we measured differences of ~5e-5 on logits of magnitude
~30; LOGIT_ATOL = 1e-3 leaves 20x margin and is still far below any gap that changes a greedy token.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from reference.engine.batch import ForwardBatch
from reference.engine.kv_cache import KVCache
from reference.models import load_model, random_model, smollm2_checkpoint_dir

LOGIT_ATOL = 1e-3  # see the module docstring
BLOCK_SIZE = 16
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away, there lived a",
    "Paged attention stores the KV cache in fixed-size blocks, so that",
]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """NOTE: this module runs hundreds of small ops (a 135M model, batch <= 4); on a 2-core machine
    shared with other processes, OpenMP hand-offs between threads cost more than they save (we
    measured a decode step at 1.5 s with 2 threads under load, 0.18 s with 1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def smol():
    model, tokenizer, config = load_model("smollm2")
    return model, tokenizer, config


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        smollm2_checkpoint_dir(), dtype=torch.float32, local_files_only=True
    ).eval()


def random_block_tables(rng: np.random.Generator, lengths: list[int], num_blocks: int) -> list[list[int]]:
    """Disjoint, shuffled (so non-contiguous) block tables covering `lengths` tokens each."""
    pool = [int(b) for b in rng.permutation(num_blocks)]
    tables = []
    for n in lengths:
        need = -(-n // BLOCK_SIZE)
        tables.append(pool[:need])
        pool = pool[need:]
    return tables


def chat_prompt(tok, question: str) -> list[int]:
    """The instruct model's own prompt format (system + user turn, then the assistant's header)."""
    messages = [{"role": "user", "content": question}]
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])


def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0]  # [T, vocab]


def test_packed_prefill_logits_equal_hf(smol, hf_model):
    model, tok, config = smol
    ids = [tok(p).input_ids for p in PROMPTS]
    tables = random_block_tables(np.random.default_rng(0), [len(x) for x in ids], 64)
    kv = KVCache.for_model(config, 64, BLOCK_SIZE, fill_nan=True)
    # All four prompts in one step: rows are packed one sequence after another.
    batch = ForwardBatch.build([(x, 0, t) for x, t in zip(ids, tables)], BLOCK_SIZE)
    logits = model.forward(batch.input_ids, batch.positions, batch, kv, "torch", all_logits=True)
    start = 0
    for x in ids:
        torch.testing.assert_close(logits[start : start + len(x)], hf_logits(hf_model, x), atol=LOGIT_ATOL, rtol=0)
        start += len(x)


def test_chunked_prefill_then_decode_equals_full_prefill(smol):
    model, tok, config = smol
    ids = chat_prompt(tok, "Why is the sky blue? Answer briefly.")
    n = len(ids)
    assert n > 30
    [table] = random_block_tables(np.random.default_rng(1), [n], 32)

    full_kv = KVCache.for_model(config, 32, BLOCK_SIZE, fill_nan=True)
    full = ForwardBatch.build([(ids, 0, table)], BLOCK_SIZE)
    expected = model.forward(full.input_ids, full.positions, full, full_kv, all_logits=True)  # [n, vocab]

    kv = KVCache.for_model(config, 32, BLOCK_SIZE, fill_nan=True)
    # Step 1: prefill the first 12 tokens. Step 2: a chunk of 10 more over the cached 12 (a prefill
    # with context, as chunked prefill or a prefix-cache hit runs it). Then one token per step.
    steps = [(0, 12), (12, 22)] + [(i, i + 1) for i in range(22, n)]
    for begin, end in steps:
        batch = ForwardBatch.build([(ids[begin:end], begin, table)], BLOCK_SIZE)
        assert (batch.decode is not None) == (end - begin == 1)
        logits = model.forward(batch.input_ids, batch.positions, batch, kv)  # [1, vocab]
        torch.testing.assert_close(logits[0], expected[end - 1], atol=LOGIT_ATOL, rtol=0)


def test_cached_kv_equals_hf_past_key_values(smol, hf_model):
    model, tok, config = smol
    ids = tok(PROMPTS[2]).input_ids
    [table] = random_block_tables(np.random.default_rng(2), [len(ids)], 16)
    kv = KVCache.for_model(config, 16, BLOCK_SIZE, fill_nan=True)
    batch = ForwardBatch.build([(ids, 0, table)], BLOCK_SIZE)
    model.forward(batch.input_ids, batch.positions, batch, kv)
    with torch.no_grad():
        past = hf_model(torch.tensor([ids]), use_cache=True).past_key_values
    for layer in range(config.num_layers):
        keys, values = kv.read_tokens(layer, table, len(ids))  # [T, kv_heads, head_dim], K after RoPE
        hf_keys = past.layers[layer].keys[0].transpose(0, 1)  # [kv_heads, T, D] -> [T, kv_heads, D]
        hf_values = past.layers[layer].values[0].transpose(0, 1)
        # K/V come before this layer's attention, so differences are only the residual stream's
        # (~1e-5 relative); 1e-4 absolute + 1e-4 relative covers values up to ~10 with margin.
        torch.testing.assert_close(keys, hf_keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(values, hf_values, atol=1e-4, rtol=1e-4)


def greedy_generate(model, config, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy decoding of several prompts together: one packed prefill, then batched decode steps."""
    tables = random_block_tables(np.random.default_rng(3), [len(p) + max_new_tokens for p in prompts], 64)
    kv = KVCache.for_model(config, 64, BLOCK_SIZE, fill_nan=True)
    outputs: list[list[int]] = [[] for _ in prompts]
    batch = ForwardBatch.build([(p, 0, t) for p, t in zip(prompts, tables)], BLOCK_SIZE)
    next_ids = model.forward(batch.input_ids, batch.positions, batch, kv).argmax(-1).tolist()
    live = list(range(len(prompts)))
    while live:
        for i, token in zip(live, next_ids):
            outputs[i].append(token)
        live = [i for i in live if len(outputs[i]) < max_new_tokens and outputs[i][-1] not in config.eos_token_ids]
        if not live:
            break
        # Decode: the newest token of each live sequence; the cache holds everything before it.
        seqs = [([outputs[i][-1]], len(prompts[i]) + len(outputs[i]) - 1, tables[i]) for i in live]
        batch = ForwardBatch.build(seqs, BLOCK_SIZE)
        next_ids = model.forward(batch.input_ids, batch.positions, batch, kv).argmax(-1).tolist()
    return outputs


def test_greedy_generation_equals_hf_generate(smol, hf_model):
    model, tok, config = smol
    # A plain-text prompt and a chat prompt (whose answer may end early with <|im_end|>, the eos).
    prompts = [tok(PROMPTS[0]).input_ids, chat_prompt(tok, "Name a primary color.")]
    ours = greedy_generate(model, config, prompts, max_new_tokens=20)
    for prompt, our_ids in zip(prompts, ours):
        with torch.no_grad():
            hf_out = hf_model.generate(
                torch.tensor([prompt]), max_new_tokens=20, do_sample=False, pad_token_id=config.eos_token_ids[0]
            )
        hf_ids = hf_out[0, len(prompt) :].tolist()
        assert our_ids == hf_ids
        assert tok.decode(our_ids) == tok.decode(hf_ids)


def test_triton_backend_equals_torch_on_a_mixed_batch():
    model = random_model(seed=7)
    config = model.config
    block_size = 4
    rng = np.random.default_rng(4)
    gen = torch.Generator().manual_seed(4)
    lengths = [9, 6, 11, 7]  # A, B: cached earlier and now decoding; C: new prompt; D: 5 cached + 2 new
    tables = [[int(b) for b in blocks] for blocks in np.split(rng.permutation(24)[:12], [3, 5, 8])]
    prompts = [torch.randint(0, config.vocab_size, (n,), generator=gen).tolist() for n in lengths]

    kv = KVCache.for_model(config, 24, block_size, fill_nan=True)
    # Earlier steps (torch backend): A and B prefilled except their last token, D's first 5 tokens.
    warm = ForwardBatch.build(
        [(prompts[0][:-1], 0, tables[0]), (prompts[1][:-1], 0, tables[1]), (prompts[3][:5], 0, tables[3])], block_size
    )
    model.forward(warm.input_ids, warm.positions, warm, kv, "torch")

    # The mixed step: C (new prompt) and D (chunk over a cached prefix) prefill, A and B decode.
    batch = ForwardBatch.build(
        [
            (prompts[2], 0, tables[2]),
            (prompts[3][5:], 5, tables[3]),
            (prompts[0][-1:], 8, tables[0]),
            (prompts[1][-1:], 5, tables[1]),
        ],
        block_size,
    )
    assert batch.num_prefill_tokens == 11 + 2 and batch.decode.seq_lens.tolist() == [9, 6]
    results = {}
    for backend in ("torch", "triton"):
        cache = KVCache.for_model(config, 24, block_size, fill_nan=True)
        for layer in range(config.num_layers):
            cache.key_caches[layer].copy_(kv.key_caches[layer])
            cache.value_caches[layer].copy_(kv.value_caches[layer])
        results[backend] = (
            model.forward(batch.input_ids, batch.positions, batch, cache, backend, all_logits=True),
            cache,
        )
    (torch_logits, torch_cache), (triton_logits, triton_cache) = results["torch"], results["triton"]
    # float32 on both paths; the kernels sum in tiles with an online softmax, the oracle in one go.
    torch.testing.assert_close(triton_logits, torch_logits, atol=1e-4, rtol=1e-4)
    for layer in range(config.num_layers):  # unwritten slots stay NaN on both sides (equal_nan)
        torch.testing.assert_close(
            triton_cache.key_caches[layer], torch_cache.key_caches[layer], atol=1e-5, rtol=1e-5, equal_nan=True
        )


def test_missing_checkpoint_folder_is_a_clear_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ValueError, match="no-such-model"):
        load_model(missing)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="not supported.*llama, mistral, qwen2"):
        load_model(tmp_path)


TINY_HF = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}  # all three bands in use


def tiny_hf_config(family: str):
    import transformers

    if family == "qwen2":  # q/k/v biases
        return transformers.Qwen2Config(**TINY_HF)
    if family == "mistral":
        return transformers.MistralConfig(**TINY_HF, tie_word_embeddings=False)
    if family == "mistral-window":  # a sliding window of 16: the 70-token prompt slides past it
        return transformers.MistralConfig(**TINY_HF, tie_word_embeddings=False, sliding_window=16)
    if family == "llama3-rope":  # Llama 3.1's frequency rescaling
        return transformers.LlamaConfig(**TINY_HF, rope_scaling=LLAMA3_ROPE)
    return transformers.LlamaConfig(**TINY_HF, attention_bias=True, tie_word_embeddings=True)


@pytest.mark.parametrize("family", ["qwen2", "mistral", "mistral-window", "llama3-rope", "llama-bias"])
def test_local_checkpoint_of_each_family_equals_hf(family, tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(tiny_hf_config(family)).eval()
    with torch.no_grad():  # HF's init (std 0.02, unit norms, zero biases) would hide mistakes
        for name, p in hf.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 if "embed" in name else p.shape[1] ** -0.5)
            else:
                p.copy_((1.0 if "norm" in name else 0.0) + 0.1 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    model, tokenizer, config = load_model(tmp_path)
    assert tokenizer is None and config.model_type == hf.config.model_type

    ids = torch.randint(0, 128, (70,), generator=torch.Generator().manual_seed(1)).tolist()
    kv = KVCache.for_model(config, 8, BLOCK_SIZE, fill_nan=True)
    batch = ForwardBatch.build([(ids, 0, [5, 2, 7, 0, 3])], BLOCK_SIZE)
    ours = model.forward(batch.input_ids, batch.positions, batch, kv, all_logits=True)
    # float32, 2 layers: summation order only; logits here are O(10).
    torch.testing.assert_close(ours, hf_logits(hf, ids), atol=1e-4, rtol=1e-4)
