"""The backtest is correct by construction: the real server (under uvicorn, a real SQLite file,
a real HTTP sink, on a clock the test moves) routes a recorded stream through rules with
every lifecycle option; then `receiver backtest` replays the same period with the same
rules, and must say exactly what the server did: the same notifications sent, suppressed
(by each reason) and still held, rule by rule."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from receiver.cli import cli
from tests import dbview
from tests.harness import FakeClock, InProcessReceiver
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)  # a Monday, 10:00 UTC
WINDOW = '{days: [mon], hours: "12:00-18:00", tz: UTC'

RULES = """
notifiers:
  hook: "{url}"
rules:
  - name: page
    match: {{type: score.drop, score: {{lt: 20}}}}
    notify: hook
    hold: 2m
    resolve: true
    repeat: 10m
    continue: true
  - name: chat
    match: {{type: score.drop}}
    notify: hook
    throttle: {{key: "{{{{ userId }}}}", every: 30m}}
    continue: true
  - name: digest
    match: {{type: score.drop}}
    notify: hook
    group: {{by: [type], wait: 10m, max: 50}}
  - name: interventions
    match: {{type: intervention.fired}}
    notify: hook
    active: {window}, defer: true}}
  - name: stopped
    match: {{type: session.stopped}}
    notify: hook
    active: {window}}}
"""


def stamp(minute: float) -> str:
    return (T0 + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ev(kind: str, event_id: str, minute: float, session: str, **fields: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "id": event_id,
        "type": kind,
        "sessionId": session,
        "userId": fields.pop("user", f"u_{session}"),
        "timestamp": stamp(minute),
    }
    if kind.startswith("score."):
        event.update(threshold=40, score=fields.pop("score", 60))
    return {**event, **fields}


# (minute the clock is at when it is sent, event): the recorded stream.
STREAM = [
    (0, ev("score.drop", "d1", 0, "s1", score=10, user="u1")),  # page held 2m
    (0, ev("score.drop", "d2", 0, "s2", score=30, user="u2")),
    (1, ev("score.recover", "r2", 1, "s2")),
    (1, ev("score.drop", "d3", 1, "s3", score=5, user="u1")),  # chat: u1 throttled
    (1.5, ev("score.recover", "r3", 1.5, "s3")),  # inside page's hold: cancelled
    (5, ev("intervention.fired", "i1", 5, "s1", interventionId="i1")),  # deferred to 12:00
    (5, ev("session.stopped", "x4", 5, "s4")),  # muted: before 12:00
    (32, ev("score.recover", "r1", 32, "s1")),  # after 3 repeats: resolved message
    (33, ev("score.drop", "d1b", 31, "s1", score=12, user="u1")),  # older than r1: stale
    (40, ev("score.drop", "d5", 40, "s5", score=50, user="u5")),
]
END = 125  # minutes: past 12:00, when the deferred intervention goes out


def settled(db: str, now: float) -> bool:
    """Nothing left for the server to do by now: every event routed, every due row sent,
    every due repeat made. One statement, so one snapshot: checked one after another, a
    repeat made between two checks (its notice moved on, its row pending) passed both, and
    the clock then moved while the row was being claimed, expiring its lease (sent twice)."""
    sql = """SELECT
        (SELECT count(*) FROM events WHERE routed_at IS NULL)
      + (SELECT count(*) FROM outbox WHERE state IN ('pending', 'sending'))
      + (SELECT count(*) FROM outbox WHERE state = 'held' AND next_at <= ?)
      + (SELECT count(*) FROM notices WHERE next_repeat_at <= ?)"""
    return dbview.query(db, sql, (now, now))[0][0] == 0


def settle(server: InProcessReceiver, clock: FakeClock) -> None:
    deadline = time.monotonic() + 15
    while not settled(str(server.db), clock.now):
        assert time.monotonic() < deadline, f"server did not settle: {server.outbox()}"
        time.sleep(0.03)


@pytest.fixture
def server(tmp_path: Path, http_sink: HTTPSink) -> Iterator[tuple[InProcessReceiver, FakeClock]]:
    clock = FakeClock(T0.timestamp())
    rules = RULES.format(url=http_sink.json_url(), window=WINDOW)
    running = InProcessReceiver(tmp_path, rules, clock).start()
    try:
        yield running, clock
    finally:
        running.stop()


def record(server: InProcessReceiver, clock: FakeClock) -> None:
    """Send the stream at its times, moving the clock in 5-minute steps between (each step
    lands on the timers' due times: repeats every 10m, digests of 10m), letting the server
    settle at each."""
    minute = 0.0
    for at, event in [*STREAM, (END, None)]:
        while minute < at:
            step = min(5.0 - minute % 5.0, at - minute)
            clock.advance(step * 60)
            minute += step
            settle(server, clock)
        if event is not None:
            assert server.send(event).status_code == 202
            settle(server, clock)


def actual(db: str) -> dict[str, dict[str, Any]]:
    """What the server did, per rule: sent (delivered), held, suppressed by reason."""
    found: dict[str, dict[str, Any]] = {}
    for rule, state, n in dbview.query(
        db, "SELECT rule, state, count(*) FROM outbox GROUP BY rule, state"
    ):
        entry = found.setdefault(rule, {"sent": 0, "held_at_end": 0, "suppressed": Counter()})
        if state == "delivered":
            entry["sent"] += n
        elif state == "held":
            entry["held_at_end"] += n
        else:
            entry["suppressed"][state] += n
    return {r: {**e, "suppressed": dict(e["suppressed"])} for r, e in found.items()}


def test_a_backtest_of_the_current_rules_says_what_the_server_did(
    server: tuple[InProcessReceiver, FakeClock], http_sink: HTTPSink
) -> None:
    receiver, clock = server
    record(receiver, clock)
    db = str(receiver.db)
    # The scenario reaches every outcome the comparison is about.
    kinds = {row[0] for row in dbview.query(db, "SELECT DISTINCT kind FROM outbox")}
    states = {row[0] for row in dbview.query(db, "SELECT DISTINCT state FROM outbox")}
    assert kinds == {"event", "digest", "repeat", "resolved"}
    assert states == {"delivered", "cancelled", "throttled", "grouped", "stale", "muted"}
    assert (
        len(http_sink.requests)
        == dbview.query(db, "SELECT count(*) FROM outbox WHERE state = 'delivered'")[0][0]
    )

    start, end = T0.timestamp(), T0.timestamp() + END * 60 + 1
    receiver.stop()  # done: the backtest reads what it left (the fixture's stop is a no-op)
    done = CliRunner().invoke(
        cli,
        ["backtest", str(receiver.rules), "--against", str(receiver.rules), "--db", db,
         "--from", str(start), "--to", str(end), "--json"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    expected = actual(db)
    for side in ("candidate", "current"):
        got = {
            rule: {k: t[k] for k in ("sent", "held_at_end", "suppressed")}
            for rule, t in report[side]["rules"].items()
        }
        assert got == expected
    assert report["events"] == len(STREAM)
    assert report["missed_count"] == report["added_count"] == 0
    # The real store was only read: its outbox is as the server left it.
    assert actual(db) == expected
