"""Gemma 3 in the engine, on a tiny random Gemma 3 (6 layers, every third full, the others sliding over 8 tokens).

The oracle is Hugging Face transformers' own Gemma3ForCausalLM holding the same weights: logits at every position of
prompts longer than the window, prefilled whole, in chunks and by decode steps, on every attention backend; then the
engine's greedy tokens under `paged` (every layer keeps every block) and `hybrid` (sliding groups give blocks back),
and the hybrid pool checked at every step: a sliding group holds no block wholly before its window.
"""

from __future__ import annotations

import os

import pytest
import torch

from reference.engine.batch import ForwardBatch
from reference.engine.kv_cache import KVCache
from reference.engine.kv_groups import kv_layout, model_spec, sliding_pattern
from reference.engine.llm import LLM
from reference.engine.sampling import SamplingParams
from reference.models.config import ModelConfig
from reference.models.loader import TINY_GEMMA3_CONFIG, random_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

CFG = TINY_GEMMA3_CONFIG
W = CFG.sliding_window  # 8
BS = 4


@pytest.fixture(scope="module")
def ours():
    return random_model(CFG, seed=1)


def hf_model(model):
    """transformers' Gemma 3 with our model's weights."""
    c, w = model.config, model.weights
    hf_cfg = transformers.Gemma3TextConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        sliding_window=c.sliding_window,
        layer_types=list(c.layer_types),
        query_pre_attn_scalar=int(c.query_pre_attn_scalar),
        tie_word_embeddings=True,
        attn_implementation="eager",
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": c.rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": c.rope_local_theta},
        },
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=1,
    )
    hf = transformers.Gemma3ForCausalLM(hf_cfg).eval()
    h, k, d = c.num_heads, c.num_kv_heads, c.head_dim
    state = {"model.embed_tokens.weight": w.embed_tokens, "model.norm.weight": w.norm, "lm_head.weight": w.embed_tokens}
    for i, layer in enumerate(w.layers):
        p = f"model.layers.{i}."
        q, kk, v = layer.qkv_proj.split([h * d, k * d, k * d])
        gate, up = layer.gate_up_proj.chunk(2)
        state.update(
            {
                p + "input_layernorm.weight": layer.input_norm,
                p + "post_attention_layernorm.weight": layer.post_attention_norm,
                p + "pre_feedforward_layernorm.weight": layer.pre_feedforward_norm,
                p + "post_feedforward_layernorm.weight": layer.post_feedforward_norm,
                p + "self_attn.q_proj.weight": q,
                p + "self_attn.k_proj.weight": kk,
                p + "self_attn.v_proj.weight": v,
                p + "self_attn.o_proj.weight": layer.o_proj,
                p + "self_attn.q_norm.weight": layer.q_norm,
                p + "self_attn.k_norm.weight": layer.k_norm,
                p + "mlp.gate_proj.weight": gate,
                p + "mlp.up_proj.weight": up,
                p + "mlp.down_proj.weight": layer.down_proj,
            }
        )
    result = hf.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    return hf


@pytest.fixture(scope="module")
def hf(ours):
    return hf_model(ours)


TOKENS = torch.randint(3, 256, (30,), generator=torch.Generator().manual_seed(0)).tolist()  # 30 > W = 8


@pytest.fixture(scope="module")
def hf_logits(hf):
    with torch.no_grad():
        return hf(torch.tensor([TOKENS])).logits[0]


@pytest.mark.parametrize("backend", ["torch", "torch_batched", "numba", "triton"])
def test_logits_equal_transformers_past_the_window_whole_chunked_and_decoded(ours, hf_logits, backend):
    table = list(range(17, 25))  # not from 0: a wrong table would read the NaN blocks
    cache = KVCache.for_model(CFG, 64, BS, fill_nan=True)
    batch = ForwardBatch.build([(TOKENS, 0, table)], BS)
    whole = ours.forward(batch.input_ids, batch.positions, batch, cache, backend, all_logits=True)
    torch.testing.assert_close(whole, hf_logits, atol=2e-4, rtol=1e-4)
    cache = KVCache.for_model(CFG, 64, BS, fill_nan=True)
    steps = [(0, 11), (11, 19)] + [(p, p + 1) for p in range(19, 30)]  # two chunks (the second past W), then decodes
    for start, end in steps:
        batch = ForwardBatch.build([(TOKENS[start:end], start, table)], BS)
        logits = ours.forward(batch.input_ids, batch.positions, batch, cache, backend)
        torch.testing.assert_close(logits[0], hf_logits[end - 1], atol=2e-4, rtol=1e-4)


def greedy_hf(hf, prompt, n):
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


PROMPTS = [TOKENS[:5], TOKENS[:13], TOKENS]


