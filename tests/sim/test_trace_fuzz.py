"""Fuzzing the trace readers: whatever bytes a file holds, `sim.workloads.trace.read_trace` returns valid requests or
raises TraceError, one line that starts with the file's path and names a line (or the whole file). Never another
exception: no OverflowError, RecursionError, UnicodeDecodeError, csv.Error, KeyError, MemoryError, ...

Four sources, 2,100 examples in all: random bytes under each suffix, and mutations of a valid JSONL trace, a
valid CSV trace and a valid ShareGPT file (bytes flipped, inserted, deleted, lines cut, duplicated or swapped,
field values replaced by hostile ones: huge integers, NaN and Infinity literals, floats, bools, nulls, strings,
deep nesting, duplicate keys, BOMs, CRLF, lone surrogates).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sim.base.limits import MAX_ID, MAX_TIME_S, MAX_TOKENS
from sim.base.request import Request
from sim.workloads.trace import TraceError, read_trace

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SUFFIXES = (".jsonl", ".csv", ".json")

VALID_JSONL = "".join(
    json.dumps(r) + "\n"
    for r in [
        {"request_id": 0, "arrival_time": 0.0, "prompt_len": 8, "output_len": 4},
        {"request_id": 1, "arrival_time": 0.25, "prompt_len": 6, "output_len": 3, "n": 2},
        {
            "request_id": 2,
            "arrival_time": 1.5,
            "prompt_len": 4,
            "output_len": 9,
            "beam_width": 3,
            "prefix_id": 0,
            "prefix_len": 2,
            "prompt_token_ids": [7, 8, 100, 2000],
        },
        {"request_id": 3, "arrival_time": 2, "prompt_len": 3, "output_len": 1, "prefix_id": None},
    ]
)
VALID_CSV = (
    "request_id,arrival_time,prompt_len,output_len,n,beam_width,prefix_id,prefix_len\r\n"
    "0,0.0,8,4,1,1,,0\r\n1,0.25,6,3,2,1,,0\r\n2,1.5,4,9,1,3,0,2\r\n3,2,3,1,,,,\r\n"
)
VALID_SHAREGPT = json.dumps(
    [
        {
            "id": "a",
            "conversations": [{"from": "human", "value": "one two three"}, {"from": "gpt", "value": "four five"}],
        },
        {"id": "b", "conversations": [{"from": "human", "value": "only a question"}]},
        {
            "id": "c",
            "conversations": [
                {"from": "system", "value": "be brief"},
                {"from": "human", "value": "hi there"},
                {"from": "gpt", "value": "hello"},
            ],
        },
    ],
    indent=1,
)

HOSTILE = [
    "1" + "0" * 400,
    "1" + "0" * 5000,
    "9223372036854775808",
    "-1",
    "0",
    "1e17",
    "1e400",
    "-1e400",
    "NaN",
    "Infinity",
    "-Infinity",
    "1.5",
    "8.0",
    "true",
    "false",
    "null",
    '"8"',
    '""',
    "[]",
    "{}",
    "[" * 2000,
    '{"a": {"a": {"a": 1}}}',
    '"\\ud800"',
    "[1, 2, 3, 4, 5, 6, 7, 8]",
    "[1, -2]",
    "[9223372036854775808]",
    "1_000",
    "\u0665",
    "nan",
    "inf",
    " 8 ",
    "0x10",
    "'8'",
    "",
    "\ufeff",
    "\x00",
    "5000",
    "70000",
]  # (the last two: past a context, within the readers' limits)


def _words(text: str) -> int:
    return len(text.split())  # a stand-in tokenizer: fast, and any text gives some count


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("trace_fuzz")  # one file per suffix, rewritten by every example


def check(folder: Path, data: bytes, suffix: str) -> str:
    """The property: valid requests, or one TraceError line naming the file and a line (or the whole file).
    Returns what happened, in two words (an `event` of hypothesis's statistics)."""
    path = folder / f"trace{suffix}"
    path.write_bytes(data)
    try:
        requests = read_trace(path, count_tokens=_words, max_seq_len=64, rate=None)
    except TraceError as e:
        message = str(e)
        assert "\n" not in message and "\r" not in message, message
        assert message.startswith(f"{path} line ") or message.startswith(f"{path}: "), message
        rest = message[len(str(path)) :]
        assert re.match(r" line [1-9][0-9]*: \S", rest) or re.match(r": \S", rest), message
        assert len(message) < 1000, message
        return " ".join(re.sub(r"^ line [0-9]+: |^: ", "", rest).split()[:2])
    assert requests and all(type(r) is Request for r in requests)
    assert len({r.request_id for r in requests}) == len(requests)
    for r in requests:
        assert type(r.request_id) is int and 0 <= r.request_id <= MAX_ID
        assert type(r.arrival_time) is float and 0 <= r.arrival_time <= MAX_TIME_S
        assert all(type(v) is int and 1 <= v <= MAX_TOKENS for v in (r.prompt_len, r.output_len, r.n, r.beam_width))
        assert r.prefix_id is None or (type(r.prefix_id) is int and 0 <= r.prefix_id <= MAX_ID)
        ids = r.prompt_token_ids
        assert ids is None or (len(ids) == r.prompt_len and all(type(i) is int and 0 <= i <= MAX_ID for i in ids))
    return "read"


@st.composite
def mutated(draw, text: str) -> bytes:
    """`text` with 1-4 mutations, at the level of lines, fields and bytes."""
    data = text.encode()
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(
            st.sampled_from(
                ["value"] * 6 + ["key", "line"] * 2 + ["flip", "insert", "delete", "truncate", "bom", "crlf"]
            )
        )
        if kind == "value":  # a number, string or literal replaced by a hostile value
            tokens = rb'"(?:[^"\\\n]|\\.)*"(\s*:)?|-?[0-9][0-9.eE+-]*|true|false|null|\[[^\[\]\n]*\]'
            spans = [m.span() for m in re.finditer(tokens, data) if not m.group(1)]  # values, not keys
            if spans:
                start, end = draw(st.sampled_from(spans))
                data = data[:start] + draw(st.sampled_from(HOSTILE)).encode("utf-8", "surrogatepass") + data[end:]
        elif kind == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1 :]
        elif kind == "insert":
            i = draw(st.integers(0, len(data)))
            data = data[:i] + draw(st.binary(min_size=1, max_size=8)) + data[i:]
        elif kind == "delete" and data:
            i = draw(st.integers(0, len(data) - 1))
            data = data[:i] + data[i + draw(st.integers(1, 16)) :]
        elif kind == "truncate":
            data = data[: draw(st.integers(0, len(data)))]
        elif kind == "line":  # a line duplicated, dropped or moved
            lines = data.splitlines(keepends=True)
            if lines:
                i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines)))
                line = lines[i]
                op = draw(st.sampled_from(["dup", "drop", "move"]))
                if op != "dup":
                    del lines[i]
                if op != "drop":
                    lines.insert(min(j, len(lines)), line)
                data = b"".join(lines)
        elif kind == "bom":
            data = b"\xef\xbb\xbf" + data
        elif kind == "crlf":
            data = data.replace(b"\n", b"\r\n")
        elif kind == "key":  # a key renamed, duplicated or removed (JSON) / a header cell changed (CSV)
            keys = [m.span() for m in re.finditer(rb'"[a-z_]+"(?=:)|(?<=[,\n])[a-z_]+(?=[,\r\n])|^[a-z_]+(?=,)', data)]
            if keys:
                start, end = draw(st.sampled_from(keys))
                new = draw(
                    st.sampled_from(
                        [
                            b'"request_id"',
                            b'"colour"',
                            b'"n"',
                            b"request_id",
                            b"output_len",
                            b"x",
                            b"",
                            b'"conversations"',
                            b'"from"',
                            b'"value"',
                        ]
                    )
                )
                data = data[:start] + new + data[end:]
    return data


