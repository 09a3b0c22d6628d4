"""Traces on disk, ShareGPT import, and the GGUF-built tokenizer (sim/workloads/trace.py, sim/workloads/sharegpt.py, sim/base/tokenizer.py)."""

import dataclasses
import json
import os
import re

import pytest

from sim.base.request import Request
from sim.workloads.sharegpt import import_sharegpt, load_sharegpt_pairs
from sim.workloads.trace import TraceError, read_csv, read_jsonl, read_trace, write_csv, write_jsonl
from sim.workloads.workload import generate_requests


@pytest.fixture
def requests():
    # A mix: beams, parallel samples, shared prefixes with token ids.
    plain = generate_requests("sharegpt", 20, rate=3.0, beam_width=4, seed=5)
    shared = generate_requests("alpaca", 10, rate=3.0, n=2, prefix_len=8, num_prefixes=2, seed=6)
    return plain + [dataclasses.replace(r, request_id=100 + r.request_id) for r in shared]


def test_jsonl_round_trip(tmp_path, requests):
    path = tmp_path / "trace.jsonl"
    write_jsonl(requests, path)
    assert read_jsonl(path) == requests
    assert read_trace(path) == requests


def test_csv_round_trip_without_token_ids(tmp_path, requests):
    path = tmp_path / "trace.csv"
    write_csv(requests, path)
    back = read_trace(path)
    for r in requests:
        r.prompt_token_ids = None  # CSV keeps lengths and prefixes, not token ids
    assert back == requests  # arrival times too: written with repr, so exactly


def test_jsonl_defaults_for_optional_fields(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"request_id": 0, "arrival_time": 1, "prompt_len": 3, "output_len": 4}\n\n')
    assert read_jsonl(path) == [Request(0, 1.0, 3, 4)]


@pytest.mark.parametrize(
    "bad_line, message",
    [
        (
            '{"request_id": 1, "arrival_time": 0.5, "prompt_len": 3, "output_len": "x"}',
            r"line 2: output_len: got 'x' \(allowed: an integer from 1 to 1,048,576\)",
        ),
        ('{"request_id": 1, "arrival_time": -1, "prompt_len": 3, "output_len": 2}', "line 2: arrival_time: got -1"),
        (
            '{"request_id": 1, "arrival_time": 0, "prompt_len": 3, "output_len": 2, "colour": 1}',
            "line 2: unknown field",
        ),
        (
            '{"request_id": 1, "arrival_time": 0, "prompt_len": 3, "output_len": 2, "n": 2, "beam_width": 2}',
            "line 2: request 1: use either n",
        ),
        (
            '{"request_id": 1, "arrival_time": 0, "prompt_len": 2, "output_len": 2, "prompt_token_ids": [1]}',
            "line 2: request 1: 1 prompt_token_ids for prompt_len 2",
        ),
        ('{"request_id": 1, "arrival_time": 0, "prompt_len": true, "output_len": 2}', "line 2: prompt_len: got True"),
        ("[1, 2]", "line 2: expected a JSON object, got a list"),
        ('{"request_id": 1,', "line 2: not valid JSON"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path, bad_line, message):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"request_id": 0, "arrival_time": 0, "prompt_len": 3, "output_len": 4}\n' + bad_line + "\n")
    with pytest.raises(TraceError, match="trace.jsonl " + message.replace("[", r"\[")) as info:
        read_jsonl(path)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "text, message",
    [
        ("request_id,arrival_time,prompt_len\n0,0,1\n", "line 1: missing column\\(s\\) output_len"),
        (
            "request_id,arrival_time,prompt_len,output_len\n0,0,1,2\n1,0,1,0\n",
            "line 3: output_len: got 0 \\(allowed: an integer from 1",
        ),
        ("request_id,arrival_time,prompt_len,output_len\n0,soon,1,2\n", "line 2: arrival_time: got 'soon'"),
        ("request_id,arrival_time,prompt_len,output_len\n0,0,1,2,9\n", "line 2: expected 4 columns"),
    ],
)
def test_malformed_csv_names_file_and_line(tmp_path, text, message):
    path = tmp_path / "trace.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match="trace.csv " + message):
        read_csv(path)


