"""uvicorn's httptools protocol with the two guards it lacks: a header deadline and a header cap.

uvicorn (0.29 to at least 0.54) has no timeout for reading a request's headers
(its keep-alive timer runs only between requests, and not at all before the
first one), and under httptools no limit on their size either: a client may
trickle headers for ever, or send 20 MB of them, and each connection holds a
slot and memory (slowloris). `--limit-concurrency` bounds how many such
connections there are, but then they crowd out honest senders. So each
connection here must finish a request's headers within `header_timeout`
seconds of its first byte (or of connecting), in at most `max_header_bytes`
bytes, or it is answered 408 / 431 and closed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEADER_BYTES = 16384  # as h11, uvicorn's other parser


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    header_timeout: float = 10.0
    max_header_bytes: int = MAX_HEADER_BYTES

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_bytes = 0
        self._in_headers = True
        self._deadline: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        reading_headers = self._in_headers
        super().data_received(data)
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
        self._arm()

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self._in_headers and not self.transport.is_closing():
            self._refuse(
                408,
                "header_timeout",
                f"request headers not received within {self.header_timeout:g}s",
            )

    def _refuse(self, status: int, code: str, message: str) -> None:
        self._disarm()
        reason = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}[status]
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, reason, len(body), body)
        )
        self.transport.close()


def guarded_protocol(*, header_timeout: float, max_header_bytes: int = MAX_HEADER_BYTES) -> Any:
    """A GuardedHttpToolsProtocol class with these limits, for uvicorn.Config(http=...)."""
    return type(
        "GuardedHttpToolsProtocol",
        (GuardedHttpToolsProtocol,),
        {"header_timeout": header_timeout, "max_header_bytes": max_header_bytes},
    )
