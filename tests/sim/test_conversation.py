"""Conversation workloads (sim/workloads/conversation.py, sim/workloads/conversation_import.py): every turn's prompt is the session's
history, ids consistent across turns, lengths from the ShareGPT fit, the context rule, the multi-turn ShareGPT
import, bad input refused in one line, prefix caching of prompts and of generated tokens, and the chatbot figure."""

from __future__ import annotations

import csv
import dataclasses
import json

import numpy as np
import pytest

import sim
from sim.base.limits import MAX_TOKENS
from sim.base.request import Request
from sim.drivers.cli import main
from sim.workloads.conversation import flatten, generate_conversations, generate_sessions, session_turns
from sim.workloads.conversation_import import import_conversations
from sim.workloads.sharegpt import default_encode
from sim.workloads.trace import TraceError
from sim.workloads.workload import LOGNORMAL_PARAMS, generate_requests

FIT_TOLERANCE = 0.05  # relative: the sample means below have a standard error of 1-2% (heavy-tailed log-normals)


def lognormal_mean(mu: float, sigma: float) -> float:
    return float(np.exp(mu + sigma**2 / 2))  # rounding to integers moves it by far less than the tolerance


def messages_and_replies(session: list[Request]) -> tuple[list[int], list[int]]:
    """Each turn's new message length (its prompt minus the history before it) and reply length."""
    history, messages = 0, []
    for r in session:
        messages.append(r.prompt_len - history)
        history = r.prompt_len + r.output_len
    return messages, [r.output_len for r in session]


# --- the shape of a session ------------------------------------------------------------------------------------
def test_each_turn_starts_with_the_previous_prompt_and_reply():
    sessions = generate_sessions(400, rate=0.5, seed=3)
    assert sum(map(len, sessions)) == 400 and max(map(len, sessions)) >= 3
    owners: dict[int, int] = {}
    for s, session in enumerate(sessions):
        for before, after in zip(session, session[1:]):
            # turn k+1 = turn k's prompt, then its reply, then a new message
            history = before.prompt_token_ids + before.output_token_ids
            assert after.prompt_token_ids[: len(history)] == history
            assert after.prompt_len > len(history)
            assert after.arrival_time >= before.arrival_time and after.request_id > before.request_id
        for r in session:
            for token in r.prompt_token_ids + r.output_token_ids:
                assert owners.setdefault(token, s) == s  # no id is used by two sessions
    requests = flatten(sessions)
    assert [r.request_id for r in requests] == list(range(400))
    assert [r.arrival_time for r in requests] == sorted(r.arrival_time for r in requests)


def test_seeds_reproduce_and_the_rate_moves_only_arrivals():
    def shape(requests):
        return [(r.arrival_time, r.prompt_token_ids, r.output_token_ids) for r in requests]

    a = generate_conversations(300, rate=1.0, seed=7)
    assert shape(a) == shape(generate_conversations(300, rate=1.0, seed=7))
    assert shape(a) != shape(generate_conversations(300, rate=1.0, seed=8))
    slow, fast = generate_sessions(300, rate=1.0, seed=7), generate_sessions(300, rate=4.0, seed=7)
    lengths = [[(r.prompt_len, r.output_len) for r in s] for s in slow]
    assert lengths == [[(r.prompt_len, r.output_len) for r in s] for s in fast]
    assert [s[0].arrival_time for s in fast] != [s[0].arrival_time for s in slow]


