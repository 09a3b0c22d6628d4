"""Import of real ShareGPT conversation files (a JSON list of conversations) as request traces.

The vLLM paper's section 6.1 recipe: the first user turn is the prompt, the model's reply to it is the output, and
pairs that do not fit the model's context are skipped; tokens are counted with the embedded SmolLM2 tokenizer
unless told otherwise. `sim.workloads.trace.read_trace` imports a `.json` file that is such a list through this module.
"""
from __future__ import annotations

import codecs
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from sim.base.limits import MAX_NUM_REQUESTS, MAX_TIME_S
from sim.base.request import Request

from ..base.trace_files import TraceError, json_object, no_constant, open_trace, parse_int


@functools.lru_cache(maxsize=1)
def _smollm2_tokenizer():
    from sim.base.tokenizer import load_smollm2_tokenizer

    return load_smollm2_tokenizer()


def _default_tokenizer():
    try:
        return _smollm2_tokenizer()
    except (ImportError, RuntimeError, OSError) as e:
        raise ValueError(f"importing a ShareGPT file counts tokens with the embedded SmolLM2 tokenizer, which "
                         f"cannot be loaded: {e}") from None


def default_count_tokens() -> Callable[[str], int]:
    """The token counter a ShareGPT file is imported with unless told otherwise: the embedded SmolLM2 tokenizer
    (sim/base/tokenizer.py), loaded once."""
    return _default_tokenizer().count_tokens


def default_encode() -> Callable[[str], list[int]]:
    """text -> token ids with the same tokenizer (multi-turn import, sim.workloads.conversation_import: real ids)."""
    return _default_tokenizer().encode


@dataclass(slots=True)
class ShareGPTPairs:
    """(prompt, output) token counts taken from a ShareGPT file, and what was skipped and why."""

    prompt_lens: list[int] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)
    skipped_too_long: int = 0  # prompt + output > max_seq_len (the paper drops these)
    skipped_no_pair: int = 0  # no human turn followed by a gpt turn, or an empty one

    def describe(self) -> str:
        total = len(self.prompt_lens) + self.skipped_too_long + self.skipped_no_pair
        return (f"{len(self.prompt_lens)} requests from {total} conversations ({self.skipped_too_long} skipped as too "
                f"long, {self.skipped_no_pair} without a human turn followed by a gpt reply)")


def _json_list_items(path: str | Path, text: str) -> Iterator[tuple[int, object]]:
    """(line, item) of each item of the JSON list that is the whole of `text`, decoded one at a time, so that a
    problem with an item names its line."""
    decoder = json.JSONDecoder(parse_int=parse_int, object_pairs_hook=json_object, parse_constant=no_constant)
    NEWLINE = "\n"  # ids of any length: see parse_int
    line, pos = 1, 0  # the line number at text[pos]

    def skip(i: int) -> int:
        nonlocal line, pos
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        line, pos = line + text.count("\n", pos, i), i
        return i

    def bad(i: int, what: str) -> TraceError:
        return TraceError(f"{path} line {line + text.count(NEWLINE, pos, i)}: not valid JSON ({what})")

    i = skip(0)
    if i == len(text):
        raise TraceError(f"{path}: the whole file is empty (expected a JSON list of conversations)")
    if text[i] != "[":
        raise TraceError(f"{path} line {line}: expected a JSON list of conversations")
    i = skip(i + 1)
    if text.startswith("]", i):
        i += 1
    else:
        while True:
            try:
                item, end = decoder.raw_decode(text, i)
            except RecursionError:
                raise TraceError(f"{path} line {line}: JSON nested too deep (a conversation is a list of "
                                 "turns)") from None
            except json.JSONDecodeError as e:
                raise TraceError(f"{path} line {e.lineno}: not valid JSON ({e.msg.removesuffix(' at')} at column "
                                 f"{e.colno})") from None
            except ValueError as e:  # json_object, no_constant: a key twice, NaN or Infinity
                raise bad(i, str(e)) from None
            yield line, item
            i = skip(end)
            if text.startswith(",", i):
                i = skip(i + 1)
            elif text.startswith("]", i):
                i += 1
                break
            else:
                raise bad(i, "expected ',' or ']' after an item of the list")
    i = skip(i)
    if i != len(text):
        raise bad(i, "extra data after the list")


def _only_control(text: str) -> bool:
    """Characters, none of them printable or white space: NULs, escapes, a binary file's bytes read as text."""
    return bool(text) and not any(c.isprintable() or c.isspace() for c in text)


def _codes(text: str) -> str:
    shown = " ".join(f"U+{ord(c):04X}" for c in text[:4])
    return shown + (f" and {len(text) - 4} more" if len(text) > 4 else "")


