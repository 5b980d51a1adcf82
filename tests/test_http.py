"""The HTTP layer over raw sockets: every error is JSON, wherever it is made.

uvicorn answers some requests before the app sees them (a parse error, the concurrency
limit, a websocket upgrade) and Starlette others (a redirect for a trailing slash);
receiver/http.py and the app make each of those a JSON error. The header deadline and
slow clients are in tests/test_attacks.py.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from receiver import events
from tests.harness import Receiver, signed

pytestmark = pytest.mark.e2e

KB = 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    env = {"RECEIVER_HEADER_TIMEOUT": "3", "RECEIVER_BODY_TIMEOUT": "3"}
    receiver = Receiver(tmp_path_factory.mktemp("http"), env=env).start()
    yield receiver
    receiver.stop()


class Answer:
    """One raw HTTP response: status, lower-cased headers, body."""

    def __init__(self, raw: bytes) -> None:
        assert raw, "the server closed the connection without answering"
        head, _, self.body = raw.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines)}
        if "content-length" in self.headers:
            self.body = self.body[: int(self.headers["content-length"])]

    def json(self) -> Any:
        assert self.headers.get("content-type", "").startswith("application/json"), self.headers
        return json.loads(self.body)

    def error(self) -> tuple[int, str]:
        body = self.json()
        assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
        return self.status, body["error"]["code"]


def exchange(port: int, data: bytes, *, piece: int = 0, timeout: float = 10) -> Answer:
    """Send data (in one write, or trickled in pieces of `piece` bytes) and read to the close.

    A trickle stops as soon as an answer is waiting: a server may refuse mid-request.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        pieces = [data[i : i + piece] for i in range(0, len(data), piece)] if piece else [data]
        for chunk in pieces:
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(chunk)
            except OSError:
                break  # closed on us: the answer, if any, is waiting
            if piece:
                time.sleep(0.001)
        received = []
        try:
            while chunk := sock.recv(65536):
                received.append(chunk)
        except ConnectionResetError:
            pass  # the server closed with our bytes unread; what it answered came first
        return Answer(b"".join(received))


def read_one(sock: socket.socket) -> Answer:
    """Read one response with a content-length from a connection that stays open."""
    raw = b""
    while b"\r\n\r\n" not in raw or len(raw) < raw.index(b"\r\n\r\n") + 4 + int(
        Answer(raw).headers["content-length"]
    ):
        chunk = sock.recv(65536)
        assert chunk, "closed before the response was complete"
        raw += chunk
    return Answer(raw)


def head_of(size: int, request_line: bytes = b"GET /healthz HTTP/1.1") -> bytes:
    """A request head (request line to the blank line) of exactly size bytes."""
    head = request_line + b"\r\nHost: x\r\nConnection: close\r\n"
    n = 0
    while size - len(head) - 2 > 0:
        room = size - len(head) - 2 - len(b"X-Pad-000: \r\n")
        head += b"X-Pad-%03d: %s\r\n" % (n, b"a" * max(0, min(KB, room)))
        n += 1
    head += b"\r\n"
    assert len(head) == size, (len(head), size)
    return head


# -- the header cap --------------------------------------------------------------------------


@pytest.mark.parametrize("piece", [0, KB], ids=["one-write", "trickled"])
@pytest.mark.parametrize("size", [17 * KB, 50 * KB, 100 * KB], ids=["17KB", "50KB", "100KB"])
def test_headers_over_16_kb_get_431_however_they_arrive(
    server: Receiver, size: int, piece: int
) -> None:
    answer = exchange(server.port, head_of(size), piece=piece)
    assert answer.error() == (431, "headers_too_large")
    assert answer.headers["connection"] == "close"
    assert "16384 bytes" in answer.json()["error"]["message"]


def test_a_long_url_counts_towards_the_header_cap(server: Receiver) -> None:
    answer = exchange(server.port, b"GET /healthz?q=" + b"a" * 20 * KB + b" HTTP/1.1\r\n\r\n")
    assert answer.error() == (431, "headers_too_large")


@pytest.mark.parametrize("piece", [0, KB], ids=["one-write", "trickled"])
def test_a_15_kb_header_block_is_served(server: Receiver, piece: int) -> None:
    answer = exchange(server.port, head_of(15 * KB), piece=piece)
    assert (answer.status, answer.json()) == (200, {"status": "ok"})


def test_the_header_cap_applies_to_each_request_on_a_connection(server: Receiver) -> None:
    ten_kb = head_of(10 * KB).replace(b"Connection: close", b"Connection: keep-alive")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        for _ in range(2):  # 20 KB on one connection, in two requests: each is served
            sock.sendall(ten_kb)
            assert read_one(sock).status == 200
        sock.sendall(head_of(20 * KB))
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert Answer(answer).error() == (431, "headers_too_large")


# -- errors uvicorn makes: the parser's 400, the overload 503, upgrades ----------------------


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"GARBAGE\r\n\r\n", id="not-http"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", id="no-colon"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: b\x01c\r\n\r\n", id="ctl-char"),
        pytest.param(
            b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            id="smuggling",
        ),
    ],
)
def test_a_malformed_request_gets_a_json_400(server: Receiver, request_bytes: bytes) -> None:
    answer = exchange(server.port, request_bytes)
    assert answer.error() == (400, "invalid_request")
    assert answer.headers["connection"] == "close"