def test_unknown_trace_suffix(tmp_path):
    with pytest.raises(TraceError, match=r"allowed: \.jsonl, \.csv"):
        read_trace(tmp_path / "trace.txt")


def _words(text: str) -> int:
    return len(text.split())  # a stand-in tokenizer: one token per word


def _write_sharegpt(path):
    conversations = [
        {
            "id": "a",
            "conversations": [{"from": "human", "value": "one two three"}, {"from": "gpt", "value": "four five"}],
        },
        {"id": "b", "conversations": [{"from": "human", "value": "only a question"}]},  # no reply: skipped
        {
            "id": "c",
            "conversations": [
                {"from": "gpt", "value": "greeting"},
                {"from": "human", "value": "hi there"},
                {"from": "gpt", "value": "hello"},
                {"from": "human", "value": "ignored"},
            ],
        },
        {"id": "d", "conversations": [{"from": "human", "value": "w " * 6}, {"from": "gpt", "value": "w " * 5}]},
        {"id": "e", "conversations": []},
    ]
    path.write_text(json.dumps(conversations))


def test_import_sharegpt_takes_first_pair_and_skips_what_does_not_fit(tmp_path):
    path = tmp_path / "sharegpt.json"
    _write_sharegpt(path)
    # max_seq_len 10: "d" has 6 + 5 = 11 tokens and is skipped, as the paper skips too-long pairs.
    pairs = load_sharegpt_pairs(path, _words, max_seq_len=10)
    assert (pairs.prompt_lens, pairs.output_lens) == ([3, 2], [2, 1])
    assert (pairs.skipped_too_long, pairs.skipped_no_pair) == (1, 2)
    offline = import_sharegpt(path, count_tokens=_words, max_seq_len=10)
    assert [(r.request_id, r.arrival_time, r.prompt_len, r.output_len) for r in offline] == [
        (0, 0.0, 3, 2),
        (1, 0.0, 2, 1),
    ]
    online = import_sharegpt(path, count_tokens=_words, rate=2.0, seed=1)
    assert len(online) == 3 and 0 < online[0].arrival_time < online[1].arrival_time < online[2].arrival_time
    assert online == import_sharegpt(path, count_tokens=_words, rate=2.0, seed=1)


def test_import_sharegpt_rejects_a_malformed_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[{"id": "a", "conversations": [}]')
    with pytest.raises(TraceError, match="bad.json line 1: not valid JSON"):
        import_sharegpt(path, count_tokens=_words)
    path.write_text('[{"id": "a"}]')
    with pytest.raises(TraceError, match="conversation 0 has no 'conversations'"):
        import_sharegpt(path, count_tokens=_words)
    with pytest.raises(ValueError, match="rate must be"):
        import_sharegpt(path, count_tokens=_words, rate=0)


# ---- the tokenizer built from the GGUF file ------------------------------------------------------------

TEXTS = [
    "Hello, world!",
    "  leading spaces and trailing   ",
    "it's we're they'll I'd",
    " 2024-11-22 3.14159 1e-9 12345678901234567890",
    "x²+y² = z²",
    "def f(x):\n\treturn x**2  # comment\n",
    "x = [1,2,3]; y = {'a': 10}\n    if x: pass",
    "日本語のテキスト、中文文本。",
    "emoji 😀👍🏽 done",
    "Ünïcödé naïve café",
    "<|im_start|>user\nhi<|im_end|>\n",
    "\n\n\n  \r\n\t",
    "line1\nline2\r\nline3",
    "a" * 60,
    "١٢٣ ٤٥ ½ cup, ¾ tsp, Ⅻ ₀₁₂ ⁰¹² ①②",
    "",
]
# Where the two readings of the "smollm" pre-tokenizer part (sim/base/tokenizer.py docstring): llama.cpp splits
# every numeral off first, so a space before a non-ASCII numeral stays a token of its own (216 = "Ġ").
LLAMA_CPP_DIFFERS = {
    "١٢٣ ٤٥ ½ cup, ¾ tsp, Ⅻ ₀₁₂ ⁰¹² ①②",
}


@pytest.fixture(scope="module")
def reference_tokenizer():
    transformers = pytest.importorskip("transformers")
    from sim.base.tokenizer import find_gguf_file

    gguf = find_gguf_file()
    return transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@pytest.fixture(scope="module")
def tokenizers():
    from sim.base.tokenizer import load_smollm2_tokenizer

    return {match: load_smollm2_tokenizer(match) for match in ("transformers", "llama.cpp")}


@pytest.mark.slow
def test_tokenizer_ids_equal_transformers(tokenizers, reference_tokenizer):
    ours = tokenizers["transformers"]
    for text in TEXTS:
        assert ours.encode(text) == reference_tokenizer.encode(text, add_special_tokens=False), text
        assert ours.decode(ours.encode(text)) == text
        assert ours.count_tokens(text) == len(ours.encode(text))
    assert ours.encode("<|im_start|>") == [1]  # control tokens stay whole
    assert (ours.bos_token_id, ours.eos_token_id, ours.vocab_size) == (1, 2, 49152)


@pytest.mark.slow
def test_llama_cpp_reading_differs_only_on_non_ascii_numerals(tokenizers, reference_tokenizer):
    ours = tokenizers["llama.cpp"]
    for text in TEXTS:
        same = ours.encode(text) == reference_tokenizer.encode(text, add_special_tokens=False)
        assert same == (text not in LLAMA_CPP_DIFFERS), text
        assert ours.decode(ours.encode(text)) == text
    assert ours.encode(" ٤")[0] == 216  # the space is its own token before a numeral


def test_tokenizer_match_is_validated():
    from sim.base.tokenizer import load_smollm2_tokenizer

    with pytest.raises(ValueError, match="allowed: transformers, llama.cpp"):
        load_smollm2_tokenizer("sentencepiece")


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".csv"])
def test_a_fifo_is_refused_before_it_is_opened(tmp_path, suffix):
    """Opening a FIFO blocks until a writer comes (and a .json trace used to be opened twice): refused instead."""
    fifo = tmp_path / f"t{suffix}"
    os.mkfifo(fifo)
    with pytest.raises(TraceError, match="not a regular file"):
        read_trace(fifo)