def iter_conversations(path: str | Path) -> Iterator[tuple[int, int, list[dict]]]:
    """(index, line, turns) of every conversation of a ShareGPT file, read and checked: UTF-8, a JSON list, each
    item {"conversations": [turn objects]}, at most MAX_NUM_REQUESTS of them. TraceError (one line) otherwise."""
    with open_trace(path) as f:
        try:
            data = f.read()
        except OSError as e:
            raise TraceError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        start = e.start + (len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0)
        line = data.count(b"\n", 0, start) + 1
        raise TraceError(f"{path} line {line}: not UTF-8 text (byte 0x{data[start]:02x})") from None
    for index, (line, item) in enumerate(_json_list_items(path, text)):
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
            raise TraceError(f"{path} line {line}: conversation {index} has no 'conversations' list of turns "
                             '(expected {"conversations": [{"from": "human", "value": "..."}, ...]})')
        for k, turn in enumerate(turns):
            for key in ("from", "value"):
                value = turn.get(key)
                try:
                    if isinstance(value, str):
                        value.encode("utf-8")
                except UnicodeEncodeError:  # json.loads turns "\ud800" into a lone surrogate: not a character
                    raise TraceError(f"{path} line {line}: conversation {index}, turn {k}: {key!r} holds a lone "
                                     f"surrogate escape (allowed: Unicode text; a character past U+FFFF is a pair "
                                     f"of escapes)") from None
                if isinstance(value, str) and _only_control(value):
                    raise TraceError(f"{path} line {line}: conversation {index}, turn {k}: {key!r} holds only "
                                     f"control characters, {_codes(value)} (allowed: text; an empty string or "
                                     "whitespace for an empty turn)")
        if index == MAX_NUM_REQUESTS:
            raise TraceError(f"{path} line {line}: more than {MAX_NUM_REQUESTS:,} conversations (the limit of one "
                             "trace)")
        yield index, line, turns


def load_sharegpt_pairs(path: str | Path, count_tokens: Callable[[str], int], max_seq_len: int = 2048) -> ShareGPTPairs:
    """The first human turn and the gpt reply after it, of every conversation, as token counts."""
    pairs = ShareGPTPairs()
    for _, _, turns in iter_conversations(path):
        pair = next(
            ((a.get("value"), b.get("value")) for a, b in zip(turns, turns[1:])
             if a.get("from") == "human" and b.get("from") == "gpt"),
            None,
        )
        if pair is None or not all(isinstance(text, str) and text for text in pair):
            pairs.skipped_no_pair += 1
            continue
        prompt_len, output_len = count_tokens(pair[0]), count_tokens(pair[1])
        if prompt_len < 1 or output_len < 1:
            pairs.skipped_no_pair += 1
        elif prompt_len + output_len > max_seq_len:
            pairs.skipped_too_long += 1
        else:
            pairs.prompt_lens.append(prompt_len)
            pairs.output_lens.append(output_len)
    return pairs


def check_rate(rate: float | None) -> None:
    """The rate a file's requests (or sessions, sim.workloads.conversation_import) arrive at: None (all at t = 0), or a finite
    number > 0 per second."""
    if rate is not None and not (isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 < rate < math.inf):
        raise ValueError(f"rate must be a finite number > 0 requests/s, got {rate}")


def sharegpt_requests(path: str | Path, pairs: ShareGPTPairs, *, rate: float | None = None,
                      seed: int = 0) -> list[Request]:
    """The requests of `pairs` (from `load_sharegpt_pairs(path, ...)`), in file order: Poisson arrivals at `rate`
    req/s (seeded), or all at t = 0 when rate is None. TraceError if there is none, or the last arrives past
    MAX_TIME_S."""
    check_rate(rate)
    count = len(pairs.prompt_lens)
    if count == 0:
        raise TraceError(f"{path}: no request in the whole file: {pairs.describe()}")
    if rate is None:
        times = [0.0] * count
    else:
        times = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, count)).tolist()
        if not times[-1] <= MAX_TIME_S:
            raise TraceError(f"{path}: {count} requests at {rate:g} req/s arrive until {times[-1]:.3g} s, past the "
                             f"limit {MAX_TIME_S:g} s (allowed: a higher rate)")
    return [
        Request(request_id=i, arrival_time=times[i], prompt_len=p, output_len=o)
        for i, (p, o) in enumerate(zip(pairs.prompt_lens, pairs.output_lens))
    ]


def import_sharegpt(
    path: str | Path,
    *,
    count_tokens: Callable[[str], int],
    max_seq_len: int = 2048,
    rate: float | None = None,
    seed: int = 0,
) -> list[Request]:
    """Requests from a ShareGPT conversation file, in file order; Poisson arrivals at `rate` req/s (seeded),
    or all at t = 0 when rate is None. Skip counts: see `load_sharegpt_pairs`."""
    check_rate(rate)
    pairs = load_sharegpt_pairs(path, count_tokens, max_seq_len)
    return sharegpt_requests(path, pairs, rate=rate, seed=seed) if pairs.prompt_lens else []
