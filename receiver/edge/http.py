"""uvicorn's httptools protocol with the guards it lacks: header and body deadlines, a header cap,
and JSON for every error it answers itself.

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

uvicorn also answers some requests before any app sees them, in text/plain: a
request its parser refuses (400) and one past `limit_concurrency` (503). Here
both are the receiver's JSON errors (`invalid_request`, `overloaded`), counted
through `on_refused` like the refusals above. Websocket upgrades are not
offered (the receiver has no websocket routes): such a request is answered as
plain HTTP, by the app, instead of uvicorn's empty 403.
"""

from __future__ import annotations

import asyncio
import http
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

import httptools
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from receiver.errors import (
    BodyTimeoutError,
    HeadersTooLargeError,
    HeaderTimeoutError,
    InvalidRequestError,
    OverloadedError,
    RequestError,
)
from receiver.logs import LogLimiter

log = logging.getLogger("receiver.http")
_limited_log = LogLimiter(log)

MAX_HEADER_BYTES = 16384  # as h11, uvicorn's other parser
# What a refused sender is told to wait, in seconds, when the connection limit is reached.
OVERLOAD_RETRY_AFTER = 1


class _HeadersTooLarge(Exception):
    """Raised from a parser callback to stop httptools at once; never leaves this module."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    max_header_bytes: int = MAX_HEADER_BYTES
    # Told the error code of each request refused here (for the rejected-requests metric).
    on_refused: Callable[[str], None] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_bytes = 0  # bytes read while a header block stays unfinished
        self._head_size = 0  # the parsed size of this request's line and headers
        self._in_headers = True
        self._in_body = False
        self._deadline: asyncio.TimerHandle | None = None
        self._arm(self.header_timeout)

    def data_received(self, data: bytes) -> None:
        # uvicorn's own, but with the receiver's answers to what the parser refuses.
        reading_headers = self._in_headers
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # Answered as plain HTTP (on_headers_complete ran); nothing else to speak after.
            if self.cycle is not None:
                self.cycle.keep_alive = False
        except httptools.HttpParserError as exc:
            if self._head_size > self.max_header_bytes:  # _count_head stopped the parser
                self._refuse(self._too_large())
            else:
                reason = str(exc) or "unreadable"
                self._refuse(
                    InvalidRequestError(f"malformed HTTP request: {reason[:1].lower()}{reason[1:]}")
                )
            return
        if self._in_body and self._deadline is None and not self.transport.is_closing():
            # The headers are in and the body is not (yet): from now on it has body_timeout.
            self._arm(self.body_timeout)
        if reading_headers and self._in_headers and not self.transport.is_closing():
            # Still inside the header block after this read: every byte so far is header.
            # (The parser reports a header only once it is whole, so one header trickled
            # for ever is caught here, not in on_header.)
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes:
                self._refuse(self._too_large())

    def send_400_response(self, msg: str) -> None:
        # Not called by data_received above; kept JSON for any other caller in uvicorn.
        self._refuse(InvalidRequestError(f"malformed HTTP request: {msg.lower().rstrip('.')}"))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers, self._header_bytes, self._head_size = True, 0, 0
        self._arm(self.header_timeout)

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)  # "name: value\r\n"
        super().on_header(name, value)

    def _count_head(self, size: int) -> None:
        # However the bytes arrived (one read of 100 KB, or a trickle), the parsed head
        # counts. Raising stops the parser before the request reaches the app.
        self._head_size += size
        if self._head_size > self.max_header_bytes:
            raise _HeadersTooLarge

    def on_headers_complete(self) -> None:
        self._in_headers, self._in_body = False, True
        self._disarm()
        limit = self.limit_concurrency
        if limit is None or (len(self.connections) < limit and len(self.tasks) < limit):
            super().on_headers_complete()
            return
        # uvicorn's own check (the same test) would run its text/plain 503 app; have it
        # run ours instead. It still queues the answer behind a pipelined request.
        error = OverloadedError(
            f"too many connections and requests in progress (RECEIVER_LIMIT_CONCURRENCY"
            f" {limit}); retry in a moment"
        )
        self._note_refusal(error)
        app = self.app
        self.limit_concurrency, self.app = None, _answer(error, retry_after=OVERLOAD_RETRY_AFTER)
        try:
            super().on_headers_complete()
        finally:
            self.limit_concurrency, self.app = limit, app

    def on_message_complete(self) -> None:
        self._in_body = False
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _should_upgrade(self) -> bool:
        return False  # no websocket routes: an upgrade request is plain HTTP to the app

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
                HeaderTimeoutError(f"request headers not received within {self.header_timeout:g}s")
            )
        elif self._in_body:
            self._refuse(
                BodyTimeoutError(
                    f"request body not received within {self.body_timeout:g}s; send it at once"
                )
            )

    def _too_large(self) -> HeadersTooLargeError:
        limit = self.max_header_bytes
        return HeadersTooLargeError(f"request line and headers exceed {limit} bytes")

    def _note_refusal(self, error: RequestError) -> None:
        client = self.client[0] if self.client else "-"
        _limited_log.warning(  # a few lines a minute per reason and client, then a summary
            f"{error.code} rejections",
            client,
            "rejected %s from %s: %s",
            error.code,
            client,
            error.message,
            extra={"code": error.code},
        )
        if self.on_refused is not None:
            self.on_refused(error.code)

    def _refuse(self, error: RequestError) -> None:
        """Answer error at once, outside any request cycle, and close the connection."""
        self._disarm()
        self._note_refusal(error)
        reason = http.HTTPStatus(error.status).phrase.encode()
        body = json.dumps(error.to_dict()).encode()
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (error.status, reason, len(body), body)
        )
        self.transport.close()


def _answer(error: RequestError, *, retry_after: int | None = None) -> ASGIApp:
    """An ASGI app that answers every request with error, as JSON, and closes the connection."""
    body = json.dumps(error.to_dict()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        (b"connection", b"close"),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", b"%d" % retry_after))

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


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
        log.critical("shutdown did not finish within %gs of the signal; exiting now", self.grace)
        logging.shutdown()
        os._exit(1)


def _ignore(sig: int, frame: FrameType | None) -> None:
    pass
