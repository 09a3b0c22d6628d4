"""The prompts the engine takes, as vLLM's offline API takes them: a str, a list of token ids, a dict
{"prompt": str} / {"prompt_token_ids": [...]}, or a list of these (and numpy integer arrays); anything else is a
TypeError naming the allowed forms. Token ids are checked for being integers here, against the vocabulary by
the engine.
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


def prompt_parts(prompt, where: str) -> tuple[str | None, list[int] | None]:
    """(text, None) or (None, token ids) of one prompt; the ids are ints, not yet checked against the vocabulary."""
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, dict):
        if len(prompt) != 1 or not set(prompt) <= set(_PROMPT_KEYS):
            raise ValueError(f"{where}: a prompt dict takes exactly one of the keys 'prompt', 'prompt_token_ids', "
                             f"got keys {sorted(map(repr, prompt))}")
        [(key, value)] = prompt.items()
        if key == "prompt":
            if not isinstance(value, str):
                raise TypeError(f"{where}: the value of 'prompt' must be a str, got {type(value).__name__}")
            return value, None
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
