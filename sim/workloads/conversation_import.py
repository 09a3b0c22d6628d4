"""Import of multi-turn ShareGPT conversations as chat sessions, with real token ids (sim/workloads/conversation.py's model).

Each conversation of a ShareGPT .json file (read and checked by sim/workloads/sharegpt.py) becomes one session: one request
per human turn answered by a gpt turn, whose prompt is the tokens of every earlier turn and then the message, and
whose output is the reply's tokens:

    conversation:   human h1, gpt g1, human h2, gpt g2
    requests:       prompt [h1]          output [g1]
                    prompt [h1 g1 h2]    output [g2]       starts with the first request's prompt + output

Tokens: SmolLM2's tokenizer (sim/base/tokenizer.py) encodes each turn's text on its own; a prompt is the concatenation.
NOTE: a chat server wraps every turn in its chat template (role markers, separators); we leave the template out,
so a prompt is a few tokens per turn shorter than a served one, and its ids are real text's ids but not exactly
what a server would see. Prefix reuse across turns is the same either way.

Any other turn (a system prompt, a human turn with no gpt reply after it, a reply from another model, a human turn
or a reply with empty text) is history only: its tokens join the next request's prompt. The context rule is
sim.workloads.conversation's: without a history limit a session ends at its first turn whose prompt + reply does not fit
(its later turns are dropped; a conversation whose first turn does not fit gives no request); with one, prompts
keep their last `history_limit` tokens and replies their first max_seq_len - history_limit. Arrivals: sessions
start by Poisson at `rate` sessions/s (seeded), or all at t = 0 (rate None), and each later turn comes an
exponential think time after the one before, as in sim.workloads.conversation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..base.limits import MAX_NUM_REQUESTS, MAX_SEED, is_int
from ..base.request import Request
from ..base.trace_files import TraceError, show
from .conversation import DEFAULT_THINK_TIME, Turn, check_conversation_options, place_sessions, session_turns
from .sharegpt import check_rate, default_encode, iter_conversations


@dataclass(slots=True)
class ImportedSessions:
    """The served turns of every conversation of a file, in file order, and what was left out and why."""

    sessions: list[list[Turn]] = field(default_factory=list)  # one per conversation; empty: nothing served
    num_exchanges: int = 0  # human turns answered by a gpt turn, both non-empty: the requests before the context rule
    num_cut: int = 0  # exchanges dropped because their session ran out of context

    def describe(self) -> str:
        served = sum(map(len, self.sessions))
        empty = sum(1 for s in self.sessions if not s)
        return (f"{served} requests in {len(self.sessions) - empty} sessions from {len(self.sessions)} conversations "
                f"({self.num_exchanges} human turns answered by a gpt turn, {self.num_cut} of them dropped where a "
                f"session ran out of context; {empty} conversations gave no request)")


def _turn_text(path, line: int, index: int, j: int, turn: dict) -> tuple[str, str]:
    role, text = turn.get("from"), turn.get("value")
    for name, value in (("from", role), ("value", text)):
        if not isinstance(value, str):
            raise TraceError(f"{path} line {line}: conversation {index}, turn {j}: {name!r} is "
                             f"{'missing' if value is None else show(value)} (expected a string, e.g. "
                             '{"from": "human", "value": "..."})')
    return role, text


def _exchanges(path, line: int, index: int, turns: list[dict],
               encode: Callable[[str], list[int]]) -> list[tuple[list[int], list[int]]]:
    """(message ids, reply ids) of each human turn answered by a gpt turn; other turns' ids join the next message."""
    texts = [_turn_text(path, line, index, j, turn) for j, turn in enumerate(turns)]
    exchanges, pending, j = [], [], 0
    while j < len(texts):
        role, text = texts[j]
        ids = encode(text)
        if role == "human" and j + 1 < len(texts) and texts[j + 1][0] == "gpt":
            reply = encode(texts[j + 1][1])
            if ids and reply:
                exchanges.append((pending + ids, reply))
                pending = []
            else:  # an empty message or reply: history only
                pending += ids + reply
            j += 2
        else:
            pending += ids
            j += 1
    return exchanges


def load_sessions(path: str | Path, encode: Callable[[str], list[int]], max_seq_len: int = 2048,
                  history_limit: int | None = None) -> ImportedSessions:
    """Every conversation of a ShareGPT file as the (prompt ids, reply ids) of its served turns (module docstring).
    A malformed file is one TraceError naming the file, the line, the conversation and what is wrong."""
    check_conversation_options(max_seq_len, history_limit=history_limit)
    imported = ImportedSessions()
    for index, line, turns in iter_conversations(path):
        exchanges = _exchanges(path, line, index, turns, encode)
        served = session_turns(exchanges, max_seq_len, history_limit)
        imported.sessions.append(served)
        imported.num_exchanges += len(exchanges)
        imported.num_cut += len(exchanges) - len(served)
        if imported.num_exchanges - imported.num_cut > MAX_NUM_REQUESTS:
            raise TraceError(f"{path} line {line}: more than {MAX_NUM_REQUESTS:,} requests (the limit of one trace)")
    return imported


def import_conversations(
    path: str | Path,
    *,
    encode: Callable[[str], list[int]] | None = None,
    max_seq_len: int = 2048,
    history_limit: int | None = None,
    rate: float | None = None,
    think_time: float = DEFAULT_THINK_TIME,
    seed: int = 0,
) -> tuple[list[list[Request]], ImportedSessions]:
    """The sessions of a ShareGPT file as requests (the conversations that gave at least one, in file order), and
    what the import kept and left out. `encode`: text -> token ids (default: SmolLM2's tokenizer). TraceError if
    the file gives no request."""
    check_rate(rate)
    check_conversation_options(max_seq_len, think_time=think_time, history_limit=history_limit)
    if not (is_int(seed) and 0 <= seed <= MAX_SEED):
        raise ValueError(f"seed must be an integer from 0 to {MAX_SEED:,}, got {seed}")
    imported = load_sessions(path, encode or default_encode(), max_seq_len, history_limit)
    sessions = [s for s in imported.sessions if s]
    if not sessions:
        raise TraceError(f"{path}: no request in the whole file: {imported.describe()}")
    # NOTE: two streams from one seed: changing the rate moves the session starts only, not the think times.
    arrival_rng, think_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    if rate is None:
        starts = [0.0] * len(sessions)
    else:
        starts = np.cumsum(arrival_rng.exponential(1.0 / rate, len(sessions))).tolist()
    thinks = [think_rng.exponential(think_time, len(s) - 1) for s in sessions]
    return place_sessions(sessions, starts, thinks), imported
