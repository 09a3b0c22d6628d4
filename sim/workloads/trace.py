"""Request traces on disk, one request a line (JSONL or CSV); `read_trace` also imports ShareGPT conversation
files (sim/workloads/sharegpt.py). What the two readers share (opening a file safely; TraceError, the one line any bad file
gives) is in sim/base/trace_files.py.

A trace pins a workload down exactly, so a run can be repeated, shared, or fed to the reference engine.
"""
from __future__ import annotations

import codecs
import csv
import itertools
import json
import math
import numbers
import re
from pathlib import Path
from typing import Callable, Iterator

from sim.base.limits import (
    MAX_COUNT,
    MAX_ID,
    MAX_LINE_BYTES,
    MAX_NUM_REQUESTS,
    MAX_PRIORITY,
    MAX_TIME_S,
    MAX_TOKENS,
    is_int,
    require,
)
from sim.base.request import Request

from ..base.trace_files import LongInt, TraceError, json_object, open_trace, parse_int, show
from .sharegpt import default_count_tokens, load_sharegpt_pairs, sharegpt_requests

CSV_COLUMNS = ("request_id", "arrival_time", "prompt_len", "output_len", "n", "beam_width", "prefix_id", "prefix_len",
               "priority")  # (priority: optional, written only when a request has one other than 0)
JSON_FIELDS = CSV_COLUMNS + ("prompt_token_ids",)
_FIELD_SET = frozenset(JSON_FIELDS)
_REQUIRED = ("request_id", "arrival_time", "prompt_len", "output_len")
# integer field -> (smallest, largest allowed value, default when absent); None = required. Limits: sim.base.limits.
_INT_FIELDS = {"request_id": (0, MAX_ID, None), "prompt_len": (1, MAX_TOKENS, None),
               "output_len": (1, MAX_TOKENS, None), "n": (1, MAX_COUNT, 1), "beam_width": (1, MAX_COUNT, 1),
               "prefix_len": (0, MAX_TOKENS, 0), "priority": (-MAX_PRIORITY, MAX_PRIORITY, 0)}
_INT_TEXT = re.compile(r"[+-]?[0-9]+")  # a CSV integer: ASCII digits (int() would also take '1_000' and '٣')
_NUMBER_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")  # no nan, no inf


def _record(request: Request) -> dict:
    return {name: getattr(request, name) for name in JSON_FIELDS}


def jsonl_text(requests: list[Request]) -> str:
    """The requests as JSONL: one JSON object a line (no prompt_token_ids where a request has none, no priority
    where it is 0)."""
    lines = []
    for request in requests:
        record = _record(request)
        if record["prompt_token_ids"] is None:
            del record["prompt_token_ids"]
        if record["priority"] == 0:
            del record["priority"]
        lines.append(json.dumps(record) + "\n")
    return "".join(lines)


def write_jsonl(requests: list[Request], path: str | Path) -> None:
    """One JSON object a line, written whole or not at all (sim.base.outfiles.atomic_write)."""
    from sim.base.outfiles import atomic_write

    with atomic_write(path) as f:
        f.write(jsonl_text(requests))


def write_csv(requests: list[Request], path: str | Path) -> None:
    """CSV holds no token ids (use JSONL for prefix-caching traces); an empty prefix_id means none. Written whole
    or not at all (sim.base.outfiles.atomic_write)."""
    from sim.base.outfiles import atomic_write

    with atomic_write(path, newline="") as f:
        writer = csv.writer(f)
        priorities = any(r.priority for r in requests)
        writer.writerow(CSV_COLUMNS if priorities else CSV_COLUMNS[:-1])
        for r in requests:
            writer.writerow([r.request_id, repr(r.arrival_time), r.prompt_len, r.output_len, r.n, r.beam_width,
                             "" if r.prefix_id is None else r.prefix_id, r.prefix_len, *([r.priority] * priorities)])


def _name(key: str) -> str:
    return key if key.isidentifier() and len(key) <= 40 else show(key)


def _names(keys: list[str]) -> str:
    """Field names for a message: the first three, and how many more."""
    more = f" and {len(keys) - 3:,} more" if len(keys) > 3 else ""
    return ", ".join(map(_name, keys[:3])) + more


def _upto(high: int) -> str:
    return "2**63 - 1" if high == MAX_ID else f"{high:,}"


