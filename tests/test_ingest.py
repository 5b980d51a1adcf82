"""The POST /v1/events contract over real HTTP, against `receiver serve` under uvicorn."""

import json
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from receiver import events, signature
from receiver.edge.ingest import _answer
from tests.harness import SECRET, Receiver, signed

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    tmp = tmp_path_factory.mktemp("ingest")
    receiver = Receiver(tmp, env={"RECEIVER_MAX_BODY": "4096"}).start()
    yield receiver
    receiver.stop()


def drop(event_id: str, **fields: object) -> bytes:
    return json.dumps(events.sample("score.drop", id=event_id, **fields)).encode()


def error(response: httpx.Response) -> tuple[int, str, str]:
    assert response.headers["content-type"] == "application/json"
    err = response.json()["error"]
    return response.status_code, err["code"], err["message"]


def stored(server: Receiver, table: str = "events") -> int:
    with sqlite3.connect(server.db) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def test_new_event_is_accepted_then_duplicate(server: Receiver) -> None:
    body = drop("evt_contract_1")
    first = server.post(body, signed(body))
    again = server.post(body, signed(body))
    assert (first.status_code, first.json()) == (
        202,
        {"id": "evt_contract_1", "status": "accepted"},
    )
    assert (again.status_code, again.json()) == (
        200,
        {"id": "evt_contract_1", "status": "duplicate"},
    )


def test_duplicate_is_detected_by_id_even_if_body_differs(server: Receiver) -> None:
    a, b = drop("evt_contract_2", score=10), drop("evt_contract_2", score=11)
    assert server.post(a, signed(a)).status_code == 202
    assert server.post(b, signed(b)).json()["status"] == "duplicate"


def test_a_duplicate_with_another_body_is_answered_duplicate_but_counted_and_logged(
    server: Receiver,
) -> None:
    a, b = drop("evt_conflict", score=10), drop("evt_conflict", score=11)
    conflicts = server.metric("receiver_events_total", 'result="conflict"')
    duplicates = server.metric("receiver_events_total", 'result="duplicate"')
    assert server.post(a, signed(a)).status_code == 202
    assert server.post(a, signed(a)).json()["status"] == "duplicate"  # the same bytes
    again = server.post(b, signed(b))
    assert (again.status_code, again.json()) == (
        200,
        {"id": "evt_conflict", "status": "duplicate"},
    )
    assert server.metric("receiver_events_total", 'result="conflict"') == conflicts + 1
    assert server.metric("receiver_events_total", 'result="duplicate"') == duplicates + 1
    assert (
        "WARNING receiver.ingest: conflict: event evt_conflict from 127.0.0.1 repeats a stored"
        " id with a different body" in server.logs()
    )
    with sqlite3.connect(server.db) as conn:
        (body,) = conn.execute("SELECT body FROM events WHERE id = 'evt_conflict'").fetchone()
    assert body == a.decode()  # the first body is kept


def test_missing_signature(server: Receiver) -> None:
    assert error(server.post(drop("evt_nosig"))) == (
        401,
        "missing_signature",
        "X-Service-Signature header is required",
    )


@pytest.mark.parametrize(
    "header",
    [
        pytest.param(lambda b: signature.sign(b"wrong", b), id="wrong-secret"),
        pytest.param(lambda b: signature.sign(SECRET.encode(), b + b" "), id="other-body"),
        pytest.param(lambda b: "sha1=" + "0" * 40, id="sha1"),
        pytest.param(
            lambda b: signature.sign(SECRET.encode(), b).removeprefix("sha256="), id="no-prefix"
        ),
        pytest.param(lambda b: "sha256=not-hex", id="not-hex"),
        pytest.param(lambda b: "sha256=", id="prefix-alone"),
        pytest.param(lambda b: signature.sign(SECRET.encode(), b).upper(), id="upper-case"),
    ],
)
def test_invalid_signature(server: Receiver, header: object) -> None:
    body = drop("evt_badsig")
    response = server.post(body, {signature.SIGNATURE_HEADER: header(body)})  # type: ignore[operator]
    assert error(response)[:2] == (401, "invalid_signature")


def test_two_signature_headers_are_refused(server: Receiver) -> None:
    body = drop("evt_twosig")
    good = signed(body)[signature.SIGNATURE_HEADER]
    response = httpx.post(
        f"{server.url}/v1/events",
        content=body,
        headers=[(signature.SIGNATURE_HEADER, good), (signature.SIGNATURE_HEADER, good)],
    )
    assert error(response) == (
        401,
        "invalid_signature",
        "X-Service-Signature must appear once, got 2 headers",
    )


def test_unsigned_input_never_reaches_the_parser(server: Receiver) -> None:
    # Not JSON and not signed: the answer is about the signature, not the JSON.
    assert error(server.post(b"{{{", {signature.SIGNATURE_HEADER: "sha256=" + "0" * 64}))[1] == (
        "invalid_signature"
    )


