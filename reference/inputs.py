"""vLLM's prompt dictionaries (`vllm.inputs`): `from reference.inputs import TokensPrompt` where a script had
`from vllm.inputs import TokensPrompt`. They are plain dicts, as in vLLM; the engine reads the one key each carries
(reference/engine/prompts.py)."""
from __future__ import annotations

from typing import TypedDict


class TextPrompt(TypedDict):
    prompt: str


class TokensPrompt(TypedDict):
    prompt_token_ids: list[int]


__all__ = ["TextPrompt", "TokensPrompt"]
