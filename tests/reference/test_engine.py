"""The reference engine end to end on the real SmolLM2: vLLM's offline API, checked against HF transformers.

The engine runs the SIMULATOR's scheduler and KV manager (sim/) on real tensors, so these tests also check
that the shared memory bookkeeping is right: a wrong block table or a missed copy changes the text.
Greedy decoding and beam search must give HF transformers' tokens; sampling must be reproducible by seed;
parallel samples and beams must share blocks (paper 4.4) and copy on write.
"""

from __future__ import annotations

import math

import pytest
import torch

from reference import LLM, BeamSearchParams, SamplingParams
from reference.engine.sampling import sample, sample_generator
from reference.models import random_model

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away, there lived a"]
GREEDY_TOKENS = 16


def chat_prompt(tok, question: str) -> list[int]:
    """The instruct model's own format; its short answers end with the eos token <|im_end|>."""
    return list(
        tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
    )


def engine(smol, **kwargs) -> LLM:
    kwargs.setdefault("num_gpu_blocks", 64)
    kwargs.setdefault("max_model_len", 512)  # keeps the `max` policy's reservation small
    return LLM.from_loaded(*smol, **kwargs)


def hf_generate(hf_model, ids: list[int], **kwargs) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), pad_token_id=2, do_sample=False, **kwargs)
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def greedy_prompts(smol):
    tok = smol[1]
    return [tok(p).input_ids for p in PROMPTS[:2]] + [chat_prompt(tok, "What is 2+2? Answer with a number only.")]


@pytest.fixture(scope="module")
def hf_greedy(hf_model, greedy_prompts):
    return [hf_generate(hf_model, ids, max_new_tokens=GREEDY_TOKENS) for ids in greedy_prompts]


@pytest.mark.parametrize("policy", ["paged", "max"])
def test_greedy_equals_hf_generate(smol, greedy_prompts, hf_greedy, policy):
    tok = smol[1]
    llm = engine(smol, policy=policy)
    # Two prompts as text, the chat prompt as token ids (both spellings of a prompt are accepted).
    outs = llm.generate(
        [PROMPTS[0], PROMPTS[1], greedy_prompts[2]], SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS)
    )
    for out, ids, hf_ids in zip(outs, greedy_prompts, hf_greedy):
        assert out.finished and out.prompt_token_ids == ids
        [completion] = out.outputs
        assert completion.token_ids == hf_ids
        assert completion.text == tok.decode(hf_ids, skip_special_tokens=True)
        ends_with_eos = hf_ids[-1] == 2
        assert completion.finish_reason == ("stop" if ends_with_eos else "length")
    assert hf_greedy[2][-1] == 2, "the chat prompt should exercise the eos path"
    assert outs[0].prompt == PROMPTS[0] and outs[2].prompt is None
    assert llm.kv_manager.num_free_blocks == llm.kv_manager.num_blocks  # every block came back


def test_parallel_samples_share_the_prompt_and_seeds_reproduce(smol):
    llm = engine(smol)
    prompt = "Write a short poem about the sea:"  # 8 tokens: one partly filled block of 16, shared by n = 3
    params = SamplingParams(n=3, temperature=1.0, top_p=0.9, top_k=50, max_tokens=8, seed=7, ignore_eos=True)
    rid = llm.scheduler_request_id(llm.add_request(prompt, params))  # the scheduler's int, as step_log names it
    llm.step()  # the prefill: the prompt is computed ONCE, and each sibling samples from its logits
    seq_ids = llm.scheduler.seq_ids(rid)
    tables = [llm.kv_manager.block_table(i) for i in seq_ids]
    assert len(seq_ids) == 3 and tables[0] == tables[1] == tables[2]
    assert llm.kv_manager.allocator.ref_count(tables[0][0]) == 3
    assert llm.step_log[0].prefills[1:] == [(rid, seq_ids[1], 8, 0), (rid, seq_ids[2], 8, 0)]  # sample-only
    while llm.has_unfinished_requests():
        outs = llm.step()
    texts = [c.text for c in outs[0].outputs]
    # The first decode writes into the shared last block: two of the three owners copy it first.
    assert len(llm.step_log[1].blocks_to_copy) == 2
    assert len(set(texts)) > 1  # each sample draws its own stream
    assert all(len(c.token_ids) == 8 and c.finish_reason == "length" for c in outs[0].outputs)

    again = engine(smol).generate(prompt, params)[0]
    assert [c.text for c in again.outputs] == texts  # same seed, same text
    other = engine(smol).generate(prompt, SamplingParams(**{**_fields(params), "seed": 8}))[0]
    assert [c.text for c in other.outputs] != texts


