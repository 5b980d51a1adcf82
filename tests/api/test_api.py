"""The /v1 read API end to end: a real server under uvicorn, on SQLite and on PostgreSQL,
keys made with the real CLI, events posted signed, then read back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from receiver import events
from tests.harness import Receiver, eventually

pytestmark = pytest.mark.e2e


def at(minutes_ago: float) -> str:
    return events.iso(datetime.now(UTC) - timedelta(minutes=minutes_ago), digits=3)


def ev(i: int, kind: str, session: str, minutes_ago: float, **fields: Any) -> dict[str, Any]:
    return events.sample(
        kind, id=f"evt_{i}", sessionId=session, timestamp=at(minutes_ago), **fields
    )


@pytest.fixture
def server(tmp_path: Path, receiver_db: str | None) -> Any:
    receiver = Receiver(tmp_path, db=receiver_db).start()
    try:
        yield receiver
    finally:
        receiver.stop()


def test_sessions_scores_and_aggregates(server: Receiver) -> None:
    key = server.make_key("reader")
    sent = [
        ev(1, "score.drop", "s1", 50, userId="u1", score=30, page="/checkout", cohort="a"),
        ev(2, "intervention.fired", "s1", 49, userId="u1"),
        ev(3, "score.recover", "s1", 48, userId="u1", score=70, page="/checkout", cohort="a"),
        ev(4, "score.drop", "s2", 40, userId="u2", score=10, page="/cart", cohort="a"),
        ev(5, "score.drop", "s3", 30, userId="u1", score=20, page="/cart"),
        ev(6, "session.stopped", "s3", 29, userId="u1"),
        ev(7, "score.recover", "s3", 28, userId="u1", score=90, page="/cart"),  # stays stopped
    ]
    for event in sent:
        assert server.send(event).status_code == 202

    # Read right after the 202s, routed or not.
    one = server.get("/v1/sessions/s1", key)
    assert one.status_code == 200, one.text
    assert one.json() == {
        "id": "s1",
        "userId": "u1",
        "score": 70,
        "status": "active",
        "context": "/checkout",
        "startedAt": sent[0]["timestamp"][:-1] + "000Z",
        "cohort": "a",
        "signals": 2,
        "interventions": 1,
        "updatedAt": sent[2]["timestamp"][:-1] + "000Z",
    }
    assert server.get("/v1/sessions/s1/score", key).json() == {
        "sessionId": "s1",
        "score": 70,
        "updatedAt": sent[2]["timestamp"][:-1] + "000Z",
    }
    history = server.get("/v1/sessions/s1/scores", key).json()
    assert [p["score"] for p in history["history"]] == [30, 70]
    assert server.get("/v1/sessions/s3", key).json()["status"] == "stopped"

    # Lists, totals and groups show routed events only (receiver/store/sessions.py: page):
    # read before routing (sends now 3 ms apart, not 50), s1 and s3 were missing once.
    routed = "SELECT count(*) FROM events WHERE routed_at IS NOT NULL"
    eventually(lambda: server.query(routed) == [(len(sent),)], "every event routed")
    listed = server.get("/v1/sessions?userId=u1", key).json()
    assert [s["id"] for s in listed["sessions"]] == ["s3", "s1"]
    assert listed["total"] == 2 and listed["cursor"] is None
    assert set(listed["sessions"][0]) == {"id", "userId", "score", "status", "context", "startedAt"}
    assert [s["id"] for s in server.get("/v1/sessions?status=dropped", key).json()["sessions"]] == [
        "s2"
    ]

    walked: list[str] = []
    cursor = ""
    for _ in range(5):
        page = server.get(f"/v1/sessions?limit=1{cursor}", key).json()
        walked += [s["id"] for s in page["sessions"]]
        if page["cursor"] is None:
            break
        cursor = f"&cursor={page['cursor']}"
    assert walked == ["s3", "s2", "s1"]

    groups = server.get("/v1/scores", key).json()["groups"]
    # page, avg by default; lowest first; the session without a page is left out
    assert groups == [
        {"key": "/cart", "avg": 50.0, "p50": 10, "sessions": 2},
        {"key": "/checkout", "avg": 70.0, "p50": 70, "sessions": 1},
    ]
    by_cohort = server.get("/v1/scores?groupBy=cohort&metric=p95&window=1h", key).json()
    assert by_cohort == {"groups": [{"key": "a", "avg": 40.0, "p50": 10, "p95": 70, "sessions": 2}]}
    assert server.get("/v1/scores?window=1h&groupBy=userId", key).json()["groups"][0]["key"] == "u2"


def test_errors_are_json_with_a_code_that_names_the_problem(server: Receiver) -> None:
    key = server.make_key("reader")
    cases = {
        "/v1/sessions?limit=0": (400, "invalid_parameter", "limit"),
        "/v1/sessions?limit=101": (400, "invalid_parameter", "1 to 100"),
        "/v1/sessions?status=foo": (400, "invalid_parameter", "active, dropped, stopped"),
        "/v1/sessions?from=yesterday": (400, "invalid_parameter", "from must be an ISO 8601"),
        "/v1/sessions?cursor=nope": (400, "invalid_parameter", "cursor"),
        "/v1/scores?window=2d": (400, "invalid_parameter", "1h, 24h, 7d, 30d"),
        "/v1/scores?groupBy=x": (400, "invalid_parameter", "page, cohort, userId"),
        "/v1/scores?metric=max": (400, "invalid_parameter", "avg, p50, p95"),
        "/v1/sessions/none": (404, "session_not_found", "none"),
        "/v1/sessions/none/score": (404, "session_not_found", "none"),
        "/v1/sessions/none/scores": (404, "session_not_found", "none"),
        "/v1/nothing": (404, "not_found", "/v1/nothing"),
    }
    for path, (status, code, words) in cases.items():
        r = server.get(path, key)
        assert r.status_code == status, (path, r.text)
        assert r.headers["content-type"] == "application/json"
        assert r.json()["error"]["code"] == code, path
        assert words in r.json()["error"]["message"], (path, r.text)
    r = httpx.post(f"{server.url}/v1/sessions", headers={"Authorization": f"Bearer {key}"})
    assert (r.status_code, r.json()["error"]["code"]) == (405, "method_not_allowed")


def test_keys_missing_malformed_unknown_and_revoked_get_401(server: Receiver) -> None:
    key = server.make_key("k")
    assert server.get("/v1/sessions", key).status_code == 200
    for headers in (
        {},
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer ar_unknown"},
    ):
        r = httpx.get(f"{server.url}/v1/sessions", headers=headers)
        assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthorized"), headers
        assert "ar_unknown" not in r.text
    listed = server.cli("keys", "list")
    assert listed.returncode == 0 and key not in listed.stdout and "k  ar_" in listed.stdout
    assert server.cli("keys", "revoke", "k").returncode == 0
    r = server.get("/v1/sessions", key)
    assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthorized")
    assert key not in server.logs()
    # the OpenAPI document needs no key
    doc = server.get("/v1/openapi.json")
    assert doc.status_code == 200 and "/v1/sessions/{id}/scores" in doc.json()["paths"]


def test_a_burst_of_61_on_a_free_key_gets_exactly_one_429(server: Receiver) -> None:
    key = server.make_key("free", plan="free")
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}) as client:
        answers = [client.get(f"{server.url}/v1/sessions") for _ in range(61)]
    statuses = [r.status_code for r in answers]
    assert statuses.count(429) == 1 and statuses[-1] == 429 and statuses.count(200) == 60
    refused = answers[-1]
    assert refused.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    for r in answers:
        assert r.headers["RateLimit-Limit"] == "60"
    assert [int(r.headers["RateLimit-Remaining"]) for r in answers[:3]] == [59, 58, 57]
    assert refused.headers["RateLimit-Remaining"] == "0"


def test_a_key_s_role_is_checked_before_its_plan_limit(server: Receiver) -> None:
    """An exhausted free reader key asking to write is told it may not (403), not to wait
    (429); and writes it may not make spend none of its 60 requests a minute."""
    spent = server.make_key("spent", plan="free")
    fresh = server.make_key("fresh", plan="free")
    ack = f"{server.url}/v1/alerts/session:s1/ack"
    with httpx.Client(headers={"Authorization": f"Bearer {spent}"}) as client:
        reads = [client.get(f"{server.url}/v1/sessions").status_code for _ in range(61)]
        assert reads[-1] == 429 and reads.count(200) == 60
        refused = client.post(ack)
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "forbidden"
    assert "needs writer" in refused.json()["error"]["message"]
    with httpx.Client(headers={"Authorization": f"Bearer {fresh}"}) as client:
        writes = [client.post(ack).status_code for _ in range(61)]
        read = client.get(f"{server.url}/v1/sessions")
    assert writes == [403] * 61
    assert read.status_code == 200 and read.headers["RateLimit-Remaining"] == "59"


def test_a_session_id_with_a_slash_is_served(tmp_path: Path) -> None:
    receiver = Receiver(tmp_path).start()
    try:
        key = receiver.make_key("reader")
        assert receiver.send(ev(1, "score.drop", "a/b", 1, score=12)).status_code == 202
        assert receiver.get("/v1/sessions/a%2Fb", key).json()["id"] == "a/b"
        assert receiver.get("/v1/sessions/a/b/score", key).json()["score"] == 12
        assert len(receiver.get("/v1/sessions/a/b/scores", key).json()["history"]) == 1
    finally:
        receiver.stop()
