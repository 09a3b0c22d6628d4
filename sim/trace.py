"""Request traces on disk, one request a line (JSONL or CSV), and import of real ShareGPT conversations.

A trace pins a workload down exactly, so a run can be repeated, shared, or fed to the reference engine.
The ShareGPT importer follows the vLLM paper's section 6.1 recipe: the first user turn is the prompt, the
model's reply to it is the output, and pairs that do not fit the model's context are skipped.
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from sim.request import Request

CSV_COLUMNS = ("request_id", "arrival_time", "prompt_len", "output_len", "n", "beam_width", "prefix_id", "prefix_len")
JSON_FIELDS = CSV_COLUMNS + ("prompt_token_ids",)
# field -> (smallest allowed value, default when absent); None = required.
_INT_FIELDS = {"request_id": (0, None), "prompt_len": (1, None), "output_len": (1, None), "n": (1, 1),
               "beam_width": (1, 1), "prefix_len": (0, 0)}


class TraceError(ValueError):
    """A malformed trace: the message names the file, the line and what is wrong."""


def _record(request: Request) -> dict:
    return {name: getattr(request, name) for name in JSON_FIELDS}


def write_jsonl(requests: list[Request], path: str | Path) -> None:
    with Path(path).open("w") as f:
        for request in requests:
            record = _record(request)
            if record["prompt_token_ids"] is None:
                del record["prompt_token_ids"]
            f.write(json.dumps(record) + "\n")


def write_csv(requests: list[Request], path: str | Path) -> None:
    """CSV holds no token ids (use JSONL for prefix-caching traces); an empty prefix_id means none."""
    with Path(path).open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for r in requests:
            writer.writerow([r.request_id, repr(r.arrival_time), r.prompt_len, r.output_len, r.n, r.beam_width,
                             "" if r.prefix_id is None else r.prefix_id, r.prefix_len])


def _int(value, name: str, low: int) -> int:
    if isinstance(value, str):  # CSV cells are strings
        try:
            value = int(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _request(record: dict) -> Request:
    """Validate one record (already parsed) and build the Request; ValueError says what is wrong."""
    unknown = sorted(set(record) - set(JSON_FIELDS))
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)} (allowed: {', '.join(JSON_FIELDS)})")
    values = {}
    for name, (low, default) in _INT_FIELDS.items():
        if record.get(name) in (None, "") and default is not None:
            values[name] = default
        else:
            values[name] = _int(record.get(name), name, low)
    t = record.get("arrival_time")
    try:
        t = float(t) if isinstance(t, (int, float, str)) and not isinstance(t, bool) else None
    except ValueError:
        t = None
    if t is None or not (math.isfinite(t) and t >= 0):
        raise ValueError(f"arrival_time must be a finite number >= 0 seconds, got {record.get('arrival_time')!r}")
    prefix_id = record.get("prefix_id")
    prefix_id = None if prefix_id in (None, "") else _int(prefix_id, "prefix_id", 0)
    ids = record.get("prompt_token_ids")
    if ids is not None and not (isinstance(ids, list) and all(type(i) is int and i >= 0 for i in ids)):
        raise ValueError("prompt_token_ids must be a list of integers >= 0")
    return Request(arrival_time=t, prefix_id=prefix_id, prompt_token_ids=ids, **values)


def read_jsonl(path: str | Path) -> list[Request]:
    requests = []
    with Path(path).open() as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError(f"expected a JSON object, got {type(record).__name__}")
                requests.append(_request(record))
            except ValueError as e:  # json.JSONDecodeError is a ValueError too
                raise TraceError(f"{path} line {line_no}: {e}") from None
    return requests


def read_csv(path: str | Path) -> list[Request]:
    requests = []
    with Path(path).open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in ("request_id", "arrival_time", "prompt_len", "output_len") if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"{path} line 1: missing column(s) {', '.join(missing)} (columns: {', '.join(CSV_COLUMNS)})")
        for record in reader:
            line_no = reader.line_num
            try:
                if None in record or None in record.values():
                    raise ValueError(f"expected {len(reader.fieldnames)} columns, got a row of a different length")
                requests.append(_request(record))
            except ValueError as e:
                raise TraceError(f"{path} line {line_no}: {e}") from None
    return requests


def read_trace(path: str | Path) -> list[Request]:
    """Read a .jsonl or .csv trace (by suffix)."""
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json"):
        return read_jsonl(path)
    if suffix == ".csv":
        return read_csv(path)
    raise TraceError(f"{path}: unknown trace format {suffix!r} (allowed: .jsonl, .csv)")


@dataclass(slots=True)
class ShareGPTPairs:
    """(prompt, output) token counts taken from a ShareGPT file, and what was skipped and why."""

    prompt_lens: list[int] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)
    skipped_too_long: int = 0  # prompt + output > max_seq_len (the paper drops these)
    skipped_no_pair: int = 0  # no human turn followed by a gpt turn, or an empty one


def load_sharegpt_pairs(path: str | Path, count_tokens: Callable[[str], int], max_seq_len: int = 2048) -> ShareGPTPairs:
    """The first human turn and the gpt reply after it, of every conversation, as token counts."""
    try:
        with Path(path).open() as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path} line {e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, list):
        raise TraceError(f"{path}: expected a JSON list of conversations, got {type(data).__name__}")
    pairs = ShareGPTPairs()
    for index, item in enumerate(data):
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
            raise TraceError(f"{path}: conversation {index} has no 'conversations' list of turns")
        pair = next(
            ((a.get("value"), b.get("value")) for a, b in zip(turns, turns[1:])
             if a.get("from") == "human" and b.get("from") == "gpt"),
            None,
        )
        if pair is None or not all(isinstance(text, str) and text for text in pair):
            pairs.skipped_no_pair += 1
            continue
        prompt_len, output_len = count_tokens(pair[0]), count_tokens(pair[1])
        if prompt_len < 1 or output_len < 1:
            pairs.skipped_no_pair += 1
        elif prompt_len + output_len > max_seq_len:
            pairs.skipped_too_long += 1
        else:
            pairs.prompt_lens.append(prompt_len)
            pairs.output_lens.append(output_len)
    return pairs


def import_sharegpt(
    path: str | Path,
    *,
    count_tokens: Callable[[str], int],
    max_seq_len: int = 2048,
    rate: float | None = None,
    seed: int = 0,
) -> list[Request]:
    """Requests from a ShareGPT conversation file, in file order; Poisson arrivals at `rate` req/s (seeded),
    or all at t = 0 when rate is None. Skip counts: see `load_sharegpt_pairs`."""
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be a finite number > 0 requests/s, got {rate}")
    pairs = load_sharegpt_pairs(path, count_tokens, max_seq_len)
    count = len(pairs.prompt_lens)
    if rate is None:
        times = [0.0] * count
    else:
        times = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, count)).tolist()
    return [
        Request(request_id=i, arrival_time=times[i], prompt_len=p, output_len=o)
        for i, (p, o) in enumerate(zip(pairs.prompt_lens, pairs.output_lens))
    ]