@settings(max_examples=500, **SETTINGS)
@given(
    data=st.one_of(st.binary(max_size=600), st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass"))),
    suffix=st.sampled_from(SUFFIXES),
)
def test_random_bytes(folder, data, suffix):
    event(check(folder, data, suffix))


@settings(max_examples=600, **SETTINGS)
@given(data=mutated(VALID_JSONL), suffix=st.sampled_from([".jsonl", ".json"]))
def test_mutated_jsonl(folder, data, suffix):
    event(check(folder, data, suffix))


@settings(max_examples=500, **SETTINGS)
@given(data=mutated(VALID_CSV))
def test_mutated_csv(folder, data):
    event(check(folder, data, ".csv"))


@settings(max_examples=500, **SETTINGS)
@given(data=mutated(VALID_SHAREGPT))
def test_mutated_sharegpt(folder, data):
    event(check(folder, data, ".json"))


@pytest.mark.parametrize(
    "text, suffix", [(VALID_JSONL, ".jsonl"), (VALID_JSONL, ".json"), (VALID_CSV, ".csv"), (VALID_SHAREGPT, ".json")]
)
def test_the_seeds_are_valid(folder, text, suffix):
    """The files the mutations start from are read whole (so a mutation is what breaks them)."""
    assert check(folder, text.encode(), suffix) == "read"
    assert len(read_trace(folder / f"trace{suffix}", count_tokens=_words)) in (2, 4)


@settings(max_examples=300, **SETTINGS)
@given(data=st.one_of(mutated(VALID_JSONL).map(lambda d: (d, ".jsonl")), mutated(VALID_CSV).map(lambda d: (d, ".csv"))))
def test_a_run_on_a_mutated_trace_names_the_file_and_line_of_what_it_refuses(folder, data):
    """Past the reader, sim.run refuses a request that cannot be served (past the context, past the pool): its one
    line still names the file and the line that holds the request, not only the request's id."""
    from sim.api import run

    raw, suffix = data
    path = folder / f"run{suffix}"
    path.write_bytes(raw)
    try:
        result = run(trace=str(path), model="smollm2-135m", kv_slots=4096)
    except ValueError as e:  # TraceError is one
        message = str(e)
        assert "\n" not in message and message.startswith(f"{path}"), message
        rest = message[len(str(path)) :]
        assert re.match(r" line [1-9][0-9]*: \S", rest) or re.match(r": \S", rest), message
        event("refused: " + " ".join(re.sub(r"^ line [0-9]+: |^: ", "", rest).split()[:2]))
        return
    assert result.summary["num_finished"] == result.summary["num_requests"]
    event("served")
