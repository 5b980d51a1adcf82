"""Maintenance windows end to end: the real app under uvicorn on a real SQLite file with a
clock the test drives (the window's start and end), real servers on the wall clock for a
kill -9 inside a window and for two PostgreSQL replicas; an HTTP sink for every message."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from receiver.cli import cli
from receiver.events import sample
from tests.dispatch.test_lifecycle import T0
from tests.harness import FakeClock, InProcessReceiver, Receiver, eventually, http_client
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

RULES = """
notifiers:
  hook: "{url}"
  team-chat: "{chat}"
rules:
  - name: drops
    match: {{type: score.drop}}
    notify: hook
    title: "drop {{{{ sessionId }}}}"
    resolve: true  # follows its alert: what is still open when the window ends is woken
maintenance:
  - name: deploy
    match: {{sessionId: {match}}}
    timezone: UTC
    every: ["{every}"]
    notify: [team-chat]
"""


def every(start: datetime, end: datetime) -> str:
    """A weekly range from start to end (UTC, whole minutes), days named."""
    return f"{start:%a %H:%M}-{end:%a %H:%M}"


def rules(sink: HTTPSink, start: datetime, end: datetime, match: str = "s1") -> str:
    chat = sink.json_url("/chat")
    return RULES.format(url=sink.json_url(), chat=chat, every=every(start, end), match=match)


def titles(sink: HTTPSink) -> list[str]:
    return [str(r.json.get("title")) for r in sink.requests]


def explain(server: InProcessReceiver | Receiver, event_id: str) -> dict[str, str]:
    made = CliRunner().invoke(
        cli, ["keys", "create", "--name", "ops", "--plan", "enterprise", "--role", "writer",
              "--json", "--db", str(server.db)],
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    found = http_client.get(
        f"{server.url}/v1/events/{event_id}/explain",
        headers={"Authorization": f"Bearer {json.loads(made.output)['key']}"},
        timeout=10,
    ).json()
    [rule] = [r for r in found["rules"] if r["matched"]]
    return {"decision": str(rule["decision"]), "reason": str(rule.get("reason"))}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0.timestamp())


@pytest.fixture
def server(tmp_path: Path, clock: FakeClock, http_sink: HTTPSink) -> Iterator[InProcessReceiver]:
    start, end = T0 + timedelta(minutes=10), T0 + timedelta(minutes=40)
    found = InProcessReceiver(tmp_path, rules(http_sink, start, end), clock).start()
    try:
        yield found
    finally:
        found.stop()


def test_notices_at_start_and_end_and_what_it_held_woken_once(
    server: InProcessReceiver, clock: FakeClock, http_sink: HTTPSink
) -> None:
    clock.advance(10 * 60)  # 10:10, the window starts
    eventually(lambda: titles(http_sink) == ["Maintenance deploy started"], "the start notice")
    assert "10:10 UTC" in http_sink.requests[0].json["message"]
    for i, session in enumerate(("s1", "s2")):
        at = "2026-11-23T10:11:00Z"
        server.send(sample("score.drop", id=f"e{i}", sessionId=session, timestamp=at))
    server.wait_routed(2)
    eventually(lambda: "drop s2" in titles(http_sink), "the unmatched session's message")
    held = explain(server, "e0")
    assert held == {
        "decision": "maintenance",
        "reason": "deploy (until 2026-11-23 10:40 UTC)",  # explain puts "maintenance: " first
    }
    assert ("e0", "drops", "event", "maintenance") in server.outbox()
    clock.advance(10 * 60)  # still inside: nothing more
    server.wait_sent()
    assert titles(http_sink) == ["Maintenance deploy started", "drop s2"]
    clock.advance(20 * 60)  # 10:40, it ends
    eventually(lambda: len(http_sink.requests) >= 4, "the end notice and the woken message")
    server.wait_sent()
    assert sorted(titles(http_sink)[2:]) == ["Maintenance deploy ended", "drop s1"]
    [woken] = [r for r in http_sink.requests if r.json.get("title") == "drop s1"]
    assert "was in maintenance: deploy since 2026-11-23 10:10:00Z" in woken.json["message"]
    for _ in range(3):  # after it: nothing said or woken twice
        clock.advance(60)
    server.wait_sent()
    assert len(http_sink.requests) == 4


def _next_minutes(lead: float = 10.0) -> tuple[datetime, datetime]:
    """A one-minute window starting at the first whole minute at least lead seconds away."""
    now = datetime.now(UTC)
    start = (now + timedelta(seconds=lead + 60)).replace(second=0, microsecond=0)
    return start, start + timedelta(minutes=1)


def _wait_until(at: datetime) -> None:
    eventually(lambda: datetime.now(UTC) >= at, f"the wall clock to reach {at:%H:%M:%S}", 180)


@pytest.mark.timeout(300)  # the wall clock: up to a minute to the window, a minute in it
def test_a_kill_9_inside_the_window_wakes_what_it_held_once_after_restart(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    start, end = _next_minutes()
    server = Receiver(tmp_path, rules=rules(http_sink, start, end)).start()
    try:
        _wait_until(start)
        eventually(lambda: "Maintenance deploy started" in titles(http_sink), "the start notice")
        server.send(sample("score.drop", id="e1", sessionId="s1"))
        held = "SELECT state FROM outbox WHERE event_id = 'e1'"
        eventually(lambda: server.query(held) == [("maintenance",)], "the drop held")
        server.kill()
        _wait_until(end + timedelta(seconds=1))  # it ends while nothing runs
        assert "drop s1" not in titles(http_sink)
        server.start()
        eventually(lambda: "drop s1" in titles(http_sink), "the held drop woken after restart")
        eventually(lambda: "Maintenance deploy ended" in titles(http_sink), "the end notice")
        server.stop()
        server.start()  # a second start wakes and says nothing again
        server.send(sample("score.drop", id="e2", sessionId="s2"))
        eventually(lambda: "drop s2" in titles(http_sink), "a later drop")
        assert sorted(titles(http_sink)) == [
            "Maintenance deploy ended", "Maintenance deploy started", "drop s1", "drop s2",
        ]  # fmt: skip
    finally:
        server.stop()


@pytest.mark.timeout(300)  # the wall clock, as above
def test_two_postgres_replicas_say_each_notice_once(
    tmp_path: Path, http_sink: HTTPSink, pg_url: str
) -> None:
    start, end = _next_minutes()
    text = rules(http_sink, start, end, match="[s1, s2]")
    replicas = [
        Receiver(tmp_path / name, rules=text, db=pg_url)
        for name in ("a", "b")
        if (tmp_path / name).mkdir() is None
    ]
    for replica in replicas:
        replica.start()
    try:
        _wait_until(start)
        eventually(lambda: "Maintenance deploy started" in titles(http_sink), "the start notice")
        for i, replica in enumerate(replicas):  # senders reach either replica
            replica.send(sample("score.drop", id=f"e{i}", sessionId=f"s{i + 1}"))
        held = "SELECT count(*) FROM outbox WHERE state = 'maintenance'"
        eventually(lambda: replicas[0].query(held) == [(2,)], "both drops held")
        _wait_until(end)
        eventually(lambda: {"drop s1", "drop s2"} <= set(titles(http_sink)), "both drops woken")
        eventually(lambda: "Maintenance deploy ended" in titles(http_sink), "the end notice")
        unsent = "SELECT 1 FROM outbox WHERE state IN ('pending', 'sending') LIMIT 1"
        eventually(lambda: replicas[0].query(unsent) == [], "every row sent")
        assert sorted(titles(http_sink)) == [
            "Maintenance deploy ended", "Maintenance deploy started", "drop s1", "drop s2",
        ]  # fmt: skip
    finally:
        for replica in replicas:
            replica.stop()
