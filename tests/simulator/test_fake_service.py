"""The fake upstream (`receiver simulate --serve-api`) as a real server: the document's API
in the receiver's dialect, plan limits, and signed deliveries with the retry schedule."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from receiver import signature
from tests.fake_upstream import KEYS, FakeUpstream
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeUpstream]:
    """Its live sessions standing still (a tick an hour), so its answers do not change."""
    server = FakeUpstream(tmp_path, population=45, tick=3600).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def live_fake(tmp_path: Path) -> Iterator[FakeUpstream]:
    server = FakeUpstream(tmp_path, population=45, tick=0.2).start()
    try:
        yield server
    finally:
        server.stop()


def test_paging_with_the_cursor_lists_every_session_once_newest_first(fake: FakeUpstream) -> None:
    seen: list[dict[str, object]] = []
    cursor = None
    for _ in range(10):
        page = fake.get("/sessions", limit="20", **({"cursor": cursor} if cursor else {})).json()
        assert page["total"] == 45
        seen += page["sessions"]
        cursor = page["cursor"]
        if cursor is None:
            break
    assert len(seen) == 45 and len({s["id"] for s in seen}) == 45
    starts = [str(s["startedAt"]) for s in seen]
    assert starts == sorted(starts, reverse=True)
    assert set(seen[0]) == {"id", "userId", "score", "status", "context", "startedAt"}


def test_one_session_its_score_and_its_history(fake: FakeUpstream) -> None:
    one = fake.get("/sessions/sess_up_000").json()
    assert set(one) == {
        "id", "userId", "score", "status", "context", "signals", "interventions",
        "startedAt", "updatedAt",
    }  # fmt: skip
    score = fake.get("/sessions/sess_up_000/score").json()
    assert score == {
        "sessionId": "sess_up_000",
        "score": one["score"],
        "updatedAt": one["updatedAt"],
    }
    history = fake.get("/sessions/sess_up_000/scores").json()["history"]
    stamps = [p["timestamp"] for p in history]
    assert stamps == sorted(stamps) and history[-1]["score"] == one["score"]
    missing = fake.get("/sessions/sess_nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "session_not_found"


def test_filters_and_bad_parameters_are_refused_as_the_receiver_does(fake: FakeUpstream) -> None:
    stopped = fake.get("/sessions", status="stopped", limit="100").json()
    assert stopped["total"] == 42 and all(s["status"] == "stopped" for s in stopped["sessions"])
    bad = fake.get("/sessions", limit="500")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_parameter"
    groups = fake.get("/scores", groupBy="cohort", metric="p95").json()["groups"]
    assert groups and {"key", "avg", "p50", "p95", "sessions"} == set(groups[0])


def test_the_free_plan_allows_60_requests_a_minute(fake: FakeUpstream) -> None:
    with httpx.Client(headers={"Authorization": f"Bearer {KEYS['free']}"}) as client:
        answers = [client.get(f"{fake.url}/sessions", params={"limit": 1}) for _ in range(61)]
    assert [a.status_code for a in answers[:60]] == [200] * 60
    assert answers[0].headers["RateLimit-Limit"] == "60"
    refused = answers[60]
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["code"] == "rate_limited"
    # Another key is counted apart, and enterprise has no limit.
    assert fake.get("/sessions", plan="enterprise").status_code == 200


def test_deliveries_are_signed_and_retried_on_the_schedule_until_answered(
    live_fake: FakeUpstream, http_sink: HTTPSink
) -> None:
    """--speed 600: retries 0.1s, 0.5s, 3s, 12s, 48s after the first attempt. The sink
    refuses at first; once it answers 2xx, every event is delivered, none failed."""
    fake = live_fake
    http_sink.fail_with(503)
    made = httpx.post(
        f"{fake.url}/webhooks",
        headers={"Authorization": f"Bearer {KEYS['pro']}"},
        json={"url": f"{http_sink.url}/v1/events", "events": ["score.drop", "score.recover"]},
        timeout=10,
    )
    assert made.status_code == 201
    secret = made.json()["secret"]
    refused = http_sink.wait_for(3, timeout=60)
    http_sink.ok()
    first = refused[0]
    signature.verify([secret.encode()], first.body, first.headers["X-Service-Signature"])
    wanted = {r.json["id"] for r in refused}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # each refused event comes again and is taken
        taken = {r.json["id"] for r in http_sink.requests if r.status == 200}
        if wanted <= taken:
            break
        time.sleep(0.1)
    assert wanted <= taken
    [hook] = fake.stats()["webhooks"]
    assert hook["retried"] >= len(wanted) and hook["failed"] == 0


def test_registration_is_validated(fake: FakeUpstream) -> None:
    made = httpx.post(
        f"{fake.url}/webhooks",
        headers={"Authorization": f"Bearer {KEYS['pro']}"},
        json={"url": "http://127.0.0.1:9/x", "events": ["score.dropped"]},
        timeout=10,
    )
    assert made.status_code == 400
    assert made.json()["error"]["code"] == "invalid_webhook"
    assert "score.dropped" in made.json()["error"]["message"]
