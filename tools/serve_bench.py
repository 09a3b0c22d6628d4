"""`make serve-bench`: the server measured from outside by the load generators people point at vLLM, guidellm and
aiperf, at a few constant request rates; one CSV row per client and rate.

    python tools/serve_bench.py                          # both clients, 0.5 / 1 / 2 req/s, 20 s of arrivals each
    python tools/serve_bench.py --clients aiperf --rates 1,4 --duration 30 --results runs/   # keep their own files
    python tools/serve_bench.py --write-tokenizer DIR    # only the tokenizer folder, for one's own guidellm/aiperf

What it does, in order:
1. Starts `python -m reference serve` in a process of its own (SmolLM2, --num-gpu-blocks 512, --seed 0, the engine's
   default of one torch thread) on --port and waits for /health.
2. Writes the embedded SmolLM2's tokenizer as a Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json,
   chat_template.jinja) into `.venv-bench/smollm2-tokenizer`. Both clients make their synthetic prompts with a
   tokenizer they load by `AutoTokenizer.from_pretrained(path)`; the embedded model has no hub id and this machine no
   hub, so they get a local folder: the tokenizer the engine itself uses (reference.models.loader converts the GGUF
   file once and keeps the result in its cache), saved on its own.
3. Warms the server up with two requests of the run's shape (a fresh process's first steps are slow; no client should
   pay for them). Then for each rate, each client in turn (interleaved, so that a machine whose other load changes
   meets both alike): the client's own command line (guidellm_command, aiperf_command) sends round(rate x duration)
   requests at constant arrivals, each a synthetic prompt of --prompt-tokens tokens with max_tokens --output-tokens
   and ignore_eos, to /v1/completions, streamed. Token counts are the server's (`usage`): a client that re-tokenizes
   the text it got back can find fewer tokens than were generated (a decoded text's BPE merges differ from the
   sampled ids'; aiperf counted 30 of 32 once).
4. Reads each client's own result file (read_guidellm: its JSON output; read_aiperf: profile_export_aiperf.json) and
   writes figures/serve_bench.csv (`# ` lines: the machine, the server, the workload, this command, the load average
   before the run) with the client's version and exact command on each row. The clients run on the same machine as
   the server: on 2 cores they compete with it, as they would on anyone's laptop.

The rows' measures, each as its client computes it:
    request_throughput   completed requests / the client's measuring window (guidellm: its benchmark's duration;
                         aiperf: its observation window), req/s
    output_tokens_per_s  generated tokens / the same window
    ttft_p50/p99_ms      time to first token, from sending the request to its first streamed token
    itl_p50/p99_ms       inter-token latency: each request's time from its first token to its last (aiperf: to the
                         response's end) / (tokens - 1), its percentiles over requests (with 10-40 requests a point,
                         p99 is close to the largest)

The clients live in `.venv-bench` (the Makefile's serve-bench target builds it with pinned versions: their
dependencies are not the engine's). A bad flag, a missing client and a server that does not start are one line and
exit 2; a client that fails midway is one line and exit 1; either way nothing is written.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.base.outfiles import check_outputs, temp_prefix, write_csv  # noqa: E402

DEFAULT_OUT = "figures/serve_bench.csv"
CLIENT_VENV = ".venv-bench"  # relative to the repository root, as the Makefile names it
TOKENIZER_FOLDER = "smollm2-tokenizer"  # inside the client venv
CLIENTS = ("guidellm", "aiperf")
MODEL = "smollm2"  # the name the server answers to (its --served-model-name default)
DEFAULT_RATES = "0.5,1,2"
COLUMNS = (
    "client",
    "client_version",
    "rate_req_per_s",
    "num_requests",
    "completed",
    "errors",
    "duration_s",
    "request_throughput",
    "output_tokens_per_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "load_average",
    "command",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
RESULTS_TOKEN = "RESULTS_DIR"  # stands for the folder of the clients' files in the commands the CSV records
# NOTE: not passed on to the clients. With HF_HUB_OFFLINE=1, aiperf 0.13 looks a tokenizer up in the hub's cache only,
# a local folder included, and fails ("Repo id must be in the form 'repo_name'..."); without it, a path that is a
# folder is loaded from there, no hub asked. (This process sets it: reference.models.loader does.)
HUB_OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


class BenchError(Exception):
    """A run that cannot go on (the server did not start, a client failed): one line; `code` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# --- the clients' result files ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LoadPoint:
    """One client's measurements at one rate, as that client reported them."""

    client: str
    client_version: str
    num_requests: int  # sent
    completed: int
    errors: int
    duration_s: float
    request_throughput: float  # completed requests / s
    output_tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float


