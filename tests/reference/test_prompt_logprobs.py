"""`SamplingParams(prompt_logprobs=k)`: RequestOutput.prompt_logprobs as vLLM returns it, checked against HF
transformers' own logits over the prompt (and against numbers vLLM itself returned), with the prompt computed
whole, in chunks, after a preemption by recomputation, and beside a prefix cache that already holds its prefix.

Tolerance: 2e-4 on log-probabilities. Both sides are float32, but two programs: this engine's projections (oneDNN
with prepacked weights), its paged attention and its chunking against HF's matmuls and SDPA sum in different
orders, through 30 layers. Measured on these prompts with the top 20 at every position: a median difference of
8e-6 and a largest of 7e-5, at the early positions whose logits reach 35 in magnitude (float32's spacing there is
4e-6); against vLLM's own numbers, 1.3e-5. 2e-4 leaves room for another CPU's kernels, and a wrong row (an
off-by-one position, a chunk filed twice) moves log-probs by whole units.
"""

from __future__ import annotations

import pytest
import torch

from reference import LLM, SamplingParams
from reference.models import random_model

TOL = 2e-4
SHARED = (
    "You are a careful assistant. Answer in one short sentence, and never make up facts. "
    "Here is the question: "
)  # a prefix of several 16-token blocks, shared by two prompts
TEXTS = [
    "The capital of France is",
    SHARED + "what is the tallest mountain on Earth, and in which country does it stand?",  # 39 tokens
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
]


def engine(smol, **kwargs) -> LLM:
    kwargs.setdefault("num_gpu_blocks", 96)
    kwargs.setdefault("max_model_len", 512)
    return LLM.from_loaded(*smol, **kwargs)


def hf_log_softmax(hf_model, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab]: row i - 1 is HF's log-distribution of token i."""
    with torch.no_grad():
        return torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)


def assert_matches_hf(prompt_logprobs, ids: list[int], expected: torch.Tensor, k: int) -> None:
    """vLLM's shape (None first, then the prompt's token and the top k: ranks 1..k, plus the prompt token's own
    if it is not among them) with HF's values, and each rank HF's: the tokens at least as likely, counted with the
    tolerance either way (a near-tie far down the list may fall on either side in two float32 programs)."""
    assert len(prompt_logprobs) == len(ids) and prompt_logprobs[0] is None
    for i in range(1, len(ids)):
        entry, row, token = prompt_logprobs[i], expected[i - 1], ids[i]
        assert next(iter(entry)) == token, i  # the prompt's own token first
        ranks = sorted(lp.rank for lp in entry.values())
        assert ranks == list(range(1, k + 1)) or ranks == [*range(1, k + 1), entry[token].rank], (i, ranks)
        for t, lp in entry.items():
            v = float(row[t])
            assert lp.logprob == pytest.approx(v, abs=TOL), (i, t)
            assert int((row >= v + TOL).sum()) <= lp.rank <= int((row >= v - TOL).sum()), (i, t, lp.rank)


@pytest.fixture(scope="module")
def prompts(smol):
    return [smol[1](t).input_ids for t in TEXTS]


@pytest.fixture(scope="module")
def hf_rows(hf_model, prompts):
    return [hf_log_softmax(hf_model, ids) for ids in prompts]


def test_prompt_logprobs_are_hfs_log_softmax(smol, prompts, hf_rows):
    outs = engine(smol).generate(
        prompts, [SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=k) for k in (3, 0, 5)]
    )
    for out, ids, rows, k in zip(outs, prompts, hf_rows, (3, 0, 5)):
        assert_matches_hf(out.prompt_logprobs, ids, rows, k)
    assert all(e[t].decoded_token == smol[1].decode([t]) for e in outs[0].prompt_logprobs[1:] for t in e)


def test_not_asked_is_none_and_n_samples_share_one_list(smol, prompts):
    llm = engine(smol)
    assert llm.generate(prompts[0], SamplingParams(max_tokens=2))[0].prompt_logprobs is None
    [out] = llm.generate(prompts[0], SamplingParams(n=3, temperature=1.0, seed=0, max_tokens=2, prompt_logprobs=1))
    assert len(out.outputs) == 3 and len(out.prompt_logprobs) == len(prompts[0])


