"""`make serve-bench` (tools/serve_bench.py) without guidellm or aiperf: each client's result file read as that client
writes it, bad result files and bad flags refused in one line, the commands it runs, the tokenizer folder it writes,
a server that does not start, and the README's numbers recomputed from the committed CSV.

The files under tests/data/serve_bench/ are real outputs, cut down to what a reader needs: guidellm 0.8.1's
`--output kind=json` (per-request lists emptied, the metrics the tool reads kept whole less their confidence
intervals) and aiperf 0.13.0's profile_export_aiperf.json (the summary metrics), each from a run of 6 requests against
`python -m reference serve` (`guidellm.json`, `aiperf.json`), and again against a server with --max-model-len 200
given prompts of 195 +- 20 tokens, some of them refused with a 400 (`*_errors.json`)."""

import csv
import json
import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "serve_bench"
sys.path.insert(0, str(ROOT / "tools"))

import serve_bench  # noqa: E402
from serve_bench import read_aiperf, read_guidellm  # noqa: E402

from sim.figures.readme_numbers import Files, make_block  # noqa: E402


def record(name: str) -> dict:
    return json.loads((DATA / name).read_text())


# --- the clients' result files ------------------------------------------------------------------------------------
def test_a_guidellm_result_is_read_from_its_metrics():
    point = read_guidellm(DATA / "guidellm.json")
    metrics = record("guidellm.json")["benchmarks"][0]["metrics"]
    ttft = metrics["time_to_first_token_ms"]["successful"]["percentiles"]
    assert (point.client, point.client_version) == ("guidellm", "0.8.1")
    assert (point.num_requests, point.completed, point.errors) == (6, 6, 0)
    assert (point.ttft_p50_ms, point.ttft_p99_ms) == (ttft["p50"], ttft["p99"])
    assert point.ttft_p50_ms <= point.ttft_p99_ms and point.itl_p50_ms <= point.itl_p99_ms
    # its throughput is completed requests over its own duration
    assert point.request_throughput == pytest.approx(point.completed / point.duration_s)


def test_a_guidellm_result_with_refused_requests_counts_them():
    point = read_guidellm(DATA / "guidellm_errors.json")
    assert (point.num_requests, point.completed, point.errors) == (6, 5, 1)


def test_an_aiperf_result_is_read_from_its_summary():
    point = read_aiperf(DATA / "aiperf.json")
    summary = record("aiperf.json")
    assert (point.client, point.client_version) == ("aiperf", "0.13.0")
    assert (point.num_requests, point.completed, point.errors) == (6, 6, 0)
    assert (point.itl_p50_ms, point.itl_p99_ms) == (
        summary["inter_token_latency"]["p50"],
        summary["inter_token_latency"]["p99"],
    )
    assert point.output_tokens_per_s == summary["output_token_throughput"]["avg"]


def test_an_aiperf_result_with_refused_requests_counts_them():
    """aiperf's request_count leaves the failed requests out: they are in error_request_count and error_summary."""
    point = read_aiperf(DATA / "aiperf_errors.json")
    summary = record("aiperf_errors.json")
    assert sum(e["count"] for e in summary["error_summary"]) == 2
    assert (point.num_requests, point.completed, point.errors) == (6, 4, 2)


def _guidellm_without_ttft(r):
    del r["benchmarks"][0]["metrics"]["time_to_first_token_ms"]


def _guidellm_twice(r):
    r["benchmarks"] *= 2


def _guidellm_nan(r):
    r["benchmarks"][0]["metrics"]["inter_token_latency_ms"]["successful"]["percentiles"]["p99"] = float("nan")


def _aiperf_without_itl(r):
    del r["inter_token_latency"]


def _aiperf_text_count(r):
    r["request_count"]["avg"] = "six"


def _aiperf_errors_as_text(r):
    r["error_summary"] = "none"