@pytest.mark.slow
def test_lengths_turns_and_think_times_follow_the_model():
    # A context far past any draw: no session ends early, no length is truncated.
    sessions = generate_sessions(rate=2.0, duration=2500.0, turns=5.0, think_time=30.0, max_seq_len=MAX_TOKENS, seed=1)
    messages, replies = zip(*(messages_and_replies(s) for s in sessions))
    messages, replies = np.concatenate(messages), np.concatenate(replies)
    assert len(messages) > 20_000
    fit = LOGNORMAL_PARAMS["sharegpt"]
    assert messages.mean() == pytest.approx(lognormal_mean(*fit["prompt"]), rel=FIT_TOLERANCE)  # ~168 tokens
    assert replies.mean() == pytest.approx(lognormal_mean(*fit["output"]), rel=FIT_TOLERANCE)  # ~355 tokens
    assert np.mean([len(s) for s in sessions]) == pytest.approx(5.0, rel=FIT_TOLERANCE)
    gaps = [b.arrival_time - a.arrival_time for s in sessions for a, b in zip(s, s[1:])]
    assert np.mean(gaps) == pytest.approx(30.0, rel=FIT_TOLERANCE)
    starts = sorted(s[0].arrival_time for s in sessions)
    assert len(starts) == pytest.approx(2.0 * 2500, rel=FIT_TOLERANCE) and starts[-1] < 2500.0


# --- the context rule --------------------------------------------------------------------------------------------
def test_a_session_ends_at_the_first_turn_that_does_not_fit():
    ids = iter(range(1000))
    exchanges = [([next(ids) for _ in range(5)], [next(ids) for _ in range(5)]) for _ in range(3)]
    turns = session_turns(exchanges, max_seq_len=20)
    # turn 1: 5 + 5 fits; turn 2: 15 + 5 = 20 fits; turn 3: 25 + 5 does not, and ends the session
    assert [(len(p), len(r)) for p, r in turns] == [(5, 5), (15, 5)]
    assert turns[1][0] == exchanges[0][0] + exchanges[0][1] + exchanges[1][0]
    for requests in (generate_conversations(2000, rate=1.0, seed=2), generate_requests("sharegpt", 10, rate=1.0)):
        assert max(r.total_len for r in requests) <= 2048


def test_a_history_limit_keeps_the_last_tokens_and_cuts_prefix_reuse():
    ids = iter(range(1000))
    exchanges = [([next(ids) for _ in range(5)], [next(ids) for _ in range(6)]) for _ in range(3)]
    turns = session_turns(exchanges, max_seq_len=12, history_limit=8)
    # every turn fits: prompts keep their last 8 tokens, replies their first 12 - 8 = 4
    assert [(len(p), len(r)) for p, r in turns] == [(5, 4), (8, 4), (8, 4)]
    assert turns[1][0] == (exchanges[0][0] + exchanges[0][1][:4] + exchanges[1][0])[-8:]
    assert turns[2][0][:4] != turns[1][0][:4]  # the window moved: the next prompt no longer starts the same way
    sessions = generate_sessions(rate=0.5, duration=2000.0, turns=6.0, history_limit=1024, seed=4)
    requests = flatten(sessions)
    assert max(r.prompt_len for r in requests) == 1024 and max(r.output_len for r in requests) <= 1024
    assert np.mean([len(s) for s in sessions]) == pytest.approx(6.0, rel=0.1)  # no session ends for the context


# --- import of multi-turn ShareGPT files -------------------------------------------------------------------------
CONVERSATIONS = [
    {
        "id": "a",
        "conversations": [
            {"from": "system", "value": "You are terse."},
            {"from": "human", "value": "What is paged attention?"},
            {"from": "gpt", "value": "KV cache in fixed-size blocks, like virtual memory pages."},
            {"from": "human", "value": "Why?"},
            {"from": "gpt", "value": "Less fragmentation, so larger batches."},
            {"from": "human", "value": "Thanks!"},
        ],
    },
    {"id": "b", "conversations": [{"from": "gpt", "value": "Hello."}, {"from": "human", "value": "Hi."}]},
    {
        "id": "c",
        "conversations": [
            {"from": "human", "value": "Count to three."},
            {"from": "gpt", "value": "One, two, three."},
            {"from": "human", "value": ""},
            {"from": "gpt", "value": "Anything else?"},
            {"from": "human", "value": "No."},
            {"from": "gpt", "value": "Bye."},
        ],
    },
]


