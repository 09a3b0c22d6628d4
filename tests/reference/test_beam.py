"""Beam search's rules (reference/engine/beam.py), vLLM's, on hand-made log-probabilities: where they part from HF's."""

import math

import torch

from reference.engine.beam import Beam, BeamSearchState


def rows(*probs):
    return torch.tensor(probs, dtype=torch.float32).log()


def test_an_eos_candidate_outside_the_top_k_is_kept_and_can_win():
    # width 1, tokens 0..7, 3 is EOS. Step 1: the EOS candidate ranks 2nd (inside the top 2k = 2, outside the top
    # k = 1): vLLM keeps it as a completed sequence; HF's rule would drop it (only top-k candidates finish).
    state = BeamSearchState(width=1, max_tokens=3, eos_token_ids=(3,), prompt_len=2)
    step = state.step([Beam(0, [], 0.0)], rows([0.4, 0.1, 0.05, 0.35, 0.04, 0.03, 0.02, 0.01]))
    assert [b.token_ids for b in step.beams] == [[0]] and not step.done
    assert [h.token_ids for h in state.completed] == [[3]]
    later = rows([0.3, 0.2, 0.15, 0.02, 0.12, 0.1, 0.06, 0.05])  # EOS unlikely: not among the top 2
    step = state.step(step.beams, later)
    step = state.step(step.beams, later)  # the last step
    assert step.done and state.done and len(state.completed) == 1
    best = state.hypotheses[0]
    # [3] scores log .35 / (2 + 1 - 1) = -0.52; the running [0, 0, 0] log(.4 * .3 * .3) / 5 = -0.66
    assert best.token_ids == [3] and best.finish_reason == "stop"
    assert math.isclose(best.score, math.log(0.35) / 2, rel_tol=1e-6)
    assert [h.token_ids for h in state.hypotheses] == [[3]]  # width 1: one result


def test_the_score_counts_the_prompt_and_not_a_final_eos():
    state = BeamSearchState(width=2, max_tokens=4, eos_token_ids=(3,), prompt_len=4)
    assert state.score([5, 3], -2.0) == -2.0 / 5  # 4 prompt + 2 generated - the EOS
    assert state.score([5, 6], -2.0) == -2.0 / 6
    assert BeamSearchState(2, 4, (3,), length_penalty=2.0, prompt_len=4).score([5, 6], -2.0) == -2.0 / 36


def test_the_best_k_non_eos_candidates_continue_and_name_their_parents():
    state = BeamSearchState(width=2, max_tokens=5, eos_token_ids=(), prompt_len=1)
    step = state.step(
        [Beam(7, [], 0.0), Beam(8, [], 0.0)], rows([0.5, 0.3, 0.2, 0.0 + 1e-9], [0.25, 0.25, 0.25, 0.25])
    )  # first step: beam 7 only
    assert [b.token_ids for b in step.beams] == [[0], [1]] and step.parents == [7, 7]
    step = state.step(
        [Beam(7, [0], math.log(0.5)), Beam(9, [1], math.log(0.3))], rows([0.1, 0.1, 0.1, 0.7], [0.9, 0.05, 0.03, 0.02])
    )
    assert [b.token_ids for b in step.beams] == [[0, 3], [1, 0]] and step.parents == [7, 9]  # .5 x .7 > .3 x .9
