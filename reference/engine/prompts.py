"""The prompts the engine takes, as vLLM's offline API takes them: a str, a list of token ids, a dict
{"prompt": str} / {"prompt_token_ids": [...]}, or a list of these (and numpy integer arrays); anything else is a
TypeError naming the allowed forms. Token ids are checked for being integers here, against the vocabulary by
the engine. Also here: the conversations `LLM.chat` takes (`chat_messages`), checked before the chat template sees
them.
"""
from __future__ import annotations

import numbers

import numpy as np

_PROMPT_FORMS = "a str, a list of token ids, or a dict {'prompt': str} / {'prompt_token_ids': list[int]}"
_PROMPT_KEYS = ("prompt", "prompt_token_ids")


def _is_number(x) -> bool:
    return isinstance(x, (numbers.Number, np.bool_))


def prompt_list(prompts) -> list:
    """The prompts of one call, each as given: a str or a dict is one prompt; a list or tuple whose first element
    is a number is ONE prompt of token ids, else one prompt per element; a 1-D numpy array is one prompt, a 2-D
    one a prompt per row. TypeError for anything else (bytes included: text must be str)."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, np.ndarray):
        if prompts.ndim not in (1, 2):
            raise ValueError(f"an array of prompts must be 1-D (one prompt of token ids) or 2-D (one per row), "
                             f"got {prompts.ndim}-D")
        return [prompts] if prompts.ndim == 1 else list(prompts)
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be {_PROMPT_FORMS}, or a list of them: got {type(prompts).__name__}")
    if prompts and _is_number(prompts[0]):
        return [prompts]
    return list(prompts)


def check_text(text: str, where: str) -> str:
    """`text` if UTF-8 can encode it, else ValueError naming the first character it cannot: a lone surrogate, which
    Python makes of bytes that are not UTF-8 (a command-line argument, surrogateescape) or JSON's "\\udfff"."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{where} is not valid text: character {exc.start} is {text[exc.start]!r}, a lone "
                         f"surrogate (allowed: text that UTF-8 can encode)") from None
    return text


def prompt_parts(prompt, where: str) -> tuple[str | None, list[int] | None]:
    """(text, None) or (None, token ids) of one prompt; the ids are ints, not yet checked against the vocabulary."""
    if isinstance(prompt, str):
        return check_text(prompt, where), None
    if isinstance(prompt, dict):
        if len(prompt) != 1 or not set(prompt) <= set(_PROMPT_KEYS):
            raise ValueError(f"{where}: a prompt dict takes exactly one of the keys 'prompt', 'prompt_token_ids', "
                             f"got keys {sorted(map(repr, prompt))}")
        [(key, value)] = prompt.items()
        if key == "prompt":
            if not isinstance(value, str):
                raise TypeError(f"{where}: the value of 'prompt' must be a str, got {type(value).__name__}")
            return check_text(value, where), None
        if not isinstance(value, (list, tuple, np.ndarray)):
            raise TypeError(f"{where}: the value of 'prompt_token_ids' must be a list of token ids, "
                            f"got {type(value).__name__}")
        return None, _token_ids(value, where)
    if isinstance(prompt, (list, tuple, np.ndarray)):
        return None, _token_ids(prompt, where)
    raise TypeError(f"{where}: prompts must be {_PROMPT_FORMS}: got {type(prompt).__name__}")


def _token_ids(value, where: str) -> list[int]:
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
            raise TypeError(f"{where}: an array of token ids must be 1-D of an integer dtype, got {value.ndim}-D "
                            f"{value.dtype}")
        return value.tolist()
    ids = []
    for i, t in enumerate(value):
        if not isinstance(t, numbers.Integral) or isinstance(t, (bool, np.bool_)):
            raise TypeError(f"{where}: token ids must be integers, got {type(t).__name__} {t!r} at position {i}")
        ids.append(int(t))
    return ids


_CHAT_FORMS = "a conversation (a list of {'role': ..., 'content': ...} dicts) or a list of conversations"
_MESSAGE_FORM = "{'role': str, 'content': str or a list of {'type': 'text', 'text': str} parts}"


def chat_messages(messages) -> list[list[dict]]:
    """The conversations of one `LLM.chat` call as the chat template takes them: each message a dict with a str
    'role' and a str 'content', OpenAI's list of content parts joined into one. TypeError / ValueError naming the
    message (messages[i] in one conversation, messages[c][i] in a list of them) for anything else."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise TypeError(f"messages must be {_CHAT_FORMS}, got {_describe(messages)}")
    single = isinstance(messages[0], dict)  # a list of messages, not of conversations
    conversations = [messages] if single else messages
    checked = []
    for c, conversation in enumerate(conversations):
        if not isinstance(conversation, (list, tuple)) or not conversation:
            raise TypeError(f"messages must be {_CHAT_FORMS}: messages[{c}] is {_describe(conversation)}")
        checked.append([_message(m, f"messages[{i}]" if single else f"messages[{c}][{i}]")
                        for i, m in enumerate(conversation)])
    return checked


def _message(message, where: str) -> dict:
    """One message with its content as one str. NOTE: as vLLM renders a text-only list of parts for a template that
    takes a str: the texts joined with newlines. vLLM drops a message whose content is None (an assistant's tool
    call); this engine calls no tools, so None is refused."""
    if not isinstance(message, dict):
        raise TypeError(f"{where}: a message must be a dict {_MESSAGE_FORM}, got {_describe(message)}")
    for key in ("role", "content"):
        if message.get(key) is None:
            what = f"its {key!r} is None" if key in message else f"it has no {key!r}"
            raise ValueError(f"{where}: {what} (allowed: a message {_MESSAGE_FORM})")
    if not isinstance(message["role"], str):
        raise TypeError(f"{where}: 'role' must be a str, got {_describe(message['role'])}")
    content = message["content"]
    if isinstance(content, str):
        check_text(content, f"{where}: its 'content'")
        return message
    if not isinstance(content, (list, tuple)):
        raise TypeError(f"{where}: 'content' must be a str or a list of parts, got {_describe(content)}")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise TypeError(f"{where}: content part {j} must be a dict {{'type': 'text', 'text': str}}, "
                            f"got {_describe(part)}")
        if part.get("type") != "text":
            raise ValueError(f"{where}: content part {j} has type {part.get('type')!r}: this engine serves text only "
                             "(allowed: {'type': 'text', 'text': str})")
        if not isinstance(part.get("text"), str):
            raise TypeError(f"{where}: content part {j}: 'text' must be a str, got {_describe(part.get('text'))}")
        texts.append(check_text(part["text"], f"{where}: content part {j}"))
    return {**message, "content": "\n".join(texts)}


def _describe(value) -> str:
    """A value's type, and the value when it is short: one line for an error message."""
    text = repr(value)
    return type(value).__name__ if len(text) > 40 or "\n" in text else f"{type(value).__name__} {text}"
