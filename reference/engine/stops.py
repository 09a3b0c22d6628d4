"""vLLM v1's stop rules for one sample: an end-of-sequence or stop token, a stop string in the new text, max_tokens.

A sample stops with finish_reason "stop" (an end-of-sequence id unless ignore_eos, a stop token id, or a stop string,
whose text is cut there) or "length" (max_tokens). No stop comes before min_tokens; stop strings are searched only in
the text new since the last check (as vLLM's detokenizer does), from min_tokens + 1 tokens on.
"""
from __future__ import annotations

from typing import Callable


def stop_ids(params, eos_token_ids) -> tuple[int, ...]:
    """Every token id that stops this sample (what a min_tokens rule masks until then)."""
    eos = () if params.ignore_eos else tuple(eos_token_ids)
    return eos + tuple(params.stop_token_ids)


def check_stop(state, seq, token: int, eos_token_ids, decode: Callable[[list[int], bool], str]) -> None:
    """After `token` joined `seq` (a sample of the request `state`): set its finish_reason (and stop_reason, stop_token,
    text_end) if it stops now. `decode(token_ids, skip_special_tokens)`: the text of its tokens."""
    p, n = state.params, len(seq.token_ids)
    if n >= p.min_tokens:
        if not p.ignore_eos and token in eos_token_ids:
            seq.finish_reason, seq.stop_token = "stop", True
        elif token in p.stop_token_ids:
            seq.finish_reason, seq.stop_token, seq.stop_reason = "stop", True, token
    if p.stop and n > p.min_tokens and not seq.stop_token:
        text = decode(seq.token_ids, p.skip_special_tokens)
        hit, seq.text_len = check_stop_strings(text, seq.text_len, p.stop, p.include_stop_str_in_output)
        if hit is not None:
            seq.finish_reason, (seq.stop_reason, seq.text_end) = "stop", hit
    if seq.finish_reason is None and n >= state.max_tokens:
        seq.finish_reason = "length"


def check_stop_strings(text: str, checked: int, stop: list[str], include: bool) -> tuple[tuple[str, int] | None, int]:
    """A step's stop-string check: find_stop_string over the text past its first `checked` characters; (the hit,
    the characters checked from now on). A trailing partly decoded character (U+FFFD until its last byte comes) is
    not counted as checked: when it completes, the text's length may not change, yet a stop string may end there."""
    return find_stop_string(text, len(text) - checked, stop, include), len(text.rstrip("\ufffd"))


def find_stop_string(text: str, new_chars: int, stop: list[str], include: bool) -> tuple[str, int] | None:
    """vLLM's check_stop_strings: the first stop string (in the list's order) found in the text's newest
    `new_chars` characters (or overlapping them); (the string, where the text ends: -1 for no cut)."""
    if new_chars <= 0:
        return None
    for s in stop:
        index = text.find(s, 1 - new_chars - len(s))
        if index == -1:
            continue
        if include:
            index += len(s)
            if index >= len(text):
                return s, -1
        return s, index
    return None