@pytest.mark.parametrize(
    "name, reader, change, message",
    [
        ("guidellm.json", read_guidellm, _guidellm_without_ttft, "no 'time_to_first_token_ms'"),
        ("guidellm.json", read_guidellm, _guidellm_twice, "with one benchmark"),
        ("guidellm.json", read_guidellm, _guidellm_nan, "ITL p99 is nan"),
        ("aiperf.json", read_aiperf, _aiperf_without_itl, "no 'inter_token_latency'"),
        ("aiperf.json", read_aiperf, _aiperf_text_count, "request_count is 'six'"),
        ("aiperf.json", read_aiperf, _aiperf_errors_as_text, "not an aiperf result file"),
    ],
)
def test_a_result_file_missing_a_measure_is_one_line_naming_it(tmp_path, name, reader, change, message):
    r = record(name)
    change(r)
    path = tmp_path / name
    path.write_text(json.dumps(r))
    with pytest.raises(ValueError, match=message) as info:
        reader(path)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", "\ufffe\x00", "null"])
@pytest.mark.parametrize("reader", [read_guidellm, read_aiperf])
def test_a_file_that_is_no_result_is_one_line(tmp_path, reader, text):
    path = tmp_path / "result.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="not a (guidellm|aiperf) result file"):
        reader(path)
    with pytest.raises(ValueError, match="not a"):
        reader(tmp_path / "missing.json")


# --- the commands -------------------------------------------------------------------------------------------------
WORKLOAD = serve_bench.Workload(prompt_tokens=128, output_tokens=64, num_requests=20, rate=1.0, seed=0)


def test_the_guidellm_command_asks_for_the_workload():
    command, result = serve_bench.client_command(
        "guidellm", "guidellm", "http://127.0.0.1:8011", "tok", WORKLOAD, "out"
    )
    assert result == "out/guidellm-rate1.json"
    assert " ".join(command) == (
        "guidellm run --backend kind=openai_http,target=http://127.0.0.1:8011,model=smollm2,"
        "request_format=/v1/completions --tokenizer kind=huggingface_auto,model=tok "
        "--data kind=synthetic_text,prompt_tokens=128,output_tokens=64 --profile kind=constant,rate=1 "
        "--constraint kind=max_requests,count=20 --seed kind=static,value=0 "
        "--output kind=json,path=out/guidellm-rate1.json --disable-progress"
    )


def test_the_aiperf_command_asks_for_the_workload_and_the_servers_token_counts():
    command, result = serve_bench.client_command("aiperf", "aiperf", "http://127.0.0.1:8011", "tok", WORKLOAD, "out")
    assert result == "out/aiperf-rate1/profile_export_aiperf.json"
    flags = dict(zip(command, command[1:]))  # each flag -> what follows it
    assert flags["--prompt-input-tokens-mean"] == "128" and flags["--prompt-output-tokens-mean"] == "64"
    assert flags["--request-rate"] == "1" and flags["--request-count"] == "20"
    assert flags["--arrival-pattern"] == "constant" and flags["--extra-inputs"] == "ignore_eos:true"
    assert {"--streaming", "--use-server-token-count"} <= set(command)