def test_a_websocket_upgrade_is_answered_as_plain_http(server: Receiver) -> None:
    upgrade = (
        b"Host: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    assert exchange(server.port, b"GET /ws HTTP/1.1\r\n" + upgrade).error() == (404, "not_found")
    answer = exchange(server.port, b"GET /healthz HTTP/1.1\r\n" + upgrade)
    assert (answer.status, answer.json()) == (200, {"status": "ok"})


@pytest.fixture
def crowded(tmp_path: Any) -> Iterator[Receiver]:
    # Two connections open or requests in progress and the next request is refused (uvicorn
    # counts the connection asking too).
    env = {"RECEIVER_LIMIT_CONCURRENCY": "2", "RECEIVER_HEADER_TIMEOUT": "8"}
    receiver = Receiver(tmp_path, env=env).start()
    yield receiver
    if receiver.proc is not None:
        receiver.stop()


def test_overload_gets_a_json_503_and_is_counted(crowded: Receiver) -> None:
    get = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    body = json.dumps(events.sample("score.drop", id="evt_crowded")).encode()
    post = (
        b"POST /v1/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n"
        % len(body)
        + b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in signed(body).items())
        + b"\r\n"
        + body
    )
    refused = 0
    held = [socket.create_connection(("127.0.0.1", crowded.port)) for _ in range(2)]
    try:
        deadline = time.monotonic() + 5
        while (answer := exchange(crowded.port, get)).status == 200:
            assert time.monotonic() < deadline, "never refused with two connections held"
            time.sleep(0.05)
        refused += 1
        assert answer.error() == (503, "overloaded")
        assert answer.headers["connection"] == "close" and answer.headers["retry-after"] == "1"
        assert "RECEIVER_LIMIT_CONCURRENCY" in answer.json()["error"]["message"]
        answer = exchange(crowded.port, post)
        refused += 1
        assert answer.error() == (503, "overloaded")
    finally:
        for sock in held:
            sock.close()
    # Once the held connections are gone, /metrics answers and counts every refusal.
    deadline = time.monotonic() + 5
    while (metrics := httpx.get(f"{crowded.url}/metrics", timeout=5)).status_code == 503:
        refused += 1
        assert time.monotonic() < deadline, "still refused after the connections closed"
        time.sleep(0.05)
    wanted = 'receiver_events_rejected_total{reason="overloaded"} '
    [line] = [x for x in metrics.text.splitlines() if x.startswith(wanted)]
    assert float(line.split()[-1]) == refused
    assert crowded.send(events.sample("score.drop", id="evt_after_crowd")).status_code == 202


# -- no redirects -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, path",
    [("POST", "/v1/events/"), ("GET", "/v1/events/"), ("GET", "/healthz/"), ("GET", "/metrics/")],
)
def test_a_trailing_slash_is_a_json_404_not_a_redirect_to_the_host_header(
    server: Receiver, method: str, path: str
) -> None:
    request = f"{method} {path} HTTP/1.1\r\nHost: evil.example.com\r\nConnection: close\r\n"
    answer = exchange(server.port, (request + "Content-Length: 0\r\n\r\n").encode())
    assert answer.error() == (404, "not_found")
    assert "location" not in answer.headers
    assert b"evil.example.com" not in answer.body


# -- pipelining and 100 Continue --------------------------------------------------------------


def post_event(event_id: str, *, close: bool = False, expect: bool = False) -> tuple[bytes, bytes]:
    """A signed POST /v1/events: (its head, its body)."""
    body = json.dumps(events.sample("score.drop", id=event_id)).encode()
    (name, value), *_ = signed(body).items()
    head = "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += f"{name}: {value}\r\nContent-Length: {len(body)}\r\n"
    head += "Connection: close\r\n" if close else ""
    head += "Expect: 100-continue\r\n" if expect else ""
    return (head + "\r\n").encode(), body


def read_many(sock: socket.socket, count: int) -> list[Answer]:
    """Read count responses, each with a content-length, from a connection left open."""
    raw, answers = b"", []
    while len(answers) < count:
        end = raw.find(b"\r\n\r\n")
        if end >= 0:
            size = end + 4 + int(Answer(raw[: end + 4]).headers["content-length"])
            if len(raw) >= size:
                answers.append(Answer(raw[:size]))
                raw = raw[size:]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"closed after {len(answers)} of {count} responses"
        raw += chunk
    return answers


def test_pipelined_requests_are_answered_whole_and_in_order(server: Receiver) -> None:
    """Three requests written at once get three whole answers, in their order."""
    first, second = post_event("evt_piped_1"), post_event("evt_piped_2")
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"".join(first) + health + b"".join(second))
        answers = read_many(sock, 3)
    assert [a.status for a in answers] == [202, 200, 202]
    assert answers[0].json()["id"] == "evt_piped_1" and answers[2].json()["id"] == "evt_piped_2"


def test_100_continue_is_sent_before_the_body_is(server: Receiver) -> None:
    head, body = post_event("evt_continue", close=True, expect=True)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head)
        interim = sock.recv(65536)  # the sender waits for it before it sends the body
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), interim
        sock.sendall(body)
        raw = interim.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n")
        while chunk := sock.recv(65536):
            raw += chunk
    assert Answer(raw).status == 202
