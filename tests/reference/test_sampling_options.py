"""vLLM's SamplingParams options on the real SmolLM2: stop strings and ids, min_tokens, penalties, min-p, logprobs,
special tokens. Checked against HF transformers where both implement the option (repetition penalty, minimum new
tokens), and otherwise against the engine's own unconstrained output (a stop must cut exactly there)."""

from __future__ import annotations

import math

import pytest
import torch

from reference import LLM, SamplingParams
from reference.engine.sampling import RowContext, filter_logits, process_row
from reference.engine.stops import find_stop_string

QUESTION = "Name three colours, separated by commas."


@pytest.fixture(scope="module")
def chat(smol):
    tok = smol[1]
    return list(
        tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
    )


def run(smol, prompt, **params):
    llm = LLM.from_loaded(*smol, num_gpu_blocks=64, max_model_len=512)
    return llm.generate([prompt], SamplingParams(temperature=0.0, **params))[0].outputs[0]


def hf_greedy(hf_model, ids, **kwargs):
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), pad_token_id=2, do_sample=False, **kwargs)
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def free(smol, chat):
    """The unconstrained greedy answer: it ends with the end-of-sequence token well before 48 tokens."""
    out = run(smol, chat, max_tokens=48)
    assert out.finish_reason == "stop" and out.stop_reason is None and len(out.token_ids) < 40
    return out


def test_repetition_penalty_equals_hf(smol, hf_model):
    ids = smol[1]("The the the the cat sat on the mat and the").input_ids
    ours = run(smol, ids, max_tokens=20, repetition_penalty=1.3, ignore_eos=True).token_ids
    assert ours == hf_greedy(hf_model, ids, max_new_tokens=20, min_new_tokens=20, repetition_penalty=1.3)
    assert ours != run(smol, ids, max_tokens=20, ignore_eos=True).token_ids  # the penalty changed the answer


def test_min_tokens_equals_hf_min_new_tokens(smol, hf_model, chat, free):
    n = len(free.token_ids) + 6  # past where the answer would have ended
    ours = run(smol, chat, max_tokens=n + 4, min_tokens=n)
    assert len(ours.token_ids) >= n and ours.token_ids[: len(free.token_ids) - 1] == free.token_ids[:-1]
    hf = hf_greedy(hf_model, chat, max_new_tokens=n + 4, min_new_tokens=n, eos_token_id=2)
    assert ours.token_ids == hf[: len(ours.token_ids)]


def test_stop_string_cuts_the_text_there(smol, chat, free):
    word = free.text.splitlines()[1].split()[-1]  # the answer is a numbered list: its second colour
    cut = free.text.index(word)
    out = run(smol, chat, max_tokens=48, stop=["no such string", word])
    assert out.finish_reason == "stop" and out.stop_reason == word and out.text == free.text[:cut]
    assert out.token_ids == free.token_ids[: len(out.token_ids)] and len(out.token_ids) < len(free.token_ids)
    kept = run(smol, chat, max_tokens=48, stop=word, include_stop_str_in_output=True)
    assert kept.text == free.text[: cut + len(word)] and kept.token_ids == out.token_ids


def test_stop_token_id_ends_there_and_leaves_its_text_out(smol, chat, free):
    token = free.token_ids[3]
    out = run(smol, chat, max_tokens=48, stop_token_ids=[token])
    assert out.token_ids == free.token_ids[: free.token_ids.index(token) + 1]
    assert out.finish_reason == "stop" and out.stop_reason == token
    tok = smol[1]
    assert out.text == tok.decode(out.token_ids[:-1], skip_special_tokens=True)
    kept = run(smol, chat, max_tokens=48, stop_token_ids=[token], include_stop_str_in_output=True)
    assert kept.text == tok.decode(out.token_ids, skip_special_tokens=True)


def test_special_tokens_in_the_text_when_asked(smol, chat, free):
    out = run(smol, chat, max_tokens=48, skip_special_tokens=False, include_stop_str_in_output=True)
    assert out.token_ids == free.token_ids and out.text.endswith("<|im_end|>")
    assert run(smol, chat, max_tokens=48, skip_special_tokens=False).text == free.text  # EOS left out by default


def test_logprobs_rank_the_chosen_token_and_sum_to_the_cumulative(smol, chat, free):
    out = run(smol, chat, max_tokens=48, logprobs=3)
    assert out.token_ids == free.token_ids and len(out.logprobs) == len(out.token_ids)
    for token, step in zip(out.token_ids, out.logprobs):
        assert next(iter(step)) == token and step[token].rank == 1  # greedy: the chosen token is the most likely
        assert sorted(lp.rank for lp in step.values()) == [1, 2, 3]
        values = [lp.logprob for lp in sorted(step.values(), key=lambda lp: lp.rank)]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert step[token].decoded_token == smol[1].decode([token])
    total = sum(step[t].logprob for t, step in zip(out.token_ids, out.logprobs))
    assert math.isclose(total, out.cumulative_logprob, rel_tol=1e-5)
    assert free.logprobs is None and out.finished() and not type(out)(0, "", [], None).finished()


def test_penalties_follow_vllms_formulas():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0])
    row = logits.clone()
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    process_row(row, params, RowContext(prompt_ids=[0], output_ids=[1, 1, 3], stop_ids=(4,)))
    # token 0 (prompt): 2/2; token 1 (out twice): -1*2 - 0.5*2 - 0.25; token 3 (out once): 3/2 - 0.5 - 0.25
    assert row.tolist() == [1.0, -3.25, 0.5, 0.75, -2.0]
    masked = logits.clone()
    process_row(masked, SamplingParams(min_tokens=5), RowContext([0], [1], stop_ids=(4, 2)))
    assert masked[4] == masked[2] == float("-inf") and masked[0] == 2.0  # stop ids masked before min_tokens


def test_min_p_drops_tokens_below_the_fraction_of_the_most_likely():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    kept = filter_logits(probs.log(), SamplingParams(temperature=1.0, min_p=0.2))  # threshold 0.1
    assert torch.isfinite(kept).tolist() == [True, True, True, False]


def test_stop_string_search_is_vllms():
    assert find_stop_string("hello world", 5, ["wor"], False) == ("wor", 6)
    assert find_stop_string("hello world", 5, ["wor"], True) == ("wor", 9)
    assert find_stop_string("hello world", 5, ["world"], True) == ("world", -1)  # ends the text: no cut
    assert find_stop_string("hello world", 2, ["hello"], False) is None  # only new text is searched
    assert find_stop_string("hello world", 0, ["o"], False) is None
    assert find_stop_string("abcabc", 3, ["c", "b"], False) == ("c", 5)  # the list's order, not the position