def test_prompt_logprobs_are_what_vllm_returned(smol):
    """vLLM 0.32's CPU build, float32, on this checkpoint (tools/peer/api_checks.py, check "prompt_logprobs"):
    per position [[token id, logprob, rank], ...] sorted by id."""
    vllm = [
        None,
        [[29, -0.8654828071594238, 1], [3575, -11.539274215698242, 2923]],
        [[282, -0.3376066982746124, 1]],
        [[260, -2.184504985809326, 1], [4649, -2.4386610984802246, 2]],
        [[314, -0.45092111825942993, 1]],
    ]
    [out] = engine(smol).generate(TEXTS[0], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1))
    got = [None if p is None else sorted([t, lp.logprob, lp.rank] for t, lp in p.items()) for p in out.prompt_logprobs]
    assert [None if p is None else [(t, r) for t, _, r in p] for p in got] == [
        None if p is None else [(t, r) for t, _, r in p] for p in vllm
    ]
    assert all(a[1] == pytest.approx(b[1], abs=TOL) for g, v in zip(got[1:], vllm[1:]) for a, b in zip(g, v))


def test_chunked_prefill_collects_every_chunk_once(smol, prompts, hf_rows):
    """A budget of 16 tokens: the 39-token prompt arrives in 3 chunks over 3 steps, beside the others."""
    llm = engine(smol, max_num_batched_tokens=16)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=2))
    for out, ids, rows in zip(outs, prompts, hf_rows):
        assert_matches_hf(out.prompt_logprobs, ids, rows, 2)
    chunks = [e for r in llm.step_log for e in r.prefills if e[0] == 1]  # (request, seq, computed, new)
    assert len(chunks) >= 2 and chunks[-1][2] > 0, "expected the long prompt in several chunks"


def test_only_steps_that_feed_a_wanted_prompt_project_every_row(smol, prompts, monkeypatch):
    """all_logits (every fed row onto the vocabulary) in exactly the steps that feed prompt positions still missing
    (each chunk of the one request that asked), never in decodes or in steps without it."""
    llm = engine(smol, max_num_batched_tokens=16)
    calls, forward = [], llm.model.forward

    def recording(*args, all_logits=False, **kwargs):
        calls.append(all_logits)
        return forward(*args, all_logits=all_logits, **kwargs)

    monkeypatch.setattr(llm.model, "forward", recording)
    params = [
        SamplingParams(temperature=0, max_tokens=4),
        SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=1),
    ]
    llm.generate(prompts[:2], params)
    chunks = [r.step for r in llm.step_log for e in r.prefills if e[0] == 1]
    assert calls == [r.step in chunks for r in llm.step_log] and sum(calls) == len(chunks) >= 2


def test_a_prefix_cache_hit_is_skipped_and_the_blocks_still_cached(smol, prompts, hf_rows):
    """As vLLM: a request that wants prompt log-probs never reads the prefix cache (every position computed), but
    its own full blocks are cached for the requests after it."""
    llm = engine(smol, enable_prefix_caching=True)
    ids, other = prompts[1], smol[1](SHARED + "who wrote Hamlet?").input_ids
    assert llm.generate([other], SamplingParams(max_tokens=1))[0].num_cached_tokens == 0  # caches the shared prefix
    [out] = llm.generate([ids], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2))
    assert out.num_cached_tokens == 0 and llm.stats.num_cached_tokens == 0  # the cached prefix was not read
    assert_matches_hf(out.prompt_logprobs, ids, hf_rows[1], 2)
    [again] = llm.generate([ids], SamplingParams(temperature=0, max_tokens=2))  # reads what the last one cached
    shared = next(i for i, (a, b) in enumerate(zip(ids, other)) if a != b)
    assert again.num_cached_tokens == (len(ids) - 1) // 16 * 16 > shared // 16 * 16  # its own blocks too


def test_preemption_by_recomputation_adds_nothing_twice():
    """A pool too small for three requests: the latest, which asked for prompt log-probs, is preempted and its
    prompt recomputed; its list is the same as in a roomy pool, one entry per prompt token."""
    tiny = random_model(seed=3)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (10, 9, 11)]
    params = [SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)] * 2 + [
        SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, prompt_logprobs=3)
    ]

    def run(**kwargs):
        llm = LLM.from_loaded(tiny, block_size=4, **kwargs)
        return llm.generate(prompts, params)[2], llm

    roomy, _ = run(num_gpu_blocks=64)
    tight, llm = run(num_gpu_blocks=14, preemption="recompute")
    assert llm.stats.num_preemptions > 0
    assert any(
        rid == 2 and computed == 0 and new > len(prompts[2])
        for r in llm.step_log
        for rid, _, computed, new in r.prefills
    ), "expected request 2 recomputed with its outputs"
    assert tight.outputs[0].token_ids == roomy.outputs[0].token_ids and len(tight.prompt_logprobs) == len(prompts[2])
    for a, b in zip(tight.prompt_logprobs[1:], roomy.prompt_logprobs[1:]):
        assert list(a) == list(b) and all(a[t].logprob == pytest.approx(b[t].logprob, abs=1e-5) for t in a)
        assert all(a[t].decoded_token is None for t in a)  # no tokenizer: nothing to decode (as vLLM)
