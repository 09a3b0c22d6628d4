"""Bad input, the classes of it: every numeric flag of `python -m sim` with values out of range or of the wrong
kind, flags that mean nothing with the others, and every kind of broken trace file. Each gets exactly one line
`error: ...` on stderr naming what is wrong and exit status 2, never a traceback (docs/ARCHITECTURE.md, "Bad
input"); `sim.run(...)` raises ValueError with the same message. The table runs `sim.drivers.cli.main` in this process
(fast); a few cases run `python -m sim` in a subprocess to show that no traceback escapes the real command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim import run
from sim.base.limits import MAX_LINE_BYTES
from sim.base.request import Request
from sim.drivers.cli import main

ROOT = Path(__file__).resolve().parents[2]
HUGE = str(10**30)
LINE0 = '{"request_id": 0, "arrival_time": 0, "prompt_len": 5, "output_len": 3}\n'
HEADER = "request_id,arrival_time,prompt_len,output_len\n"


def _line(**fields) -> str:
    return json.dumps({"request_id": 1, "arrival_time": 0.5, "prompt_len": 5, "output_len": 3, **fields}) + "\n"


# ---- every numeric flag of `run`, each made meaningful by its context, with values it must refuse ----------
INT_FLAGS = {  # flag -> (run() keyword, the other flags that make it mean something)
    "--num-gpus": ("num_gpus", []),
    "--kv-slots": ("kv_slots", []),
    "--num-requests": ("num_requests", []),
    "--seed": ("seed", []),
    "--n": ("n", []),
    "--beam-width": ("beam_width", []),
    "--prefix-len": ("prefix_len", []),
    "--num-prefixes": ("num_prefixes", ["--prefix-len", "8"]),
    "--prompt-len": ("prompt_len", ["--workload", "fixed", "--output-len", "5"]),
    "--output-len": ("output_len", ["--workload", "fixed", "--prompt-len", "5"]),
    "--block-size": ("block_size", []),
    "--max-num-seqs": ("max_num_seqs", []),
    "--max-num-batched-tokens": ("max_num_batched_tokens", []),
    "--num-speculative-tokens": ("num_speculative_tokens", []),
}
FLOAT_FLAGS = {
    "--rate": ("rate", []),
    "--duration": ("duration", []),
    "--burstiness": ("burstiness", ["--arrival", "gamma"]),
    "--swap-space": ("swap_space_gib", ["--preemption", "swap"]),
    "--watermark": ("watermark", []),
    "--slo-ttft": ("slo_ttft", []),
    "--slo-tbt": ("slo_tbt", []),
    "--priority-share": ("priority_share", []),
    "--acceptance-rate": ("acceptance_rate", ["--num-speculative-tokens", "2"]),
    "--cpu-offload-gib": ("cpu_offload_gib", []),
}
RANGE_FLAGS = {
    "--prompt-len-range": ("prompt_len_range", ["--workload", "uniform", "--output-len-range", "1,5"]),
    "--output-len-range": ("output_len_range", ["--workload", "uniform", "--prompt-len-range", "1,5"]),
}
VALID_ZERO = {"--seed", "--prefix-len", "--swap-space", "--watermark", "--priority-share", "--cpu-offload-gib"}
VALID_ZERO |= {"--num-speculative-tokens", "--acceptance-rate"}  # 0: speculation off; every draft rejected


def _numeric_cases() -> list:
    cases = []
    for flags, values in (
        (INT_FLAGS, ["-1", "0", "nan", "inf", "-inf", "1e300", HUGE, "abc", "", "2.5"]),
        (FLOAT_FLAGS, ["-1", "0", "nan", "inf", "-inf", "1e300", HUGE, "abc", ""]),
        (RANGE_FLAGS, ["-1,5", "5,1", "0,0", f"1,{HUGE}", "1,1e300", "a,b", "1", "1,2,3"]),
    ):
        for flag, (keyword, context) in flags.items():
            for value in values:
                if value == "0" and flag in VALID_ZERO:
                    continue
                # a value that starts with '-' goes as --flag=VALUE, else argparse takes it for a flag
                typed = [f"{flag}={value}"] if value.startswith("-") else [flag, value]
                argv = ["run", *context, *typed]
                cases.append(pytest.param(argv, (flag, keyword), None, False, id=f"{flag}={value[:12]}"))
    return cases


# ---- flags that mean nothing with the others, and impossible combinations -------------------------------
T = "{trace}"  # replaced by the path of the case's trace file
COMBINATIONS = [
    (["run", "--trace", T, "--workload", "alpaca"], "--workload alpaca: describes a generated workload"),
    (["run", "--trace", T, "--rate", "2"], "--rate 2: describes a generated workload"),
    (["run", "--trace", T, "--duration", "60"], "--duration 60: describes"),
    (["run", "--trace", T, "--num-requests", "5"], "--num-requests 5: describes"),
    (["run", "--trace", T, "--n", "2"], "--n 2: describes"),
    (["run", "--trace", T, "--prefix-len", "4"], "--prefix-len 4: describes"),
    (["run", "--trace", T, "--arrival", "offline"], "--arrival offline: describes"),
    (["run", "--trace", T, "--priority-share", "0.5"], "--priority-share 0.5: describes a generated workload"),
    (["run", "--scheduling-policy", "lifo"], "scheduling_policy: got 'lifo' (allowed: fcfs, priority)"),
    (
        ["run", "--acceptance-rate", "0.5"],
        "--acceptance-rate 0.5: is the draft tokens' acceptance rate, and "
        "speculative decoding is off (--num-speculative-tokens 0)",
    ),
    (["run", "--num-speculative-tokens", "65"], "num_speculative_tokens: got 65 (allowed: an integer from 0 to 64)"),
    (
        ["run", "--num-speculative-tokens", "2", "--acceptance-rate", "1.5"],
        "acceptance_rate: got 1.5 (allowed: a finite number >= 0 and <= 1, the chance that a draft token is accepted)",
    ),
    (["run", "--policy", "max", "--block-size", "16"], "--block-size 16: applies to --policy paged only"),
    (["run", "--policy", "pow2", "--watermark", "0.1"], "--watermark 0.1: applies to --policy paged only"),
    (["run", "--policy", "oracle", "--preemption", "swap"], "--preemption swap: applies to --policy paged only"),
    (
        ["run", "--policy", "oracle", "--victim", "fewest_computed"],
        "--victim fewest_computed: applies to --policy paged",
    ),
    (["run", "--policy", "max", "--prefix-caching", "on"], "--prefix-caching on: applies to --policy paged only"),
    (["run", "--policy", "paged", "--allocator", "first_fit"], "--allocator first_fit: applies to the contiguous"),
    (["run", "--swap-space", "8"], "--swap-space 8: applies to --preemption swap only"),
    (["run", "--scheduler", "v0", "--no-chunked-prefill"], "--no-chunked-prefill: applies to --scheduler v1 only"),
    (["run", "--scheduler", "static", "--no-chunked-prefill"], "--no-chunked-prefill: applies to --scheduler v1"),
    (["run", "--burstiness", "0.5"], "--burstiness 0.5: applies to --arrival gamma only"),
    (
        ["run", "--arrival", "offline", "--num-requests", "5", "--rate", "3"],
        "--rate 3: means nothing with --arrival offline",
    ),
    (["run", "--arrival", "offline", "--duration", "5"], "--duration 5: means nothing with --arrival offline"),
    (["run", "--arrival", "offline"], "num_requests"),
    (["run", "--num-requests", "5", "--duration", "60"], "--duration 60: conflicts with --num-requests 5"),
    (["run", "--prompt-len", "5"], "--prompt-len 5: applies to --workload fixed only"),
    (["run", "--workload", "alpaca", "--output-len", "5"], "--output-len 5: applies to --workload fixed only"),
    (
        ["run", "--workload", "fixed", "--prompt-len", "5", "--output-len", "5", "--prompt-len-range", "1,2"],
        "--prompt-len-range 1,2: applies to --workload uniform only",
    ),
    (["run", "--output-len-range", "1,2"], "--output-len-range 1,2: applies to --workload uniform only"),
    (["run", "--num-prefixes", "4"], "--num-prefixes 4: applies with a shared prefix only"),
    (["run", "--prefix-caching", "on"], "--prefix-caching on: has nothing to cache"),
    (["run", "--prefix-caching", "maybe"], "allowed: auto, on, off"),
    (["run", "--n", "2", "--beam-width", "2"], "n and beam_width"),
    (["run", "--workload", "fixed"], "needs prompt_len and output_len"),
    (["run", "--workload", "fixed", "--prompt-len", "2000", "--output-len", "100"], "allowed: <= 2048"),
    (["run", "--workload", "uniform", "--prompt-len-range", "1,10"], "needs prompt_len_range and output_len_range"),
    (["run", "--prefix-len", "2047"], "prefix_len"),
    (
        ["run", "--rate", "1e9"],
        "rate x duration: 1e+09 x 3600 = 3.6e+12 expected requests (allowed: at most 10,000,000",
    ),
    (
        ["run", "--duration", "1e12"],
        "duration: got 1000000000000.0 (allowed: a finite number > 0 and <= 1e+09 seconds)",
    ),
    (["run", "--rate", "1e-5", "--num-requests", "100000"], "num_requests / rate: 100000 / 1e-05 = 1e+10 s"),
    (["run", "--rate", "1e-300"], "duration: got 3600.0 (allowed: long enough for a request to arrive"),
    (["run", "--seed=-1"], "seed: got -1 (allowed: an integer from 0 to"),
    (["run", "--rate", "-inf"], "a value that starts with '-' is written --rate=VALUE"),
    (
        ["run", "--model", "smollm2-135m", "--gpu", "h200", "--num-gpus", "64"],
        "the KV pool (what model, gpu and num_gpus leave): ",
    ),
    (["run", "--kv-slots", str(2**40), "--block-size", "1"], "blocks of 1 (allowed: at most 8,388,608 blocks"),
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
        "= 50,157,102 blocks of 1 under 'hybrid' (allowed: at most 8,388,608",
    ),  # its pages hold one layer group: 6x
    (["run", "--preemption", "swap", "--swap-space", "1e6", "--block-size", "1"], "swap_space_gib: "),
    (["run", "--cpu-offload-gib", "1e-9"], "cpu_offload_gib: 1e-09 GiB per GPU holds no KV block of 13,107,200 bytes"),
    (["run", "--cpu-offload-gib", "1e6", "--block-size", "1"], "cpu_offload_gib: "),
    (["run", "--policy", "radix", "--cpu-offload-gib", "4"], "--cpu-offload-gib 4: policy 'radix' has no CPU offload"),
    (["run", "--policy", "max", "--cpu-offload-gib", "4"], "--cpu-offload-gib 4: policy 'max' has no CPU offload"),
    (["run", "--prefix-caching", "off", "--cpu-offload-gib", "4"], "--cpu-offload-gib 4: keeps evicted prefix-cache"),
    (["run", "--scheduler", "v0", "--max-num-batched-tokens", "10"], "is over max_num_batched_tokens"),
    (["run", "--beam-width", "4", "--max-num-batched-tokens", "3"], "beam_width 4 is over max_num_batched_tokens"),
    (["run", "--max-num-seqs", "1", "--n", "4"], "4 sequences (allowed: <= max_num_seqs, 1)"),
    (["run", "--kv-slots", "16"], "need"),
    (["run", "--model", "opt-175b"], "do not fit"),
    (["run", "--model", "gpt-5"], "allowed"),
    (["run", "--bogus"], "unrecognized arguments: --bogus"),
    (["sweep", "--grid", "rate=1,2", "--grid", "rate=3"], "rate is given twice"),
    (["sweep", "--grid", "rate=1", "--set", "rate=3"], "rate is given twice"),
    (["sweep", "--grid", "rate=1,1"], "a value is given twice"),
    (["sweep", "--grid", "stop_at=1"], "unknown sweep parameter 'stop_at'"),
    (["sweep", "--grid", "seed=-1"], "seed: got -1"),
    (["sweep", "--grid", f"kv_slots={HUGE}"], "kv_slots: got"),
    (["sweep", "--grid", "swap_space_gib=1e300", "--set", "preemption=swap"], "swap_space_gib: got 1e+300"),
    (["sweep", "--grid", "rate=1,1e9"], "rate x duration"),
    (["sweep", "--grid", "policy=max,paged", "--set", "block_size=8"], "block_size=8: applies to policy='paged' only"),
    (["sweep", "--grid", "rate=nan"], "rate: got nan"),
    (["sweep", "--grid", "rate=1", "--jobs", "0"], "jobs: got 0"),
    (["sweep", "--grid", "rate=1", "--jobs=-1"], "jobs: got -1"),
    (["figures", "--only", "nope"], "unknown figure 'nope'"),
    (["figures", "--only", "sharing", "--jobs", "0", "--out", "{tmp}"], "jobs: got 0"),
    (["figures", "--jobs", "nan"], "invalid int value"),
    (
        ["figures", "--only", "sharing", "--jobs", HUGE, "--out", "{tmp}"],
        "jobs: got 1000000000000000000000000000000 (allowed: an integer from 1 to 1,024)",
    ),
    (["sweep", "--grid", "rate=1", "--jobs", HUGE], "jobs: got 1000000000000000000000000000000"),
    (["run", "--pool-page-steps", "5"], "--pool-page-steps 5: means nothing without --pool-page"),
    (["run", "--num-requests", "5", "--requests-csv", "-"], "--requests-csv -: not standard output here"),
    (["disagg", "--link-bandwidth", "5e-324"], "--link-bandwidth: got 5e-324 (allowed: GB/s >= 1e-06, or inf)"),
    (["disagg", "--link-latency", "1e300"], "--link-latency: got 1e+300 (allowed: seconds from 0 to 1e+09)"),
    (["disagg", "--colocated", "--link-bandwidth", "10"], "--link-bandwidth 10: means nothing with --colocated"),
    (["disagg", "--workload", "fixed"], "--workload: got 'fixed' (allowed: sharegpt, alpaca)"),
    (["bench", "--bogus"], "unrecognized arguments"),
    (["bench-alloc", "--ops", HUGE], "--ops must be >= 1"),
    (["bench-alloc", "--ops", "0"], "--ops must be >= 1"),
    (["bench-alloc", "--seed=-1"], "--seed: got -1"),
    (["bench-alloc", "--ops", "nan"], "invalid int value"),
]


# ---- broken trace files: (file name, its bytes, what the one line must say after "FILE line N: ") -----------
TRACES = [
    (
        "t.jsonl",
        LINE0 + '{"request_id": 1, "arrival_time": 1' + "0" * 400 + ', "prompt_len": 5, "output_len": 3}\n',
        "line 2: arrival_time: got an integer of 401 digits (allowed: a number of seconds from 0 to 1e+09)",
    ),
    ("t.jsonl", LINE0 + _line(arrival_time=1e17), "line 2: arrival_time: got 1e+17"),
    ("t.jsonl", LINE0 + _line(arrival_time=10**30), "line 2: arrival_time: got an integer of 31 digits"),
    ("t.jsonl", LINE0 + _line(arrival_time=-0.5), "line 2: arrival_time: got -0.5"),
    ("t.jsonl", LINE0 + _line(arrival_time="0.5"), "line 2: arrival_time: got '0.5'"),
    ("t.jsonl", LINE0 + _line(arrival_time=None), "line 2: arrival_time: missing"),
    ("t.jsonl", LINE0 + _line(arrival_time=True), "line 2: arrival_time: got True"),
    (
        "t.jsonl",
        LINE0 + '{"request_id": 1, "arrival_time": NaN, "prompt_len": 5, "output_len": 3}\n',
        "line 2: arrival_time: got nan",
    ),
    (
        "t.jsonl",
        LINE0 + '{"request_id": 1, "arrival_time": -Infinity, "prompt_len": 5, "output_len": 3}\n',
        "line 2: arrival_time: got -inf",
    ),
    ("t.jsonl", LINE0 + "[" * 3000 + "\n", "line 2: JSON nested too deep"),
    ("t.jsonl", LINE0 + '{"request_id": 1, "x": ' + "[" * 3000 + "]" * 3000 + "}\n", "line 2: JSON nested too deep"),
    (
        "t.jsonl",
        LINE0 + _line(request_id=2**63),
        "line 2: request_id: got 9223372036854775808 (allowed: an integer from 0 to 2**63 - 1)",
    ),
    (
        "t.jsonl",
        LINE0 + '{"request_id": 1' + "0" * 5000 + ', "arrival_time": 0, "prompt_len": 5, "output_len": 3}\n',
        "line 2: request_id: got an integer of 5001 digits",
    ),
    ("t.jsonl", LINE0 + _line(prefix_id=2**64), "line 2: prefix_id: got 18446744073709551616"),
    (
        "t.jsonl",
        LINE0 + _line(prompt_token_ids=[1, 2, 3, 4, 2**63]),
        "line 2: prompt_token_ids: got a list holding 9223372036854775808",
    ),
    ("t.jsonl", LINE0 + _line(prompt_token_ids=[1, 2, 3, 4, -1]), "line 2: prompt_token_ids: got a list holding -1"),
    ("t.jsonl", LINE0 + _line(prompt_token_ids=[1, 2, 3, 4, 5.0]), "line 2: prompt_token_ids: got a list holding 5.0"),
    ("t.jsonl", LINE0 + _line(prompt_token_ids="12345"), "line 2: prompt_token_ids: got '12345'"),
    ("t.jsonl", LINE0 + _line(prompt_token_ids=[1, 2]), "line 2: request 1: 2 prompt_token_ids for prompt_len 5"),
    (
        "t.jsonl",
        LINE0 + _line(prompt_token_ids=list(range(9))),
        "line 2: request 1: 9 prompt_token_ids for prompt_len 5",
    ),
    ("t.jsonl", LINE0 + _line(prompt_len=5.0), "line 2: prompt_len: got 5.0 (allowed: an integer from 1 to 1,048,576)"),
    ("t.jsonl", LINE0 + _line(prompt_len="5"), "line 2: prompt_len: got '5'"),
    ("t.jsonl", LINE0 + _line(prompt_len=None), "line 2: prompt_len: missing"),
    ("t.jsonl", LINE0 + _line(prompt_len=0), "line 2: prompt_len: got 0"),
    (
        "t.jsonl",
        LINE0 + _line(output_len=2**21),
        "line 2: output_len: got 2097152 (allowed: an integer from 1 to 1,048,576)",
    ),
    ("t.jsonl", LINE0 + _line(n=True), "line 2: n: got True"),
    ("t.jsonl", LINE0 + _line(beam_width=[2]), "line 2: beam_width: got [2]"),
    ("t.jsonl", LINE0 + _line(n=2, beam_width=2), "line 2: request 1: use either n"),
    ("t.jsonl", LINE0 + _line(prefix_len=9), "line 2: request 1: prefix_len must be in [0, prompt_len]"),
    ("t.jsonl", LINE0 + _line(colour=1), "line 2: unknown field(s) colour"),
    (
        "t.jsonl",
        LINE0 + _line(priority=1.5),
        "line 2: priority: got 1.5 (allowed: an integer from -1,000,000 to 1,000,000)",
    ),
    ("t.jsonl", LINE0 + _line(priority=10**7), "line 2: priority: got 10000000"),
    ("t.jsonl", LINE0 + _line(priority="high"), "line 2: priority: got 'high'"),
    ("t.csv", HEADER.strip() + ",priority\n0,0,5,3,urgent\n", "line 2: priority: got 'urgent'"),
    (
        "t.jsonl",
        LINE0 + '{"request_id": 1, "request_id": 2, "arrival_time": 0, "prompt_len": 5, "output_len": 3}\n',
        "line 2: field request_id appears twice in one object",
    ),
    (
        "t.jsonl",
        LINE0 + "\n" + LINE0,
        "line 3: request_id: 0 is already the id of line 1 (allowed: each request_id once)",
    ),
    ("t.jsonl", LINE0 + "[1, 2]\n", "line 2: expected a JSON object, got a list"),
    ("t.jsonl", LINE0 + "null\n", "line 2: expected a JSON object, got null"),
    ("t.jsonl", LINE0 + '"x"\n', "line 2: expected a JSON object, got a string"),
    ("t.jsonl", LINE0 + '{"request_id": 1,\n', "line 2: not valid JSON"),
    ("t.jsonl", LINE0 + LINE0.strip() + " " + LINE0, "line 2: not valid JSON (Extra data at column 72)"),
    ("t.jsonl", '[{"conversations": []}]\n', "line 1: expected one JSON object per line, got a JSON list. A ShareGPT"),
    ("t.jsonl", '[\n  {"conversations": []}\n]\n', "line 1: expected one JSON object per line, got a JSON list"),
    ("t.jsonl", "", ": no requests in the whole file (it is empty or holds only blank lines)"),
    ("t.jsonl", "\n \r\n\t\n", ": no requests in the whole file"),
    (
        "t.jsonl",
        LINE0.encode() + b'{"request_id": 1, "arrival_time": 0, "x\xff": 1}\n',
        "line 2: not UTF-8 text (byte 0xff",
    ),
    ("t.jsonl", b"\xfe\xff" + LINE0.encode("utf-16-be"), "line 1: not UTF-8 text (byte 0xfe"),
    ("t.jsonl", LINE0.encode() + b"{" + b" " * MAX_LINE_BYTES + b"}\n", "line 2: longer than 16,777,216 bytes"),
    ("t.jsonl", LINE0 + "\ufeff" + LINE0, "line 2: not valid JSON"),
    (
        "t.json",
        '{"request_id": 0, "arrival_time": 1e17, "prompt_len": 5, "output_len": 3}',
        "line 1: arrival_time: got 1e+17",
    ),
    (
        "t.csv",
        HEADER + '0,0,5,3\n1,0,5,"' + "9" * 200_000 + '"\n',
        "line 3: not valid CSV (a cell is longer than 131,072 characters)",
    ),
    ("t.csv", HEADER + f"0,0,5,3\n{2**63},0,5,3\n", "line 3: request_id: got 9223372036854775808"),
    ("t.csv", HEADER + "0," + "9" * 400 + ",5,3\n", "line 2: arrival_time: got '999999999"),
    ("t.csv", HEADER + "0,1e17,5,3\n", "line 2: arrival_time: got '1e17'"),
    ("t.csv", HEADER + "0,nan,5,3\n", "line 2: arrival_time: got 'nan'"),
    ("t.csv", HEADER + "0,Infinity,5,3\n", "line 2: arrival_time: got 'Infinity'"),
    ("t.csv", HEADER + "0,0,1_0,3\n", "line 2: prompt_len: got '1_0'"),
    ("t.csv", HEADER + "0,0,5.0,3\n", "line 2: prompt_len: got '5.0'"),
    ("t.csv", HEADER + "0,0,\u0665,3\n", "line 2: prompt_len: got '\u0665'"),
    ("t.csv", HEADER + "0,0,5,\n", "line 2: output_len: missing"),
    ("t.csv", HEADER + "0,0,5,3,9\n", "line 2: expected 4 columns (as the header), got 5"),
    ("t.csv", HEADER + '0,0,5,"3\n', "line 2: not valid CSV"),
    ("t.csv", HEADER + '0,0,"5"x,3\n', "line 2: not valid CSV (',' expected after '\"')"),
    ("t.csv", HEADER + "0,0,5,3\n0,1,5,3\n", "line 3: request_id: 0 is already the id of line 2"),
    (
        "t.csv",
        "request_id,arrival_time,prompt_len,output_len,output_len\n0,0,5,3,3\n",
        "line 1: column output_len appears twice",
    ),
    (
        "t.csv",
        "request_id,arrival_time,prompt_len,output_len,prompt_token_ids\n0,0,5,3,1\n",
        "line 1: unknown column(s) prompt_token_ids",
    ),
    ("t.csv", "request_id,arrival_time,prompt_len\n0,0,5\n", "line 1: missing column(s) output_len"),
    ("t.csv", HEADER, ": no requests in the whole file (it holds only its header)"),
    ("t.csv", "", ": no header line in the whole file"),
    ("t.csv", HEADER.encode() + b"0,0\xe9,5,3\n", "line 2: not UTF-8 text (byte 0xe9 at byte 4 of the line)"),
    ("t.json", "[" * 5000, "line 1: JSON nested too deep"),
    (
        "t.json",
        '[\n{"conversations": [{"from": "human", "value": "hi"}]},\n{"id": 3}\n]',
        "line 3: conversation 1 has no 'conversations' list of turns",
    ),
    ("t.json", '[\n{"conversations": []},\n{"conversations": [}\n]', "line 3: not valid JSON"),
    ("t.json", '[\n{"conversations": []}\n] x', "line 3: not valid JSON (extra data after the list)"),
    ("t.json", '[{"conversations": []}, ]', "line 1: not valid JSON"),
    ("t.json", b'[\n{"conversations": []},\n"\xff"]', "line 3: not UTF-8 text (byte 0xff)"),
    ("t.json", "[]", ": no request in the whole file: 0 requests from 0 conversations"),
    (
        "t.json",
        '[\n{"id": "x", "conversations": [{"from": "human", "value": "a", "value": "b"}]}]',
        "line 2: not valid JSON (field value appears twice in one object)",
    ),  # json kept the last one
    (
        "t.json",
        '[\n{"id": NaN, "conversations": [{"from": "human", "value": "a"}]}]',
        "line 2: not valid JSON (NaN is not JSON",
    ),
    ("t.json", '[{"conversations": [{"from": "gpt", "value": "hi"}]}]', "0 requests from 1 conversations"),
    ("t.txt", LINE0, ": unknown trace format '.txt' (allowed: .jsonl, .csv, or .json"),
    ("t.jsonl/", None, ": is a directory, not a trace file"),
    ("missing.jsonl", "MISSING", ": no such file"),
]


def _trace_cases() -> list:
    cases = []
    for i, (name, content, fragment) in enumerate(TRACES):
        argv = ["run", "--trace", T, "--kv-slots", "4096"]
        cases.append(pytest.param(argv, (fragment,), (name, content), True, id=f"trace{i}-{name}"))
    return cases


CLI_CASES = (
    _numeric_cases()
    + [
        pytest.param(argv, (fragment,), ("ok.jsonl", LINE0) if T in argv else None, False, id=f"combo{i}")
        for i, (argv, fragment) in enumerate(COMBINATIONS)
    ]
    + _trace_cases()
)


def _prepare(tmp_path: Path, argv: list[str], trace) -> tuple[list[str], str | None]:
    path = None
    if trace is not None:
        name, content = trace
        path = tmp_path / name.rstrip("/")
        if name.endswith("/"):
            path.mkdir()
        elif content != "MISSING":
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return [a.replace(T, str(path)).replace("{tmp}", str(tmp_path)) for a in argv], path and str(path)


@pytest.mark.parametrize("argv, fragments, trace, names_file", CLI_CASES)
def test_bad_input_is_one_line_naming_it_and_exit_2(tmp_path, capsys, argv, fragments, trace, names_file):
    argv, path = _prepare(tmp_path, argv, trace)
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse's own errors exit from inside
        status = exit_.code
    out, err = capsys.readouterr()
    assert status == 2, (status, err)
    assert err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err and out == ""
    assert any(f in err for f in fragments), err
    if names_file:  # "FILE line N: field: ..." or "FILE: ..." for the whole file
        assert err.startswith(f"error: {path} line ") or err.startswith(f"error: {path}: "), err


def test_the_table_covers_every_class():
    """The table's size, as reported: numeric flag values, combinations, broken traces."""
    assert len(_numeric_cases()) >= 150 and len(COMBINATIONS) >= 60 and len(TRACES) >= 70


