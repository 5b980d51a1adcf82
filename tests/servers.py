"""Real local servers that catch notifications: an HTTP sink and an SMTP sink.

sink = HTTPSink().start()
sink.fail_with(500)             # answer 500 until sink.ok()
...send json:// to sink.json_url() ...
[req] = sink.wait_for(1)        # bounded wait, raises AssertionError on timeout
sink.stop(); sink.start()       # down for a while, then up again on the same port
smtp.stall()                    # take DATA, never answer: a server stalling mid-conversation
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import json
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar
from urllib.parse import quote

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

HOST = "127.0.0.1"

T = TypeVar("T")


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def _wait_for(items: Callable[[], list[T]], count: int, timeout: float, what: str) -> list[T]:
    deadline = time.monotonic() + timeout
    while True:
        got = items()
        if len(got) >= count:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"expected {count} {what} within {timeout}s, got {len(got)}")
        time.sleep(0.02)


@dataclass(frozen=True)
class Request:
    """One request the HTTP sink received, and the status it answered."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    status: int
    received_at: float = field(default_factory=time.monotonic)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog is 5: a busy test process that accepts late let a
    # subscriber's 8 sends at once overflow it, and the dropped SYN came back a second
    # later, out of order (the replay order test saw an event arrive far too late).
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (our timeout tests) resets the connection; that's expected.
        pass


class HTTPSink:
    """A real HTTP server on 127.0.0.1 recording every request, with switchable answers.

    Requests are recorded on arrival (before any delay), so `wait_for` sees an attempt
    even when the sink answers slowly or with an error.
    """

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self._lock = threading.Lock()
        self._requests: list[Request] = []
        self._status = 200
        self._delay = 0.0
        self._in_flight = 0
        self.max_in_flight = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._gate = threading.Event()  # cleared by hold(): answers wait for release()
        self._gate.set()

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> HTTPSink:
        """Start serving; after a stop(), on the same port as before."""
        if self._server is not None:
            return self
        self._wake.clear()
        server = _Server((HOST, self.port), self._handler_class())
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening (connections are refused) and cut short any delayed answers."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._wake.set()
        self._gate.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        self._server = self._thread = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def __enter__(self) -> HTTPSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- behaviour -------------------------------------------------------------

    def fail_with(self, status: int) -> None:
        """Answer every following request with this status."""
        with self._lock:
            self._status = status

    def delay(self, seconds: float) -> None:
        """Wait this long before answering each following request."""
        with self._lock:
            self._delay = seconds

    def hold(self) -> None:
        """Keep each following request's answer back until release() (or stop())."""
        self._gate.clear()

    def release(self) -> None:
        """Answer the held requests, and the following ones at once again."""
        self._gate.set()

    def ok(self) -> None:
        """Answer 200 at once again."""
        with self._lock:
            self._status = 200
            self._delay = 0.0

    # -- results ---------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def clear(self) -> None:
        with self._lock:
            self._requests.clear()
            self.max_in_flight = 0

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Request]:
        """Wait until at least count requests arrived; return them all."""
        return _wait_for(lambda: self.requests, count, timeout, "requests")

    # -- apprise URLs ----------------------------------------------------------

    def json_url(self, path: str = "/notify") -> str:
        """An apprise URL that POSTs {"title", "message", ...} JSON to path."""
        return f"json://{HOST}:{self.port}/{path.lstrip('/')}"

    def mattermost_url(self, token: str = "abc") -> str:
        """An apprise URL that POSTs a Slack-style {"text": ...} to /hooks/<token>."""
        return f"mmost://{HOST}:{self.port}/{token}"

    # -- the handler -----------------------------------------------------------

    def _record(self, req: Request) -> None:
        with self._lock:
            self._requests.append(req)

    def _enter(self) -> tuple[int, float]:
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            return self._status, self._delay

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                status, delay = sink._enter()
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    body = self.rfile.read(length) if length else b""
                    try:
                        parsed = json.loads(body) if body else None
                    except ValueError:
                        parsed = None
                    sink._record(
                        Request(
                            method=self.command,
                            path=self.path,
                            headers=dict(self.headers.items()),
                            body=body,
                            json=parsed,
                            status=status,
                        )
                    )
                    if delay:
                        sink._wake.wait(delay)
                    sink._gate.wait()
                    answer = b"ok" if status < 400 else b"error"
                    self.send_response(status)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                finally:
                    sink._leave()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


