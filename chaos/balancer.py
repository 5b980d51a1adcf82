"""A plain load balancer in front of the replicas, for the replica scenario.

    lb = Balancer(["http://127.0.0.1:4001", "http://127.0.0.1:4002"]).start()
    ...point the sender at lb.url...
    lb.stop()

Round-robin per request. A replica that refuses the connection, or drops it
without an answer (killed mid-request), is skipped: the request goes to the next
one, as nginx's `proxy_next_upstream error` does. Any answer a replica gives,
503 included, goes back to the sender as it is; the sender retries on its own
schedule. Every answer is recorded with the replica that gave it, so a scenario
can count how the load was spread and what the replicas said during a fault.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from tests.servers import HOST

FORWARDED = ("content-type", "x-service-signature")


@dataclass(frozen=True)
class Answer:
    """One try of one request on one replica: its status and error code, or why none."""

    at: float  # time.monotonic()
    replica: int
    status: int | None  # None: refused or dropped, tried on the next replica
    code: str | None  # the error code of a JSON error body; "refused", "dropped"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a sender that gave up (its timeout) resets the connection; expected


class Balancer:
    """Forwards every request to one of `upstreams` (base URLs), round-robin."""

    def __init__(self, upstreams: list[str], *, timeout: float = 15.0) -> None:
        self.upstreams = upstreams
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._next = itertools.count()
        self._client = httpx.Client(
            timeout=timeout, limits=httpx.Limits(max_connections=100, max_keepalive_connections=40)
        )
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def start(self) -> Balancer:
        self._server = _Server((HOST, 0), self._handler_class())
        self.url = f"http://{HOST}:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
        self._server = self._thread = None
        self._client.close()

    def forward(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Any:
        """(status, content type, body) from the first replica that answers."""
        first = next(self._next)
        for n in range(len(self.upstreams)):
            replica = (first + n) % len(self.upstreams)
            try:
                response = self._client.request(
                    method, self.upstreams[replica] + path, content=body, headers=headers
                )
            except httpx.TimeoutException:
                self._record(replica, 504, "timeout")
                return 504, "application/json", _error("gateway_timeout", "replica timed out")
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                # Refused: nothing sent. Dropped: maybe stored, and the next replica answers
                # 200 duplicate then; either way the event is safe to send again.
                why = "refused" if isinstance(exc, httpx.ConnectError) else "dropped"
                self._record(replica, None, why)
                continue
            self._record(replica, response.status_code, error_code(response))
            kind = response.headers.get("content-type", "application/json")
            return response.status_code, kind, response.content
        return 502, "application/json", _error("bad_gateway", "no replica answered")

    def statuses(self, since: float = float("-inf"), until: float = float("inf")) -> Counter[str]:
        """ "<status> <code>" (or "refused" / "dropped") -> how many, within a time span."""
        with self._lock:
            answers = list(self.answers)
        return Counter(
            f"{a.status} {a.code}".strip() if a.status is not None else str(a.code)
            for a in answers
            if since <= a.at <= until
        )

    def per_replica(self) -> Counter[int]:
        """Requests each replica answered (any status)."""
        with self._lock:
            return Counter(a.replica for a in self.answers if a.status is not None)

    def _record(self, replica: int, status: int | None, code: str | None) -> None:
        with self._lock:
            self.answers.append(Answer(time.monotonic(), replica, status, code))

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        balancer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _proxy(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() in FORWARDED}
                status, kind, content = balancer.forward(self.command, self.path, body, headers)
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = _proxy

        return Handler


def error_code(response: httpx.Response) -> str | None:
    """The error code of a refusal (JSON error body), None for a success or another body."""
    if response.status_code < 400:
        return None
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


def _error(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()
