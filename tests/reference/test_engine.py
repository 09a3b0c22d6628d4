"""The reference engine end to end on the real SmolLM2: vLLM's offline API, checked against HF transformers.

The engine runs the SIMULATOR's scheduler and KV manager (sim/) on real tensors, so these tests also check
that the shared memory bookkeeping is right: a wrong block table or a missed copy changes the text.
Greedy decoding and beam search must give HF transformers' tokens; sampling must be reproducible by seed;
parallel samples and beams must share blocks (paper 4.4) and copy on write.
"""
from __future__ import annotations

import pytest
import torch

from reference import LLM, BeamSearchParams, SamplingParams
from reference.models import load_model, random_model, smollm2_checkpoint_dir
from reference.sampling import sample, sample_generator

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away, there lived a"]
GREEDY_TOKENS = 16


@pytest.fixture(scope="module")
def smol():
    """(model, tokenizer, config), loaded once; every test builds cheap engines around it with from_loaded."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the engine picks on CPU; HF's runs here get the same (measured faster)
    yield load_model("smollm2")
    torch.set_num_threads(before)  # give the other test modules theirs back


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_checkpoint_dir(), dtype=torch.float32,
                                                local_files_only=True).eval()


def chat_prompt(tok, question: str) -> list[int]:
    """The instruct model's own format; its short answers end with the eos token <|im_end|>."""
    return list(tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        tokenize=True)["input_ids"])


def engine(smol, **kwargs) -> LLM:
    kwargs.setdefault("num_gpu_blocks", 64)
    kwargs.setdefault("max_model_len", 512)  # keeps the `max` policy's reservation small
    return LLM.from_loaded(*smol, **kwargs)


def hf_generate(hf_model, ids: list[int], **kwargs) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), pad_token_id=2, do_sample=False, **kwargs)
    return out[0, len(ids):].tolist()


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
    outs = llm.generate([PROMPTS[0], PROMPTS[1], greedy_prompts[2]],
                        SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS))
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
    rid = llm.add_request(prompt, params)
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


def test_beam_search_equals_hf(smol, hf_model, beam_prompts):
    llm = engine(smol)
    params = BeamSearchParams(beam_width=3, max_tokens=12)
    results = llm.beam_search(beam_prompts, params)  # both requests' beams run in the same steps
    for ids, result in zip(beam_prompts, results):
        hf_ids = hf_generate(hf_model, ids, max_new_tokens=12, num_beams=3, early_stopping=False,
                             length_penalty=1.0)
        best = result.sequences[0]
        assert best.tokens == ids + hf_ids
        assert len(result.sequences) == 3
        assert [s.score for s in result.sequences] == sorted((s.score for s in result.sequences), reverse=True)
    # the chat prompt's short answer ends with eos: finished hypotheses and the early-stop rule are exercised
    assert results[1].sequences[0].finish_reason == "stop"
    assert llm.kv_manager.num_free_blocks == llm.kv_manager.num_blocks


def test_beams_share_blocks_and_copy_on_write(smol, beam_prompts):
    llm = engine(smol, block_size=4)  # small blocks: forks share partly filled blocks often
    rid = llm.add_request(beam_prompts[0], BeamSearchParams(beam_width=3, max_tokens=6))
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
    system = ("You are a careful assistant. Answer every question in one short sentence, and never use more "
              "words than you need. Be friendly, be precise, and check your facts twice. Question: ")
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
    greedy = SamplingParams(temperature=0.0)
    top1 = SamplingParams(temperature=5.0, top_k=1)  # a hot temperature, but only one token survives top-k
    narrow = SamplingParams(temperature=5.0, top_p=0.01)  # the most likely token alone reaches top_p
    gens = [sample_generator(0, i) for i in range(2)]
    for params in (greedy, top1, narrow):
        tokens, logprobs = sample(logits, [params, params], gens)
        assert tokens == [0, 1]
        assert logprobs == pytest.approx([raw[0, 0].item(), raw[1, 1].item()])  # before temperature / filters
    draws = {tuple(sample(logits, [SamplingParams(top_k=2)] * 2, gens)[0]) for _ in range(50)}
    assert {t for d in draws for t in d} <= {0, 1, 2} and len(draws) > 1  # only the two best of each row
