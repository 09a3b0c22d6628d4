"""Running the app: on this process's main thread until Ctrl-C or SIGTERM (`run_server`), or on a thread of its own
(`serve_in_thread`, for tests, notebooks and tools); and how it stops.

Stopping, whichever way it is asked (a signal, `server.should_exit = True`):
  1. the listening socket closes (uvicorn) and new requests get a 503;
  2. every open response ends at once: a stream with OpenAI's error object as an event, then `data: [DONE]`
     (completions and the pool page's /pool/events alike); a whole response with a 503 (OpenStreams.close_all);
  3. the engine's thread ends its step in progress, aborts every request still open (their blocks back in the pool)
     and stops;
  4. `run_server` returns the shell's status for the signal: 130 for Ctrl-C (SIGINT), 143 for SIGTERM.
No generation waits for the streams to finish, so stopping takes about as long as one engine step.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time

GRACE_S = 5.0  # after the streams were ended, how long uvicorn waits for their connections before cancelling them


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server that ends the app's open responses as it starts shutting down, and leaves the caught
        signal for run_server to turn into an exit status (uvicorn re-raises it after its shutdown)."""

        def __init__(self, config, app) -> None:
            super().__init__(config)
            self.app, self.stopped_by = app, None

        def handle_exit(self, sig: int, frame) -> None:  # (uvicorn's signal handler)
            if self.stopped_by is None:
                self.stopped_by = sig
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets=None) -> None:
            why = "the server is shutting down" + (f" ({signal.Signals(self.stopped_by).name})" if self.stopped_by
                                                    else "")
            self.app.state.begin_shutdown(f"{why}: the request was aborted")
            await super().shutdown(sockets)

        @contextlib.contextmanager
        def capture_signals(self):
            # NOTE: uvicorn's own also re-raises the signal once the server has stopped; this one only installs the
            # handlers (and puts the old ones back): run_server returns the status itself
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server


def serve_in_thread(llm, model_name: str, host: str = "127.0.0.1", port: int = 0, on_finished=None):
    """The server on a thread of this process (a free port by default), started: (the server, its base URL).
    `server.should_exit = True` stops it as a signal would (open responses ended, requests aborted). `on_finished` as
    make_app's."""
    import uvicorn

    from reference.server.app import make_app

    app = make_app(llm, model_name, on_finished)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=GRACE_S)
    server = _server_class()(config, app)
    thread = threading.Thread(target=server.run, name="server", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    return server, f"http://{host}:{server.servers[0].sockets[0].getsockname()[1]}"


def run_server(llm, model_name: str, host: str, port: int) -> int:
    """Serve until Ctrl-C or SIGTERM; the exit status: 0, or 128 + the signal (130, 143)."""
    import uvicorn

    from reference.server.app import make_app

    app = make_app(llm, model_name)
    config = uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=GRACE_S)
    server = _server_class()(config, app)
    server.run()
    if server.stopped_by is None:
        return 0
    snap, aborted = app.state.metrics.snapshot, app.state.metrics.finished["abort"]
    logging.getLogger("uvicorn.error").info(
        "Stopped by %s: open requests aborted, their streams ended with an error event and [DONE] (requests aborted "
        "since the start: %d); KV blocks still in use: %d of %d", signal.Signals(server.stopped_by).name, aborted,
        snap.num_blocks - snap.num_free_blocks, snap.num_blocks)
    return 128 + server.stopped_by