def write(path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.slow
def test_import_makes_one_request_per_answered_human_turn(tmp_path):
    path = write(tmp_path / "chats.json", CONVERSATIONS)
    encode = default_encode()
    sessions, imported = import_conversations(path, rate=None, think_time=10.0)
    assert [len(s) for s in sessions] == [2, 2]  # b has no answered human turn
    assert imported.num_exchanges == 4 and imported.num_cut == 0
    (a1, a2), (c1, c2) = sessions
    turns = [t["value"] for t in CONVERSATIONS[0]["conversations"]]
    # the system prompt is history: it opens the first prompt
    assert a1.prompt_token_ids == encode(turns[0]) + encode(turns[1])
    assert a1.output_token_ids == encode(turns[2])
    assert a2.prompt_token_ids == a1.prompt_token_ids + a1.output_token_ids + encode(turns[3])
    # the empty human turn is no request, and its reply is history
    c = [t["value"] for t in CONVERSATIONS[2]["conversations"]]
    assert c2.prompt_token_ids == encode(c[0]) + encode(c[1]) + encode(c[3]) + encode(c[4])
    assert a1.arrival_time == c1.arrival_time == 0.0 and a2.arrival_time > 0.0


def test_import_applies_the_context_rule_and_runs(tmp_path):
    path = write(tmp_path / "chats.json", CONVERSATIONS)
    whole = sum(map(len, import_conversations(path)[0]))
    sessions, imported = import_conversations(path, max_seq_len=30)  # a's second turn (27 + 7) does not fit
    assert imported.num_cut > 0 and sum(map(len, sessions)) == whole - imported.num_cut
    assert imported.num_cut == 1 and all(r.total_len <= 30 for s in sessions for r in s)
    result = sim.run(trace=path, conversations=True, rate=0.5, think_time=5.0)
    assert result.summary["num_requests"] == 4 and result.summary["num_sessions"] == 2
    assert "multi-turn sessions" in result.summary["trace_import"]


@pytest.mark.parametrize(
    "data, message",
    [
        (
            [{"conversations": [{"from": "human", "value": 3}]}],
            r"chats\.json line 1: conversation 0, turn 0: 'value' is 3 \(expected a string",
        ),
        (
            [{"conversations": []}, {"conversations": [{"value": "hi"}]}],
            r"chats\.json line 1: conversation 1, turn 0: 'from' is missing",
        ),
        ([{"turns": []}], r"chats\.json line 1: conversation 0 has no 'conversations' list"),
        ([{"conversations": [{"from": "gpt", "value": "hello"}]}], r"chats\.json: no request in the whole file"),
    ],
)
def test_bad_files_are_one_line(tmp_path, data, message):
    path = write(tmp_path / "chats.json", data)
    with pytest.raises(TraceError, match=message) as info:
        import_conversations(path)
    assert "\n" not in str(info.value)


# --- options -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(workload="conversation", turns=0.5), r"turns: got 0\.5 \(allowed: a finite number >= 1"),
        (dict(workload="conversation", think_time=-1.0), r"think_time: got -1\.0"),
        (
            dict(workload="conversation", history_limit=2048),
            r"history_limit: got 2048 .*from 1 to max_seq_len - 1 = 2047",
        ),
        (dict(workload="conversation", n=2), r"n=2: means nothing with workload='conversation'"),
        (dict(workload="conversation", prefix_len=16), r"prefix_len=16: means nothing with workload='conversation'"),
        (dict(workload="sharegpt", turns=3.0), r"turns=3\.0: applies to workload='conversation' only"),
        (dict(workload="alpaca", history_limit=512), r"history_limit=512: applies to workload='conversation' only"),
        (dict(conversations=True), r"conversations=True: applies to a ShareGPT conversation file only"),
        (dict(workload="conversation", rate=1e6, duration=1e3, turns=100.0), r"rate x duration x turns"),
    ],
)
def test_bad_options_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sim.run(num_requests=None if "duration" in kwargs else 10, **kwargs)