@pytest.mark.parametrize(
    "policy, backend, budget",
    [("paged", "torch_batched", 16), ("hybrid", "torch_batched", 16), ("hybrid", "numba", 8), ("hybrid", "torch", 64)],
)
def test_engine_greedy_tokens_equal_transformers(ours, hf, policy, backend, budget):
    expected = [greedy_hf(hf, p, 24) for p in PROMPTS]
    llm = LLM(ours, policy=policy, block_size=BS, num_gpu_blocks=64, backend=backend, max_num_batched_tokens=budget)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    got = [r.outputs[0].token_ids for r in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)]
    assert got == expected


def test_hybrid_frees_blocks_outside_the_window_at_every_step(ours):
    llm = LLM(ours, policy="hybrid", block_size=BS, num_gpu_blocks=64, max_num_batched_tokens=8)
    kv = llm.kv_manager
    assert kv.windows == (None, W, W) and llm.kv_cache.layout.num_groups == 3
    llm.add_request({"prompt_token_ids": TOKENS}, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    held_max, before = 0, {}
    while llm.has_unfinished_requests():
        llm.step()
        kv.check_invariants()
        assert kv.breakdown().total == kv.num_slots  # the five shares account for every slot of the pool
        for seq_id in kv.seq_ids:
            tables = kv.group_tables(seq_id)
            assert all(b is not None for b in tables[0])  # the full group keeps every block
            # this step's first query sat at the tokens held before it: it and later ones read from there - W + 1
            lo = max(0, before.get(seq_id, 0) - W + 1)
            for table in tables[1:]:
                assert all(b is None for b in table[: lo // BS]), (lo, table)  # every block wholly before: freed
                assert all(b is not None for b in table[lo // BS :]), (lo, table)  # every block it reads: held
                held_max = max(held_max, len(table) - lo // BS)
            before[seq_id] = kv.num_tokens(seq_id)
    # a sliding group never holds more than the window's blocks plus one step's chunk of 8 and a partial block
    assert held_max <= -(-W // BS) + -(-8 // BS) + 1
    assert kv.num_free_blocks == kv.num_blocks  # everything back once the request finished


def test_layout_groups_layers_as_the_manager_counts_them(ours):
    llm = LLM(ours, policy="hybrid", block_size=BS, num_gpu_blocks=64)
    layout = llm.kv_cache.layout
    # full layers 2, 5 form group 0; sliding 0, 1 group 1; sliding 3, 4 group 2; each in the tensor of its place
    assert layout.layer_group == (1, 1, 0, 2, 2, 0) and layout.layer_tensor == (0, 1, 0, 0, 1, 1)
    assert llm.kv_cache.num_layers == 2 and llm.kv_manager.num_blocks == 64 * 6 // (2 * 1)  # same bytes, 3x pages
    paged = LLM(ours, policy="paged", block_size=BS, num_gpu_blocks=64)
    assert paged.kv_cache.layout.num_groups == 1 and paged.kv_cache.num_layers == 6
    per_page = lambda c: c.num_layers * c.num_blocks  # noqa: E731  (K/V tensors x pages: the cache's size)
    assert per_page(llm.kv_cache) == per_page(paged.kv_cache)
    assert kv_layout(CFG, paged.kv_manager).num_groups == 1


def test_hybrid_is_refused_for_a_model_without_sliding_layers():
    llama = random_model()
    with pytest.raises(ValueError, match="interleaves full and sliding-window attention"):
        LLM(llama, policy="hybrid", block_size=BS, num_gpu_blocks=64)


def test_config_reads_transformers_gemma3_configs():
    hf = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 6,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "vocab_size": 256,
        "sliding_window": 8,
        "query_pre_attn_scalar": 16,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    }
    config = ModelConfig.from_hf_dict(hf)
    assert config.layer_types == ("sliding_attention",) * 5 + ("full_attention",)  # the default pattern of 6
    assert (config.rope_theta, config.rope_local_theta, config.attention_scale) == (1e6, 1e4, 0.25)
    assert [config.layer_window(i) for i in range(6)] == [8] * 5 + [None]
    old = {k: v for k, v in hf.items() if k != "rope_parameters"} | {
        "rope_theta": 1e6,
        "rope_local_base_freq": 1e4,
        "sliding_window_pattern": 3,
    }
    config = ModelConfig.from_hf_dict(old)  # transformers < 5 spells them at the top level
    assert config.layer_types == ("sliding_attention", "sliding_attention", "full_attention") * 2
    assert sliding_pattern(config) == 3 and model_spec(config, torch.float32).num_sliding_layers == 4


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_activation": "relu"}, "hidden_activation 'relu' is not supported"),
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0 is not supported"),
        ({"layer_types": ["full_attention"]}, "layer_types must name each of the 6 layers"),
        ({"layer_types": ["sliding_attention"] * 6}, None),
    ],
)
def test_config_bad_gemma3_fields_are_one_line(change, message):
    hf = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 6,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "vocab_size": 256,
        "head_dim": 16,
    } | change
    if message is None:  # valid for the model, but no full layer: the KV manager cannot group it
        with pytest.raises(ValueError, match="every N-th layer full attention"):
            sliding_pattern(ModelConfig.from_hf_dict(hf))
        return
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_dict(hf)