def _int(value, name: str, low: int, high: int, cell: bool = False) -> int:
    """An integer field in [low, high]: a JSON integer (not a bool, not 3.0), or a CSV cell of ASCII digits."""
    if cell:
        value = value.strip()
        if _INT_TEXT.fullmatch(value):
            value = parse_int(value)
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{name}: got {show(value)} (allowed: an integer from {low:,} to {_upto(high)})")
    return value


def _seconds(value, name: str, cell: bool = False) -> float:
    """A time in [0, MAX_TIME_S] seconds: a JSON number or a CSV cell in decimal notation (no nan, no inf)."""
    number = value
    if cell:
        number = value.strip()
        number = float(number) if _NUMBER_TEXT.fullmatch(number) else None
    elif type(value) is int:  # float() of a huge integer would overflow
        number = float(value) if -MAX_TIME_S <= value <= MAX_TIME_S else math.inf
    if type(number) is not float or not 0 <= number <= MAX_TIME_S:  # NaN fails the comparison too
        raise ValueError(f"{name}: got {show(value)} (allowed: a number of seconds from 0 to {MAX_TIME_S:g})")
    return number


def _token_ids(ids) -> list[int]:
    if type(ids) is list and (not ids or ({*map(type, ids)} == {int} and min(ids) >= 0 and max(ids) <= MAX_ID)):
        return ids
    bad = next((i for i in ids if type(i) is not int or not 0 <= i <= MAX_ID), None) if type(ids) is list else ids
    raise ValueError(f"prompt_token_ids: got {'a list holding ' if type(ids) is list else ''}{show(bad)} "
                     f"(allowed: a list of integers from 0 to {_upto(MAX_ID)}, one per prompt token)")


def _absent(value, cell: bool) -> bool:
    return value is None or (cell and not value.strip())  # JSON null or no field; an empty CSV cell


def parse_record(record: dict, cell: bool = False) -> Request:
    """Validate one record (a JSON object, or a CSV row with `cell`) and build the Request; ValueError says
    which field is wrong and what is allowed."""
    if not record.keys() <= _FIELD_SET:
        unknown = [key for key in record if key not in _FIELD_SET]
        sharegpt = "; a ShareGPT file is a JSON list of such objects" if "conversations" in unknown else ""
        raise ValueError(f"unknown field(s) {_names(unknown)} (allowed: {', '.join(JSON_FIELDS)}){sharegpt}")
    values = {}
    for name, (low, high, default) in _INT_FIELDS.items():  # in the order of the columns
        value = record.get(name)
        if type(value) is int and low <= value <= high:  # the common case first
            values[name] = value
        elif not _absent(value, cell):
            values[name] = _int(value, name, low, high, cell)
        elif default is None:
            raise ValueError(f"{name}: missing (allowed: an integer from {low:,} to {_upto(high)})")
        else:
            values[name] = default
        if name == "request_id":
            t = record.get("arrival_time")
            if _absent(t, cell):
                raise ValueError(f"arrival_time: missing (allowed: a number of seconds from 0 to {MAX_TIME_S:g})")
            values["arrival_time"] = _seconds(t, "arrival_time", cell)
    prefix_id, ids = record.get("prefix_id"), record.get("prompt_token_ids")
    prefix_id = None if _absent(prefix_id, cell) else _int(prefix_id, "prefix_id", 0, MAX_ID, cell)
    return Request(prefix_id=prefix_id, prompt_token_ids=None if ids is None else _token_ids(ids), **values)


_DECODER = json.JSONDecoder(object_pairs_hook=json_object)
_DECODER_LONG = json.JSONDecoder(object_pairs_hook=json_object, parse_int=parse_int)


def _json_type(value) -> str:
    for kind, words in ((dict, "an object"), (list, "a list"), (LongInt, "a number"), (str, "a string"),
                        (bool, "true/false"), ((int, float), "a number")):
        if isinstance(value, kind):
            return words
    return "null"