def test_body_over_the_limit_by_content_length(server: Receiver) -> None:
    body = drop("evt_big", padding="x" * 5000)
    assert error(server.post(body, signed(body))) == (
        413,
        "payload_too_large",
        f"body of {len(body)} bytes exceeds the limit of 4096 bytes",
    )


def test_body_over_the_limit_without_content_length(server: Receiver) -> None:
    # Chunked transfer: no Content-Length to trust, so the limit holds while reading.
    body = drop("evt_big_chunked", padding="x" * 5000)

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000]

    response = httpx.post(f"{server.url}/v1/events", content=chunks(), headers=signed(body))
    assert error(response) == (413, "payload_too_large", "body exceeds the limit of 4096 bytes")


def test_lying_content_length_is_caught_while_reading(server: Receiver) -> None:
    import socket

    body = drop("evt_liar", padding="x" * 6000)
    head = (
        f"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
        f"{signature.SIGNATURE_HEADER}: {signed(body)[signature.SIGNATURE_HEADER]}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(head.encode() + body)
        answer = sock.recv(4096).decode()
    # The server reads exactly Content-Length bytes, so the rest is never buffered as this
    # request's body: the excess is parsed as a next request and refused as garbage.
    assert answer.startswith("HTTP/1.1 4")
    with sqlite3.connect(server.db) as conn:
        assert conn.execute("SELECT count(*) FROM events WHERE id = 'evt_liar'").fetchone() == (0,)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(b"not json", "body is not valid JSON", id="not-json"),
        pytest.param(b"[1,2,3]", "body must be a JSON object, got a JSON array", id="array"),
        pytest.param(b'{"a": NaN}', "NaN is not valid JSON", id="nan"),
    ],
)
def test_signed_but_not_json_is_400_and_quarantined(
    server: Receiver, body: bytes, message: str
) -> None:
    before = stored(server, "quarantine")
    status, code, text = error(server.post(body, signed(body)))
    assert (status, code) == (400, "invalid_json") and message in text
    assert stored(server, "quarantine") == before + 1


@pytest.mark.parametrize(
    ("event", "message"),
    [
        pytest.param({"type": "score.drop"}, "id: field required", id="missing-id"),
        pytest.param(
            {"id": "evt_q1", "timestamp": "2026-11-21T10:00:00Z", "sessionId": "s"},
            "type",
            id="missing-type",
        ),
        pytest.param(
            {**events.sample("score.drop", id="evt_q2"), "score": "low"}, "score", id="wrong-type"
        ),
        pytest.param(
            {**events.sample("score.drop", id="evt_q3"), "type": "score.spike"},
            "type: must be one of",
            id="unknown-type",
        ),
    ],
)
def test_signed_but_invalid_event_is_422_and_quarantined(
    server: Receiver, event: dict[str, object], message: str
) -> None:
    body = json.dumps(event).encode()
    before = stored(server, "quarantine")
    status, code, text = error(server.post(body, signed(body)))
    assert (status, code) == (422, "invalid_event") and message in text
    with sqlite3.connect(server.db) as conn:
        rows = conn.execute(
            "SELECT reason, body FROM quarantine ORDER BY id DESC LIMIT 1"
        ).fetchall()
    assert stored(server, "quarantine") == before + 1
    assert rows[0][1] == body and rows[0][0].startswith("invalid_event: ")


def test_unknown_fields_are_kept_in_the_raw_body(server: Receiver) -> None:
    body = drop("evt_extra", context="checkout", meta={"page": "/pay"})
    assert server.post(body, signed(body)).status_code == 202
    with sqlite3.connect(server.db) as conn:
        (raw,) = conn.execute("SELECT body FROM events WHERE id = 'evt_extra'").fetchone()
    assert json.loads(raw)["meta"] == {"page": "/pay"}


def test_errors_elsewhere_are_json_too(server: Receiver) -> None:
    assert error(server.get("/v1/nothing-here"))[:2] == (404, "not_found")
    assert error(httpx.get(f"{server.url}/v1/events"))[:2] == (405, "method_not_allowed")


def test_health_ready_and_metrics(server: Receiver) -> None:
    assert server.get("/healthz").json() == {"status": "ok"}
    ready = server.get("/readyz").json()
    assert ready["status"] == "ready" and ready["checks"]["store"] == "ok"
    assert ready["checks"]["rules"]["last_reload"] == "ok"
    body = drop("evt_metrics")
    accepted = server.metric("receiver_events_total", 'result="accepted"')
    server.post(body, signed(body))
    server.post(body, signed(body))
    server.post(body)
    assert server.metric("receiver_events_total", 'result="accepted"') == accepted + 1
    assert server.metric("receiver_events_total", 'result="duplicate"') >= 1
    assert server.metric("receiver_events_rejected_total", 'reason="missing_signature"') >= 1
    assert server.metric("receiver_ingest_seconds_count") >= 3


def test_rejections_are_logged_without_secrets(server: Receiver) -> None:
    body = drop("evt_logged")
    server.post(body, {signature.SIGNATURE_HEADER: "sha256=" + "1" * 64})
    logs = server.logs()
    assert "rejected invalid_signature from 127.0.0.1" in logs
    assert SECRET not in logs


