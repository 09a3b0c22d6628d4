"""`python -m reference`: bad input is one line and exit status 2; a real generation matches LLM.generate.

Commands run as real subprocesses (what a user types), except where noted: `main(argv)` in this process is
the same code `python -m reference` runs, without paying torch's import again.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reference import LLM, SamplingParams
from reference.cli import main

ROOT = Path(__file__).resolve().parents[2]
IDS = "5 17 42 99 7 8 120 3 64"  # a prompt for the tiny random model, which has no tokenizer
QUESTION = "What is the capital of France?"

BAD = {  # name -> (arguments, a word the error line must contain)
    "n_zero": (["generate", "hi", "--n", "0"], "--n"),
    "max_tokens_zero": (["generate", "hi", "--max-tokens", "0"], "--max-tokens"),
    "beam_with_temperature": (["generate", "hi", "--beam-width", "2", "--temperature", "0.7"], "--temperature"),
    "n_and_beam": (["generate", "hi", "--n", "2", "--beam-width", "2"], "--beam-width"),
    "top_p": (["generate", "hi", "--top-p", "1.5"], "--top-p"),
    "top_k": (["generate", "hi", "--top-k", "-2"], "--top-k"),
    "policy": (["generate", "hi", "--policy", "contiguous"], "paged"),
    "not_an_int": (["generate", "hi", "--max-tokens", "many"], "--max-tokens"),
    "a_float_for_an_int": (["generate", "hi", "--n", "2.0"], "--n: invalid int value: '2.0'"),
    "temperature_inf": (["generate", "hi", "--temperature", "inf"], "--temperature inf (allowed: a number >= 0)"),
    "top_p_nan": (["generate", "hi", "--top-p", "nan"], "--top-p"),
    "seed_negative": (["generate", "hi", "--seed", "-1"], "--seed -1 (allowed: an integer >= 0"),
    "empty_prompt": (["generate", "  "], "prompt"),
    "min_tokens_over_max": (["generate", "hi", "--max-tokens", "4", "--min-tokens", "5"], "--min-tokens 5"),
    "min_p": (["generate", "hi", "--min-p", "2"], "--min-p 2.0 (allowed: a number in [0, 1])"),
    "repetition_penalty": (["generate", "hi", "--repetition-penalty", "0"], "--repetition-penalty"),
    "presence_penalty": (["generate", "hi", "--presence-penalty", "3"], "--presence-penalty"),
    "frequency_penalty_nan": (["generate", "hi", "--frequency-penalty", "nan"], "--frequency-penalty"),
    "logprobs": (["generate", "hi", "--logprobs", "21"], "--logprobs 21 (allowed: an integer from 0 to 20)"),
    "prompt_logprobs": (
        ["generate", "hi", "--prompt-logprobs", "-1"],
        "--prompt-logprobs -1 (allowed: an integer from 0 to 20)",
    ),
    "beam_with_prompt_logprobs": (
        ["generate", "hi", "--beam-width", "2", "--prompt-logprobs", "1"],
        "beam search takes only",
    ),
    "empty_stop": (["generate", "hi", "--stop", ""], "--stop"),
    "beam_with_stop": (["generate", "hi", "--beam-width", "2", "--stop", "x"], "beam search takes only"),
    "unknown_model": (["generate", "hi", "--model", "/no/such/checkpoint"], "/no/such/checkpoint"),
    "not_a_checkpoint": (["generate", "hi", "--model", "tests"], "tests"),
    "kv_blocks_too_small": (
        ["generate", IDS, "--model", "random", "--kv-blocks", "1", "--block-size", "4"],
        "--kv-blocks",
    ),
    "prompt_too_long": (["generate", " ".join(["5"] * 1100), "--model", "random"], "1100 tokens"),
    "text_without_tokenizer": (["generate", "hello", "--model", "random"], "token ids"),
    "hybrid_without_sliding_layers": (
        ["generate", IDS, "--model", "random", "--policy", "hybrid"],
        "0 sliding layers (allowed: gemma3-270m",
    ),
    "unknown_policy": (["generate", "hi", "--policy", "lru"], "--policy"),
    "bench_batch_size": (["bench", "--hf-batch-size", "0"], "--hf-batch-size"),
    "no_command": ([], "COMMAND"),
    "logprobs_without_json": (["generate", "hi", "--logprobs", "2"], "--logprobs / --prompt-logprobs without --json"),
    "prompt_logprobs_without_json": (["generate", "hi", "--prompt-logprobs", "1"], "without --json"),
    "arabic_indic_digit": (["generate", "5 \u0663", "--model", "random"], "token ids"),
    "block_size_huge": (
        ["generate", IDS, "--model", "random", "--block-size", "1000000000"],
        "--block-size 1000000000 (allowed: an integer from 1 to 256)",
    ),
    "pool_past_memory": (["generate", IDS, "--model", "random", "--kv-blocks", "100000000"], "--kv-blocks"),
    "traces_dir_a_file": (["validate-sim", "--traces-dir", "README.md"], "--traces-dir README.md: not a folder"),
    "prompt_not_utf8": (["generate", "\udcff hi"], "the prompt holds bytes that are not UTF-8"),  # argv byte 0xff
    "serve_unknown_host": (["serve", "--model", "random", "--host", "999.1.1.1"], "--host 999.1.1.1: not an address"),
}
GENERATE = ["generate", QUESTION, "--max-tokens", "8"]


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "reference", *args], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


@pytest.mark.slow
def test_bad_input_is_one_line_and_exit_2():
    """Every case at once (each process pays torch's import; together they overlap), then each is checked."""
    procs = {name: start(args) for name, (args, _) in BAD.items()}
    for name, proc in procs.items():
        code, out, err = finish(proc)
        lines = err.strip().splitlines()
        assert code == 2, f"{name}: {err}"
        assert out == "", name
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{name}: {err}"
        assert BAD[name][1] in lines[0], f"{name}: {lines[0]}"
        if name not in ("no_command", "not_an_int", "a_float_for_an_int"):  # argparse's own wording for these
            assert "(allowed: " in lines[0], f"{name}: {lines[0]}"


LLAMA_FIELDS = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "vocab_size": 256,
}
BROKEN_CONFIGS = {  # name -> (config.json text, generation_config.json text or None, the error after "error: PATH: ")
    "a missing field": (
        json.dumps({k: v for k, v in LLAMA_FIELDS.items() if k != "num_hidden_layers"}),
        None,
        "config.json: missing field 'num_hidden_layers' (allowed: ",
    ),
    "a null field": (json.dumps({**LLAMA_FIELDS, "vocab_size": None}), None, "config.json: missing field 'vocab_size'"),
    "a string for an int": (
        json.dumps({**LLAMA_FIELDS, "hidden_size": "64"}),
        None,
        "config.json: field 'hidden_size' is '64' (allowed: an integer)",
    ),
    "a float for an int": (json.dumps({**LLAMA_FIELDS, "hidden_size": 64.0}), None, "field 'hidden_size' is 64.0"),
    "not JSON": ("{oops", None, "config.json: not valid JSON: "),
    "a list": ("[1, 2]", None, "config.json: a JSON list (allowed: a JSON object"),
    "no model_type": (
        json.dumps({k: v for k, v in LLAMA_FIELDS.items() if k != "model_type"}),
        None,
        "config.json: missing field 'model_type' (allowed: llama, mistral, qwen2, gemma3_text)",
    ),
    "a bad rope_scaling": (
        json.dumps({**LLAMA_FIELDS, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}),
        None,
        "config.json: missing field 'rope_scaling.low_freq_factor'",
    ),
    "a bad generation config": (
        json.dumps(LLAMA_FIELDS),
        '{"eos_token_id": "x"}',
        "generation_config.json: field 'eos_token_id' is 'x'",
    ),
    # bool is not int and a string is not a bool: bool("false") would read as True
    "a string for a bool": (
        json.dumps({**LLAMA_FIELDS, "tie_word_embeddings": "false"}),
        None,
        "config.json: field 'tie_word_embeddings' is 'false' (allowed: true, false or null)",
    ),
    "a number for a bool": (
        json.dumps({**LLAMA_FIELDS, "attention_bias": 1}),
        None,
        "config.json: field 'attention_bias' is 1 (allowed: true, false or null)",
    ),
    "a bool for an int": (
        json.dumps({**LLAMA_FIELDS, "num_key_value_heads": True}),
        None,
        "config.json: field 'num_key_value_heads' is True (allowed: an integer)",
    ),
    "layer types not strings": (
        json.dumps({**LLAMA_FIELDS, "model_type": "gemma3_text", "layer_types": [[1], [2]]}),
        None,
        "config.json: field 'layer_types' is [[1], [2]] (allowed: a list of",
    ),
    "nested too deeply": ('{"a": ' * 100_000 + "1" + "}" * 100_000, None, "config.json: JSON nested too deeply"),
}