def test_a_lone_surrogate_in_a_sharegpt_file_names_file_line_and_turn(tmp_path):
    """json.loads turns the escape "\\ud800" into a string that no tokenizer can take: refused where it is."""
    path = tmp_path / "chats.json"
    path.write_text(
        '[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},\n'
        ' {"conversations": [{"from": "human", "value": "a \\ud800 b"}, {"from": "gpt", "value": "c"}]}]'
    )
    with pytest.raises(TraceError, match="chats.json line 2: conversation 1, turn 0: 'value' holds a lone surrogate"):
        read_trace(path, count_tokens=len)


@pytest.mark.parametrize(
    "value, accepted",
    [
        ("\\u0000\\u0001", False),
        ("\\u001b[0m", True),
        ("\\n\\t", True),
        ("", True),
        ("\\u200b", False),
        ("ok\\u0000", True),
    ],
)
def test_a_turn_of_control_characters_only_is_refused_where_it_is(tmp_path, value, accepted):
    """NULs or escapes alone are no text (a binary file read as one); white space or an empty turn is an empty turn,
    and a control character inside text is the text's business."""
    path = tmp_path / "chats.json"
    path.write_text(
        '[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},\n'
        f' {{"conversations": [{{"from": "human", "value": "{value}"}}, {{"from": "gpt", "value": "c"}}]}}]'
    )
    if accepted:
        read_trace(path, count_tokens=len)
    else:
        with pytest.raises(
            TraceError, match="chats.json line 2: conversation 1, turn 0: 'value' holds only control characters, U\\+"
        ):
            read_trace(path, count_tokens=len)


@pytest.mark.parametrize(
    "name, text, line",
    [
        (
            "t.jsonl",
            '{"request_id": 0, "arrival_time": 0, "prompt_len": 10, "output_len": 5}\n\n'
            '{"request_id": 7, "arrival_time": 1, "prompt_len": 3000, "output_len": 5}\n',
            3,
        ),
        ("t.csv", "request_id,arrival_time,prompt_len,output_len\n3,0,10,5\n4,0,5000,2\n", 3),
    ],
)
def test_a_request_the_run_refuses_is_named_by_file_and_line(tmp_path, name, text, line):
    from sim.api import run

    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(path))} line {line}: request \d+: prompt_len \+ output_len"
    ):
        run(trace=str(path))  # opt-13b: a 2,048-token context