def test_concurrent_senders_get_exactly_one_202_per_id(tmp_path: Path) -> None:
    server = Receiver(tmp_path).start()
    try:
        ids = [f"evt_c{i}" for i in range(100)]
        bodies = [drop(i) for i in ids for _ in range(5)]  # each id delivered 5 times
        with (
            httpx.Client(limits=httpx.Limits(max_connections=32)) as client,
            ThreadPoolExecutor(32) as pool,
        ):
            statuses = list(
                pool.map(lambda b: server.post(b, signed(b), client).status_code, bodies)
            )
        assert statuses.count(202) == len(ids)
        assert statuses.count(200) == len(bodies) - len(ids)
        assert stored(server) == len(ids)
    finally:
        server.stop()


def test_restart_keeps_old_ids_duplicate(tmp_path: Path) -> None:
    server = Receiver(tmp_path).start()
    body = drop("evt_restart")
    try:
        assert server.post(body, signed(body)).status_code == 202
    finally:
        # SIGTERM: a graceful exit (uvicorn re-raises the signal once it has shut down).
        assert server.stop() == 0
        assert "; store closed" in server.logs()
    server.start()
    try:
        assert server.post(body, signed(body)).json()["status"] == "duplicate"
    finally:
        server.stop()


def test_locked_store_answers_503_and_recovers(tmp_path: Path) -> None:
    server = Receiver(tmp_path).start()
    try:
        locker = sqlite3.connect(server.db, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        body = drop("evt_locked")
        status, code, message = error(server.post(body, signed(body)))
        assert (status, code) == (503, "storage_unavailable") and "locked" in message
        assert server.get("/readyz").status_code == 503
        locker.execute("ROLLBACK")
        locker.close()
        assert server.post(body, signed(body)).status_code == 202  # the sender's retry lands
        # Ready again by itself: the loops the lock paused (routing) each succeed on their
        # next turn, a second or a few later on a busy machine.
        deadline = time.monotonic() + 60
        while (ready := server.get("/readyz")).status_code != 200:
            assert time.monotonic() < deadline, f"not ready again: {ready.text}"
            time.sleep(0.1)
    finally:
        server.stop()


def test_json_log_format_gives_one_object_a_line(tmp_path: Path) -> None:
    server = Receiver(tmp_path, env={"RECEIVER_LOG_FORMAT": "json"}).start()
    try:
        body = drop("evt_jsonlog")
        server.post(body, {signature.SIGNATURE_HEADER: "sha256=" + "2" * 64})
    finally:
        server.stop()
    lines = [json.loads(line) for line in server.logs().splitlines() if line.startswith("{")]
    [rejected] = [line for line in lines if line.get("code") == "invalid_signature"]
    assert rejected["level"] == "warning" and rejected["logger"] == "receiver.ingest"
    assert rejected["msg"].startswith("rejected invalid_signature from 127.0.0.1")
    assert len(lines) == len(server.logs().splitlines())  # every line is JSON, uvicorn's too


def test_an_event_id_with_a_newline_cannot_forge_a_log_line(tmp_path: Path) -> None:
    forged = "2026-01-01 00:00:00,000 INFO    receiver: all clear"
    event = {"id": f"evt_nl\n{forged}", "type": "score.drop", "sessionId": "s"}  # no timestamp
    body = json.dumps(event).encode()
    server = Receiver(tmp_path).start()
    try:
        assert error(server.post(body, signed(body)))[:2] == (422, "invalid_event")
    finally:
        server.stop()
    logs = server.logs()
    assert f"rejected invalid_event from 127.0.0.1 (event evt_nl\\n{forged}): " in logs
    assert not any(line.startswith(forged) for line in logs.splitlines())


def test_rejection_lines_are_limited_per_reason_and_client_but_all_counted(
    tmp_path: Path,
) -> None:
    server = Receiver(tmp_path).start()
    try:
        before = server.metric("receiver_events_rejected_total", 'reason="missing_signature"')
        with httpx.Client() as client:
            for i in range(40):
                assert server.post(drop(f"evt_flood_{i}"), client=client).status_code == 401
        after = server.metric("receiver_events_rejected_total", 'reason="missing_signature"')
        # Another reason from the same client still gets its own lines.
        bad = drop("evt_flood_bad")
        server.post(bad, {signature.SIGNATURE_HEADER: "sha256=" + "3" * 64})
    finally:
        server.stop()
    assert after == before + 40
    logs = server.logs()
    assert logs.count("rejected missing_signature from 127.0.0.1") == 5
    assert logs.count("rejected invalid_signature from 127.0.0.1") == 1


@pytest.mark.parametrize("event_id", ["evt_1", 'a"b\\c', "é\u2028☃", "\x00\x1f"])
@pytest.mark.parametrize("status", ["accepted", "duplicate"])
def test_the_answer_is_written_as_json_dumps_writes_it(event_id: str, status: str) -> None:
    payload = {"id": event_id, "status": status}
    assert _answer(payload) == json.dumps(payload).encode()
    assert json.loads(_answer(payload)) == payload
