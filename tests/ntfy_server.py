"""An ntfy stand-in: a real local HTTP server that answers as ntfy's docs say, recording
what it got, and a phone that shows its notifications and presses their buttons.

It follows ntfy's docs/publish.md: "Publish as JSON" (POST or PUT a JSON object to the
server root: topic required, title, message, priority 1-5, tags, click, up to three
actions), "Action buttons" (`view`: label and url; `http`: label, url, method POST by
default, headers, body, clear), and "Updating + deleting notifications" (2.16+: a message's
`sequence_id`, letters, digits, - and _, at most 64, puts it in a sequence whose later
messages replace it; `PUT /<topic>/<sequence_id>/clear` marks it read and dismisses it;
`DELETE /<topic>/<sequence_id>` deletes it), and "Authentication" (Basic or Bearer). An
answer is the message as ntfy returns it (id, time, event "message", ...), an error ntfy's
shape ({"code", "http", "error"}).

    ntfy = NtfyStandIn(token="tk_abc").start()
    ... publish to ntfy.url("alerts") ...
    [shown] = ntfy.phone()                 # the notifications a phone shows now
    status = ntfy.press(shown, "Ack")      # POST the button's url as the phone does
    ntfy.stop()

version="2.15" is a server before sequence ids: it ignores `sequence_id` (each message is a
notification of its own) and has no clear endpoint (404).
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx

from tests.servers import HOST, _Server, _wait_for

ID = re.compile(r"[-_A-Za-z0-9]{1,64}")
ACTIONS = {"view": ("label", "url"), "http": ("label", "url"), "broadcast": ("label",)}


@dataclass
class Published:
    """One message the stand-in took: the JSON it got, the headers, and what it made of it."""

    json: dict[str, Any]
    headers: dict[str, str]
    id: str
    sequence_id: str | None  # the sequence it belongs to (None on a server before 2.16)


@dataclass
class Shown:
    """A notification on the phone: the newest message of its sequence."""

    key: str
    message: dict[str, Any]
    cleared: bool = False
    messages: list[dict[str, Any]] = field(default_factory=list)


class NtfyStandIn:
    """A real ntfy-like server on 127.0.0.1 (see the module); thread-safe."""

    def __init__(
        self,
        *,
        version: str = "2.16",
        token: str | None = None,
        user: tuple[str, str] | None = None,
    ) -> None:
        self.version = version
        self.sequences = tuple(int(p) for p in version.split(".")) >= (2, 16)
        self._auth = {f"Bearer {token}"} if token else set()
        if user is not None:
            pair = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
            self._auth.add(f"Basic {pair}")
        self._lock = threading.Lock()
        self.published: list[Published] = []
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # method, path, headers
        self.cleared: list[tuple[str, str]] = []  # (topic, sequence id)
        self._shown: dict[str, Shown] = {}
        self._fail: tuple[int, str | None] | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> NtfyStandIn:
        server = _Server((HOST, 0), self._handler())
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = self._thread = None

    def __enter__(self) -> NtfyStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def url(self, topic: str, scheme: str = "ntfy", query: str = "", auth: str = "") -> str:
        """A notifier URL of this server (apprise's syntax)."""
        return f"{scheme}://{auth}{HOST}:{self.port}/{topic}" + (f"?{query}" if query else "")

    def fail_with(self, status: int | None, retry_after: str | None = None) -> None:
        """Answer every request with status (None: answer normally again)."""
        with self._lock:
            self._fail = None if status is None else (status, retry_after)

    # -- what it got -----------------------------------------------------------------------

    def wait_published(self, count: int, timeout: float = 30.0) -> list[Published]:
        return _wait_for(lambda: list(self.published), count, timeout, "ntfy messages")

    def phone(self, *, cleared: bool = False) -> list[Shown]:
        """The notifications a subscribed phone shows now, oldest first (cleared ones
        too when asked)."""
        with self._lock:
            return [s for s in self._shown.values() if cleared or not s.cleared]

    def press(self, shown: Shown | dict[str, Any], label: str) -> httpx.Response:
        """Tap a notification's button as the ntfy app does: an `http` action's request
        (its method, headers and body; POST with an empty body by default), from the
        phone (no cookie, no CSRF token); with clear: true, a 2xx dismisses it."""
        message = shown.message if isinstance(shown, Shown) else shown
        [action] = [a for a in message.get("actions", []) if a["label"] == label]
        assert action["action"] == "http", action
        answer = httpx.request(
            action.get("method", "POST"),
            action["url"],
            headers={"User-Agent": "ntfy/1.22.0 (Android)", **action.get("headers", {})},
            content=action.get("body", "").encode(),
            timeout=30,
        )
        if action.get("clear") and 200 <= answer.status_code < 300:
            with self._lock:
                for s in self._shown.values():
                    if s.message is message:
                        s.cleared = True
        return answer

    # -- ntfy's API ------------------------------------------------------------------------

    def _publish(self, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        try:
            got = json.loads(body)
        except ValueError:
            return _error(400, 40001, "invalid request: body must be JSON")
        problem = _invalid(got)
        if problem is not None:
            return _error(400, 40001, f"invalid request: {problem}")
        message_id = secrets.token_hex(6)
        sequence = got.get("sequence_id") if self.sequences else None
        key = sequence or message_id
        answer = {
            "id": message_id,
            "time": int(time.time()),
            "event": "message",
            **{k: v for k, v in got.items() if k != "sequence_id" or self.sequences},
        }
        if self.sequences:
            answer["sequence_id"] = key
        with self._lock:
            self.published.append(Published(got, headers, message_id, sequence))
            shown = self._shown.get(key)
            if shown is None:
                self._shown[key] = Shown(key, got, messages=[got])
            else:  # the same sequence: the notification is replaced (and shown again)
                shown.message, shown.cleared = got, False
                shown.messages.append(got)
        return 200, answer

    def _clear(self, topic: str, sequence: str) -> tuple[int, dict[str, Any]]:
        if not self.sequences:
            return _error(404, 40401, "page not found")
        with self._lock:
            self.cleared.append((topic, sequence))
            if sequence in self._shown:
                self._shown[sequence].cleared = True
        return 200, {"id": secrets.token_hex(6), "event": "message_clear", "topic": topic,
                     "sequence_id": sequence}  # fmt: skip

    def _answer(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Any:
        with self._lock:
            self.requests.append((method, path, headers))
            fail = self._fail
        if fail is not None:
            return (*_error(fail[0], fail[0] * 100, "failing on purpose"), fail[1])
        if self._auth and headers.get("Authorization") not in self._auth:
            return (*_error(401, 40101, "unauthorized"), None)
        parts = [p for p in path.split("?")[0].split("/") if p]
        if method in ("POST", "PUT") and not parts:
            return (*self._publish(body, headers), None)
        if method == "PUT" and len(parts) == 3 and parts[2] == "clear":
            return (*self._clear(parts[0], parts[1]), None)
        return (*_error(404, 40401, "page not found"), None)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = dict(self.headers.items())
                status, answer, retry_after = server._answer(self.command, self.path, body, headers)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def _error(status: int, code: int, error: str) -> tuple[int, dict[str, Any]]:
    return status, {"code": code, "http": status, "error": error}


def _invalid(got: Any) -> str | None:
    """What is wrong with a JSON publish, as ntfy's docs define its fields; None if fine."""
    if not isinstance(got, dict):
        return "not a JSON object"
    topic = got.get("topic")
    if not isinstance(topic, str) or not ID.fullmatch(topic):
        return "topic missing or invalid"
    if "priority" in got and got["priority"] not in (1, 2, 3, 4, 5):
        return "priority must be 1 to 5"
    if not isinstance(got.get("tags", []), list):
        return "tags must be a list"
    if "sequence_id" in got and not ID.fullmatch(str(got["sequence_id"])):
        return "invalid sequence ID"
    actions = got.get("actions", [])
    if not isinstance(actions, list) or len(actions) > 3:
        return "at most 3 actions"
    for action in actions:
        need = ACTIONS.get(action.get("action"))
        if need is None or any(not action.get(k) for k in need):
            return f"invalid action {action!r}"
        if action["action"] in ("view", "http") and not str(action["url"]).startswith("http"):
            return "action url must be http(s)"
    return None
