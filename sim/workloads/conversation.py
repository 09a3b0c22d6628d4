"""Conversation workloads: multi-turn chat sessions, each turn sending the whole history again (vLLM paper 6.5).

A chatbot answers turn k of a conversation from a prompt that holds everything said so far, every earlier user
message and reply, then the new message:

    turn 1 prompt:  [m1]                     reply r1
    turn 2 prompt:  [m1 r1 m2]               reply r2     starts with turn 1's prompt + reply
    turn 3 prompt:  [m1 r1 m2 r2 m3]         reply r3     starts with turn 2's prompt + reply
                     |<--- prefix --->|
                     what a prefix cache can hand back, if its blocks are still cached when the turn comes

Synthetic sessions (`generate_sessions`), the model:

- Session starts follow sim.workloads.workload's arrival processes (poisson, gamma, offline) at `rate` *sessions*/s; a
  session's turns add their own requests, so the request rate is about rate x the mean turns per session.
- Turns per session: geometric with mean `turns` (P(t) = p (1 - p)^(t - 1), p = 1 / turns, t >= 1). A modelling
  choice: memoryless (a user stops after each reply with the same chance), one parameter, at least one turn.
- Lengths: each user message from the ShareGPT prompt fit, each reply from its output fit
  (sim.workloads.workload.LOGNORMAL_PARAMS), all independent. Approximation: the fit describes first turns; real follow-up
  messages tend to be shorter.
- Think time: turn k+1 arrives at turn k's arrival plus an exponential think time (mean `think_time` seconds).
  NOTE: this is an open-loop approximation. Arrivals are fixed before the simulation runs, so a slow server does
  not slow its users down: when turn k's reply takes longer than the think time, turn k+1 arrives before that
  reply is finished (a real user would wait for it) and a prefix cache can only return the part already computed.
  A think time well above a reply's latency (tens of seconds here) keeps this rare.
- Context: without `history_limit`, a session ends at the first turn whose prompt + reply would not fit
  `max_seq_len` (turn 1 is truncated instead, as sim.workloads.workload truncates, so every session has a request).
  With `history_limit` H, every prompt is cut to its last H tokens and every reply to max_seq_len - H tokens
  (the paper's chatbot: the last 1024 of OPT's 2048, and at most 1024 generated), so sessions never end early.
  NOTE: a cut prompt no longer starts where the previous turn's started; the prefix cache's chained block hashes
  name the whole prefix, so once a history passes H no block of it is reused.

Token ids are synthetic: each session owns a range of ids no other session uses, laid out as its history
(m1, r1, m2, r2, ...), so turn k+1's prompt ids start with exactly turn k's prompt and reply ids, and no two
sessions ever share a block by accident. Each request carries its reply's ids (`Request.output_token_ids`), so
a paged pool with prefix caching keeps the generated tokens' blocks too (sim/scheduling/scheduler.py, `_new_spec`).
`sim.workloads.conversation_import` builds the same sessions from a real ShareGPT file with real token ids.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from ..base.limits import MAX_NUM_REQUESTS, MAX_SEED, MAX_TIME_S, MAX_TURNS, is_int, is_real
from ..base.request import Request
from .workload import LOGNORMAL_PARAMS, arrival_gaps, check_workload_args, lognormal_lengths

DEFAULT_TURNS = 4.0  # mean turns (user messages) per session
DEFAULT_THINK_TIME = 60.0  # mean seconds from one turn's arrival to the next
_CHUNK = 1024  # session start gaps drawn at a time

Turn = tuple[list[int], list[int]]  # (prompt ids, reply ids) of one served turn


def session_turns(exchanges: Sequence[tuple[Sequence[int], Sequence[int]]], max_seq_len: int,
                  history_limit: int | None = None) -> list[Turn]:
    """(prompt ids, reply ids) of each turn of one session, from its (message ids, reply ids) exchanges in order:
    the prompt is every earlier message and reply, then the message. The context rule is the module docstring's
    (without history_limit the session ends at the first turn that does not fit; this function truncates nothing
    else)."""
    history: list[int] = []
    turns: list[Turn] = []
    for message, reply in exchanges:
        history.extend(message)
        if history_limit is None:
            if len(history) + len(reply) > max_seq_len:
                break
            prompt = history[:]  # NOTE: slices copy references: the int objects are shared with the history
        else:
            prompt, reply = history[-history_limit:], reply[: max_seq_len - history_limit]
        turns.append((prompt, list(reply)))
        history.extend(reply)
    return turns


def place_sessions(sessions: list[list[Turn]], starts: Sequence[float],
                   thinks: Sequence[np.ndarray]) -> list[list[Request]]:
    """The requests of each session: turn 1 at its start, turn k+1 `thinks[s][k - 1]` seconds after turn k.
    request_id numbers every request in arrival order (ties: by session, then turn). Empty sessions stay empty."""
    times = [np.concatenate(([start], start + np.cumsum(gaps[: len(turns) - 1]))).tolist() if turns else []
             for turns, start, gaps in zip(sessions, starts, thinks)]
    order = sorted((t, s, k) for s, session_times in enumerate(times) for k, t in enumerate(session_times))
    if order and not order[-1][0] <= MAX_TIME_S:
        raise ValueError(f"the last turn arrives at {order[-1][0]:.3g} s, past the limit {MAX_TIME_S:g} s (allowed: "
                         "a shorter think_time or a higher rate)")
    placed: list[list[Request | None]] = [[None] * len(turns) for turns in sessions]
    for request_id, (t, s, k) in enumerate(order):
        prompt, reply = sessions[s][k]
        placed[s][k] = Request(request_id=request_id, arrival_time=t, prompt_len=len(prompt), output_len=len(reply),
                               prompt_token_ids=prompt, output_token_ids=reply)
    return placed  # type: ignore[return-value]  # every slot is filled


def flatten(sessions: list[list[Request]]) -> list[Request]:
    """Every request of the sessions, in arrival order (request_id order, as place_sessions numbers them)."""
    return sorted((r for session in sessions for r in session), key=lambda r: r.request_id)


def check_conversation_options(max_seq_len: int, *, turns: float = DEFAULT_TURNS,
                               think_time: float = DEFAULT_THINK_TIME, history_limit: int | None = None) -> None:
    """One line for an option out of range (sim.base.limits); max_seq_len is the model's context."""
    if not (is_real(turns) and 1 <= turns <= MAX_TURNS):
        raise ValueError(f"turns: got {turns!r} (allowed: a mean number of turns per session from 1 to {MAX_TURNS:,})")
    if not (is_real(think_time) and 0 <= think_time <= MAX_TIME_S):
        raise ValueError(f"think_time: got {think_time!r} (allowed: a mean number of seconds from 0 to "
                         f"{MAX_TIME_S:g})")
    if history_limit is not None and not (is_int(history_limit) and 1 <= history_limit <= max_seq_len - 1):
        raise ValueError(f"history_limit: got {history_limit!r} (allowed: None, or an integer from 1 to "
                         f"max_seq_len - 1 = {max_seq_len - 1}: the prompt keeps that many tokens, the reply the "
                         "rest)")


