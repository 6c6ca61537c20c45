"""The /metrics endpoint the load generator's stand-ins serve (a replayer's vLLM series, the dcgm-exporter stand-in),
beside the worker loops that keep what it renders current."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("gpuaas.loadgen")


class MetricsEndpoint:
    """127.0.0.1:`port`/metrics (0: a free port) answering `render()` at every scrape, on its own thread."""

    def __init__(self, render: Callable[[], str], *, name: str, port: int = 0):
        self.name = name

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # http.server's name for the GET handler
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is served")
                    return
                body = render().encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    log.warning("%s: the scraper hung up before /metrics was sent (its scrape timeout)", name)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def start(self, *loops: Callable[[], None]) -> None:
        """Serve, and run each of `loops` on a daemon thread of its own (they return when their owner stops)."""
        for target in (self.server.serve_forever, *loops):
            th = threading.Thread(target=target, daemon=True, name=f"{self.name}-{target.__name__}")
            th.start()
            self._threads.append(th)

    def stop(self) -> None:
        """Stop serving and wait for the threads (the owner has told its loops to return)."""
        if self._threads:  # shutdown() waits for serve_forever, which an endpoint never started does not run
            self.server.shutdown()
        self.server.server_close()
        for th in self._threads:
            th.join(timeout=5)