def _load_json(path: Path, client: str) -> dict:
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a {client} result file ({exc})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: not a {client} result file (a JSON {type(record).__name__}, expected an object)")
    return record


def _number(value, path: Path, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        raise ValueError(f"{path}: {name} is {value!r} (expected a finite number)")
    return float(value)


def read_guidellm(path: Path) -> LoadPoint:
    """The one benchmark of a guidellm JSON output (`--output kind=json,path=...`), from its `metrics` section."""
    record = _load_json(path, "guidellm")
    try:
        (bench,) = record["benchmarks"]
        version, m = record["metadata"]["guidellm_version"], bench["metrics"]
        totals = m["request_totals"]
        ttft, itl = (
            m[name]["successful"]["percentiles"] for name in ("time_to_first_token_ms", "inter_token_latency_ms")
        )
        values = {
            "request_totals.total": totals["total"],
            "request_totals.successful": totals["successful"],
            "request_totals.errored": totals["errored"],
            "duration": bench["duration"],
            "requests_per_second": m["requests_per_second"]["successful"]["mean"],
            "output_tokens_per_second": m["output_tokens_per_second"]["successful"]["mean"],
            "TTFT p50": ttft["p50"],
            "TTFT p99": ttft["p99"],
            "ITL p50": itl["p50"],
            "ITL p99": itl["p99"],
        }
    except (KeyError, TypeError, ValueError) as exc:  # ValueError: not exactly one benchmark
        raise ValueError(f"{path}: not a guidellm result file with one benchmark (no {exc})") from None
    n, done, errors, *rest = (_number(value, path, name) for name, value in values.items())
    return LoadPoint("guidellm", str(version), int(n), int(done), int(errors), *rest)


def read_aiperf(path: Path) -> LoadPoint:
    """aiperf's summary (profile_export_aiperf.json in its --output-artifact-dir): each metric {unit, avg, p50, ...}."""
    record = _load_json(path, "aiperf")
    try:
        # error_request_count is there only when some failed; error_summary counts them by message
        errors = (
            record["error_request_count"]["avg"]
            if "error_request_count" in record
            else sum(e["count"] for e in record["error_summary"])
        )
        ttft, itl = record["time_to_first_token"], record["inter_token_latency"]
        values = {
            "error_request_count": errors,
            "request_count": record["request_count"]["avg"],
            "benchmark_duration": record["benchmark_duration"]["avg"],
            "request_throughput": record["request_throughput"]["avg"],
            "output_token_throughput": record["output_token_throughput"]["avg"],
            "TTFT p50": ttft["p50"],
            "TTFT p99": ttft["p99"],
            "ITL p50": itl["p50"],
            "ITL p99": itl["p99"],
        }
        version = record["aiperf_version"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not an aiperf result file (no {exc})") from None
    errors, done, duration, *rest = (_number(value, path, name) for name, value in values.items())
    # request_count counts the requests that came back well, not the failed ones
    return LoadPoint("aiperf", str(version), int(done + errors), int(done), int(errors), duration, *rest)


# --- the clients' command lines -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Workload:
    prompt_tokens: int
    output_tokens: int
    num_requests: int
    rate: float  # req/s, constant arrivals
    seed: int


def guidellm_command(exe: str, url: str, tokenizer: str, w: Workload, out_json: str) -> list[str]:
    """guidellm 0.8's `run`: every setting a `kind=...,key=value` spec, as its --help lists them."""
    return [
        exe,
        "run",
        "--backend",
        f"kind=openai_http,target={url},model={MODEL},request_format=/v1/completions",
        "--tokenizer",
        f"kind=huggingface_auto,model={tokenizer}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={w.prompt_tokens},output_tokens={w.output_tokens}",
        "--profile",
        f"kind=constant,rate={w.rate:g}",
        "--constraint",
        f"kind=max_requests,count={w.num_requests}",
        "--seed",
        f"kind=static,value={w.seed}",
        "--output",
        f"kind=json,path={out_json}",
        "--disable-progress",
    ]


def aiperf_command(exe: str, url: str, tokenizer: str, w: Workload, out_dir: str) -> list[str]:
    """aiperf's `profile`; --use-server-token-count: tokens as the server counted them (module docstring, 3)."""
    return [
        exe,
        "profile",
        "--model",
        MODEL,
        "--url",
        url,
        "--endpoint-type",
        "completions",
        "--streaming",
        "--tokenizer",
        tokenizer,
        "--prompt-input-tokens-mean",
        str(w.prompt_tokens),
        "--prompt-input-tokens-stddev",
        "0",
        "--prompt-output-tokens-mean",
        str(w.output_tokens),
        "--prompt-output-tokens-stddev",
        "0",
        "--extra-inputs",
        "ignore_eos:true",
        "--use-server-token-count",
        "--request-rate",
        f"{w.rate:g}",
        "--arrival-pattern",
        "constant",
        "--request-count",
        str(w.num_requests),
        "--random-seed",
        str(w.seed),
        "--output-artifact-dir",
        out_dir,
        "--export-level",
        "summary",
        "--ui-type",
        "none",
    ]


def client_command(client: str, exe: str, url: str, tokenizer: str, w: Workload, folder: str) -> tuple[list, str]:
    """(the command, the result file it writes) for one load point, its files under `folder`."""
    stem = f"{client}-rate{w.rate:g}"
    if client == "guidellm":
        out = f"{folder}/{stem}.json"
        return guidellm_command(exe, url, tokenizer, w, out), out
    return aiperf_command(exe, url, tokenizer, w, f"{folder}/{stem}"), f"{folder}/{stem}/profile_export_aiperf.json"


READERS = {"guidellm": read_guidellm, "aiperf": read_aiperf}


# --- the flags ----------------------------------------------------------------------------------------------------
def parse_rates(text: str) -> tuple[float, ...]:
    """'0.5,1,2' -> (0.5, 1.0, 2.0): distinct positive rates up to 100 req/s, in the order given."""
    try:
        rates = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--rates {text!r}: expected numbers separated by commas (e.g. {DEFAULT_RATES})") from None
    if not all(0 < r <= 100 for r in rates) or len(set(rates)) != len(rates):
        raise ValueError(f"--rates {text!r}: each rate in (0, 100] req/s, none twice")
    return rates


def parse_clients(text: str) -> tuple[str, ...]:
    clients = tuple(text.split(","))
    if not clients or any(c not in CLIENTS for c in clients) or len(set(clients)) != len(clients):
        raise ValueError(f"--clients {text!r}: allowed {', '.join(CLIENTS)} (comma-separated, each once)")
    return clients


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python tools/serve_bench.py", description=__doc__.splitlines()[0])
    p.add_argument("--clients", default=",".join(CLIENTS), help=f"which, in order (default: {','.join(CLIENTS)})")
    p.add_argument("--rates", default=DEFAULT_RATES, help=f"constant request rates, req/s (default: {DEFAULT_RATES})")
    p.add_argument(
        "--duration",
        type=float,
        default=20.0,
        help="seconds of arrivals per rate: round(rate x duration) requests (default: 20)",
    )
    p.add_argument("--prompt-tokens", type=int, default=128, help="tokens per synthetic prompt (default: 128)")
    p.add_argument("--output-tokens", type=int, default=64, help="tokens generated per request (default: 64)")
    p.add_argument("--num-gpu-blocks", type=int, default=512, help="the server's KV pool, blocks of 16 (default: 512)")
    p.add_argument("--port", type=int, default=8011, help="the server's port on 127.0.0.1 (default: 8011)")
    p.add_argument("--seed", type=int, default=0, help="the clients' and the server's seed (default: 0)")
    p.add_argument(
        "--client-venv",
        default=CLIENT_VENV,
        help=f"where guidellm and aiperf are (default: {CLIENT_VENV}, made by make serve-bench)",
    )
    p.add_argument("--results", help="keep the clients' own result files in this folder (default: a temporary one)")
    p.add_argument(
        "--start-timeout",
        type=float,
        default=600.0,
        help="seconds the server may take to answer /health (default: 600)",
    )
    p.add_argument("--out", default=DEFAULT_OUT, help=f"the CSV (default: {DEFAULT_OUT})")
    p.add_argument("--write-tokenizer", metavar="DIR", help="only write the tokenizer folder to DIR and exit")
    return p


def check_args(a: argparse.Namespace) -> None:
    """ValueError, one line, for a flag the run cannot use; sets a.rates and a.clients to their parsed values."""
    a.rates, a.clients = parse_rates(a.rates), parse_clients(a.clients)
    for name, value, low, high in (
        ("duration", a.duration, 1, 3600),
        ("prompt-tokens", a.prompt_tokens, 1, 4096),
        ("output-tokens", a.output_tokens, 1, 4096),
        ("num-gpu-blocks", a.num_gpu_blocks, 1, 1_000_000),
        ("port", a.port, 1024, 65535),
        ("seed", a.seed, 0, 2**31 - 1),
        ("start-timeout", a.start_timeout, 1, 86400),
    ):
        if not low <= value <= high:  # NaN is refused too
            raise ValueError(f"--{name} {value}: allowed {low} to {high:,}")
    if a.num_gpu_blocks * 16 < a.prompt_tokens + a.output_tokens:
        raise ValueError(
            f"--num-gpu-blocks {a.num_gpu_blocks}: {a.num_gpu_blocks * 16} slots cannot hold one request "
            f"of {a.prompt_tokens} + {a.output_tokens} tokens"
        )
    if any(round(r * a.duration) < 1 for r in a.rates):
        raise ValueError(f"--duration {a.duration:g}: every rate needs at least one request (rate x duration >= 0.5)")
    check_outputs({"--out": a.out}, make_parents=a.out == DEFAULT_OUT)
    if a.results is not None and Path(a.results).exists() and not Path(a.results).is_dir():
        raise ValueError(f"--results {a.results}: not a folder")


def client_exe(venv: str, client: str) -> str:
    exe = Path(venv) / "bin" / client
    if not os.access(exe, os.X_OK):
        raise BenchError(
            f"no {client} in {venv} (`make serve-bench` builds {CLIENT_VENV} with guidellm and aiperf; "
            "or --client-venv DIR)",
            code=2,
        )
    return str(exe)


# --- the tokenizer folder -----------------------------------------------------------------------------------------
def write_tokenizer(folder: str | Path) -> Path:
    """The engine's SmolLM2 tokenizer saved as a Hugging Face tokenizer folder at `folder`, replacing it whole (written
    to a temporary sibling, then renamed). A folder holding anything but tokenizer files is refused."""
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(p.name not in TOKENIZER_FILES for p in folder.iterdir())):
        raise ValueError(f"{folder}: exists and is not a tokenizer folder (give a new path)")
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    from reference.models.loader import smollm2_checkpoint_dir

    tokenizer = AutoTokenizer.from_pretrained(smollm2_checkpoint_dir(), local_files_only=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=temp_prefix(folder.name)))
    try:
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)
        if folder.exists():
            shutil.rmtree(folder)
        os.rename(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


# --- the server ---------------------------------------------------------------------------------------------------
def server_command(a: argparse.Namespace) -> list[str]:
    return [
        "python",
        "-m",
        "reference",
        "serve",
        "--port",
        str(a.port),
        "--num-gpu-blocks",
        str(a.num_gpu_blocks),
        "--seed",
        str(a.seed),
    ]


def _get(url: str, timeout: float = 5.0) -> int:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status


def check_port_free(port: int) -> None:
    """BenchError (exit 2) if something listens on 127.0.0.1:port already: its /health could answer for ours."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise BenchError(
                f"--port {port}: cannot listen there ({exc.strerror}; another server? give a free port)", code=2
            ) from None


def start_server(a: argparse.Namespace, log: Path) -> subprocess.Popen:
    """The server in a session of its own (its log in `log`), once /health answers; BenchError (exit 2) otherwise."""
    check_port_free(a.port)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}  # its default: 1
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, *server_command(a)[1:]],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + a.start_timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise BenchError(f"the server did not start (exit {server.returncode}): {_last_line(log)}", code=2)
        try:
            if _get(f"http://127.0.0.1:{a.port}/health") == 200:
                return server
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.5)
    stop(server)
    raise BenchError(
        f"the server did not answer /health within {a.start_timeout:g} s (--start-timeout): {_last_line(log)}", code=2
    )


def warm_up(port: int, prompt_tokens: int, output_tokens: int) -> None:
    """Two requests of the run's shape, one after the other (a fresh process's first steps are slow)."""
    body = json.dumps(
        {
            "model": MODEL,
            "prompt": " hello" * prompt_tokens,
            "max_tokens": output_tokens,
            "ignore_eos": True,
            "temperature": 0,
        }
    ).encode()
    for _ in range(2):
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                response.read()
        except (OSError, urllib.error.URLError) as exc:
            raise BenchError(f"the server refused a warm-up request: {exc}", code=2) from None


def stop(process: subprocess.Popen, grace_s: float = 120.0) -> None:
    """SIGTERM to the process's session, SIGKILL after `grace_s` (a busy machine stops slowly)."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        except ProcessLookupError:
            pass


