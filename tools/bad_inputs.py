"""Try the command lines with bad input, as a careless user and a hostile file would, and count what happens.

    .venv/bin/python tools/bad_inputs.py [--only sim|reference] [--jobs 2] [--csv figures/bad_inputs.csv]

Every case is a command that must be refused: one line `error: ...` on stderr, exit status 2, no traceback,
and every file that existed before (input traces, earlier outputs) unchanged afterwards. Each case runs in a
fresh process in a temporary folder holding its files. The cases are generated from the command lines' own
parsers (every numeric flag gets negative, non-finite, non-numeric and out-of-range values; every choice flag
an unknown one) plus hand-written ones: flag combinations that would be silently ignored, output paths that
cannot be written or that name an input, and hostile trace files.

Outcomes: `clean` (as required), `traceback`, `wrong_exit` (any status but 2, e.g. 0 for an input silently
accepted), `messy` (status 2 but not one `error:` line), `hung` (no answer in --timeout seconds) and, counted
on top, `files_lost` (a file that existed before was changed or removed). The table is printed and saved.
This is a probe, not a test: tests/sim/test_bad_input.py and tests/reference/test_api_bad_input.py hold the
fast tables that run in `make test`.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOOD_JSONL = (
    b'{"request_id": 0, "arrival_time": 0.0, "prompt_len": 8, "output_len": 4}\n'
    b'{"request_id": 1, "arrival_time": 0.5, "prompt_len": 12, "output_len": 6}\n'
)
GOOD_CSV = b"request_id,arrival_time,prompt_len,output_len\n0,0.0,8,4\n1,0.5,12,6\n"
SENTINEL = b"an earlier output that must survive\n"

INT_BAD = ["-1", "abc", "", "1.5", "nan", "99999999999999999999999999999"]
FLOAT_BAD = ["-1", "abc", "", "nan", "inf", "-inf", "1e400"]
# flags whose huge values are legitimate (a seed is any integer numpy accepts)
HUGE_OK = {"--seed"}
# flags for which +inf is a value they document (sim disagg --link-bandwidth inf: an instantaneous link), so "inf"
# and "1e400" are not bad input there
INF_OK = {"--link-bandwidth"}


@dataclass
class Case:
    command: str  # "sim" or "reference": python -m <command>
    argv: list[str]
    kind: str  # which class of bad input
    files: dict[str, bytes] = field(default_factory=dict)  # created in the case's folder first


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flag_cases(command: str, sub: str, parser: argparse.ArgumentParser, base: list[str]) -> list[Case]:
    """Bad values for every flag that takes a number or a choice."""
    cases = []
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0 or action.dest in ("help",):
            continue
        flag = max(action.option_strings, key=len)
        if action.type is int:
            values = [v for v in INT_BAD if not (flag in HUGE_OK and v.startswith("9999"))]
        elif action.type is float:
            values = [v for v in FLOAT_BAD if not (flag in INF_OK and v in ("inf", "1e400"))]
        elif action.choices or (action.metavar or "").startswith("{"):
            values = ["bogus", ""]
        else:
            continue
        cases += [Case(command, [sub, *base, flag, v], f"{sub} flag value") for v in values]
    return cases


def sim_cases() -> list[Case]:
    from sim.drivers import bench_alloc
    from sim.drivers.cli import build_parser

    subs = _subparsers(build_parser())
    cases = []
    for name, parser in subs.items():
        if name == "bench-alloc":
            continue
        cases += _flag_cases("sim", name, parser, [])
    alloc = argparse.ArgumentParser()
    for flag, typ in (("--ops", int), ("--seed", int)):
        alloc.add_argument(flag, type=typ)
    cases += _flag_cases("sim", "bench-alloc", alloc, [])
    del bench_alloc
    run = ["run", "--num-requests", "20"]
    t = {"t.jsonl": GOOD_JSONL}
    combos = [
        (["run", "--rate", "1e9"], "workload past the limits"),
        (["run", "--duration", "1e12"], "workload past the limits"),
        (["run", "--rate", "1e6", "--duration", "1e6"], "workload past the limits"),
        (["run", "--num-requests", "1000000000"], "workload past the limits"),
        ([*run, "--kv-slots", "100000000000000"], "pool past the limits"),
        ([*run, "--policy", "max", "--prefix-caching", "on"], "ignored combination"),
        ([*run, "--policy", "max", "--block-size", "32"], "ignored combination"),
        ([*run, "--prompt-len", "5"], "ignored combination"),
        ([*run, "--workload", "fixed", "--prompt-len", "5"], "missing flag"),
        ([*run, "--prompt-len-range", "5,9"], "ignored combination"),
        ([*run, "--n", "2", "--beam-width", "2"], "conflicting flags"),
        ([*run, "--scheduler", "v0", "--no-chunked-prefill"], "ignored combination"),
        (["run", "--arrival", "offline"], "missing flag"),
        ([*run, "--trace", "t.jsonl"], "ignored combination"),
        (["run", "--trace", "t.jsonl", "--workload", "alpaca"], "ignored combination"),
        (["run", "--trace", "t.jsonl", "--prefix-len", "8"], "ignored combination"),
        (["run", "--trace", "missing.jsonl"], "missing input"),
        (["run", "--trace", "."], "input is a folder"),
        ([*run, "--prompt-len-range", "9,5", "--workload", "uniform", "--output-len-range", "1,2"], "bad range"),
        ([*run, "--workload", "uniform", "--prompt-len-range", "1", "--output-len-range", "1,2"], "bad range"),
        ([*run, "--workload", "uniform", "--prompt-len-range", "-3,2", "--output-len-range", "1,2"], "bad range"),
        ([*run, "--workload", "fixed", "--prompt-len", "100000000", "--output-len", "4"], "request past the context"),
        ([*run, "--max-num-seqs", "0"], "flag value"),
        ([*run, "--slo-ttft", "0"], "flag value"),
        ([*run, "--watermark", "1.5"], "flag value"),
        ([*run, "--pool-page-steps", "5"], "ignored combination"),
        ([*run, "--requests-csv", "-"], "output path"),
        (
            [
                "run",
                "--policy",
                "hybrid",
                "--model",
                "gemma3-270m",
                "--num-gpus",
                "4",
                "--block-size",
                "1",
                "--workload",
                "fixed",
                "--prompt-len",
                "8",
                "--output-len",
                "4",
                "--num-requests",
                "2",
            ],
            "pool past the limits",
        ),
        (["disagg", "--num-requests", "5", "--link-bandwidth", "5e-324"], "flag value"),
        (["disagg", "--num-requests", "5", "--link-latency", "1e300"], "flag value"),
        (["disagg", "--num-requests", "5", "--colocated", "--link-bandwidth", "10"], "ignored combination"),
        (["disagg", "--num-requests", "5", "--workload", "fixed"], "flag value"),
        (["paper-table", "--sensitivity", "/dev/null"], "input is not a file"),
        (["paper-table", "--figures", "."], "missing input"),
    ]
    cases += [Case("sim", argv, kind, dict(t)) for argv, kind in combos]
    # outputs: unwritable, a folder, equal to an input or to each other; earlier outputs must survive
    keep = {"t.jsonl": GOOD_JSONL, "A.csv": SENTINEL, "adir/x": SENTINEL}
    outputs = [
        [*run, "--requests-csv", "A.csv", "--steps-csv", "nodir/x.csv"],
        [*run, "--requests-csv", "A.csv", "--steps-csv", "/dev/full"],  # fails only at the write: A.csv must stay
        [*run, "--requests-csv", "A.csv", "--steps-csv", "adir"],
        [*run, "--requests-csv", "A.csv", "--steps-csv", "A.csv"],
        [*run, "--requests-csv", "A.csv", "--steps-csv", "t.jsonl/x.csv"],
        ["run", "--trace", "t.jsonl", "--requests-csv", "t.jsonl"],
        ["run", "--trace", "t.jsonl", "--steps-csv", "./t.jsonl"],
        ["run", "--trace", "t.jsonl", "--requests-csv", "adir/../t.jsonl"],
        [*run, "--requests-csv", "A.csv", "--chrome-trace", "adir"],
        [*run, "--requests-csv", "A.csv", "--chrome-trace", "A.csv"],
        ["run", "--trace", "t.jsonl", "--chrome-trace", "t.jsonl"],
        [*run, "--requests-csv", "A.csv", "--pool-page", "A.csv"],
        [*run, "--requests-csv", "A.csv", "--pool-page", "/dev/full"],  # fails only at the write: A.csv must stay
        ["run", "--trace", "t.jsonl", "--pool-page", "t.jsonl"],
        ["sweep", "--grid", "rate=1", "--set", "duration=5", "--out", "nodir/x.csv"],
        ["sweep", "--grid", "rate=1", "--set", "duration=5", "--out", "adir"],
        ["figures", "--only", "memory_waste", "--quick", "--out", "A.csv"],
        ["bench", "--quick", "--csv", "nodir/x.csv"],
        ["bench", "--quick", "--csv", "adir"],
        ["bench-alloc", "--ops", "100", "--csv", "nodir/x.csv"],
        ["bench-alloc", "--ops", "100", "--csv", "t.jsonl/x.csv"],
    ]
    cases += [Case("sim", argv, "output path", dict(keep)) for argv in outputs]
    sweeps = [
        ["sweep"],
        ["sweep", "--grid", "rate"],
        ["sweep", "--grid", "bogus=1"],
        ["sweep", "--grid", "rate=a"],
        ["sweep", "--grid", "rate=1", "--grid", "rate=2"],
        ["sweep", "--set", "rate=-1", "--grid", "policy=max"],
        ["sweep", "--grid", "rate=1", "--set", "requests=1"],
        ["sweep", "--grid", "rate=1", "--jobs", "0"],
        ["figures", "--only", "bogus"],
        ["figures", "--jobs", "0"],
    ]
    cases += [Case("sim", argv, "sweep/figures spec") for argv in sweeps]
    cases += [
        Case("sim", ["run", "--trace", name], "hostile trace", {name: content})
        for name, content in hostile_traces().items()
    ]
    return cases


def hostile_traces() -> dict[str, bytes]:
    row = '{{"request_id": {rid}, "arrival_time": {t}, "prompt_len": {p}, "output_len": {o}{extra}}}\n'

    def jsonl(rid="0", t="0.0", p="8", o="4", extra=""):
        return row.format(rid=rid, t=t, p=p, o=o, extra=extra).encode()

    traces = {
        "empty.jsonl": b"",
        "blank.jsonl": b"\n\n",
        "nul.jsonl": b"\x00\x00",
        "utf16.jsonl": GOOD_JSONL.decode().encode("utf-16"),
        "latin1.jsonl": b'{"request_id": 0, "x\xe9": 1}\n',
        "deep.jsonl": b"[" * 3000 + b"\n",
        "deepobj.jsonl": b'{"a":' * 3000 + b"\n",
        "list.jsonl": b"[1, 2, 3]\n",
        "string.jsonl": b'"hello"\n',
        "truncated.jsonl": GOOD_JSONL[:40],
        "huge_t.jsonl": jsonl(t="1" + "0" * 400),
        "far_t.jsonl": jsonl(t="1e17"),
        "nan_t.jsonl": jsonl(t="NaN"),
        "inf_t.jsonl": jsonl(t="Infinity"),
        "neg_t.jsonl": jsonl(t="-1"),
        "str_t.jsonl": jsonl(t='"soon"'),
        "huge_id.jsonl": jsonl(rid=str(2**63)),
        "neg_id.jsonl": jsonl(rid="-1"),
        "float_id.jsonl": jsonl(rid="1.5"),
        "bool_len.jsonl": jsonl(p="true"),
        "null_len.jsonl": jsonl(p="null"),
        "zero_len.jsonl": jsonl(o="0"),
        "huge_len.jsonl": jsonl(p=str(10**12)),
        "float_len.jsonl": jsonl(p="8.5"),
        "dup_ids.jsonl": jsonl() + jsonl(t="1.0"),
        "unknown.jsonl": jsonl(extra=', "colour": "red"'),
        "huge_n.jsonl": jsonl(extra=', "n": 1000000000'),
        "beam_and_n.jsonl": jsonl(extra=', "n": 2, "beam_width": 2'),
        "ids_len.jsonl": jsonl(p="3", extra=', "prompt_token_ids": [1, 2]'),
        "ids_huge.jsonl": jsonl(p="2", extra=f', "prompt_token_ids": [1, {2**63}]'),
        "ids_neg.jsonl": jsonl(p="2", extra=', "prompt_token_ids": [1, -2]'),
        "ids_str.jsonl": jsonl(p="2", extra=', "prompt_token_ids": "ab"'),
        "dup_key.jsonl": b'{"request_id": 0, "request_id": 1, "arrival_time": 0, "prompt_len": 8, "output_len": 4}\n',
        "long_line.jsonl": b'{"request_id": 0, "arrival_time": 0, "pad": "' + b"x" * (2 << 20) + b'"}\n',
        "bad.csv": b"a,b\n1,2\n",
        "short_row.csv": GOOD_CSV + b"2,1.0,8\n",
        "long_row.csv": GOOD_CSV + b"2,1,8,4,1,1,,0,9\n",
        "huge_cell.csv": GOOD_CSV + b'3,"' + b"9" * (200 << 10) + b'",8,4\n',
        "nan.csv": GOOD_CSV + b"2,nan,8,4\n",
        "neg.csv": GOOD_CSV + b"2,1,-8,4\n",
        "latin1.csv": GOOD_CSV + b"2,1,8,\xff\n",
        "empty.csv": b"",
        "quote.csv": GOOD_CSV + b'2,"1,8,4\n',
        "huge_id.csv": GOOD_CSV + str(2**64).encode() + b",1,8,4\n",
        "trace.txt": GOOD_JSONL,
        "noext": GOOD_JSONL,
        "sharegpt_bad.json": b'[{"conversations": 5}]',
        "sharegpt_empty.json": b"[]",
        "sharegpt_notlist.json": b'{"conversations": []}',
        "sharegpt_control.json": b'[{"conversations": [{"from": "human", "value": "\\u0000\\u0007"}, '
        b'{"from": "gpt", "value": "ok"}]}]',
    }
    return traces


def _llama_config(extra: bytes) -> bytes:
    return (
        b'{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, '
        b'"num_attention_heads": 4, "vocab_size": 256, ' + extra + b"}"
    )


def reference_cases() -> list[Case]:
    from reference.cli import build_parser

    subs = _subparsers(build_parser())
    gen = ["hi", "--model", "random"]
    cases = _flag_cases("reference", "generate", subs["generate"], gen)
    cases += _flag_cases("reference", "bench", subs["bench"], ["--quick"])
    cases += _flag_cases("reference", "calibrate", subs["calibrate"], ["--quick"])
    cases += _flag_cases("reference", "validate-sim", subs["validate-sim"], ["--trace", "t.jsonl"])
    # the server and its load test: a bad value must be refused before a model loads or a port opens (a value taken
    # for good starts a server, which shows here as `hung`)
    cases += _flag_cases("reference", "serve", subs["serve"], ["--model", "random"])
    trace = {"t.jsonl": GOOD_JSONL}
    cases += [
        Case(c.command, c.argv, c.kind, trace)
        for c in _flag_cases("reference", "loadtest", subs["loadtest"], ["--trace", "t.jsonl"])
    ]
    cost = {
        "c.json": b'{"format": "paged-attention-lab cost model", "version": 2, "model": "opt-13b", '
        b'"coefficients": {"a": 0, "b": 0, "c": 0, "d": 0, "floor_s": 0, "swap_bandwidth": 1}}'
    }
    # a piecewise model that prices 1,536 tokens at -18.9 s (what the unconstrained fit once committed)
    absurd = {
        "c.json": b'{"format": "paged-attention-lab cost model", "version": 2, "model": "smollm2-135m", '
        b'"kind": "piecewise", "coefficients": {"knots": [1, 1024, 1536, 2048], "values": [0.05, 3.6, '
        b'-18.9, 8.7], "c": 0, "d": 0, "e": 0, "swap_bandwidth": 1, "max_decode_seqs": null, '
        b'"max_context_tokens": null, "max_prefill_pairs": null}}'
    }
    old = {
        "c.json": b'{"format": "paged-attention-lab cost model", "version": 1, "model": "smollm2-135m", '
        b'"kind": "piecewise", "coefficients": {"knots": [1, 2], "values": [0.05, 0.06], "c": 0, "d": 0, '
        b'"swap_bandwidth": 1}}'
    }
    bad_config = {"ck/config.json": b'{"model_type": "llama"}'}
    combos = [
        (["generate", "", "--model", "random"], "empty prompt", {}),
        (["generate", "hi", "--model", "nodir"], "missing input", {}),
        (["generate", "hi", "--model", "ck"], "bad checkpoint", bad_config),
        (["generate", "hi", "--model", "ck"], "bad checkpoint", {"ck/config.json": b"{not json"}),
        (["generate", "hi", "--model", "ck"], "bad checkpoint", {"ck/config.json": b"[]"}),
        # a string or a number where config.json has a bool (bool("false") would be True), a bool for an int,
        # JSON nested past Python's recursion limit
        *[
            (["generate", "hi", "--model", "ck"], "bad checkpoint", {"ck/config.json": _llama_config(extra)})
            for extra in (
                b'"tie_word_embeddings": "false"',
                b'"attention_bias": 1',
                b'"num_key_value_heads": true',
                b'"rope_scaling": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000,
            )
        ],
        (["generate", "1 2 99999999", "--model", "random"], "prompt token id", {}),
        (["generate", "1 2 x", "--model", "random"], "prompt token id", {}),
        (["generate", " ".join(["5"] * 5000), "--model", "random"], "prompt past the context", {}),
        (["generate", "hi", "--model", "random", "--n", "2", "--beam-width", "2"], "conflicting flags", {}),
        (["generate", "hi", "--model", "random", "--beam-width", "2", "--temperature", "0.5"], "conflicting flags", {}),
        (
            ["generate", "hi", "--model", "random", "--beam-width", "2", "--prompt-logprobs", "1"],
            "conflicting flags",
            {},
        ),
        (["generate", "hi", "--model", "random", "--prompt-logprobs", "21"], "flag value", {}),
        (["generate", "hi", "--model", "random", "--max-tokens", "100000000"], "flag value", {}),
        (["generate", "hi", "--model", "random", "--kv-blocks", "1"], "pool too small", {}),
        (["generate", "hi", "--model", "random", "--kv-blocks", "100000000000"], "pool past the limits", {}),
        (["generate", "hi", "--model", "random", "--chrome-trace", "nodir/t.json"], "output path", {}),
        (["generate", "hi", "--model", "random", "--chrome-trace", "."], "output path", {}),
        (["bench", "--quick", "--out", "nodir/x.csv"], "output path", {"A.csv": SENTINEL}),
        (["bench", "--quick", "--out", "A.csv/x.csv"], "output path", {"A.csv": SENTINEL}),
        (["bench", "--quick", "--out", "."], "output path", {}),
        (["bench-kernels", "--bogus"], "flag value", {}),
        (["calibrate", "--quick", "--out", "."], "output path", {}),
        (["calibrate", "--quick", "--out", "A.csv", "--steps-csv", "A.csv"], "output path", {"A.csv": SENTINEL}),
        (["validate-sim", "--cost-model", "c.json"], "cost model for another model", cost),
        (["validate-sim", "--cost-model", "c.json"], "cost model not JSON", {"c.json": b"{"}),
        (["validate-sim", "--cost-model", "absent.json"], "missing input", {}),
        (
            ["validate-sim", "--trace", "t.jsonl", "--cost-model", "absent.json"],
            "missing input",
            {"t.jsonl": GOOD_JSONL},
        ),
        (["validate-sim", "--trace", "t.jsonl", "--figure", "t.jsonl"], "output path", {"t.jsonl": GOOD_JSONL}),
        (["validate-sim", "--num-gpu-blocks", "64"], "conflicting flags", {}),
        (["validate-sim", "--cost-model", "c.json"], "absurd cost model", absurd),
        (["validate-sim", "--cost-model", "c.json"], "cost model of an old version", old),
        (["validate-sim", "--preemption", "swap"], "conflicting flags", {}),
        (["validate-sim", "--trace", "t.jsonl", "--preemption", "swap"], "conflicting flags", {"t.jsonl": GOOD_JSONL}),
        (["validate-sim", "--only", "nosuch"], "flag value", {}),
        (["calibrate", "--quick", "--passes", "0"], "flag value", {}),
        (["calibrate", "--quick", "--repeat", "100"], "flag value", {}),
        (["generate", "hi", "--model", "random", "--logprobs", "2"], "conflicting flags", {}),
        (["generate", "5 \u0663", "--model", "random"], "non-ASCII digit as a token id", {}),
        (["generate", "5 7", "--model", "random", "--block-size", "1000000000"], "flag value", {}),
        (["generate", "5 7", "--model", "random", "--kv-blocks", "100000000"], "pool past the limits", {}),
        (["validate-sim", "--traces-dir", "A.csv"], "output path", {"A.csv": SENTINEL}),
        (
            ["calibrate", "--quick", "--passes", "1", "--out", "A.csv", "--steps-csv", "/dev/full"],
            "full disk",
            {"A.csv": SENTINEL},
        ),
        (["loadtest", "--trace", "t.jsonl", "--out", "t.jsonl"], "output path", {"t.jsonl": GOOD_JSONL}),
        (["loadtest", "--trace", "t.jsonl", "--url", "ftp://x"], "flag value", {"t.jsonl": GOOD_JSONL}),
        (
            ["loadtest", "--trace", "beam.jsonl"],
            "bad trace",
            {"beam.jsonl": GOOD_JSONL.replace(b"}", b', "beam_width": 2}')},
        ),
        (
            ["validate-sim", "--online", "--trace", "t.jsonl", "--trace", "t.jsonl"],
            "conflicting flags",
            {"t.jsonl": GOOD_JSONL},
        ),
        (["validate-sim", "--online", "--quick"], "conflicting flags", {}),
        (["serve", "--model", "nosuch"], "flag value", {}),
        (["serve", "--model", "random", "--port", "70000"], "flag value", {}),
        (["serve", "--model", "random", "--host", "999.1.1.1"], "flag value", {}),
        (["generate", "\udcff hi"], "prompt not UTF-8", {}),  # the argument's byte 0xff, as a shell passes it
        (
            ["loadtest", "--trace", "t.jsonl", "--url", "http://127.0.0.1:1"],
            "no server at --url",
            {"t.jsonl": GOOD_JSONL},
        ),
        (["bench-gpu"], "needs a CUDA GPU", {}),
        (["bench-kernels"], "needs a CUDA GPU", {}),
        # vLLM's spellings (--kv-cache-dtype, --speculative-config): a value vLLM takes that this engine has no path
        # for, a bad JSON object, and a disagreement with the project's own flag
        *[
            ([*command, "--kv-cache-dtype", value], "vLLM value the engine lacks", {})
            for command in (["generate", "hi", "--model", "random"], ["serve", "--model", "random"])
            for value in ("fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16")
        ],
        (
            ["generate", "hi", "--model", "random", "--kv-dtype", "int8", "--kv-cache-dtype", "auto"],
            "conflicting flags",
            {},
        ),
        (["serve", "--model", "random", "--kv-dtype", "int8", "--kv-cache-dtype", "auto"], "conflicting flags", {}),
        *[
            (["generate", "hi", "--model", "random", "--speculative-config", config], kind, {})
            for config, kind in (
                ('{"method": "eagle", "num_speculative_tokens": 3}', "vLLM value the engine lacks"),
                ('{"method": "medusa", "model": "m", "num_speculative_tokens": 3}', "vLLM value the engine lacks"),
                ('{"method": "draft_model", "num_speculative_tokens": 3}', "vLLM value the engine lacks"),
                ('{"num_speculative_tokens": 3}', "flag value"),
                ('{"method": "ngram"}', "flag value"),
                ('{"method": "ngram", "num_speculative_tokens": 0}', "flag value"),
                ('{"method": "ngram", "num_speculative_tokens": 65}', "flag value"),
                ('{"method": "ngram", "num_speculative_tokens": 2.5}', "flag value"),
                (
                    '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}',
                    "flag value",
                ),
                ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 0}', "flag value"),
                ('{"method": "ngram", "num_speculative_tokens": 2, "bogus": 1}', "flag value"),
                ('{"method": "ngram", "num_speculative_tokens": NaN}', "flag value"),
                ('{"method": "ngram", "method": "ngram", "num_speculative_tokens": 2}', "flag value"),
                ("{method: ngram}", "flag value"),
                ("[]", "flag value"),
                ("", "flag value"),
            )
        ],
        (
            [
                "generate",
                "hi",
                "--model",
                "random",
                "--speculative-config",
                '{"method": "ngram", "num_speculative_tokens": 2}',
                "--num-speculative-tokens",
                "3",
            ],
            "conflicting flags",
            {},
        ),
    ]
    cases += [Case("reference", argv, kind, files) for argv, kind, files in combos]
    return cases


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def run_case(case: Case, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "adir").mkdir()
        for name, content in case.files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(content)
        before = snapshot(folder)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
        start = time.perf_counter()
        try:
            done = subprocess.run(
                [sys.executable, "-m", case.command, *case.argv],
                cwd=folder,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
            code, err = done.returncode, done.stderr
        except subprocess.TimeoutExpired as e:
            code, err = (
                None,
                (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or ""),
            )
        seconds = time.perf_counter() - start
        after = snapshot(folder)
    lost = sorted(name for name, content in before.items() if after.get(name) != content)
    lines = [line for line in err.splitlines() if line.strip()]
    if code is None:
        outcome = "hung"
    elif "Traceback" in err:
        outcome = "traceback"
    elif code != 2:
        outcome = "wrong_exit"
    elif len(lines) != 1 or not lines[0].startswith("error: "):
        outcome = "messy"
    else:
        outcome = "clean"
    last = lines[-1] if lines else ""
    return {
        "command": f"python -m {case.command} " + " ".join(_short(a) for a in case.argv),
        "kind": case.kind,
        "outcome": outcome,
        "exit": code,
        "files_lost": ";".join(lost),
        "seconds": round(seconds, 2),
        "message": last[:300],
    }


def _short(arg: str) -> str:
    text = arg if len(arg) <= 40 else arg[:37] + "..."
    return repr(text) if (" " in text or not text) else text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=("sim", "reference"), help="one command line only")
    p.add_argument("--jobs", type=int, default=2, help="cases run at once (default: 2)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a case may take (default: 60)")
    p.add_argument("--csv", default="figures/bad_inputs.csv", help="table to write (default: figures/bad_inputs.csv)")
    args = p.parse_args(argv)
    if args.jobs < 1 or not args.timeout > 0:
        p.error("--jobs must be >= 1 and --timeout > 0")
    out = Path(args.csv)
    if not out.parent.is_dir():
        p.error(f"--csv {out}: folder {out.parent} does not exist")
    cases = (sim_cases() if args.only != "reference" else []) + (reference_cases() if args.only != "sim" else [])
    rows = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for i, row in enumerate(pool.map(lambda c: run_case(c, args.timeout), cases), start=1):
            rows.append(row)
            if row["outcome"] != "clean" or row["files_lost"]:
                print(f"[{i}/{len(cases)}] {row['outcome']}: {row['command']}\n    {row['message']}", file=sys.stderr)
    from sim.base.outfiles import atomic_write

    with atomic_write(out, newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("clean", "traceback", "wrong_exit", "messy", "hung")}
    lost = sum(bool(r["files_lost"]) for r in rows)
    print(
        f"{len(rows)} bad inputs tried: " + ", ".join(f"{v} {k}" for k, v in counts.items()) + f"; files lost in {lost}"
    )
    print(f"table: {out}")
    return 0 if counts["clean"] == len(rows) and not lost else 1


if __name__ == "__main__":
    sys.exit(main())
