"""Attacks over real HTTP: forged signatures, replays, slow and greedy clients.

Signature forms the verifier refuses are unit-tested in tests/test_signature.py
and over HTTP in tests/test_ingest.py; this adds the ones only HTTP can carry.
"""

import json
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from receiver import events, signature
from receiver.settings import Settings
from tests.harness import Receiver, signed

pytestmark = pytest.mark.e2e

NEW, OLD = "new-secret-4f1c9a", "old-secret-77b2e0"
HEADER = signature.SIGNATURE_HEADER


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    env = {
        "RECEIVER_SECRETS": f"{NEW},{OLD}",
        "RECEIVER_MAX_EVENT_AGE": "1h",
        "RECEIVER_HEADER_TIMEOUT": "1",
        "RECEIVER_BODY_TIMEOUT": "1",
        "RECEIVER_LIMIT_CONCURRENCY": "400",
    }
    receiver = Receiver(tmp_path_factory.mktemp("attacks"), env=env, secret=NEW).start()
    yield receiver
    receiver.stop()


def drop(event_id: str, **fields: object) -> bytes:
    return json.dumps(events.sample("score.drop", id=event_id, **fields)).encode()


def code(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def count(server: Receiver, table: str, event_id: str) -> int:
    with sqlite3.connect(server.db) as conn:
        sql = f"SELECT count(*) FROM {table} WHERE " + (
            "id = ?" if table == "events" else "event_id = ?"
        )
        return int(conn.execute(sql, (event_id,)).fetchone()[0])


# -- signatures ------------------------------------------------------------------------------


def test_rotation_accepts_both_secrets_and_nothing_else(server: Receiver) -> None:
    a, b, c = drop("evt_rot_new"), drop("evt_rot_old"), drop("evt_rot_other")
    assert server.post(a, signed(a, NEW)).status_code == 202
    assert server.post(b, signed(b, OLD)).status_code == 202
    assert code(server.post(c, signed(c, "retired-secret"))) == (401, "invalid_signature")


@pytest.mark.parametrize(
    "secret",
    [NEW[:-1], NEW[:1], NEW + "x", f"{NEW},{OLD}", NEW.upper(), ""],
    ids=["prefix", "first-char", "extended", "both-joined", "upper", "empty"],
)
def test_near_miss_secrets_are_refused(server: Receiver, secret: str) -> None:
    body = drop("evt_near")
    assert code(server.post(body, signed(body, secret))) == (401, "invalid_signature")
    assert count(server, "events", "evt_near") == 0


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(lambda good: [(HEADER, ""), (HEADER, good)], id="empty-then-good"),
        pytest.param(lambda good: [(HEADER, good), (HEADER, "sha256=" + "0" * 64)], id="good-bad"),
        pytest.param(lambda good: [(HEADER.lower(), good), (HEADER.upper(), good)], id="cases"),
        pytest.param(lambda good: [("X-Service-Signature-256", good)], id="other-name"),
        pytest.param(lambda good: [("X_Service_Signature", good)], id="underscores"),
        pytest.param(lambda good: [(HEADER, good.replace("=", " = "))], id="spaced-equals"),
        pytest.param(lambda good: [(HEADER, good[:7] + "\t" + good[7:])], id="inner-tab"),
        pytest.param(lambda good: [(HEADER, "sha256=" + good[7:] + ";" + good[7:])], id="list"),
    ],
)
def test_header_tricks_are_refused(server: Receiver, headers: object) -> None:
    body = drop("evt_trick")
    good = signed(body, NEW)[HEADER]
    response = httpx.post(f"{server.url}/v1/events", content=body, headers=headers(good))  # type: ignore[operator]
    assert response.status_code == 401
    assert count(server, "events", "evt_trick") == 0


def test_signature_over_a_prefix_or_an_extension_of_the_body_is_refused(server: Receiver) -> None:
    body = drop("evt_ext")
    for other in (body[:-1], body + b" ", body + b"\x00", b" " + body):
        assert server.post(body, signed(other, NEW)).status_code == 401
    assert count(server, "events", "evt_ext") == 0


