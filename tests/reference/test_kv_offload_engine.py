"""The engine's CPU offload tier (reference/engine/kv_cache.py's tier pool, decided by sim/kv/offload.py in the paged manager):
a conversation whose second turn's prefix was evicted from a small GPU pool comes back from the tier and gives the
same greedy tokens and the same log-probabilities as with a GPU pool big enough to keep it.

On this CPU-only machine the "GPU" pool and the tier are both host tensors (pinning needs CUDA): the copies are real
tensor copies through the same code a CUDA device runs, only not over PCIe.
"""

from __future__ import annotations

import pytest

from reference import LLM, SamplingParams
from reference.engine.kv_cache import KVCache
from sim.kv.offload import TierCopy

BLOCK = 16
SYSTEM = (
    "You are a careful assistant who answers questions about geography in one short sentence and never uses "
    "more words than needed. "
)
TURN1 = SYSTEM + "User: What is the capital of Italy?\nAssistant:"
OTHER = (
    "Write a list of five fruits that are red, then explain why tomatoes are sometimes called vegetables "
    "although botanists say they are fruits, in plain words. "
) * 3  # ~90 tokens: 6 blocks, the whole small pool


def conversation(llm: LLM) -> tuple:
    """Turn 1; an unrelated request (in a small pool it evicts turn 1's cached blocks); turn 2 = turn 1 + its answer
    + a new question. Returns turn 2's output."""
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
    first = llm.generate(TURN1, params)[0]
    llm.generate(OTHER, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    turn2 = TURN1 + first.outputs[0].text + "\nUser: And of France?\nAssistant:"
    return llm.generate(turn2, params)[0]


def test_a_prefix_reloaded_from_the_tier_gives_the_same_tokens_and_logprobs(smol):
    big = LLM.from_loaded(*smol[:2], num_gpu_blocks=64, max_model_len=512, enable_prefix_caching=True, block_size=BLOCK)
    small = LLM.from_loaded(
        *smol[:2],
        num_gpu_blocks=6,
        max_model_len=512,
        enable_prefix_caching=True,
        block_size=BLOCK,
        num_offload_blocks=16,
    )
    kept, reloaded = conversation(big), conversation(small)
    stats = small.kv_manager.prefix_cache_stats()
    assert big.kv_manager.prefix_cache_stats().cpu_hit_tokens == 0
    assert stats.cpu_hit_tokens >= 2 * BLOCK and stats.reloaded_blocks >= 2  # turn 2's prefix came from the tier
    assert reloaded.num_cached_tokens == kept.num_cached_tokens >= 2 * BLOCK
    assert reloaded.outputs[0].token_ids == kept.outputs[0].token_ids
    for a, b in zip(kept.outputs[0].logprobs, reloaded.outputs[0].logprobs):
        assert a.keys() == b.keys()
        for token in a:  # NOTE: 1e-5: the same K/V bytes, the same kernels; only batch shapes may differ
            assert b[token].logprob == pytest.approx(a[token].logprob, abs=1e-5)


def test_tier_copies_move_every_layers_block_in_order():
    cache = KVCache(2, 4, 2, 1, 3, num_offload_blocks=2)
    for layer in range(2):
        cache.key_caches[layer][1] = 1.0 + layer
        cache.value_caches[layer][1] = -1.0 - layer
    # block 1 goes out to tier block 0, then block 1 is reused: tier 0 comes back into block 3
    cache.apply_tier_copies([TierCopy(True, 1, 0)])
    for layer in range(2):
        cache.key_caches[layer][1] = 7.0
    cache.apply_tier_copies([TierCopy(False, 0, 3)])
    for layer in range(2):
        assert (cache.key_caches[layer][3] == 1.0 + layer).all()
        assert (cache.value_caches[layer][3] == -1.0 - layer).all()
    with pytest.raises(ValueError, match="outside the pools"):
        cache.apply_tier_copies([TierCopy(False, 2, 0)])


def test_bad_input_is_one_line(smol):
    with pytest.raises(ValueError, match="needs enable_prefix_caching=True"):
        LLM.from_loaded(*smol[:2], num_gpu_blocks=6, num_offload_blocks=4)
    with pytest.raises(ValueError, match="policy 'radix' has no CPU offload tier"):
        LLM.from_loaded(*smol[:2], num_gpu_blocks=6, policy="radix", num_offload_blocks=4)
    with pytest.raises(ValueError, match="num_offload_blocks"):
        LLM.from_loaded(*smol[:2], num_gpu_blocks=6, enable_prefix_caching=True, num_offload_blocks=-1)
    with pytest.raises(ValueError, match=r"num_offload_blocks 1,000,000,000,000 is more than .* \(allowed: 0 \.\. "):
        LLM.from_loaded(*smol[:2], num_gpu_blocks=6, enable_prefix_caching=True, num_offload_blocks=10**12)


def test_serve_refuses_a_tier_without_the_prefix_cache_in_one_line():
    from reference.cli import UsageError, build_parser, run_serve

    args = build_parser().parse_args(["serve", "--num-gpu-blocks", "8", "--num-offload-blocks", "4"])
    with pytest.raises(UsageError, match=r"^an offload tier \(num_offload_blocks > 0\) .* needs enable_prefix_caching"):
        run_serve(args)
