"""Maintenance windows end to end: the real app under uvicorn on a real SQLite file with a
clock the test drives (the window's start and end), real servers on the wall clock for a
kill -9 inside a window and for two PostgreSQL replicas; an HTTP sink for every message."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from receiver.cli import cli
from receiver.dispatch.router import IDLE_POLL
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
    """A weekly range from start to end (UTC, whole seconds), days named."""
    return f"{start:%a %H:%M:%S}-{end:%a %H:%M:%S}"


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


def _window(lead: float, length: float = 18.0) -> tuple[datetime, datetime]:
    """A short window on the wall clock: starting at least lead seconds from now (time for
    the servers to start), whole seconds, length seconds long."""
    start = (datetime.now(UTC) + timedelta(seconds=lead + 1)).replace(microsecond=0)
    return start, start + timedelta(seconds=length)


def _wait_until(at: datetime) -> None:
    eventually(lambda: datetime.now(UTC) >= at, f"the wall clock to reach {at:%H:%M:%S}")


def _seen(sink: HTTPSink, title: str) -> datetime:
    """When the sink received the message titled title, on the wall clock."""
    [got] = [r for r in sink.requests if r.json.get("title") == title]
    return datetime.now(UTC) - timedelta(seconds=time.monotonic() - got.received_at)


def _prompt(sink: HTTPSink, title: str, boundary: datetime, ready: datetime) -> None:
    """The notice came at the boundary, not before, and within the timers' idle interval
    of when a running server could see it (they sleep until the boundary)."""
    seen = _seen(sink, title)
    assert boundary - timedelta(seconds=0.1) <= seen, (title, seen, boundary)
    assert seen <= max(boundary, ready) + timedelta(seconds=IDLE_POLL), (title, seen, boundary)


@pytest.mark.slow
def test_a_kill_9_inside_the_window_wakes_what_it_held_once_after_restart(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    start, end = _window(lead=5, length=15)
    server = Receiver(tmp_path, rules=rules(http_sink, start, end)).start()
    ready = datetime.now(UTC)
    try:
        _wait_until(start)
        eventually(lambda: "Maintenance deploy started" in titles(http_sink), "the start notice")
        _prompt(http_sink, "Maintenance deploy started", start, ready)
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


@pytest.mark.slow
def test_two_postgres_replicas_say_each_notice_once(
    tmp_path: Path, http_sink: HTTPSink, pg_url: str
) -> None:
    start, end = _window(lead=8, length=15)
    text = rules(http_sink, start, end, match="[s1, s2]")
    replicas = [
        Receiver(tmp_path / name, rules=text, db=pg_url)
        for name in ("a", "b")
        if (tmp_path / name).mkdir() is None
    ]
    for replica in replicas:
        replica.start()
    ready = datetime.now(UTC)
    try:
        _wait_until(start)
        eventually(lambda: "Maintenance deploy started" in titles(http_sink), "the start notice")
        _prompt(http_sink, "Maintenance deploy started", start, ready)
        for i, replica in enumerate(replicas):  # senders reach either replica
            replica.send(sample("score.drop", id=f"e{i}", sessionId=f"s{i + 1}"))
        held = "SELECT count(*) FROM outbox WHERE state = 'maintenance'"
        eventually(lambda: replicas[0].query(held) == [(2,)], "both drops held")
        _wait_until(end)
        eventually(lambda: {"drop s1", "drop s2"} <= set(titles(http_sink)), "both drops woken")
        eventually(lambda: "Maintenance deploy ended" in titles(http_sink), "the end notice")
        _prompt(http_sink, "Maintenance deploy ended", end, ready)
        unsent = "SELECT 1 FROM outbox WHERE state IN ('pending', 'sending') LIMIT 1"
        eventually(lambda: replicas[0].query(unsent) == [], "every row sent")
        assert sorted(titles(http_sink)) == [
            "Maintenance deploy ended", "Maintenance deploy started", "drop s1", "drop s2",
        ]  # fmt: skip
    finally:
        for replica in replicas:
            replica.stop()
