"""How `python -m reference serve` stops (reference/server/run.py): the command run as a user runs it, in a process of
its own, stopped by Ctrl-C (SIGINT) or SIGTERM while streams are open.

What must hold: every open stream, completions, chat and the pool page's /pool/events alike, ends with OpenAI's error
object as an event and then `data: [DONE]` (never a cut connection); a whole response still waited for gets a 503
error object; the engine's requests are aborted (the log's last line: no KV block still in use); the process exits
with the shell's status for the signal, 130 or 143, and writes no traceback. The time limits below only say "it
ended": they are generous, for a busy machine.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

ENDED_WITHIN_S = 60.0  # generous: only "it ended"


class Served:
    """`python -m reference serve --port 0` in a process of its own; its stderr (uvicorn's log) collected."""

    def __init__(self, *flags: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reference", "serve", "--port", "0", *flags],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log: list[str] = []
        started = threading.Event()
        self.base = None

        def read() -> None:
            for line in self.proc.stderr:
                self.log.append(line)
                found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
                if found and self.base is None:
                    self.base = f"http://127.0.0.1:{found.group(1)}"
                    started.set()
            started.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        assert started.wait(180) and self.base, "".join(self.log)

    def stop(self, sig: int) -> tuple[int, float]:
        """Send `sig`; (the exit status, seconds until the process ended)."""
        start = time.monotonic()
        self.proc.send_signal(sig)
        status = self.proc.wait(ENDED_WITHIN_S)
        self.reader.join(10)
        return status, time.monotonic() - start

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Stream(threading.Thread):
    """One open event stream, read to its end: its data lines, whether its connection ended cleanly, and when."""

    def __init__(self, base: str, path: str, body: dict | None = None) -> None:
        super().__init__(daemon=True)
        self.base, self.path, self.body = base, path, body
        self.data: list[str] = []
        self.failure: str | None = None
        self.ended_at: float | None = None
        self.started = threading.Event()

    def run(self) -> None:
        method = "GET" if self.body is None else "POST"
        try:
            with httpx.stream(method, self.base + self.path, json=self.body, timeout=ENDED_WITHIN_S) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.data.append(line[6:])
                        self.started.set()
        except httpx.HTTPError as exc:  # a connection cut mid-stream: what must not happen
            self.failure = f"{type(exc).__name__}: {exc}"
        self.ended_at = time.monotonic()
        self.started.set()


LONG = {"max_tokens": 2000, "ignore_eos": True, "temperature": 0, "stream": True}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_every_open_stream_with_an_error_event_and_done(sig):
    served = Served("--num-gpu-blocks", "512")
    try:
        base = served.base
        pool = Stream(base, "/pool/events")
        pool.start()
        streams = [Stream(base, "/v1/completions", {"prompt": f"Count to a thousand, {i}:", **LONG}) for i in range(2)]
        streams.append(
            Stream(
                base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell a long story."}], **LONG}
            )
        )
        for s in streams:
            s.start()
        for s in [*streams, pool]:
            assert s.started.wait(120) and s.data, (s.path, s.failure, "".join(served.log))
        whole: dict = {}
        essay = {"prompt": "Write an essay:", **LONG, "stream": False}
        waiting = threading.Thread(
            target=lambda: whole.update(r=httpx.post(base + "/v1/completions", json=essay, timeout=ENDED_WITHIN_S)),
            daemon=True,
        )
        waiting.start()
        time.sleep(1.0)  # (the whole response is queued and running)
        signalled = time.monotonic()
        status, seconds = served.stop(sig)
        assert status == 128 + sig, "".join(served.log)
        for s in [*streams, pool]:
            s.join(ENDED_WITHIN_S)
            assert s.failure is None, (s.path, s.failure)
            assert s.data[-1] == "[DONE]", (s.path, s.data[-3:])
            error = json.loads(s.data[-2])["error"]
            assert error["code"] == 503 and "shutting down" in error["message"], (s.path, error)
            print(f"{s.path}: ended {s.ended_at - signalled:.2f} s after {signal.Signals(sig).name}")
        waiting.join(ENDED_WITHIN_S)
        assert whole["r"].status_code == 503 and "shutting down" in whole["r"].json()["error"]["message"]
        log = "".join(served.log)
        assert "Traceback" not in log, log
        in_use = re.search(r"KV blocks still in use: (\d+) of (\d+)", log)
        assert in_use and in_use.group(1) == "0" and in_use.group(2) == "512", log
        assert f"Stopped by {signal.Signals(sig).name}" in log, log
        print(f"process ended {seconds:.2f} s after {signal.Signals(sig).name}")
    finally:
        served.kill()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_idle_server_stops_with_the_shells_status(sig):
    served = Served("--num-gpu-blocks", "64")
    try:
        assert httpx.get(served.base + "/health").status_code == 200
        status, seconds = served.stop(sig)
        log = "".join(served.log)
        assert status == 128 + sig and "Traceback" not in log, log
        assert "KV blocks still in use: 0 of 64" in log, log
        print(f"idle: ended {seconds:.2f} s after {signal.Signals(sig).name}")
    finally:
        served.kill()