def _start_times(rng: np.random.Generator, arrival: str, rate: float | None, burstiness: float) -> Iterator[float]:
    """Session start times, endless: sim.workloads.workload's arrival process, its gaps drawn _CHUNK at a time."""
    clock = 0.0
    while True:
        if arrival == "offline":
            yield 0.0
            continue
        part = (clock + np.cumsum(arrival_gaps(rng, arrival, rate, burstiness, _CHUNK))).tolist()
        yield from part
        clock = part[-1]


def generate_sessions(
    num_requests: int | None = None,
    *,
    rate: float | None = None,
    duration: float | None = None,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    max_seq_len: int = 2048,
    turns: float = DEFAULT_TURNS,
    think_time: float = DEFAULT_THINK_TIME,
    history_limit: int | None = None,
    seed: int = 0,
) -> list[list[Request]]:
    """Seeded synthetic sessions (module docstring), each the list of its turns' requests.

    With `duration`: every session that starts before it, with all of its turns (later turns may arrive after
    `duration`). With `num_requests`: sessions one after the other until there are that many requests (the last
    session is cut after the turn that makes the count).
    """
    check_workload_args("sharegpt", num_requests, rate, duration, arrival, burstiness, max_seq_len, 0, 1)
    check_conversation_options(max_seq_len, turns=turns, think_time=think_time, history_limit=history_limit)
    if not (is_int(seed) and 0 <= seed <= MAX_SEED):
        raise ValueError(f"seed must be an integer from 0 to {MAX_SEED:,}, got {seed}")
    if duration is not None and rate * duration * turns > MAX_NUM_REQUESTS:
        raise ValueError(f"rate x duration x turns = {rate * duration * turns:.3g} expected requests, more than the "
                         f"limit {MAX_NUM_REQUESTS:,}")
    # NOTE: independent streams from one seed (as sim.workloads.workload): sweeping the rate moves only the session starts;
    # every session keeps its turns, lengths and think times.
    length_rng, shape_rng, arrival_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    message_fit, reply_fit = LOGNORMAL_PARAMS["sharegpt"]["prompt"], LOGNORMAL_PARAMS["sharegpt"]["output"]
    sessions: list[list[Turn]] = []
    starts: list[float] = []
    thinks: list[np.ndarray] = []
    count, next_id = 0, 0
    for start in _start_times(arrival_rng, arrival, rate, burstiness):
        if (duration is not None and start >= duration) or (num_requests is not None and count >= num_requests):
            break
        k = int(shape_rng.geometric(1.0 / turns))
        thinks.append(shape_rng.exponential(think_time, k - 1))
        messages = lognormal_lengths(length_rng, *message_fit, k)
        replies = lognormal_lengths(length_rng, *reply_fit, k)
        # NOTE: ids are laid out only for the turns served (a geometric draw may ask for thousands, the context
        # ends a session after a few); the draws above are whole, so the streams do not depend on the cut.
        if history_limit is None:  # turn 1 is truncated as sim.workloads.workload truncates: every session has a request
            messages[0] = min(messages[0], max_seq_len - 1)
            replies[0] = min(replies[0], max_seq_len - messages[0])
            fits = np.cumsum(messages + replies) <= max_seq_len  # turn i's prompt + reply: the history up to it
            k = k if fits.all() else int(fits.argmin())  # the first turn that does not fit ends the session
        else:
            replies = np.minimum(replies, max_seq_len - history_limit)
        if num_requests is not None:
            k = min(k, num_requests - count)
        lengths = np.column_stack((messages[:k], replies[:k])).ravel().tolist()  # m1, r1, m2, r2, ...
        ids = list(range(next_id, next_id + sum(lengths)))  # this session's own ids, in order
        next_id += len(ids)
        bounds = np.cumsum([0] + lengths).tolist()
        exchanges = [(ids[bounds[2 * i] : bounds[2 * i + 1]], ids[bounds[2 * i + 1] : bounds[2 * i + 2]])
                     for i in range(k)]
        served = session_turns(exchanges, max_seq_len, history_limit)  # all k: the cut above is the same rule
        count += len(served)
        if count > MAX_NUM_REQUESTS:
            raise ValueError(f"more than {MAX_NUM_REQUESTS:,} requests (the limit of one workload): a shorter "
                             "duration, a lower rate or fewer turns")
        sessions.append(served)
        starts.append(start)
    return place_sessions(sessions, starts, thinks)


def generate_conversations(num_requests: int | None = None, **kwargs) -> list[Request]:
    """`generate_sessions`'s requests, in arrival order (request_id 0, 1, 2, ...)."""
    return flatten(generate_sessions(num_requests, **kwargs))
