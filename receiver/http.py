"""uvicorn's httptools protocol with the guards it lacks: header and body deadlines, a header cap.

uvicorn (0.29 to at least 0.54) has no timeout for reading a request's headers
(its keep-alive timer runs only between requests, and not at all before the
first one), and under httptools no limit on their size either: a client may
trickle headers for ever, or send 20 MB of them, and each connection holds a
slot and memory (slowloris). `--limit-concurrency` bounds how many such
connections there are, but then they crowd out honest senders. So each
connection here must finish a request's headers within `header_timeout`
seconds of its first byte (or of connecting), in at most `max_header_bytes`
bytes, or it is answered 408 / 431 and closed. A body must then arrive within
`body_timeout` seconds of the headers (408 and closed): a deadline kept here
rather than around each request's read in the app, where it cost a timer a
request; here a timer is armed only while a body is actually late.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("receiver.http")

MAX_HEADER_BYTES = 16384  # as h11, uvicorn's other parser
_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    max_header_bytes: int = MAX_HEADER_BYTES
    # Told the error code of each request refused here (for the rejected-requests metric).
    on_refused: Callable[[str], None] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_bytes = 0
        self._in_headers = True
        self._in_body = False
        self._deadline: asyncio.TimerHandle | None = None
        self._arm(self.header_timeout)

    def data_received(self, data: bytes) -> None:
        reading_headers = self._in_headers
        super().data_received(data)
        if self._in_body and self._deadline is None and not self.transport.is_closing():
            # The headers are in and the body is not (yet): from now on it has body_timeout.
            self._arm(self.body_timeout)
        if reading_headers and self._in_headers and not self.transport.is_closing():
            # Still inside the header block after this chunk: every byte so far is header.
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes:
                self._refuse(
                    431,
                    "headers_too_large",
                    f"request headers exceed {self.max_header_bytes} bytes",
                )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers, self._header_bytes = True, 0
        self._arm(self.header_timeout)

    def on_headers_complete(self) -> None:
        self._in_headers, self._in_body = False, True
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_body = False
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._in_headers:
            self._refuse(
                408,
                "header_timeout",
                f"request headers not received within {self.header_timeout:g}s",
            )
        elif self._in_body:
            self._refuse(
                408,
                "body_timeout",
                f"request body not received within {self.body_timeout:g}s; send it at once",
            )

    def _refuse(self, status: int, code: str, message: str) -> None:
        self._disarm()
        client = self.client[0] if self.client else "-"
        log.warning("rejected %s from %s: %s", code, client, message, extra={"code": code})
        if self.on_refused is not None:
            self.on_refused(code)
        reason = _REASONS[status]
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, reason, len(body), body)
        )
        self.transport.close()


def guarded_protocol(
    *,
    header_timeout: float,
    body_timeout: float,
    max_header_bytes: int = MAX_HEADER_BYTES,
    on_refused: Callable[[str], None] | None = None,
) -> Any:
    """A GuardedHttpToolsProtocol class with these limits, for uvicorn.Config(http=...)."""
    return type(
        "GuardedHttpToolsProtocol",
        (GuardedHttpToolsProtocol,),
        {
            "header_timeout": header_timeout,
            "body_timeout": body_timeout,
            "max_header_bytes": max_header_bytes,
            "on_refused": staticmethod(on_refused) if on_refused else None,
        },
    )


# Past the grace by this much, shutdown is stuck (a bug): the watchdog ends the process.
WATCHDOG_SLACK = 2.0


class Server(uvicorn.Server):
    """uvicorn's server with a bounded shutdown.

    The first SIGTERM or SIGINT starts the clock: on_stopping(time.monotonic()) tells
    the app, which fits its own shutdown in what is left of grace after uvicorn has
    finished the requests in flight (config.timeout_graceful_shutdown bounds those). If
    the process is still alive WATCHDOG_SLACK seconds past the grace, a watchdog thread
    logs it and exits with status 1: a supervisor's restart must never hang on us.
    """

    def __init__(
        self, config: uvicorn.Config, *, grace: float, on_stopping: Callable[[float], None]
    ) -> None:
        super().__init__(config)
        self.grace = grace
        self.on_stopping = on_stopping
        self.stopping_since: float | None = None

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn re-raises the stopping signal once it has shut down, under the handlers
        # it found in place; with these, a clean stop ends the process with status 0.
        found = {sig: signal.signal(sig, _ignore) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            super().run(sockets)
        finally:
            for sig, handler in found.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
            self.on_stopping(self.stopping_since)
            watchdog = threading.Timer(self.grace + WATCHDOG_SLACK, self._overrun)
            watchdog.daemon = True
            watchdog.start()
        super().handle_exit(sig, frame)

    def _overrun(self) -> None:
        log.critical(
            "shutdown did not finish within %gs of the signal; exiting now", self.grace
        )
        logging.shutdown()
        os._exit(1)


def _ignore(sig: int, frame: FrameType | None) -> None:
    pass
