"""Speculative decoding on the engine: the n-gram draft, greedy verification, and output IDENTICAL to plain decoding.

The claim (reference/engine/speculative.py): a verify step keeps exactly the tokens plain greedy decoding would produce, so
the token ids must not change whatever the draft proposes, the policy, the block size, k, or where a stop falls.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import LLM, SamplingParams
from reference.engine.speculative import accept_greedy, propose_ngram
from reference.models import random_model


# ---- the draft and the acceptance rule ----------------------------------------------------------------------------
def test_the_draft_continues_the_latest_earlier_occurrence_of_the_suffix():
    # "the cat" (5, 6) occurred at 0 and is the suffix again: propose what followed it there
    assert propose_ngram([5, 6, 7, 8, 9, 1, 5, 6], k=3) == [7, 8, 9]
    assert propose_ngram([5, 6, 7, 8, 9, 1, 5, 6], k=10) == [7, 8, 9, 1, 5, 6]  # up to the end of the text
    assert propose_ngram([1, 2, 3, 4], k=3) == []  # nothing recurs
    assert propose_ngram([4, 1, 2, 9, 1, 2], k=2) == [9, 1]  # the 2-gram (1, 2) before the 1-gram (2)


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.integers(0, 4), min_size=1, max_size=40), k=st.integers(1, 6))
def test_a_proposal_is_what_followed_an_earlier_occurrence_of_a_suffix(tokens, k):
    draft = propose_ngram(tokens, k)
    assert len(draft) <= k
    if not draft:  # then even the last token never occurred before with something after it
        assert tokens[-1] not in tokens[:-1]
        return
    found = False
    for n in range(1, 4):
        suffix = tokens[len(tokens) - n :]
        for start in range(len(tokens) - n):
            if len(suffix) == n and tokens[start : start + n] == suffix and tokens[start + n : start + n + k] == draft:
                found = True
    assert found, (tokens, k, draft)


@given(drafts=st.lists(st.integers(0, 3), max_size=6), data=st.data())
def test_greedy_acceptance_keeps_the_agreeing_prefix_and_one_more(drafts, data):
    targets = data.draw(st.lists(st.integers(0, 3), min_size=len(drafts) + 1, max_size=len(drafts) + 1))
    kept = accept_greedy(drafts, targets)
    a = len(kept) - 1
    assert kept == targets[: a + 1] and drafts[:a] == targets[:a]
    assert a == len(drafts) or drafts[a] != targets[a]
    with pytest.raises(ValueError, match="expected"):
        accept_greedy(drafts, targets + [0])


# ---- the engine: identical greedy tokens -------------------------------------------------------------------------
REPETITIVE = [[5, 6, 7, 8, 9] * 3 + [5, 6], [1, 2, 3, 4] * 6, list(range(30, 60)), [7, 7, 7, 7, 8]]


def _generate(model, prompts, k: int, max_tokens: int = 40, **kwargs):
    llm = LLM.from_loaded(model, num_speculative_tokens=k, **kwargs)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)], llm.stats


@pytest.mark.parametrize(
    "k, policy, block_size",
    [(1, "paged", 4), (3, "paged", 4), (5, "paged", 16), (3, "radix", 1), (4, "vattention", 16), (3, "oracle", 1)],
)
def test_tiny_model_greedy_tokens_are_identical_with_speculation(k, policy, block_size):
    tiny = random_model(seed=1)
    pool = dict(policy=policy, block_size=block_size, num_gpu_blocks=4096 // block_size)
    if policy == "vattention":
        pool = dict(policy=policy, num_gpu_blocks=64)
    plain, _ = _generate(tiny, REPETITIVE, 0, **pool)
    spec, stats = _generate(tiny, REPETITIVE, k, **pool)
    assert spec == plain
    assert stats.num_draft_tokens > 0 and 0 < stats.num_accepted_tokens <= stats.num_draft_tokens


def test_speculation_under_preemption_and_prefix_caching_keeps_the_tokens():
    """A pool too small for the batch (recompute preemptions) and a prefix cache: still the plain tokens."""
    tiny = random_model(seed=2)
    prompts = REPETITIVE + [p[::-1] for p in REPETITIVE]
    kwargs = dict(block_size=4, num_gpu_blocks=40, enable_prefix_caching=True)
    plain, _ = _generate(tiny, prompts, 0, **kwargs)
    spec, stats = _generate(tiny, prompts, 3, **kwargs)
    assert spec == plain and stats.num_preemptions > 0


def test_a_stop_token_inside_the_accepted_drafts_ends_the_sequence_there():
    tiny = random_model(seed=1)
    plain, _ = _generate(tiny, REPETITIVE, 0)
    stop = plain[0][10]  # a token plain decoding produces mid-way: generation must stop at its first occurrence
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop_token_ids=[stop])
    outs = {
        k: [
            o.outputs[0].token_ids for o in LLM.from_loaded(tiny, num_speculative_tokens=k).generate(REPETITIVE, params)
        ]
        for k in (0, 4)
    }
    assert outs[4] == outs[0] and outs[0][0][-1] == stop and len(outs[0][0]) <= 11


def test_sampled_requests_are_not_drafted_for_and_keep_their_seeded_tokens():
    tiny = random_model(seed=1)
    params = SamplingParams(temperature=0.8, max_tokens=20, seed=7, ignore_eos=True)
    outs, drafted = {}, {}
    for k in (0, 3):
        llm = LLM.from_loaded(tiny, num_speculative_tokens=k)
        outs[k] = [o.outputs[0].token_ids for o in llm.generate(REPETITIVE[:2], params)]
        drafted[k] = llm.stats.num_draft_tokens
    assert outs[3] == outs[0] and drafted[3] == 0


@pytest.mark.parametrize("k", [-1, 65, 2.5])
def test_a_bad_num_speculative_tokens_is_one_line(k):
    with pytest.raises((ValueError, TypeError), match="num_speculative_tokens"):
        LLM.from_loaded(random_model(seed=1), num_speculative_tokens=k)


# ---- the commands -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, line",
    [
        (
            ["generate", "Hi", "--num-speculative-tokens", "65"],
            "--num-speculative-tokens 65 (allowed: an integer from 0",
        ),
        (["spec-bench", "--rounds", "0"], "--rounds 0 (allowed: an integer from 1 to 10)"),
        (
            ["spec-bench", "--num-speculative-tokens", "0"],
            "--num-speculative-tokens 0 (allowed: an integer from 1 to 64)",
        ),
        (["spec-bench", "--quick", "--max-tokens", "8"], "--quick sets the tokens and rounds itself"),
    ],
)
def test_bad_flags_are_one_line(argv, line, capsys):
    from reference.cli import main

    assert main(argv) == 2  # in-process: main prints the line, returns the status
    err = capsys.readouterr().err
    assert line in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_smollm2_greedy_tokens_are_identical_in_the_spec_bench_quick_run(tmp_path):
    """`python -m reference spec-bench --quick`: SmolLM2 (chat template) on two repeat/edit prompts, 16 tokens, as one
    batch with and without the n-gram draft: greedy tokens identical (the command compares every token id and fails
    otherwise), fewer steps, drafts accepted; the CSV's header names the command."""
    import csv

    from reference.cli import main

    out = tmp_path / "spec.csv"
    assert main(["spec-bench", "--quick", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[1] == f"# command: python -m reference spec-bench --quick --out {out}"
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    plain, spec = rows
    assert plain["generated_tokens"] == spec["generated_tokens"] and spec["identical"] == "True"
    assert int(spec["steps"]) < int(plain["steps"]) and 0 < int(spec["accepted_tokens"]) <= int(spec["draft_tokens"])