@pytest.mark.parametrize("case", BROKEN_CONFIGS)
def test_a_broken_checkpoint_config_is_one_line_naming_file_and_field(tmp_path, capsys, case):
    text, generation, expected = BROKEN_CONFIGS[case]
    (tmp_path / "config.json").write_text(text)
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(generation)
    assert main(["generate", "1 2 3", "--model", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1, captured.err
    assert lines[0].startswith(f"error: {tmp_path}{'/'}") and expected in lines[0], lines[0]
    assert "(allowed: " in lines[0], lines[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_as_checkpoint_config_is_refused_at_once(tmp_path, capsys):
    os.mkfifo(tmp_path / "config.json")  # read_text() would wait for a writer forever
    assert main(["generate", "1 2 3", "--model", str(tmp_path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --model '{tmp_path}' is not a checkpoint folder"), lines


def test_help_explains_every_flag():
    code, out, _ = finish(start(["generate", "--help"]))
    assert code == 0
    for flag in (
        "--n",
        "--beam-width",
        "--max-tokens",
        "--temperature",
        "--top-p",
        "--top-k",
        "--seed",
        "--policy",
        "--block-size",
        "--kv-blocks",
        "--chat",
        "--json",
        "--model",
        "--kv-dtype",
        "--kv-cache-dtype",
        "--num-speculative-tokens",
        "--speculative-config",
    ):
        assert flag in out


@pytest.mark.slow
def test_json_generation_matches_llm_generate():
    """The CLI's greedy text is LLM.generate's greedy text for the same (chat-templated) prompt."""
    as_json, streaming = start([*GENERATE, "--json"]), start(GENERATE)  # they run while this process loads
    threads = torch.get_num_threads()
    llm = LLM("smollm2", num_gpu_blocks=64)  # a small pool: zero-filling the default one takes seconds
    torch.set_num_threads(threads)  # the engine sets one thread for the process; give the other tests theirs back
    prompt = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=False
    )
    expected = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8))[0].outputs[0]
    code, out, err = finish(as_json)
    assert code == 0, err
    result = json.loads(out)
    assert set(result) >= {"prompt", "outputs", "stats"}
    assert result["prompt"] == QUESTION and result["model_prompt"] == prompt
    (output,) = result["outputs"]
    assert set(output) == {"text", "token_ids", "cumulative_logprob", "finish_reason", "stop_reason"}
    assert output["token_ids"] == expected.token_ids
    assert output["text"] == expected.text
    assert output["finish_reason"] == expected.finish_reason
    assert set(result["stats"]) >= {
        "num_steps",
        "max_concurrent_requests",
        "num_preemptions",
        "num_gpu_blocks",
        "max_blocks_used_after_step",
    }
    assert result["stats"]["max_concurrent_requests"] == 1
    # streaming (no --json) prints the same text, step by step, then a newline
    code, streamed, err = finish(streaming)
    assert code == 0, err
    assert streamed == output["text"] + "\n"


@pytest.mark.slow
def test_a_stop_string_cuts_the_streamed_and_the_json_text():
    """--stop as vLLM's `stop`: the text ends before the string; streaming never prints what the cut removes."""
    args = ["generate", QUESTION, "--max-tokens", "24", "--stop", "Paris"]
    as_json, streaming = start([*args, "--logprobs", "2", "--json"]), start(args)  # (text shows no logprobs)
    code, out, err = finish(as_json)
    assert code == 0, err
    (output,) = json.loads(out)["outputs"]
    assert output["finish_reason"] == "stop" and output["stop_reason"] == "Paris" and "Paris" not in output["text"]
    assert len(output["logprobs"]) == len(output["token_ids"]) and output["logprobs"][0][0][2] == 1  # greedy: rank 1
    code, streamed, err = finish(streaming)
    assert code == 0, err
    assert streamed == output["text"] + "\n"


def test_parallel_samples_and_beams_through_the_cli(capsys):
    """In this process (torch is already imported here): main() is what `python -m reference` runs."""
    args = ["generate", IDS, "--model", "random", "--max-tokens", "5", "--json"]
    assert main([*args, "--n", "2", "--temperature", "0.8", "--policy", "pow2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["outputs"]) == 2
    assert all(1 <= len(o["token_ids"]) <= 5 for o in result["outputs"])
    assert result["stats"]["policy"] == "pow2"
    assert main([*args, "--beam-width", "3", "--ignore-eos"]) == 0
    beams = json.loads(capsys.readouterr().out)["outputs"]
    assert len(beams) == 3
    assert all(b["finish_reason"] == "length" and len(b["token_ids"]) == 5 for b in beams)
    assert len({tuple(b["token_ids"]) for b in beams}) == 3, "beams are distinct hypotheses"
    scores = [b["cumulative_logprob"] for b in beams]
    assert scores == sorted(scores, reverse=True), "best first (equal lengths: by cumulative log-prob)"
    assert main([*args, "--prompt-logprobs", "2"]) == 0  # per prompt token: null, then [[id, logprob, rank], ...]
    result = json.loads(capsys.readouterr().out)
    plp = result["prompt_logprobs"]
    assert len(plp) == len(IDS.split()) and plp[0] is None
    assert [p[0][0] for p in plp[1:]] == [int(t) for t in IDS.split()[1:]] and all(len(p) in (2, 3) for p in plp[1:])
    assert main(args) == 0 and "prompt_logprobs" not in json.loads(capsys.readouterr().out)
    # n > 1 without --json prints each completion when it finishes
    assert main([*args[:-1], "--n", "3", "--temperature", "1.0"]) == 0
    printed = capsys.readouterr().out
    assert sorted(line.split(" (")[0] for line in printed.splitlines() if line.startswith("---")) == [
        "--- completion 0",
        "--- completion 1",
        "--- completion 2",
    ]


def test_vllms_flag_names_give_the_project_flags_run(capsys):
    """--kv-cache-dtype and --speculative-config (vLLM serve's spellings) give the same engine settings and the same
    greedy tokens as --kv-dtype and --num-speculative-tokens. In this process, as above."""
    args = ["generate", "5 6 7 8 5 6 7 8 5 6", "--model", "random", "--max-tokens", "12", "--json"]
    ngram = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    pairs = [
        (["--kv-cache-dtype", "int8"], ["--kv-dtype", "int8"]),
        (["--speculative-config", ngram], ["--num-speculative-tokens", "3"]),
        (["--kv-cache-dtype", "int8", "--kv-dtype", "int8"], ["--kv-dtype", "int8"]),
    ]
    for theirs, ours in pairs:
        runs = []
        for flags in (theirs, ours):
            assert main([*args, *flags]) == 0
            runs.append(json.loads(capsys.readouterr().out)["outputs"][0]["token_ids"])
        assert runs[0] == runs[1], theirs


VLLM_FLAGS_BAD = {  # arguments after `generate IDS --model random` -> the error line
    "fp8": (
        ["--kv-cache-dtype", "fp8"],
        "error: --kv-cache-dtype must be one of auto, int8 (auto: the model's dtype; "
        "int8: 8-bit K/V with a float32 scale per token and KV head; vLLM's fp8 caches are not in this engine), got "
        "'fp8'",
    ),
    "kv dtypes disagree": (
        ["--kv-dtype", "int8", "--kv-cache-dtype", "auto"],
        "error: --kv-dtype 'int8' and "
        "--kv-cache-dtype 'auto' (vLLM's name for the same setting) disagree (allowed: one of them, "
        "or both the same)",
    ),
    "eagle": (
        ["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}'],
        "error: --speculative-config: method 'eagle': this engine drafts by prompt lookup only; EAGLE, Medusa, "
        "MTP and draft models need weights it does not have (allowed: 'ngram')",
    ),
    "unknown key": (
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, "model": "[ngram]"}'],
        "error: --speculative-config: key 'model' is not taken here",
    ),
    "k disagree": (
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}', "--num-speculative-tokens", "3"],
        "error: --num-speculative-tokens 3 with --speculative-config's "
        "num_speculative_tokens 2 (allowed: one of them, or both the same)",
    ),
    "not JSON": (
        ["--speculative-config", "{method: ngram}"],
        "error: argument --speculative-config: '{method: ngram}' "
        "is not JSON: Expecting property name enclosed in double quotes at character 1 (allowed: a JSON "
        "object)",
    ),
    "a list": (
        ["--speculative-config", "[]"],
        "error: argument --speculative-config: '[]' is a JSON list (allowed: a JSON object)",
    ),
    "a key twice": (
        ["--speculative-config", '{"method": "ngram", "method": "ngram"}'],
        "error: argument --speculative-config: field method appears twice in one object",
    ),
    "k out of range": (
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 65}'],
        "error: --speculative-config num_speculative_tokens must be <= 64, got 65 (allowed: 1 .. 64)",
    ),
}


@pytest.mark.parametrize("case", VLLM_FLAGS_BAD)
def test_vllms_flag_names_refuse_bad_values_in_one_line(case, capsys):
    flags, line = VLLM_FLAGS_BAD[case]
    try:
        code = main(["generate", IDS, "--model", "random", *flags])
    except SystemExit as exc:  # argparse's own refusals (a flag's type) exit from inside parse_args
        code = exc.code
    assert code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(line) and len(captured.err.strip().splitlines()) == 1, (
        captured.err
    )


@pytest.mark.slow
def test_bench_quick_writes_its_table(tmp_path, capsys):
    """The benchmark command end to end on 4 requests (the numbers themselves are not checked: no timing
    assertions); the CSV carries the machine, the command line and one row per system."""
    out = tmp_path / "bench.csv"
    assert main(["bench", "--quick", "--num-requests", "4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "engine / HF static" in printed and "paged / max" in printed
    lines = out.read_text().splitlines()
    header = [line for line in lines if line.startswith("# ")]
    assert {line.split(":")[0] for line in header} >= {"# machine", "# command", "# threads", "# workload"}
    assert "bench --quick --num-requests 4" in out.read_text()
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    assert [r["system"] for r in rows if r["section"] == "concurrency"] == ["paged", "max", "pow2", "oracle"]
    assert all(int(r["output_tokens"]) == int(rows[0]["output_tokens"]) for r in rows), "one workload for all"
    conc = {r["system"]: int(r["max_concurrent_requests"]) for r in rows if r["section"] == "concurrency"}
    assert conc["paged"] >= conc["oracle"] >= 1 and conc["paged"] >= conc["max"] >= 1


def test_a_closed_pipe_is_not_bad_input():
    """`python -m reference generate ... | head`: the reader goes away; the command stops quietly, as a Unix tool
    killed by SIGPIPE (141), instead of an error line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "reference", "generate", IDS, "--model", "random", "--max-tokens", "64", "--ignore-eos"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # before it prints anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141 and err == "", err


@pytest.mark.slow
def test_an_output_that_fails_late_is_one_line_and_keeps_the_others(tmp_path):
    """calibrate checks its outputs first, but a full disk (here /dev/full) fails only at the write: one line,
    exit 2, and the other output is neither created nor replaced."""
    out = tmp_path / "cost.json"
    out.write_text("old")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "reference",
            "calibrate",
            "--quick",
            "--passes",
            "1",
            "--out",
            str(out),
            "--steps-csv",
            "/dev/full",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "No space left on device" in lines[0], proc.stderr
    assert out.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["cost.json"]
