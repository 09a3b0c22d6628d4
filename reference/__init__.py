"""The reference half of the lab: real tensors behind the simulator's block tables.

`from reference import LLM, SamplingParams, BeamSearchParams` gives vLLM's offline API (docs/ARCHITECTURE.md, "In the engine");
`reference.inputs` and `reference.sampling_params` stand where `vllm.inputs` and `vllm.sampling_params` do.
Imports are lazy so that `import reference.attention` or `reference.models` does not pull in the engine.
"""
from __future__ import annotations

from reference.cpu_allocator import huge_pages as _huge_pages

_huge_pages()  # before any model loads: torch reads its switch at its first large allocation (see there)

_EXPORTS = {
    "LLM": "reference.engine.llm",
    "SamplingParams": "reference.engine.sampling",
    "BeamSearchParams": "reference.engine.sampling",
    "RequestOutput": "reference.engine.outputs",
    "CompletionOutput": "reference.engine.outputs",
    "BeamSearchOutput": "reference.engine.outputs",
    "BeamSearchSequence": "reference.engine.outputs",
    "Logprob": "reference.engine.outputs",
    "TextPrompt": "reference.inputs",
    "TokensPrompt": "reference.inputs",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'reference' has no attribute {name!r}")