@dataclass(frozen=True)
class Mail:
    """One message the SMTP sink accepted."""

    subject: str
    from_: str
    to: list[str]
    body: str
    message: EmailMessage
    envelope_from: str
    envelope_to: list[str]

    def parts(self) -> dict[str, list[str]]:
        """The text parts by subtype, lines ending in LF: {"plain": [...], "html": [...]}."""
        found: dict[str, list[str]] = {"plain": [], "html": []}
        for part in self.message.walk():
            if part.get_content_maintype() == "text":
                assert isinstance(part, EmailMessage)
                content = part.get_content().replace("\r\n", "\n")
                found.setdefault(part.get_content_subtype(), []).append(content)
        return found


class _MailHandler:
    def __init__(self, sink: SMTPSink) -> None:
        self.sink = sink

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        self.sink._data_started()
        while self.sink.stalled:  # mid-conversation: the message is in, no answer comes
            await asyncio.sleep(0.05)
        raw = envelope.original_content or envelope.content or b""
        data = raw if isinstance(raw, bytes) else raw.encode()
        msg = email.message_from_bytes(data, policy=email.policy.default)
        assert isinstance(msg, EmailMessage)
        part = msg.get_body(preferencelist=("plain", "html"))
        body = part.get_content() if part is not None else ""
        self.sink._record(
            Mail(
                subject=str(msg.get("Subject", "")),
                from_=str(msg.get("From", "")),
                to=[a.strip() for a in str(msg.get("To", "")).split(",") if a.strip()],
                body=str(body),
                message=msg,
                envelope_from=envelope.mail_from or "",
                envelope_to=list(envelope.rcpt_tos),
            )
        )
        return "250 Message accepted for delivery"


class SMTPSink:
    """A real SMTP server (aiosmtpd) on 127.0.0.1 collecting parsed messages.

    AUTH is offered over plain text and optional: `user`/`password` log in,
    anything else is refused. `logins` lists the user names that logged in.
    """

    user = "receiver"
    password = "smtp-S3cret-pw"

    def __init__(self, port: int = 0) -> None:
        self.port = port or free_port()
        self._lock = threading.Lock()
        self._messages: list[Mail] = []
        self.logins: list[str] = []
        self._controller: Controller | None = None
        self.stalled = False
        self.data_started = 0  # messages whose DATA began, answered or not

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        if isinstance(data, LoginPassword):
            login, password = data.login.decode(), data.password.decode()
            if login == self.user and password == self.password:
                with self._lock:
                    self.logins.append(login)
                return AuthResult(success=True)
        return AuthResult(success=False, handled=False)

    def start(self) -> SMTPSink:
        if self._controller is None:
            self._controller = Controller(
                _MailHandler(self),
                hostname=HOST,
                port=self.port,
                authenticator=self._authenticate,
                auth_require_tls=False,
            )
            self._controller.start()
        return self

    def stop(self) -> None:
        self.stalled = False  # let a stalled conversation end, so the controller can stop
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def __enter__(self) -> SMTPSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stall(self, on: bool = True) -> None:
        """Take each following message's DATA and never answer it (until stall(False))."""
        self.stalled = on

    def _data_started(self) -> None:
        with self._lock:
            self.data_started += 1

    def _record(self, mail: Mail) -> None:
        with self._lock:
            self._messages.append(mail)

    @property
    def messages(self) -> list[Mail]:
        with self._lock:
            return list(self._messages)

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Mail]:
        """Wait until at least count messages arrived; return them all."""
        return _wait_for(lambda: self.messages, count, timeout, "messages")

    def mailto_url(
        self,
        to: str | Sequence[str] = "team@example.com",
        *,
        sender: str = "receiver@example.com",
        login: bool = True,
    ) -> str:
        """An apprise URL delivering over plain SMTP (no TLS) to this sink.

        With login, the URL carries `user:password@` and apprise logs in (AUTH PLAIN/LOGIN).
        """
        targets = [to] if isinstance(to, str) else list(to)
        auth = f"{quote(self.user, safe='')}:{quote(self.password, safe='')}@" if login else ""
        return (
            f"mailto://{auth}{HOST}:{self.port}/"
            f"?mode=insecure&from={quote(sender)}&to={quote(','.join(targets))}"
        )


class EndlessAnswer:
    """A real local HTTP server answering every POST with status and a body of `size`
    bytes (300 MB by default), written 64 KB at a time until the client hangs up; counts
    in `written` what it managed to write. For the caps on what we read from a target."""

    def __init__(self, status: int = 200, size: int = 300 * 2**20) -> None:
        self.written = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(status)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                chunk = b"x" * 65536 if size > 4096 else b"boom\n  went the subscriber"
                try:
                    while outer.written < size:
                        self.wfile.write(chunk)
                        outer.written += len(chunk)
                except OSError:
                    pass  # the client hung up: what the tests want

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{HOST}:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> EndlessAnswer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