# --- flags, a missing client, a server that does not start --------------------------------------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rates", "0"], "--rates '0': each rate in (0, 100]"),
        (["--rates", "1,1"], "none twice"),
        (["--rates", "1,x"], "expected numbers separated by commas"),
        (["--rates", "nan"], "each rate in (0, 100]"),
        (["--clients", "vegeta"], "--clients 'vegeta': allowed guidellm, aiperf"),
        (["--clients", "aiperf,aiperf"], "each once"),
        (["--duration", "0"], "--duration 0.0: allowed 1 to 3,600"),
        (["--duration", "nan"], "--duration nan"),
        (["--duration", "1", "--rates", "0.2"], "every rate needs at least one request"),
        (["--num-gpu-blocks", "8"], "128 slots cannot hold one request of 128 + 64 tokens"),
        (["--port", "80"], "--port 80: allowed 1024 to 65,535"),
        (["--output-tokens", "0"], "--output-tokens 0"),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        serve_bench.main([*argv, "--out", str(tmp_path / "x.csv")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "x.csv").exists()


def test_an_output_that_is_a_folder_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        serve_bench.main(["--out", str(tmp_path)])
    assert info.value.code == 2 and "is a folder" in capsys.readouterr().err


def test_without_the_clients_it_says_how_to_get_them(tmp_path, capsys):
    code = serve_bench.main(["--client-venv", str(tmp_path / "none"), "--out", str(tmp_path / "x.csv")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no guidellm in" in err and "make serve-bench" in err
    assert not (tmp_path / "x.csv").exists()


def fake_clients(tmp_path: Path) -> Path:
    """A client venv whose clients are never reached (each would fail)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for client in serve_bench.CLIENTS:
        (venv / "bin" / client).write_text("#!/bin/sh\nexit 3\n")
        (venv / "bin" / client).chmod(0o755)
    return venv


def test_a_server_that_does_not_start_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    """The server command exits at once (here a policy it does not know): the run says why in one line."""
    command = serve_bench.server_command
    monkeypatch.setattr(serve_bench, "server_command", lambda a: [*command(a), "--policy", "nope"])
    code = serve_bench.main(
        ["--client-venv", str(fake_clients(tmp_path)), "--port", str(free_port()), "--out", str(tmp_path / "x.csv")]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: the server did not start (exit 2): ") and err.count("\n") == 1
    assert "nope" in err and not (tmp_path / "x.csv").exists()


def test_a_port_in_use_is_refused_before_the_server_starts(tmp_path, capsys):
    """Another server there could answer /health for one that never started."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = serve_bench.main(
            ["--client-venv", str(fake_clients(tmp_path)), "--port", str(port), "--out", str(tmp_path / "x.csv")]
        )
    err = capsys.readouterr().err
    assert code == 2 and err == (
        f"error: --port {port}: cannot listen there (Address already in use; another server? give a free port)\n"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the tokenizer folder -----------------------------------------------------------------------------------------
def test_the_tokenizer_folder_gives_the_engines_token_ids(tmp_path):
    """What guidellm and aiperf load with AutoTokenizer.from_pretrained(folder): the engine's own tokenizer."""
    transformers = pytest.importorskip("transformers")
    from reference.models.loader import smollm2_checkpoint_dir

    folder = serve_bench.write_tokenizer(tmp_path / "tok")
    files = ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in folder.iterdir()) == files
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    ours = transformers.AutoTokenizer.from_pretrained(smollm2_checkpoint_dir(), local_files_only=True)  # the engine's
    text = "Hello, world! 1234 ünïcödé 中文 <|im_start|>user"
    assert theirs.encode(text, add_special_tokens=False) == ours.encode(text, add_special_tokens=False)
    assert serve_bench.write_tokenizer(folder) == folder  # written again over its own folder


def test_a_folder_with_other_files_is_not_overwritten(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as info:
        serve_bench.main(["--write-tokenizer", str(tmp_path)])
    assert info.value.code == 2 and "is not a tokenizer folder" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"


# --- the committed run and the README -----------------------------------------------------------------------------
def committed_rows() -> list[dict]:
    with open(ROOT / "figures" / "serve_bench.csv") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def test_the_committed_run_has_each_client_at_each_rate_and_its_command():
    rows = committed_rows()
    text = (ROOT / "figures" / "serve_bench.csv").read_text()
    assert {(r["client"], r["rate_req_per_s"]) for r in rows} == {
        (c, rate) for c in serve_bench.CLIENTS for rate in ("0.5", "1", "2")
    }
    assert "# command: python tools/serve_bench.py" in text and "# machine: " in text
    for r in rows:
        assert r["command"].startswith(f".venv-bench/bin/{r['client']} ")
        assert int(r["completed"]) + int(r["errors"]) == int(r["num_requests"])


def test_readme_numbers_are_the_committed_run():
    """The README's block (sim/figures/readme_numbers.py; that README holds exactly this block is
    tests/sim/test_readme_numbers.py's check) has the CSV's numbers."""
    block = make_block("serve-bench", Files(ROOT / "figures"))
    for r in committed_rows():
        row = block.row(f"{r['client']}.{r['rate_req_per_s']}")
        assert row["client"] == f"{r['client']} {r['client_version']}"
        assert row["requests (errors)"] == f"{r['num_requests']} ({r['errors']})"
        assert row["completed req/s"] == f"{float(r['request_throughput']):.2f}"
        assert row["output tokens/s"] == f"{float(r['output_tokens_per_s']):.1f}"
        assert row["TTFT p50 / p99"] == f"{float(r['ttft_p50_ms']):,.0f} / {float(r['ttft_p99_ms']):,.0f} ms"
        assert row["inter-token p50 / p99"] == f"{float(r['itl_p50_ms']):,.0f} / {float(r['itl_p99_ms']):,.0f} ms"