def _last_line(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    return lines[-1][:300] if lines else "(no output)"


# --- one load point -----------------------------------------------------------------------------------------------
def run_client(command: list[str], log: Path, time_limit_s: float) -> None:
    """The client in a session of its own, so that a time limit or Ctrl-C ends every process it started."""
    env = {k: v for k, v in os.environ.items() if k not in HUB_OFFLINE}
    with open(log, "w") as out:
        client = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        code = client.wait(time_limit_s)
    except subprocess.TimeoutExpired:
        stop(client, grace_s=10)
        raise BenchError(f"{Path(command[0]).name} ran past {time_limit_s:.0f} s: {_last_line(log)}") from None
    finally:
        stop(client, grace_s=10)
    if code != 0:
        raise BenchError(
            f"{Path(command[0]).name} failed (exit {code}; --results DIR keeps its log): {_last_line(log)}"
        )


def measure(client: str, exe: str, a: argparse.Namespace, w: Workload, tokenizer: str, folder: Path) -> dict:
    """One client at one rate: its command run, its result file read, the CSV row."""
    url = f"http://127.0.0.1:{a.port}"
    command, result = client_command(client, exe, url, tokenizer, w, str(folder))
    run_client(command, folder / f"{client}-rate{w.rate:g}.log", time_limit_s=a.duration + 900)
    point = READERS[client](Path(result))
    shown = [part.replace(str(folder), RESULTS_TOKEN) for part in command]
    shown[0] = f"{CLIENT_VENV}/bin/{client}" if a.client_venv == CLIENT_VENV else exe
    row = {"rate_req_per_s": f"{w.rate:g}", "load_average": f"{os.getloadavg()[0]:.2f}", "command": shlex.join(shown)}
    for name in LoadPoint.__slots__:
        value = getattr(point, name)
        row[name] = round(value, 3) if isinstance(value, float) else value
    print(
        f"{client:9s} {w.rate:g} req/s: {point.completed}/{point.num_requests} requests, {point.errors} errors, "
        f"{point.request_throughput:.2f} req/s, {point.output_tokens_per_s:.1f} output tokens/s, TTFT p50 "
        f"{point.ttft_p50_ms:.0f} ms p99 {point.ttft_p99_ms:.0f} ms, ITL p50 {point.itl_p50_ms:.0f} ms p99 "
        f"{point.itl_p99_ms:.0f} ms",
        flush=True,
    )
    return row


# --- the command --------------------------------------------------------------------------------------------------
def machine_line() -> str:
    from sim.drivers.bench_sim import machine

    m = machine()
    return f"{m['cpu']}, {os.cpu_count()} cores, {m['platform']}, python {m['python']}"


def header(a: argparse.Namespace, argv: list[str], load_before: float, total_s: float) -> list[str]:
    tokenizer = f"{a.client_venv}/{TOKENIZER_FOLDER}"
    return [
        f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        f"machine: {machine_line()}",
        f"server: {shlex.join(server_command(a))} (SmolLM2-135M float32, the engine at 1 torch thread, its "
        "default; the clients run on the same machine)",
        f"workload: synthetic prompts of {a.prompt_tokens} tokens, {a.output_tokens} output tokens (ignore_eos), "
        f"/v1/completions streamed, constant arrivals, round(rate x {a.duration:g} s) requests per rate; tokens "
        "as the server counts them (usage)",
        f"tokenizer: {tokenizer} (python tools/serve_bench.py --write-tokenizer {tokenizer}); in the commands, "
        f"{RESULTS_TOKEN} is the folder of the clients' own files (--results)",
        f"command: {shlex.join(['python', 'tools/serve_bench.py', *argv])}",
        f"load average before the run: {load_before:.2f} ({os.cpu_count()} cores; above 0.5: other work was "
        "running, and these numbers are that busy machine's)",
        f"total_s: {total_s:.0f}",
    ]


def bench(a: argparse.Namespace, argv: list[str], folder: Path) -> list[str]:
    exes = {client: client_exe(a.client_venv, client) for client in a.clients}
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    server = start_server(a, folder / "server.log")  # first: it converts the model if no process did yet
    rows = []
    try:
        tokenizer = str(write_tokenizer(Path(a.client_venv) / TOKENIZER_FOLDER))
        warm_up(a.port, a.prompt_tokens, a.output_tokens)
        for rate in a.rates:
            w = Workload(a.prompt_tokens, a.output_tokens, round(rate * a.duration), rate, a.seed)
            rows += [measure(client, exes[client], a, w, tokenizer, folder) for client in a.clients]
    finally:
        stop(server)
    comments = header(a, argv, load_before, time.monotonic() - started)
    write_csv(a.out, COLUMNS, rows, comments=comments, make_parents=True)
    return comments


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.write_tokenizer is not None:
        try:
            print(write_tokenizer(a.write_tokenizer))
        except (ValueError, OSError) as exc:
            parser.exit(2, f"error: {exc}\n")
        return 0
    try:
        check_args(a)
    except ValueError as exc:
        parser.error(str(exc))
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM ends the run as Ctrl-C: children stopped
    try:
        with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
            folder = Path(a.results).resolve() if a.results else Path(tmp)
            folder.mkdir(parents=True, exist_ok=True)
            comments = bench(a, argv, folder)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("error: interrupted (nothing written)", file=sys.stderr)
        return 130
    except ValueError as exc:  # a client's result file it could not read
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in comments[-2:]:
        print(line)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