# -- replay ----------------------------------------------------------------------------------


def _stamp(ago: timedelta) -> str:
    return (datetime.now(UTC) - ago).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def test_an_event_older_than_max_event_age_is_refused_and_not_kept(server: Receiver) -> None:
    body = drop("evt_old", timestamp=_stamp(timedelta(hours=2, minutes=5)))
    response = server.post(body, signed(body, NEW))
    assert code(response) == (422, "event_too_old")
    message = response.json()["error"]["message"]
    assert "is 2h5m old" in message and "older than 1h are refused" in message
    assert "RECEIVER_MAX_EVENT_AGE" in message
    assert count(server, "events", "evt_old") == 0
    assert count(server, "quarantine", "evt_old") == 0  # replays must not fill the disk
    # A recent event is fine, and so is a replay of it within the window: a duplicate.
    fresh = drop("evt_fresh", timestamp=_stamp(timedelta(minutes=50)))
    assert server.post(fresh, signed(fresh, NEW)).status_code == 202
    assert server.post(fresh, signed(fresh, NEW)).json()["status"] == "duplicate"


def test_max_event_age_zero_disables_the_check(tmp_path: Path) -> None:
    server = Receiver(tmp_path, env={"RECEIVER_MAX_EVENT_AGE": "0"}).start()
    try:
        body = drop("evt_ancient", timestamp="2001-01-01T00:00:00Z")
        assert server.post(body, signed(body)).status_code == 202
    finally:
        server.stop()


