"""`make demo`'s stand-in for Slack and email: an HTTP server in the demo's process taking
apprise's json:// POSTs, keeping what arrived by channel."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOST = "127.0.0.1"


@dataclass
class Sink:
    """An HTTP server taking apprise's json:// POSTs; what arrived, by channel."""

    port: int = 0
    arrived: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> Sink:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    message = json.loads(body)
                except ValueError:
                    message = {}
                with sink.lock:
                    sink.arrived.append((time.monotonic(), self.path.strip("/"), message))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((HOST, self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def since(self, seen: int) -> list[tuple[float, str, dict[str, Any]]]:
        with self.lock:
            return self.arrived[seen:]