def _fields(params: SamplingParams) -> dict:
    return {name: getattr(params, name) for name in params.__dataclass_fields__}


@pytest.fixture(scope="module")
def beam_prompts(smol):
    tok = smol[1]
    return [tok(PROMPTS[0]).input_ids, chat_prompt(tok, "What is 2+2? Answer with a number only.")]


def test_beam_search_equals_hf_where_their_rules_agree(smol, hf_model, beam_prompts):
    """vLLM's rules (reference/engine/beam.py) and HF's part on end-of-sequence tokens and on the score's length; on a
    raw prompt whose beams never meet EOS, with ignore_eos, every beam runs to max_tokens and both keep the same
    3 sequences, best first. (The chat prompt's beams do meet EOS: there ignore_eos makes it an ordinary token
    in vLLM and a forbidden one in HF's min_new_tokens, so they part.)"""
    llm = engine(smol)
    params = BeamSearchParams(beam_width=3, max_tokens=12, ignore_eos=True)
    results = llm.beam_search([beam_prompts[0], PROMPTS[1]], params)  # both requests' beams run in the same steps
    for ids, result in zip([beam_prompts[0], smol[1](PROMPTS[1]).input_ids], results):
        assert all(2 not in s.tokens[len(ids) :] for s in result.sequences)
        with torch.no_grad():
            hf = hf_model.generate(
                torch.tensor([ids]),
                pad_token_id=2,
                do_sample=False,
                max_new_tokens=12,
                min_new_tokens=12,
                num_beams=3,
                num_return_sequences=3,
                early_stopping=False,
            )
        assert [s.tokens for s in result.sequences] == hf.tolist()
        assert [s.score for s in result.sequences] == sorted((s.score for s in result.sequences), reverse=True)
    assert llm.kv_manager.num_free_blocks == llm.kv_manager.num_blocks


def test_beam_search_returns_vllms_sequences(smol, beam_prompts):
    """As vLLM's: tokens and text hold the prompt, the score divides by the whole length (an end-of-sequence token
    not counted), and sequences that ended with EOS are kept (the chat prompt's short answer ends with one)."""
    llm = engine(smol)
    results = llm.beam_search(
        [{"prompt_token_ids": ids} for ids in beam_prompts], BeamSearchParams(beam_width=3, max_tokens=12)
    )
    tok = smol[1]
    for ids, result in zip(beam_prompts, results):
        for s in result.sequences:
            assert s.tokens[: len(ids)] == ids and s.text == tok.decode(s.tokens, skip_special_tokens=True)
            length = len(s.tokens) - (s.finish_reason == "stop")
            assert math.isclose(s.score, s.cum_logprob / length, rel_tol=1e-9)
    assert results[1].sequences[0].finish_reason == "stop" and results[1].sequences[0].tokens[-1] == 2


def test_beams_share_blocks_and_copy_on_write(smol, beam_prompts):
    llm = engine(smol, block_size=4)  # small blocks: forks share partly filled blocks often
    rid = llm.scheduler_request_id(llm.add_request(beam_prompts[0], BeamSearchParams(beam_width=3, max_tokens=6)))
    max_refs = 0
    while llm.has_unfinished_requests():
        llm.step()
        llm.kv_manager.check_invariants()
        if not llm.scheduler.is_finished(rid):
            tables = [llm.kv_manager.block_table(i) for i in llm.scheduler.seq_ids(rid)]
            max_refs = max(max_refs, *(llm.kv_manager.allocator.ref_count(b) for t in tables for b in t))
    assert max_refs > 1  # forked beams point at their parent's blocks
    assert any(r.blocks_to_copy for r in llm.step_log)  # and copy the shared last block before writing
    assert llm.kv_manager.num_free_blocks == llm.kv_manager.num_blocks