def _lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line: UTF-8 (a byte-order mark at the start is skipped), each at most
    MAX_LINE_BYTES, read one at a time; a line that breaks either rule is a TraceError naming it."""
    with open_trace(path) as f:
        for line_no in itertools.count(1):
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except OSError as e:
                raise TraceError(f"{path} line {line_no}: cannot be read ({e.strerror or e})") from None
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES:
                raise TraceError(f"{path} line {line_no}: longer than {MAX_LINE_BYTES:,} bytes (the limit of one line)")
            if line_no == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TraceError(f"{path} line {line_no}: not UTF-8 text (byte 0x{raw[e.start]:02x} at byte "
                                 f"{e.start + 1} of the line)") from None
            yield line_no, text


def _collect(path: str | Path, records: Iterator[tuple[int, dict]], cell: bool = False) -> list[Request]:
    """Requests from (line number, record) pairs: each valid, request ids unique, at most MAX_NUM_REQUESTS, and
    at least one."""
    requests: list[Request] = []
    first_line: dict[int, int] = {}  # request_id -> the line that used it
    for line_no, record in records:
        try:
            request = parse_record(record, cell)
        except ValueError as e:
            raise TraceError(f"{path} line {line_no}: {e}") from None
        seen = first_line.setdefault(request.request_id, line_no)
        if seen != line_no:
            raise TraceError(f"{path} line {line_no}: request_id: {request.request_id} is already the id of line "
                             f"{seen} (allowed: each request_id once)")
        if len(requests) == MAX_NUM_REQUESTS:
            raise TraceError(f"{path} line {line_no}: more than {MAX_NUM_REQUESTS:,} requests (the limit of one trace)")
        requests.append(request)
    if not requests:
        what = "holds only its header" if cell else "is empty or holds only blank lines"
        raise TraceError(f"{path}: no requests in the whole file (it {what})")
    return requests


def _jsonl_records(path: str | Path) -> Iterator[tuple[int, dict]]:
    first = True
    for line_no, text in _lines(path):
        if not text.strip():
            continue
        if first and text.lstrip().startswith("["):
            raise TraceError(f"{path} line {line_no}: expected one JSON object per line, got a JSON list. A ShareGPT "
                             "file (a JSON list of conversations) is imported from a .json file: python -m sim run "
                             "--trace conversations.json, or sim.workloads.sharegpt.import_sharegpt")
        first = False
        try:
            try:
                record = _DECODER.decode(text)
            except ValueError as e:  # an integer past Python's 4,300 digits: keep such integers as text
                if isinstance(e, json.JSONDecodeError) or "digits" not in str(e):
                    raise
                record = _DECODER_LONG.decode(text)
        except RecursionError:
            raise TraceError(f"{path} line {line_no}: JSON nested too deep (a request is one flat object)") from None
        except json.JSONDecodeError as e:
            raise TraceError(f"{path} line {line_no}: not valid JSON ({e.msg.removesuffix(' at')} at column "
                             f"{e.colno})") from None
        except ValueError as e:  # json_object: a field twice
            raise TraceError(f"{path} line {line_no}: {e}") from None
        if not isinstance(record, dict):
            raise TraceError(f"{path} line {line_no}: expected a JSON object, got {_json_type(record)}")
        yield line_no, record


def request_lines(path: str | Path) -> dict[int, int]:
    """request_id -> the line of a JSONL or CSV trace (already read without error) that holds it, to name the line
    of a request that a later check refuses (sim.api.run: a request past the context or the pool)."""
    csv_file = trace_format(path) == "csv"
    records = _csv_records(path) if csv_file else _jsonl_records(path)
    return {parse_record(record, csv_file).request_id: line for line, record in records}


def read_jsonl(path: str | Path) -> list[Request]:
    """Requests from a JSONL file: one JSON object a line (JSON_FIELDS; blank lines are skipped)."""
    return _collect(path, _jsonl_records(path))


def _csv_records(path: str | Path) -> Iterator[tuple[int, dict]]:
    reader = csv.reader((text for _, text in _lines(path)), strict=True)
    try:
        header = next((row for row in reader if row), None)
        if header is None:
            raise TraceError(f"{path}: no header line in the whole file (expected: {','.join(CSV_COLUMNS)})")
        header = [name.strip() for name in header]
        line_no = reader.line_num
        unknown = [name for name in header if name not in CSV_COLUMNS]
        twice = next((name for name in CSV_COLUMNS if header.count(name) > 1), None)
        missing = [c for c in _REQUIRED if c not in header]
        if unknown or twice or missing:
            what = (f"unknown column(s) {_names(unknown)}" if unknown else
                    f"column {twice} appears twice" if twice else f"missing column(s) {', '.join(missing)}")
            raise TraceError(f"{path} line {line_no}: {what} (columns: {', '.join(CSV_COLUMNS)}; token ids need JSONL)")
        for row in reader:
            if not row:
                continue
            if len(row) != len(header):
                raise TraceError(f"{path} line {reader.line_num}: expected {len(header)} columns (as the header), "
                                 f"got {len(row)}")
            yield reader.line_num, dict(zip(header, row))
    except csv.Error as e:
        limit = f"field larger than field limit ({csv.field_size_limit()})"
        what = f"a cell is longer than {csv.field_size_limit():,} characters" if str(e) == limit else str(e)
        raise TraceError(f"{path} line {reader.line_num}: not valid CSV ({what})") from None


def read_csv(path: str | Path) -> list[Request]:
    """Requests from a CSV file: a header naming CSV_COLUMNS (request_id, arrival_time, prompt_len and
    output_len required), then one request a row; an empty optional cell means its default."""
    return _collect(path, _csv_records(path), cell=True)


def _first_character(path: str | Path) -> str:
    """The first character of the file that is not JSON whitespace ('' if none), a byte-order mark skipped."""
    with open_trace(path) as f:
        start = True
        while True:
            try:
                chunk = f.read(1 << 16)
            except OSError as e:
                raise TraceError(f"{path}: cannot be read ({e.strerror or e})") from None
            if start and chunk.startswith(codecs.BOM_UTF8):
                chunk = chunk[len(codecs.BOM_UTF8):]
            start = False
            if not chunk:
                return ""
            rest = chunk.lstrip(b" \t\r\n")
            if rest:
                return chr(rest[0])


def trace_format(path: str | Path) -> str:
    """'csv', 'jsonl' or 'sharegpt', from the suffix: .csv, .jsonl, or .json (JSONL, or a ShareGPT conversation
    file when its first character is '[': a JSON list)."""
    if not str(path):
        raise TraceError("trace: an empty path (allowed: a .jsonl, .csv or .json file)")
    suffix = Path(path).suffix.lower()
    if suffix in (".csv", ".jsonl"):
        return suffix[1:]
    if suffix == ".json":
        return "sharegpt" if _first_character(path) == "[" else "jsonl"
    raise TraceError(f"{path}: unknown trace format {suffix!r} (allowed: .jsonl, .csv, or .json: JSONL or a "
                     "ShareGPT conversation list)")


def read_trace(
    path: str | Path,
    *,
    count_tokens: Callable[[str], int] | None = None,
    max_seq_len: int = 2048,
    rate: float | None = None,
    seed: int = 0,
) -> list[Request]:
    """Read a trace: .jsonl or .csv (by suffix), or .json, which is JSONL unless it is a ShareGPT conversation
    list (its first character is '['). A ShareGPT file is imported (`import_sharegpt`: token counts by
    `count_tokens`, default `default_count_tokens()`; pairs over `max_seq_len` skipped; Poisson arrivals at
    `rate`, or all at t = 0); the other arguments are for it alone. Any problem with the file is one TraceError
    naming the file and the line; a file with no request is one too."""
    kind = trace_format(path)
    if kind == "sharegpt":
        pairs = load_sharegpt_pairs(path, count_tokens or default_count_tokens(), max_seq_len)
        return sharegpt_requests(path, pairs, rate=rate, seed=seed)
    return read_csv(path) if kind == "csv" else read_jsonl(path)


def check_given_requests(requests: list[Request]) -> None:
    """A list given to run(): every request as a trace line would have to be, ids unique."""
    seen: set[int] = set()
    for i, r in enumerate(requests):
        # numpy scalars are numbers here (a trace line's JSON is stricter: 3.0 is no integer there)
        record = {name: v if type(v) is int or not is_int(v) else int(v)
                  for name in JSON_FIELDS if (v := getattr(r, name)) is not None}
        t = record["arrival_time"]
        record["arrival_time"] = float(t) if isinstance(t, numbers.Real) and not is_int(t) else t
        ids = record.get("prompt_token_ids")
        if isinstance(ids, (list, tuple)) and (type(ids) is not list or {*map(type, ids)} - {int}):
            record["prompt_token_ids"] = [int(i) if is_int(i) else i for i in ids]
        try:
            parse_record(record)
        except ValueError as e:
            raise ValueError(f"requests[{i}]: {e}") from None
        require(r.request_id not in seen, f"requests[{i}]: request_id", r.request_id, "each request_id once")
        seen.add(r.request_id)
