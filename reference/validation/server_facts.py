"""What a running OpenAI-compatible server says about itself, read from the outside: the facts a simulation of it needs.

    facts = read_facts("http://127.0.0.1:8000", given={"max_num_batched_tokens": 4096})

A client that wants to replay a server's run in the simulator needs the server's KV pool and its scheduler's limits.
It asks three endpoints that vLLM and `python -m reference serve` both answer:

    GET /version     {"version": ...}: vLLM's version, or this project's
    GET /v1/models   the served model's name
    GET /metrics     vLLM's `vllm:cache_config_info`, a gauge set to 1 whose labels are every field of vLLM's
                     CacheConfig as a string (vllm/config/cache.py, metrics_info; vllm/v1/metrics/loggers.py,
                     log_metrics_info; vLLM 0.32): block_size, num_gpu_blocks, cache_dtype, enable_prefix_caching, ...

vLLM publishes no scheduler limits, so `max_num_batched_tokens` and `max_num_seqs` come from the caller (`given`:
the flags the server was started with); the project's own server also writes them as `lab:scheduler_config_info`.
A fact both the server and the caller give must agree. A fact nobody gives is one line of error naming the flag that
gives it; nothing is guessed (a wrong pool or budget would make every replayed step wrong without a sign).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# name -> (its type, the /metrics info series that may carry it, the flag that gives it)
FACTS = {
    "block_size": (int, "vllm:cache_config_info", "--block-size"),
    "num_gpu_blocks": (int, "vllm:cache_config_info", "--num-gpu-blocks"),
    "enable_prefix_caching": (bool, "vllm:cache_config_info", "--enable-prefix-caching"),
    "max_num_batched_tokens": (int, "lab:scheduler_config_info", "--max-num-batched-tokens"),
    "max_num_seqs": (int, "lab:scheduler_config_info", "--max-num-seqs"),
}
_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}\s+(\S+)\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = re.compile(r"\\(.)", re.S)  # Prometheus' label escapes: \\ \" \n


@dataclass(frozen=True, slots=True)
class ServerFacts:
    url: str
    version: str  # GET /version's "version"
    model: str  # the first model GET /v1/models lists
    block_size: int
    num_gpu_blocks: int
    enable_prefix_caching: bool
    max_num_batched_tokens: int
    max_num_seqs: int
    sources: dict  # fact -> where it came from: "/metrics" or "given"


def info_labels(metrics_text: str, name: str) -> dict[str, str] | None:
    """The labels of the first series `name{...} 1` in Prometheus text (an info gauge), unescaped; None if absent."""
    for line in metrics_text.split("\n"):  # not splitlines(): a label value may hold \x1e, \x85, \u2028, ...
        m = _SERIES.match(line)
        if m and m.group(1) == name:
            return {k: _UNESCAPE.sub(lambda e: "\n" if e.group(1) == "n" else e.group(1), v)
                    for k, v in _LABEL.findall(m.group(2))}
    return None


def _parse(name: str, value: object, where: str):
    kind = FACTS[name][0]
    text = str(value).strip()
    if kind is bool:
        if text.lower() in ("true", "1"):
            return True
        if text.lower() in ("false", "0"):
            return False
        raise ValueError(f"{where} gives {name}={value!r} (allowed: True or False)")
    if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:
        raise ValueError(f"{where} gives {name}={value!r} (allowed: an integer >= 1)")
    return int(text)


def facts_from(url: str, version: dict, models: dict, metrics_text: str, given: dict | None = None) -> ServerFacts:
    """ServerFacts from the three answers (the JSON of /version and /v1/models, the text of /metrics) and what the
    caller gives; ValueError, one line, for a fact nobody gives or one the server and the caller disagree on."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    unknown = set(given) - set(FACTS)
    if unknown:
        raise ValueError(f"unknown server facts {sorted(unknown)} (allowed: {', '.join(FACTS)})")
    values, sources = {}, {}
    for name, (_, series, flag) in FACTS.items():
        labels = info_labels(metrics_text, series) or {}
        told = labels.get(name) not in (None, "", "None")  # vLLM writes an unset field as "None"
        said = _parse(name, labels[name], f"the server's {series}") if told else None
        mine = _parse(name, given[name], flag) if name in given else None
        if said is not None and mine is not None and said != mine:
            raise ValueError(f"{url}: the server says {name}={said}, {flag} says {mine} (allowed: leave {flag} out, "
                             f"or give the server's value)")
        if said is None and mine is None:
            why = "vLLM publishes no scheduler limits" if series.startswith("lab:") else f"its /metrics has no {series}"
            raise ValueError(f"{url}: the server does not tell its {name} ({why}): give {flag} (allowed: the value "
                             f"the server was started with)")
        values[name] = said if said is not None else mine
        sources[name] = "/metrics" if said is not None else "given"
    return ServerFacts(url=url, version=_version(version), model=_model(models), sources=sources, **values)


def _version(version: object) -> str:
    """GET /version's "version" ("" if it has none)."""
    return str(version.get("version", "")) if isinstance(version, dict) else ""


def _model(models: object) -> str:
    """The first model GET /v1/models lists ("" if none)."""
    listed = models.get("data") if isinstance(models, dict) else None
    return str(listed[0].get("id", "")) if isinstance(listed, list) and listed and isinstance(listed[0], dict) else ""


def ask(url: str, timeout: float = 10.0) -> tuple[dict, dict, str]:
    """The server's answers to GET /version, /v1/models (their JSON) and /metrics (its text); ValueError, one line,
    when it cannot be asked."""
    import httpx

    base, answers = url.rstrip("/"), []
    for path in ("/version", "/v1/models", "/metrics"):
        try:
            response = httpx.get(base + path, timeout=timeout)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise ValueError(f"{url}: no server answers GET {path} ({type(exc).__name__}: {exc}) (allowed: the "
                             f"address of a running OpenAI-compatible server, http://host:port)") from None
        if response.status_code != 200:
            raise ValueError(f"{url}: GET {path} answered HTTP {response.status_code} (allowed: a server that "
                             f"answers /version, /v1/models and /metrics, as vLLM's and this project's do)")
        if path == "/metrics":
            answers.append(response.text)
            continue
        try:
            answers.append(response.json())
        except ValueError:
            raise ValueError(f"{url}: GET {path} did not answer JSON") from None
    return answers[0], answers[1], answers[2]


def read_facts(url: str, given: dict | None = None, timeout: float = 10.0) -> ServerFacts:
    """Ask the server at `url` and combine its answers with `given` (facts_from); ValueError, one line, when the
    server cannot be asked or a fact is missing or disputed."""
    return facts_from(url, *ask(url, timeout), given)


def describe(url: str, timeout: float = 10.0) -> str:
    """One line of what the server at `url` tells about itself, for a results file's `# ` lines: its version, its
    model and the settings of its info series (what it does not tell is left out). Never raises: a server that
    cannot be asked is described as such."""
    try:
        version, models, metrics = ask(url, timeout)
    except ValueError as exc:
        return " ".join(f"not asked ({exc})".split())
    parts = [f"version {_version(version) or '?'}", f"model {_model(models) or '?'}"]
    for series in ("vllm:cache_config_info", "lab:scheduler_config_info"):
        labels = info_labels(metrics, series)
        told = {k: labels[k] for k in FACTS if labels and k in labels}
        parts.append(f"{series} " + (" ".join(f"{k}={v}" for k, v in told.items()) if told else "absent"))
    return " ".join("; ".join(parts).split())  # one line, whatever the server's strings hold