def test_prefix_caching_reuses_blocks_and_keeps_outputs(smol):
    system = (
        "You are a careful assistant. Answer every question in one short sentence, and never use more "
        "words than you need. Be friendly, be precise, and check your facts twice. Question: "
    )
    prompts = [system + "What is the capital of Italy?", system + "What is the largest planet?"]
    assert len(smol[1](system).input_ids) > 32  # at least two full blocks of 16 tokens are shared
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    plain = engine(smol).generate(prompts, params)
    llm = engine(smol, enable_prefix_caching=True)
    cached = llm.generate(prompts, params)  # admitted in one step: the second hits blocks the first computes
    assert [o.outputs[0].token_ids for o in cached] == [o.outputs[0].token_ids for o in plain]
    assert cached[0].num_cached_tokens == 0 and cached[1].num_cached_tokens >= 32
    assert llm.kv_manager.allocator.num_prefix_hits >= 2
    later = llm.generate(prompts[1], params)[0]  # after both finished: the freed cached blocks are revived
    assert later.num_cached_tokens >= 32 and later.outputs[0].token_ids == plain[1].outputs[0].token_ids
    assert llm.stats.num_cached_tokens == cached[1].num_cached_tokens + later.num_cached_tokens


@pytest.mark.parametrize("block_size", [1, 16])
def test_the_radix_policy_caches_prefixes_without_the_flag_and_keeps_outputs(smol, block_size):
    """radix's tree is the policy: the engine hands it every prompt's ids (enable_prefix_caching or not), and a prompt
    sharing a system prefix with an earlier one computes only the rest, at any page size, with the same tokens."""
    system = (
        "You are a careful assistant. Answer every question in one short sentence, and never use more "
        "words than you need. Question: "
    )
    prompts = [system + "What is the capital of Italy?", system + "What is the largest planet?"]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in engine(smol).generate(prompts, params)]
    llm = LLM.from_loaded(*smol[:2], policy="radix", block_size=block_size, num_gpu_blocks=4096 // block_size)
    first = llm.generate(prompts[0], params)[0]
    second = llm.generate(prompts[1], params)[0]
    shared = len(smol[1](system).input_ids)
    assert first.num_cached_tokens == 0 and second.num_cached_tokens >= shared - block_size
    assert [first.outputs[0].token_ids, second.outputs[0].token_ids] == plain


def test_triton_backend_equals_torch_on_the_tiny_model():
    model = random_model(seed=3)
    prompts = [[5, 17, 99, 3, 42, 8, 11], [7, 7, 200, 31]]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    results = {}
    for backend in ("torch", "triton"):  # triton runs under TRITON_INTERPRET=1 on CPU
        llm = LLM.from_loaded(model, backend=backend, num_gpu_blocks=8, block_size=4)
        results[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert results["triton"] == results["torch"]


def test_sampler_filters_and_reports_raw_logprobs():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 2.9, 0.0]])
    raw = torch.log_softmax(logits, dim=-1)
    greedy = SamplingParams(temperature=0.0, logprobs=0)
    top1 = SamplingParams(temperature=5.0, top_k=1, logprobs=0)  # a hot temperature, but only one token survives
    narrow = SamplingParams(temperature=5.0, top_p=0.01, logprobs=0)  # the most likely token alone reaches top_p
    gens = [sample_generator(0, i) for i in range(2)]
    for params in (greedy, top1, narrow):
        tokens, logprobs, _ = sample(logits, [params, params], gens)
        assert tokens == [0, 1]
        assert logprobs == pytest.approx([raw[0, 0].item(), raw[1, 1].item()])  # before temperature / filters
    # a row that asks for no logprobs gets none (vLLM: cumulative_logprob None); the others keep theirs
    tokens, logprobs, top = sample(logits, [SamplingParams(temperature=0.0), greedy], gens)
    assert tokens == [0, 1] and logprobs[0] is None and top[0] is None
    assert logprobs[1] == pytest.approx(raw[1, 1].item())
    draws = {tuple(sample(logits, [SamplingParams(top_k=2)] * 2, gens)[0]) for _ in range(50)}
    assert {t for d in draws for t in d} <= {0, 1, 2} and len(draws) > 1  # only the two best of each row