def test_cli_runs_a_conversation_and_refuses_flags_in_one_line(capsys):
    assert (
        main(
            [
                "run",
                "--workload",
                "conversation",
                "--rate",
                "0.2",
                "--duration",
                "60",
                "--turns",
                "3",
                "--think-time",
                "5",
                "--prefix-caching",
                "on",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "sessions/s" in out and "prefix cache hits" in out
    assert main(["run", "--workload", "alpaca", "--think-time", "60"]) == 2
    assert capsys.readouterr().err == (
        "error: --think-time 60: applies to --workload conversation only, not --workload alpaca\n"
    )
    assert main(["run", "--conversations"]) == 2
    assert capsys.readouterr().err.startswith("error: --conversations: applies to a ShareGPT conversation file only")


def test_output_token_ids_are_checked():
    with pytest.raises(ValueError, match="request 0: 2 output_token_ids for output_len 3"):
        Request(0, 0.0, 4, 3, output_token_ids=[1, 2])
    with pytest.raises(ValueError, match="n == 1 and beam_width == 1 only"):
        Request(0, 0.0, 4, 2, n=2, output_token_ids=[1, 2])


# --- prefix caching ----------------------------------------------------------------------------------------------
def test_prefix_caching_hits_most_of_a_conversation_and_more_with_generated_tokens():
    # A pool that never evicts a cached block, and long think times: a turn comes after the previous reply is
    # finished (the open-loop caveat of sim.workloads.conversation). Then hits reach what was computed.
    kwargs = dict(policy="paged", enable_prefix_caching=True, kv_slots=2**18)
    workload = dict(rate=0.05, duration=1500.0, think_time=300.0, seed=5)
    requests = generate_conversations(**workload)
    assert sim.run(requests=requests, policy="paged").summary["prefix_cache_hit_rate_tokens"] is None  # off: default
    both = sim.run(requests=requests, **kwargs).summary["prefix_cache_hit_rate_tokens"]
    prompt_only = [dataclasses.replace(r, output_token_ids=None) for r in requests]
    only = sim.run(requests=prompt_only, **kwargs).summary["prefix_cache_hit_rate_tokens"]
    # The most a turn can hit: the full blocks of the previous turn's K/V, its prompt and its reply but the reply's
    # last token (never fed, so never computed); with prompt-only caching, the full blocks of the previous prompt.
    sessions = _sessions(requests)
    prompts = sum(r.prompt_len for r in requests)
    computed = [a.prompt_len + a.output_len - 1 for s in sessions for a in s[:-1]]
    bound = sum(n - n % 16 for n in computed) / prompts
    bound_prompt_only = sum(a.prompt_len - a.prompt_len % 16 for s in sessions for a in s[:-1]) / prompts
    assert 0.95 * bound <= both <= bound and both > 0.6
    assert 0.95 * bound_prompt_only <= only <= bound_prompt_only and only < both - 0.2
    run = sim.run(workload="conversation", **workload, **kwargs)
    assert run.summary["prefix_cache_hit_rate_tokens"] == both  # sim.run's own workload is the same one


def _sessions(requests: list[Request]) -> list[list[Request]]:
    """Requests grouped by session: without a history limit, a session's prompts all start with its first id."""
    groups: dict[int, list[Request]] = {}
    for r in requests:
        groups.setdefault(r.prompt_token_ids[0], []).append(r)
    return list(groups.values())


# --- the chatbot figure (paper Fig. 17) --------------------------------------------------------------------------
@pytest.mark.slow
def test_chatbot_figure_quick(tmp_path):
    from sim.figures import make_figures

    written = make_figures(["chatbot"], tmp_path, quick=True, jobs=1, progress=False)
    assert sorted(p.name for p in written) == ["chatbot.csv", "chatbot.png"]
    with open(tmp_path / "chatbot.csv") as f:
        rows = list(csv.DictReader(f))
    top = max(float(r["request_rate"]) for r in rows)
    latency = {r["system"]: float(r["normalized_latency_s_per_token"]) for r in rows if float(r["request_rate"]) == top}
    assert set(latency) == {"max", "pow2", "oracle", "paged"}
    # at the highest rate the paged cache is still fast while the Orca baselines queue, Max the most
    assert latency["paged"] < 0.5 * min(latency["oracle"], latency["pow2"]) and latency["max"] == max(latency.values())
