"""A stand-in for Slack's Web API and its button clicks, for the tests and `make demo`.

A real HTTP server on loopback answering the methods the Slack app channel calls, the way
Slack's reference pages show them (docs.slack.dev/reference/methods): `chat.postMessage`,
`chat.update`, `auth.test` and `conversations.info`. Every answer is HTTP 200 with
`{"ok": true, ...}` or `{"ok": false, "error": "..."}`; a token it does not know is
`invalid_auth`, none is `not_authed`, a scope the token lacks is `missing_scope` (with
`needed` and `provided`), and the token's scopes are in the `X-OAuth-Scopes` header. A
channel is known by id or by name (`#alerts`); a post to one the bot has not joined is
`not_in_channel`; fail["chat.postMessage"] = "ratelimited" answers HTTP 429 with
Retry-After, as Slack's rate limits do. It keeps every message (and its thread replies)
and records every call.

    api = SlackAPI(token="xoxb-test").start()    # RECEIVER_SLACK_API_URL=api.url
    ...
    [message] = api.messages()                    # what a channel shows now
    print(api.render(message))                    # as text, buttons as [ Ack ]

click() builds a button click as Slack sends one to the app's request URL: the
form-encoded `payload` of a `block_actions` interaction, signed v0 with the signing secret
(docs.slack.dev/authentication/verifying-requests-from-slack).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

HOST = "127.0.0.1"
MAX_BODY = 1 << 20
SCOPES = ("chat:write",)


@dataclass
class Call:
    """One Web API call as the stand-in received it."""

    method: str  # "chat.postMessage"
    args: dict[str, Any]
    token: str | None
    answer: dict[str, Any]


@dataclass
class Message:
    """A message as a channel shows it now; replies: its thread, oldest first."""

    channel: str
    ts: str
    text: str
    blocks: list[dict[str, Any]]
    thread_ts: str | None = None
    edits: int = 0
    replies: list[Message] = field(default_factory=list)


class SlackAPI:
    """The stand-in; see the module's docstring. channels: name -> id; joined: the ids the
    bot is a member of (every channel unless given); fail: the method -> error to answer
    next (once)."""

    def __init__(
        self,
        *,
        token: str = "xoxb-stand-in",
        scopes: tuple[str, ...] = SCOPES,
        channels: dict[str, str] | None = None,
        joined: set[str] | None = None,
    ) -> None:
        self.token = token
        self.scopes = scopes
        self.channels = channels if channels is not None else {"alerts": "C0123ABCD"}
        self.joined = joined if joined is not None else set(self.channels.values())
        self.calls: list[Call] = []
        self.fail: dict[str, str] = {}
        self.retry_after = 3  # seconds a "ratelimited" answer asks to wait (HTTP 429)
        self._messages: dict[tuple[str, str], Message] = {}
        self._order: list[tuple[str, str]] = []
        self._ts = itertools.count(1)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -- serving ------------------------------------------------------------------------------

    def start(self, port: int = 0) -> SlackAPI:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._answer(dict(parse_qsl(urlsplit(self.path).query)))

            def do_POST(self) -> None:  # noqa: N802
                length = min(int(self.headers.get("Content-Length") or 0), MAX_BODY)
                body = self.rfile.read(length)
                args: dict[str, Any] = dict(parse_qsl(urlsplit(self.path).query))
                if "json" in (self.headers.get("Content-Type") or ""):
                    args.update(json.loads(body or b"{}"))
                else:
                    args.update(parse_qsl(body.decode()))
                self._answer(args)

            def _answer(self, args: dict[str, Any]) -> None:
                method = urlsplit(self.path).path.rsplit("/", 1)[-1]
                auth = self.headers.get("Authorization") or ""
                token = auth.removeprefix("Bearer ").strip() or args.pop("token", None)
                answer = api.answer(method, args, token)
                data = json.dumps(answer).encode()
                limited = answer.get("error") == "ratelimited"  # Slack's 429, Retry-After
                self.send_response(429 if limited else 200)
                if limited:
                    self.send_header("Retry-After", str(api.retry_after))
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                if token == api.token:
                    self.send_header("X-OAuth-Scopes", ",".join(api.scopes))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((HOST, port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        """The Web API's base URL, for RECEIVER_SLACK_API_URL."""
        assert self._server is not None, "start() it first"
        return f"http://{HOST}:{self._server.server_address[1]}/api/"

    # -- the methods --------------------------------------------------------------------------

    def answer(self, method: str, args: dict[str, Any], token: str | None) -> dict[str, Any]:
        with self._lock:
            answer = self._answer(method, args, token)
            self.calls.append(Call(method, dict(args), token, answer))
            return answer

    def _answer(self, method: str, args: dict[str, Any], token: str | None) -> dict[str, Any]:
        needed = {"chat.postMessage": "chat:write", "chat.update": "chat:write"}
        needed["conversations.info"] = "channels:read"
        if token is None:
            return {"ok": False, "error": "not_authed"}
        if token != self.token:
            return {"ok": False, "error": "invalid_auth"}
        if method in needed and needed[method] not in self.scopes:
            provided = ",".join(self.scopes)
            return {"ok": False, "error": "missing_scope", "needed": needed[method],
                    "provided": provided}  # fmt: skip
        if method in self.fail:
            return {"ok": False, "error": self.fail.pop(method)}
        if method == "auth.test":
            return {"ok": True, "url": "https://stand-in.slack.com/", "team": "Stand-in",
                    "user": "alerts", "team_id": "T0STANDIN", "user_id": "U0BOT",
                    "bot_id": "B0BOT"}  # fmt: skip
        handler = {
            "chat.postMessage": self._post,
            "chat.update": self._update,
            "conversations.info": self._info,
        }.get(method)
        if handler is None:
            return {"ok": False, "error": "unknown_method"}
        return handler(args)

    def _channel(self, given: Any) -> str | None:
        name = str(given or "").lstrip("#")
        if name in self.channels.values():
            return name
        return self.channels.get(name)

    def _post(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(args.get("channel"))
        if channel is None:
            return {"ok": False, "error": "channel_not_found"}
        if channel not in self.joined:
            return {"ok": False, "error": "not_in_channel"}
        text, blocks = str(args.get("text") or ""), _blocks(args.get("blocks"))
        if not text and not blocks:
            return {"ok": False, "error": "no_text"}
        ts = f"{int(time.time())}.{next(self._ts):06d}"
        thread = args.get("thread_ts")
        message = Message(channel, ts, text, blocks, str(thread) if thread else None)
        if thread:
            parent = self._messages.get((channel, str(thread)))
            if parent is None:
                return {"ok": False, "error": "thread_not_found"}
            parent.replies.append(message)
        else:
            self._messages[(channel, ts)] = message
            self._order.append((channel, ts))
        shown = {"type": "message", "text": text, "blocks": blocks, "ts": ts, "bot_id": "B0BOT"}
        return {"ok": True, "channel": channel, "ts": ts, "message": shown}

    def _update(self, args: dict[str, Any]) -> dict[str, Any]:
        channel, ts = str(args.get("channel") or ""), str(args.get("ts") or "")
        if channel not in self.channels.values():
            return {"ok": False, "error": "channel_not_found"}
        message = self._messages.get((channel, ts))
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        if "text" in args:
            message.text = str(args["text"] or "")
        if "blocks" in args:
            message.blocks = _blocks(args["blocks"])
        message.edits += 1
        shown = {"text": message.text, "blocks": message.blocks}
        return {"ok": True, "channel": channel, "ts": ts, "text": message.text, "message": shown}

    def _info(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(args.get("channel"))
        if channel is None:
            return {"ok": False, "error": "channel_not_found"}
        name = next(n for n, i in self.channels.items() if i == channel)
        about = {"id": channel, "name": name, "is_channel": True,
                 "is_member": channel in self.joined}  # fmt: skip
        return {"ok": True, "channel": about}

    # -- what tests and the demo look at ------------------------------------------------------

    def delete(self, message: Message) -> None:
        """Delete a message, as a user can in Slack (chat.update then: message_not_found)."""
        with self._lock:
            self._messages.pop((message.channel, message.ts), None)
            self._order.remove((message.channel, message.ts))

    def messages(self) -> list[Message]:
        """The top-level messages, oldest first (with their threads)."""
        with self._lock:
            return [self._messages[key] for key in self._order]

    def called(self, method: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method]

    def render(self, message: Message) -> str:
        """A message as text: its blocks' words, buttons as [ Label ], then its thread."""
        lines = [_render_block(b) for b in message.blocks] or [message.text]
        lines = [line for line in lines if line]
        lines += [f"  ↳ {reply.text}" for reply in message.replies]
        return "\n".join(lines)


def _blocks(given: Any) -> list[dict[str, Any]]:
    if isinstance(given, str):  # a form-encoded call sends them as a JSON string
        given = json.loads(given or "[]")
    return list(given or [])


def _text(obj: Any) -> str:
    return str(obj.get("text", "")) if isinstance(obj, dict) else ""


def _render_block(block: dict[str, Any]) -> str:
    kind = block.get("type")
    if kind == "header":
        return f"*{_text(block.get('text'))}*"
    if kind == "section":
        fields = [_text(f).replace("\n", " ") for f in block.get("fields") or []]
        return "\n".join(filter(None, [_text(block.get("text")), "  ".join(fields)]))
    if kind == "context":
        return " ".join(_text(e) for e in block.get("elements") or [])
    if kind == "actions":
        return " ".join(f"[ {_text(e.get('text'))} ]" for e in block.get("elements") or [])
    return ""


# -- button clicks, as Slack sends them ----------------------------------------------------------


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """Slack's v0 signature of a request: v0=hex(HMAC-SHA256(secret, "v0:ts:body"))."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def click(
    message: Message,
    action_id: str,
    *,
    user: str = "U123",
    name: str = "ada",
) -> dict[str, Any]:
    """The block_actions payload of a click on the button action_id of message."""
    buttons = [
        e for b in message.blocks if b.get("type") == "actions" for e in b.get("elements") or []
    ]
    button = next(b for b in buttons if b.get("action_id") == action_id)
    return {
        "type": "block_actions",
        "team": {"id": "T0STANDIN", "domain": "stand-in"},
        "user": {"id": user, "username": name, "name": name, "team_id": "T0STANDIN"},
        "api_app_id": "A0APP",
        "container": {"type": "message", "message_ts": message.ts, "channel_id": message.channel},
        "channel": {"id": message.channel, "name": "alerts"},
        "message": {
            "type": "message",
            "ts": message.ts,
            "text": message.text,
            "blocks": message.blocks,
        },  # fmt: skip
        "response_url": "https://hooks.slack.com/actions/T0STANDIN/1/stand-in",
        "trigger_id": "1.2.3",
        "actions": [
            {
                "type": "button",
                "action_id": action_id,
                "block_id": "actions",
                "value": button.get("value"),
                "text": button.get("text"),
                "action_ts": f"{time.time():.6f}",
            }
        ],  # fmt: skip
    }


def signed(
    payload: dict[str, Any], secret: str, *, timestamp: float | None = None
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of Slack's POST of payload to the request URL."""
    body = urlencode({"payload": json.dumps(payload)}).encode()
    stamp = str(int(time.time() if timestamp is None else timestamp))
    return body, {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": signature(secret, stamp, body),
    }