# --- chunked prefill (vLLM v1): a prompt computed in chunks gives the very same tokens -----------------------
@pytest.fixture(scope="module")
def long_prompt(smol):
    """About 600 tokens of text, so that budgets of 64 and 512 tokens both cut it into chunks."""
    text = " ".join(
        f"Paragraph {i}: paging splits the KV cache into blocks, and a block table maps them." for i in range(40)
    )
    return smol[1](text + " In one sentence, paging").input_ids


@pytest.fixture(scope="module")
def hf_long(hf_model, long_prompt):
    return hf_generate(hf_model, long_prompt, max_new_tokens=GREEDY_TOKENS)


@pytest.mark.slow
@pytest.mark.parametrize("budget", [16, 64, 512])
def test_chunked_prefill_greedy_equals_unchunked_and_hf(smol, greedy_prompts, hf_greedy, long_prompt, hf_long, budget):
    """Three short prompts and a long one, together: with chunked prefill at this token budget the long prompt
    is computed in chunks (each attending to the earlier ones through the block table) while the others
    decode in the same steps. The greedy tokens equal the unchunked engine's and HF transformers'."""
    prompts = [*greedy_prompts, long_prompt]
    params = SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS)
    chunked = engine(smol, scheduler="v1", max_num_batched_tokens=budget, num_gpu_blocks=128, max_model_len=1024)
    whole = engine(smol, scheduler="v1", enable_chunked_prefill=False, num_gpu_blocks=128, max_model_len=1024)
    got = [o.outputs[0].token_ids for o in chunked.generate(prompts, params)]
    assert got == [o.outputs[0].token_ids for o in whole.generate(prompts, params)]
    assert got == [*hf_greedy, hf_long]
    chunks = [e for r in chunked.step_log for e in r.prefills if e[0] == 3]  # (request, seq, computed, new)
    # in consecutive chunks, each within the budget (decodes take their share of it too)
    assert len(chunks) >= -(-len(long_prompt) // budget) >= 2 and sum(e[3] for e in chunks) == len(long_prompt)
    assert [e[2] for e in chunks] == [sum(c[3] for c in chunks[:i]) for i in range(len(chunks))]
    assert any(r.prefills and r.decodes for r in chunked.step_log), "expected steps mixing chunks and decodes"
    assert all(r.num_batched_tokens <= budget for r in chunked.step_log)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "torch_batched", "triton"])
def test_every_backend_computes_chunks_over_the_cached_prefix(backend):
    """The tiny random model, every attention backend (Triton through its interpreter on CPU): prompts of
    30-70 tokens in chunks of 8 give the tokens of whole prompts."""
    tiny = random_model(seed=1)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (30, 47, 70)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)

    def run(**kwargs):
        llm = LLM.from_loaded(tiny, block_size=4, num_gpu_blocks=96, backend=backend, **kwargs)
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params)], llm

    whole, _ = run(scheduler="v0")
    chunked, llm = run(scheduler="v1", max_num_batched_tokens=8)
    assert chunked == whole
    assert sum(1 for r in llm.step_log for e in r.prefills if e[2] > 0) >= 10  # chunks over a cached prefix


def test_a_ten_thousand_token_prompt_with_a_budget_of_512():
    """A small model with a 16k context: a 10,000-token prompt is served in ceil(10000 / 512) = 20 chunks while a
    short request decodes beside it, and gives the tokens of the same prompt computed whole."""
    tiny = random_model(seed=2, max_position_embeddings=16384)
    gen = torch.Generator().manual_seed(0)
    long_ids = torch.randint(3, 256, (10_000,), generator=gen).tolist()
    short_ids = torch.randint(3, 256, (12,), generator=gen).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)

    def run(**kwargs):
        llm = LLM.from_loaded(tiny, block_size=16, num_gpu_blocks=700, **kwargs)
        return [o.outputs[0].token_ids for o in llm.generate([short_ids, long_ids], params)], llm

    chunked, llm = run(scheduler="v1", max_num_batched_tokens=512)
    whole, _ = run(scheduler="v1", enable_chunked_prefill=False, max_num_batched_tokens=10_000)
    assert chunked == whole
    chunks = [e[3] for r in llm.step_log for e in r.prefills if e[0] == 1]
    assert len(chunks) == 20 and sum(chunks) == 10_000
    assert all(r.num_batched_tokens <= 512 for r in llm.step_log)
