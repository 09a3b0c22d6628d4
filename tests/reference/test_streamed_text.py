"""A streamed completion adds up to the whole one, whatever the text: characters that take several tokens (Chinese,
emoji) and stop strings that a later token completes.

The engine's text of a running sample is its tokens decoded so far: a character whose bytes are split over two
tokens shows as U+FFFD until its last byte arrives, and a stop string cuts the text only once it is complete. A
stream that sends whatever is new at each step sends the U+FFFD (and never the character), and sends a stop
string's first characters before the cut removes them. So the server's Renderer and the CLI send only
`settled_text`, and the engine searches again for stop strings over a character that completed.

The property runs over random texts made of such pieces, tokenized by SmolLM2's real tokenizer, with random stop
strings: the stream's pieces, joined, equal the final text (the non-streamed answer), and never hold U+FFFD.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")

from reference.engine.outputs import CompletionOutput, RequestOutput, settled_text  # noqa: E402
from reference.engine.stops import check_stop_strings  # noqa: E402
from reference.server.streams import Renderer  # noqa: E402

PIECES = ["a", " the", " history", "中", "文", "😊", "🌸", "é", "？", " ", ".", "\n", "ab", "ß"]
STOPS = [" the ", "中文", "😊", ". ", "a", "？？", "🌸 ", "é"]


def _engine_texts(tokenizer, ids: list[int], stop: list[str], include: bool):
    """(text, finish_reason) after each token, as the engine reports a sample with these tokens
    (reference.engine.stops.check_stop and reference.engine.request_state.completion_output: stop strings searched in the new text,
    the text cut where one is found)."""
    checked = 0
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:k], skip_special_tokens=True)
        hit, checked = check_stop_strings(text, checked, stop, include)
        if hit is not None:
            yield (text[: hit[1]] if hit[1] >= 0 else text), "stop"
            return
        yield text, ("length" if k == len(ids) else None)


def _sent(frames: list[str], chat: bool) -> str:
    text = ""
    for frame in frames:
        assert frame.startswith("data: ") and frame.endswith("\n\n"), frame
        choice = json.loads(frame[len("data: ") :])["choices"][0]
        text += choice["delta"].get("content", "") if chat else choice["text"]
    return text


@settings(max_examples=150, deadline=None)
@given(
    pieces=st.lists(st.sampled_from(PIECES), min_size=1, max_size=12),
    stop=st.lists(st.sampled_from(STOPS), max_size=2),
    include=st.booleans(),
    chat=st.booleans(),
)
def test_a_stream_adds_up_to_the_whole_text(smol, pieces, stop, include, chat):
    tokenizer = smol[1]
    ids = tokenizer.encode("".join(pieces), add_special_tokens=False)
    renderer = Renderer("cmpl-0", "smollm2", chat, 1, {"stop": stop})
    streamed, printed = "", ""
    for k, (text, reason) in enumerate(_engine_texts(tokenizer, ids, stop, include), 1):
        out = RequestOutput(
            "0", None, [1], None, [CompletionOutput(0, text, ids[:k], None, finish_reason=reason)], reason is not None
        )
        piece = _sent(renderer.step(0, out), chat)
        assert "\ufffd" not in piece, (piece, text)
        streamed += piece
        shown = settled_text(text, reason is not None, max(map(len, stop), default=0))  # what the CLI prints
        assert shown.startswith(printed), (shown, printed)
        printed = shown
    assert streamed == text == printed, (streamed, text, printed)


def test_a_character_split_over_two_tokens_is_sent_once_whole(smol):
    """The reported case: "😇" is two of SmolLM2's tokens; the stream sent U+FFFD, then nothing."""
    tokenizer = smol[1]
    ids = tokenizer.encode(" 😇", add_special_tokens=False)
    assert len(ids) > 1 and "\ufffd" in tokenizer.decode(ids[:1])  # the case exists in this tokenizer
    renderer = Renderer("cmpl-0", "smollm2", False, 1, {})
    sent = []
    for k in range(1, len(ids) + 1):
        reason = "length" if k == len(ids) else None
        text = tokenizer.decode(ids[:k])
        out = RequestOutput(
            "0", None, [1], None, [CompletionOutput(0, text, ids[:k], None, finish_reason=reason)], reason is not None
        )
        sent.append(_sent(renderer.step(0, out), False))
    assert "".join(sent) == " 😇" and "\ufffd" not in "".join(sent), sent


def test_a_stop_string_ending_in_a_completed_character_stops(smol):
    """A stop string whose last character completes without lengthening the text (U+FFFD becomes "😇") is found."""
    tokenizer = smol[1]
    ids = tokenizer.encode("ab 😇 cd", add_special_tokens=False)
    reasons = [reason for _, reason in _engine_texts(tokenizer, ids, [" 😇"], False)]
    texts = [text for text, _ in _engine_texts(tokenizer, ids, [" 😇"], False)]
    assert reasons[-1] == "stop" and texts[-1] == "ab", (texts, reasons)