def test_max_event_age_reads_durations(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().max_event_age == 7 * 86400
    monkeypatch.setenv("RECEIVER_MAX_EVENT_AGE", "36h")
    assert Settings().max_event_age == 36 * 3600
    monkeypatch.setenv("RECEIVER_MAX_EVENT_AGE", "soon")
    with pytest.raises(ValidationError, match="invalid duration"):
        Settings()


# -- clock skew ------------------------------------------------------------------------------


def test_an_event_from_the_future_is_refused_counted_and_not_kept(server: Receiver) -> None:
    # One event dated 2099 would make every later event of its session stale.
    refused = server.metric("receiver_events_rejected_total", 'reason="event_from_future"')
    body = drop("evt_2099", timestamp="2099-01-01T00:00:00Z")
    for _ in range(2):  # the sender's retry carries the same timestamp: refused too
        response = server.post(body, signed(body, NEW))
        assert code(response) == (422, "event_from_future")
    message = response.json()["error"]["message"]
    assert "2099-01-01T00:00:00+00:00 is " in message
    assert "ahead of this receiver's clock" in message
    assert "more than 5m ahead are refused (RECEIVER_MAX_CLOCK_SKEW)" in message
    assert "sender's clock is wrong" in message and "retries" in message
    assert count(server, "events", "evt_2099") == 0
    assert count(server, "quarantine", "evt_2099") == 0  # as too old: resending must not fill
    after = server.metric("receiver_events_rejected_total", 'reason="event_from_future"')
    assert after == refused + 2
    assert "rejected event_from_future from 127.0.0.1 (event evt_2099): " in server.logs()
    # A sender's clock a little ahead is fine.
    ahead = drop("evt_ahead", timestamp=_stamp(timedelta(minutes=-4)))
    assert server.post(ahead, signed(ahead, NEW)).status_code == 202


def test_max_clock_skew_zero_disables_the_check(tmp_path: Path) -> None:
    server = Receiver(tmp_path, env={"RECEIVER_MAX_CLOCK_SKEW": "0"}).start()
    try:
        body = drop("evt_later", timestamp="2099-01-01T00:00:00Z")
        assert server.post(body, signed(body)).status_code == 202
    finally:
        server.stop()


def test_max_clock_skew_reads_durations_and_is_a_serve_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from click.testing import CliRunner

    from receiver.cli import cli

    assert Settings().max_clock_skew == 300
    monkeypatch.setenv("RECEIVER_MAX_CLOCK_SKEW", "90s")
    assert Settings().max_clock_skew == 90
    result = CliRunner().invoke(cli, ["serve", "--max-clock-skew", "soon"])
    assert result.exit_code == 1 and "RECEIVER_MAX_CLOCK_SKEW" in result.output


# -- slow and greedy clients -----------------------------------------------------------------


def _raw(server: Receiver, data: bytes, timeout: float = 5) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_headers_over_16_kb_are_refused_431(server: Receiver) -> None:
    head = b"POST /v1/events HTTP/1.1\r\nHost: x\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(head)
        for _ in range(16):  # 16 x 1 KB, in separate writes: just over 16384 bytes
            sock.sendall(b"X-Pad: " + b"a" * 1024 + b"\r\n")
            time.sleep(0.005)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 431")
    assert b'"headers_too_large"' in answer


def test_headers_not_finished_in_time_get_408_and_the_connection_is_closed(
    server: Receiver,
) -> None:
    started = time.monotonic()
    answer = _raw(server, b"POST /v1/events HTTP/1.1\r\nHost: x\r\n")
    assert answer.startswith(b"HTTP/1.1 408") and b'"header_timeout"' in answer
    assert time.monotonic() - started < 4


def test_a_silent_connection_is_closed_too(server: Receiver) -> None:
    assert _raw(server, b"").startswith(b"HTTP/1.1 408")


def test_body_not_finished_in_time_gets_408(server: Receiver) -> None:
    body = drop("evt_slow_body")
    head = (
        f"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        f"{HEADER}: {signed(body, NEW)[HEADER]}\r\n\r\n"
    ).encode()
    answer = _raw(server, head + body[:10])
    assert answer.startswith(b"HTTP/1.1 408") and b'"body_timeout"' in answer
    assert count(server, "events", "evt_slow_body") == 0


def test_slowloris_does_not_starve_an_honest_sender(server: Receiver) -> None:
    """200 connections trickle headers or bodies; an honest sender is still served at once."""
    stop = threading.Event()
    refused: list[bytes] = []

    def trickle(n: int) -> None:
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                if n % 2:
                    sock.sendall(b"POST /v1/events HTTP/1.1\r\nContent-Length: 500\r\n\r\n")
                else:
                    sock.sendall(b"POST /v1/events HTTP/1.1\r\n")
                while not stop.is_set():
                    sock.sendall(b"X-a: b\r\n" if n % 2 == 0 else b"{")
                    stop.wait(0.3)
        except OSError:
            pass  # closed by the server: what it should do

    threads = [threading.Thread(target=trickle, args=(n,), daemon=True) for n in range(200)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        with httpx.Client() as client:
            for i in range(20):
                body = drop(f"evt_honest_{i}")
                response = server.post(body, signed(body, NEW), client)
                assert response.status_code == 202, response.text
        # The tricklers were cut off by the deadlines rather than held for ever.
        deadline = time.monotonic() + 10
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(t.is_alive() for t in threads)
    finally:
        stop.set()
    assert refused == []
    assert server.proc is not None and server.proc.poll() is None


def test_max_event_age_must_stay_shorter_than_retention(monkeypatch: pytest.MonkeyPatch) -> None:
    # A replay of an id already pruned must still be too old to be accepted.
    monkeypatch.setenv("RECEIVER_MAX_EVENT_AGE", "30d")
    monkeypatch.setenv("RECEIVER_RETENTION", "30d")
    with pytest.raises(ValidationError, match="max event age"):
        Settings()


def test_every_refusal_code_has_a_metric() -> None:
    # A RequestError whose code has no pre-bound counter turns its 4xx into a 500.
    from receiver import errors
    from receiver.metrics import REJECT_REASONS

    def leaves(cls: type) -> list[type]:
        if issubclass(cls, errors.ApiError):  # the read API's: not refused events
            return []
        return [cls, *(c for sub in cls.__subclasses__() for c in leaves(sub))]

    codes = {c.code for c in leaves(errors.RequestError) if c is not errors.RequestError}
    codes.discard("bad_request")
    assert codes <= set(REJECT_REASONS)
