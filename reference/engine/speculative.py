"""Speculative decoding in the engine: an n-gram (prompt-lookup) draft, verified exactly by the target model.

Prompt lookup decoding (Saxena, 2023; vLLM's `ngram` speculative method, `prompt_lookup_max` / `prompt_lookup_min`):
when a sequence's last n tokens occurred earlier in its prompt or output, the tokens that followed them then are a
cheap guess of what follows now. Editing, summarising and quoting tasks repeat their input, so the guesses often hold.

    tokens    the cat sat on the mat . the cat         the last n = 2 tokens, "the cat", occurred at position 0
    proposed  sat on the                               (k = 3): the 3 tokens that followed them there

A verify step (sim/scheduling/scheduler.py: the sequence's last sampled token plus its k drafts, in lookahead slots) computes
the target's logits at every fed position in one forward pass, as a prompt chunk is computed. Greedy verification
(Leviathan et al., ICML 2023, with temperature 0): position j's argmax is the token plain decoding would sample
there, given the tokens before it; draft j is accepted while it equals that argmax, and the argmax after the last
accepted draft is the step's own next token. So the tokens are exactly plain greedy decoding's (up to the float
rounding of a chunk against a decode, the same as chunked prefill), 1 + accepted of them per step; the rejected
drafts' slots are rolled back through the KV contract.

NOTE: only greedy requests without penalties, log-probs or min_tokens are drafted for (the others: 0 drafts, plain
decoding); sampling at a temperature would need rejection sampling against the draft's distribution, which an
n-gram draft does not have.
"""
from __future__ import annotations

from typing import Sequence

PROMPT_LOOKUP_MAX = 3  # the longest suffix matched (vLLM's prompt_lookup_max)
PROMPT_LOOKUP_MIN = 1  # the shortest (vLLM's prompt_lookup_min)


def propose_ngram(tokens: Sequence[int], k: int, n_max: int = PROMPT_LOOKUP_MAX, n_min: int = PROMPT_LOOKUP_MIN
                  ) -> list[int]:
    """Up to k draft tokens: for n from n_max down to n_min, find the latest earlier occurrence of the last n tokens
    and propose the tokens that followed it (stopping at the end of `tokens`); [] if no suffix recurs."""
    length = len(tokens)
    if k < 1:
        return []
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = list(tokens[length - n:])
        for start in range(length - n - 1, -1, -1):  # the latest occurrence first, never the suffix itself
            if list(tokens[start:start + n]) == suffix:
                follow = list(tokens[start + n:start + n + k])
                if follow:
                    return follow
    return []


def accept_greedy(drafts: Sequence[int], targets: Sequence[int]) -> list[int]:
    """The tokens a verify step keeps: `targets[j]` is the target's greedy token after the fed token j (j = 0 is the
    last sampled token, j >= 1 the drafts), len(drafts) + 1 of them. The accepted drafts (the longest prefix equal to
    the targets) and then the target's own token after them."""
    if len(targets) != len(drafts) + 1:
        raise ValueError(f"expected {len(drafts) + 1} target tokens for {len(drafts)} drafts, got {len(targets)}")
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
        accepted += 1
    return list(targets[:accepted + 1])