@pytest.mark.parametrize(
    "argv, trace, fragment",
    [
        (
            ["run", "--trace", T],
            ("t.jsonl", LINE0 + '{"request_id": 1, "arrival_time": 1' + "0" * 400 + "}\n"),
            "line 2: arrival_time: got an integer of 401 digits",
        ),
        (["run", "--trace", T], ("t.jsonl", LINE0 + "[" * 3000 + "\n"), "line 2: JSON nested too deep"),
        (["run", "--trace", T], ("t.csv", HEADER + '0,0,5,"' + "9" * 200_000 + '"\n'), "line 2: not valid CSV"),
        (
            ["run", "--trace", T, "--prefix-caching", "on"],
            ("t.jsonl", _line(request_id=0, prompt_token_ids=[1, 2, 3, 4, 2**63])),
            "line 1: prompt_token_ids",
        ),
        (["run", "--rate", "1e9"], None, "rate x duration"),
        (["run", "--duration", "1e12"], None, "duration"),
        (["run", "--trace", T], ("t.jsonl/", None), "is a directory"),
    ],
)
def test_no_traceback_escapes_the_real_command(tmp_path, argv, trace, fragment):
    argv, _ = _prepare(tmp_path, argv, trace)
    done = subprocess.run([sys.executable, "-m", "sim", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert fragment in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root reads any file")
def test_unreadable_trace(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(LINE0)
    path.chmod(0)
    assert main(["run", "--trace", str(path)]) == 2
    assert capsys.readouterr().err == f"error: {path}: cannot be read (permission denied)\n"


# ---- what is accepted: BOM, CRLF, spaces in CSV, a ShareGPT file as --trace ---------------------------------
@pytest.mark.parametrize(
    "name, content",
    [
        ("t.jsonl", "\ufeff" + LINE0 + _line().replace("\n", "\r\n")),
        ("t.csv", "\ufeff" + HEADER.replace("\n", "\r\n") + "0, 0.5, 5, 3\r\n1,1.0,5,3\r\n"),
        ("t.json", LINE0 + _line()),  # .json holding JSONL
    ],
)
def test_bom_crlf_and_json_suffix_are_read(tmp_path, capsys, name, content):
    path = tmp_path / name
    path.write_text(content, newline="")
    assert main(["run", "--trace", str(path), "--json", "--kv-slots", "4096"]) == 0
    assert json.loads(capsys.readouterr().out)["num_finished"] == 2


SHAREGPT = [
    {
        "id": "a",
        "conversations": [
            {"from": "human", "value": "What is paged attention?"},
            {"from": "gpt", "value": "A way to store the KV cache in blocks."},
        ],
    },
    {"id": "b", "conversations": [{"from": "human", "value": "only a question"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "Say hi."}, {"from": "gpt", "value": "Hi!"}]},
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags, arrivals",
    [
        ([], "Poisson arrivals at 2 req/s (seed 0)"),
        (["--rate", "5", "--seed", "3"], "Poisson arrivals at 5 req/s (seed 3)"),
        (["--arrival", "offline"], "all at t = 0"),
    ],
)
def test_a_sharegpt_file_is_imported_by_run_trace(tmp_path, capsys, flags, arrivals):
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(SHAREGPT, indent=1))
    assert main(["run", "--trace", str(path), "--json", "--kv-slots", "4096", *flags]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert summary["num_finished"] == 2 and summary["trace_format"] == "sharegpt"
    assert err.startswith(
        f"note: {path} is a ShareGPT conversation file: imported 2 requests from 3 conversations "
        "(0 skipped as too long, 1 without a human turn followed by a gpt reply)"
    )
    assert arrivals in err and err.count("\n") == 1
    assert (summary["rate"] is None) == (flags == ["--arrival", "offline"])


def test_sharegpt_takes_no_gamma_arrivals(tmp_path, capsys):
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(SHAREGPT))
    assert main(["run", "--trace", str(path), "--arrival", "gamma"]) == 2
    assert "--arrival gamma: a ShareGPT file's requests arrive by Poisson" in capsys.readouterr().err


# ---- sim.run: the same checks, ValueError with the same message -------------------------------------------
@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"rate": 1e9}, "rate x duration: 1e+09 x 3600 = 3.6e+12 expected requests (allowed: at most 10,000,000"),
        ({"duration": 1e12}, "duration: got 1000000000000.0"),
        ({"rate": "2"}, "rate: got '2'"),
        ({"rate": True}, "rate: got True"),
        ({"num_gpus": 2.0}, "num_gpus: got 2.0 (allowed: an integer from 1 to 1,024)"),
        ({"block_size": True}, "block_size: got True"),
        ({"seed": -1}, "seed: got -1"),
        ({"seed": 1.5}, "seed: got 1.5"),
        ({"kv_slots": 10**30}, "kv_slots: got"),
        ({"swap_space_gib": 1e300, "preemption": "swap"}, "swap_space_gib: got 1e+300"),
        ({"watermark": 1.0}, "watermark: got 1.0"),
        ({"cpu_offload_gib": -0.5}, "cpu_offload_gib: got -0.5"),
        ({"cpu_offload_gib": 2.0, "policy": "radix"}, "cpu_offload_gib=2.0: policy 'radix' has no CPU offload tier"),
        ({"cpu_offload_gib": 2.0, "enable_prefix_caching": False}, "cpu_offload_gib=2.0: keeps evicted prefix-cache"),
        ({"jump": "yes"}, "jump: got 'yes' (allowed: True or False)"),
        ({"model": ["opt-13b"]}, "model: got ['opt-13b']"),
        ({"policy": None}, "policy: got None"),
        (
            {"prompt_len_range": (1, 2.5), "output_len_range": (1, 2), "workload": "uniform"},
            "prompt_len_range: got (1, 2.5)",
        ),
        (
            {"enable_prefix_caching": True, "policy": "max", "prefix_len": 8},
            "enable_prefix_caching=True: applies to policy='paged'",
        ),
        ({"block_size": 8, "policy": "oracle"}, "block_size=8: applies to policy='paged' only"),
        ({"burstiness": 0.5}, "burstiness=0.5: applies to arrival='gamma' only"),
        ({"burstiness": 1e-9, "arrival": "gamma"}, "burstiness: got 1e-09"),
        ({"prompt_len": 5}, "prompt_len=5: applies to workload='fixed' only"),
        (
            {"enable_chunked_prefill": False, "scheduler": "v0"},
            "enable_chunked_prefill=False: applies to scheduler='v1'",
        ),
        ({"num_requests": 10, "duration": 60.0}, "duration=60.0: conflicts with num_requests=10"),
        (
            {"requests": [Request(0, 0.0, 5, 3), Request(0, 1.0, 5, 3)]},
            "requests[1]: request_id: got 0 (allowed: each request_id once)",
        ),
        ({"requests": [Request(2**63, 0.0, 5, 3)]}, "requests[0]: request_id: got 9223372036854775808"),
        ({"requests": [Request(0, 1e17, 5, 3)]}, "requests[0]: arrival_time: got 1e+17"),
        (
            {"stop_at": (float("nan"),)},
            "stop_at: got (nan,) (allowed: a tuple of finite numbers from 0 to 1e+09 seconds)",
        ),
        ({"stop_at": ("x",)}, "stop_at: got ('x',)"),  # was a TypeError inside the loop
        ({"on_step": 5}, "on_step: got 5 (allowed: None, or a function f(simulator, plan_or_None))"),
        (
            {"requests": [Request(0, 0.0, 5, 3)], "rate": 3.0},
            "rate=3.0: describes a generated workload, and requests gives",
        ),
        ({"requests": (Request(0, 0.0, 5, 3),)}, "requests: got 'tuple'"),
        ({"requests": [Request(0, 0.0, 5, 3)], "trace": "t.jsonl"}, "trace and requests: got 'both'"),
        ({"trace": 5}, "trace: got 5"),
        ({"trace": "/nonexistent/t.csv"}, "/nonexistent/t.csv: no such file"),
    ],
)
def test_run_refuses_what_the_cli_refuses(kwargs, fragment):
    with pytest.raises(ValueError) as err:
        run(**kwargs)
    assert fragment in str(err.value)
