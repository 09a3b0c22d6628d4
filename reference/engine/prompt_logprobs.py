"""Prompt log-probabilities: vLLM's `SamplingParams(prompt_logprobs=k)` and `RequestOutput.prompt_logprobs`.

What vLLM 0.32 returns, and what this module reproduces (vllm/v1/worker/gpu_model_runner.py
`_get_prompt_logprobs_dict`, vllm/v1/sample/sampler.py `gather_logprobs`, vllm/logprobs.py
`create_prompt_logprobs` / `append_logprobs_for_next_position`, vllm/v1/engine/logprobs.py `_update_prompt_logprobs`):

    prompt_logprobs = [None,                                  # position 0: nothing predicts the first token
                       {t1: Logprob, top_1: Logprob, ...},    # position 1: from the logits at row 0
                       ...]                                   # one entry per prompt token

Entry i holds the prompt's own token i first, with its log-probability under the logits of row i - 1 and its
rank (the number of tokens at least as likely, itself included: vLLM counts `logprobs >= logprob(token)`), then
the k most likely tokens at that position with ranks 1..k; a token among both is one key (k or k + 1 entries),
and, as in vLLM's dict, it keeps its first place with the top-k rank. Log-probabilities are the log-softmax of
the RAW logits in float32: vLLM's default logprobs_mode "raw_logprobs", and "prompt tokens skip sampling
processors" (its comment), so neither temperature nor penalties apply. decoded_token is the token decoded
alone, special tokens as they are (vLLM's `convert_ids_list_to_tokens`; its extra repair of a lone byte of a
multi-byte character is not made here), or None without a tokenizer.

How the engine collects them: a step that feeds prompt positions a request still lacks runs the model with
`all_logits=True` (reference/engine/executor.py), and this request's rows go through `PromptLogprobs.add`. Positions are
filled in order, each once, as vLLM writes them by position into one buffer: a prompt in chunks adds one chunk per
step; a recomputation after preemption feeds positions already filled and adds nothing; a request that wants them
never reads the prefix cache (sim.base.request.Request.skip_reading_prefix_cache, as vLLM's SamplingParams sets it), so
every position is computed. NOTE: vLLM hands the list over once the prompt is done; this engine's RequestOutput
of a step that computed only a chunk (vLLM makes none) shows the positions filled so far.
"""
from __future__ import annotations

from typing import Callable

import torch

from reference.engine.outputs import Logprob

ROWS_AT_ONCE = 512  # rows per log-softmax: [512, vocab] float32 is 100 MB for SmolLM2's 49152 tokens


class PromptLogprobs:
    """One request's prompt log-probabilities, filled position by position as its prompt is computed."""

    def __init__(self, prompt_token_ids: list[int], k: int) -> None:
        self.token_ids = prompt_token_ids
        self.k = k
        self.entries: list[dict[int, Logprob] | None] = [None]  # position 0 has none

    @property
    def done(self) -> bool:
        return len(self.entries) == len(self.token_ids)

    def wants(self, num_computed: int, num_new: int) -> bool:
        """Whether feeding positions [num_computed, num_computed + num_new) reaches a position still missing (the
        row at position j predicts the token at j + 1). NOTE: a feed starting past it would leave a gap: it is wanted
        all the same, so that `add` says so instead of the entries silently stopping short."""
        return not self.done and num_new > 0 and num_computed + num_new >= len(self.entries)

    def add(self, num_computed: int, logits: torch.Tensor, decode: Callable[[int], str] | None) -> None:
        """The entries a step's rows give: `logits` [num_new, vocab] at positions num_computed, num_computed + 1, ...
        Positions already filled are skipped (a recomputation); a gap before them is a RuntimeError."""
        first = len(self.entries)  # the first missing position: predicted by the row at first - 1
        if num_computed > first - 1:
            raise RuntimeError(f"expected the step to feed position {first - 1} or earlier (prompt log-probs fill "
                               f"positions in order), found it starting at {num_computed}")
        last = min(num_computed + logits.shape[0], len(self.token_ids) - 1)  # the last position it predicts
        if last >= first:
            rows = logits[first - 1 - num_computed:last - num_computed]
            self.entries += position_logprobs(rows, self.token_ids[first:last + 1], self.k, decode)


def position_logprobs(logits: torch.Tensor, targets: list[int], k: int,
                      decode: Callable[[int], str] | None) -> list[dict[int, Logprob]]:
    """One {token id: Logprob} per row of `logits` [rows, vocab]: the row's target token (rank: the tokens at least as
    likely), then its top k, as vLLM's gather_logprobs and append_logprobs_for_next_position build them."""
    names: dict[int, str | None] = {}

    def name(token: int) -> str | None:
        if token not in names:
            names[token] = None if decode is None else decode(token)
        return names[token]

    out: list[dict[int, Logprob]] = []
    for start in range(0, len(targets), ROWS_AT_ONCE):
        rows = torch.log_softmax(logits[start:start + ROWS_AT_ONCE].float(), dim=-1)
        wanted = torch.tensor(targets[start:start + ROWS_AT_ONCE], device=rows.device)[:, None]
        chosen = rows.gather(1, wanted)
        ranks = (rows >= chosen).sum(-1).tolist()
        ids, values = wanted, chosen
        if k:
            top = torch.topk(rows, k, dim=-1)
            ids, values = torch.cat((wanted, top.indices), dim=1), torch.cat((chosen, top.values), dim=1)
        for pos_ids, pos_values, rank in zip(ids.tolist(), values.tolist(), ranks):
            # NOTE: a dict built in vLLM's order: a top-k token that is also the target overwrites its value
            # (the same log-prob) with its top-k rank, keeping the target's place first.
            out.append({t: Logprob(v, r, name(t)) for t, v, r in zip(pos_ids, pos_values, [rank, *range(1, k + 1)])})
    return out
