"""Late events, in process: the lifecycle pipeline over a real SQLite schema, no server.

The sender retries for hours, so events arrive out of order. An event older than
its alert's newest is stale for lifecycle rules (hold, resolve, repeat): it sends
nothing for them and never moves the alert back. Every other rule forwards each
matching event exactly once, whatever the order (tests/dispatch/test_lifecycle.py does the
same end to end).
"""

import json
import sqlite3
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from receiver.dispatch.explain import explain_now
from receiver.dispatch.pipeline import Pipeline
from receiver.rules import Ruleset, load_text
from receiver.store.sqlite.schema import migrate
from receiver.store.sqlite.tx import Alert, SQLiteTx

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)  # a Monday, 10:00 UTC


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ev(kind: str, event_id: str, minute: float) -> dict[str, Any]:
    return {
        "id": event_id,
        "type": kind,
        "sessionId": "sess_1",
        "userId": "user_42",
        "score": 12 if kind == "score.drop" else 55,
        "threshold": 40,
        "timestamp": at(minute),
    }


DROP, RECOVER = "score.drop", "score.recover"

PLAIN = """
  - name: forward
    match: {type: [score.drop, score.recover]}
    notify: console
    continue: true
"""
LIFECYCLE = """
  - name: page
    match: {type: score.drop}
    notify: console
    resolve: true
"""


class Routed:
    """Events routed one by one, as the router does, each in its own transaction."""

    def __init__(self, rules: str, conn: sqlite3.Connection) -> None:
        self.ruleset: Ruleset = load_text("rules:" + rules, env={})
        self.conn = conn
        self.now = T0.timestamp()
        self.counts: dict[str, int] = {}

    def arrive(self, *events: dict[str, Any], gap: float = 1.0) -> "Routed":
        for payload in events:
            self.now += gap
            self.conn.execute(
                "INSERT INTO events (id, type, session_id, event_ts, received_at, body)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    payload["id"],
                    payload["type"],
                    payload["sessionId"],
                    payload["timestamp"],
                    self.now,
                    json.dumps(payload),
                ),
            )
            self.conn.execute("BEGIN")
            pipeline = Pipeline(SQLiteTx(self.conn), self.ruleset, self.now)
            pipeline.event(payload["id"], payload, self.ruleset.route(payload))
            self.conn.execute("COMMIT")
            for outcome, n in pipeline.counts.items():
                self.counts[outcome] = self.counts.get(outcome, 0) + n
        return self

    def outbox(self, rule: str | None = None) -> list[tuple[str, str, str, str]]:
        rows = self.conn.execute(
            "SELECT event_id, rule, kind, state FROM outbox ORDER BY id"
        ).fetchall()
        return [r for r in rows if rule is None or r[1] == rule]

    def alert(self) -> tuple[str, int, str]:
        state, episode, last_ts = self.conn.execute(
            "SELECT state, episode, last_ts FROM alerts WHERE id = 'session:sess_1'"
        ).fetchone()
        return state, episode, last_ts


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    db = sqlite3.connect(":memory:", isolation_level=None)
    migrate(db)
    yield db
    db.close()


def route(conn: sqlite3.Connection, rules: str, arrivals: Sequence[dict[str, Any]]) -> Routed:
    return Routed(rules, conn).arrive(*arrivals)


@pytest.mark.parametrize(
    ("arrivals", "forwarded"),
    [
        pytest.param(
            [ev(RECOVER, "e2", 20), ev(DROP, "e1", 10)],
            ["e2", "e1"],
            id="recover-then-its-drop",
        ),
        pytest.param(
            [ev(DROP, "e1", 0), ev(RECOVER, "e2", 10), ev(DROP, "e0", 5)],
            ["e1", "e2", "e0"],
            id="retried-older-drop-after-the-recover",
        ),
        pytest.param(
            [ev(DROP, "e1", 0), ev(DROP, "e3", 20), ev(RECOVER, "e2", 10)],
            ["e1", "e3", "e2"],
            id="retried-older-recover-after-a-newer-drop",
        ),
        pytest.param(
            [ev(DROP, "e3", 30), ev(RECOVER, "e2", 20), ev(DROP, "e1", 10), ev(RECOVER, "e0", 0)],
            ["e3", "e2", "e1", "e0"],
            id="all-in-reverse",
        ),
    ],
)
def test_a_plain_rule_forwards_every_event_once_in_any_order(
    conn: sqlite3.Connection, arrivals: list[dict[str, Any]], forwarded: list[str]
) -> None:
    routed = route(conn, PLAIN, arrivals)
    assert routed.outbox() == [(i, "forward", "event", "pending") for i in forwarded]
    assert routed.counts.get("stale", 0) == 0


def test_a_lifecycle_rule_records_a_drop_older_than_its_recover_as_stale(
    conn: sqlite3.Connection,
) -> None:
    routed = route(conn, LIFECYCLE, [ev(RECOVER, "e2", 20), ev(DROP, "e1", 10)])
    assert routed.outbox() == [("e1", "page", "event", "stale")]
    assert routed.alert() == ("resolved", 0, at(20))  # never opened
    assert routed.counts["stale"] == 1


def test_a_retried_drop_after_the_recover_does_not_reopen_the_alert(
    conn: sqlite3.Connection,
) -> None:
    routed = route(conn, LIFECYCLE, [ev(DROP, "e1", 0), ev(RECOVER, "e2", 10), ev(DROP, "e0", 5)])
    assert routed.outbox() == [
        ("e1", "page", "event", "pending"),
        ("e2", "page", "resolved", "pending"),
        ("e0", "page", "event", "stale"),
    ]
    assert routed.alert() == ("resolved", 1, at(10))
    routed.arrive(ev(RECOVER, "e4", 15))  # in order: nothing open, so no second resolved
    assert routed.outbox()[3:] == []


def test_both_kinds_on_the_same_late_drop(conn: sqlite3.Connection) -> None:
    """The plain rule forwards the late drop; the lifecycle rule and the alert ignore it."""
    routed = route(
        conn, PLAIN + LIFECYCLE, [ev(DROP, "e1", 0), ev(RECOVER, "e2", 10), ev(DROP, "e0", 5)]
    )
    assert routed.outbox("forward") == [
        ("e1", "forward", "event", "pending"),
        ("e2", "forward", "event", "pending"),
        ("e0", "forward", "event", "pending"),
    ]
    assert routed.outbox("page") == [
        ("e1", "page", "event", "pending"),
        ("e2", "page", "resolved", "pending"),
        ("e0", "page", "event", "stale"),
    ]
    assert routed.alert() == ("resolved", 1, at(10))
    assert routed.counts["stale"] == 1 and routed.counts["pending"] == 4
    # The next real drop opens episode 2 as usual, and its recover resolves it.
    routed.arrive(ev(DROP, "e5", 20), ev(RECOVER, "e6", 25))
    assert routed.alert() == ("resolved", 2, at(25))
    assert ("e6", "page", "resolved", "pending") in routed.outbox("page")


def test_a_plain_rule_with_the_alert_open_forwards_an_older_drop(
    conn: sqlite3.Connection,
) -> None:
    """Stale is about the alert's order, not its state: open alerts too."""
    routed = route(conn, PLAIN + LIFECYCLE, [ev(DROP, "e2", 10), ev(DROP, "e1", 5)])
    assert [r[3] for r in routed.outbox("forward")] == ["pending", "pending"]
    assert [r[3] for r in routed.outbox("page")] == ["pending", "stale"]
    assert routed.alert() == ("open", 1, at(10))


def test_a_plain_rules_deferred_notification_is_not_cancelled_by_a_resolve(
    conn: sqlite3.Connection,
) -> None:
    """Its notifications belong to the event, not to the alert; hold still cancels."""
    rules = """
  - name: forward
    match: {type: score.drop}
    notify: console
    continue: true
    active: {hours: "12:00-18:00", defer: true}
  - name: page
    match: {type: score.drop}
    notify: console
    hold: 60s
"""
    routed = route(conn, rules, [ev(DROP, "e1", 0), ev(RECOVER, "e2", 0.5)])
    assert routed.outbox() == [
        ("e1", "forward", "event", "held"),  # deferred to 12:00, still to be sent
        ("e1", "page", "event", "cancelled"),
    ]


def test_a_throttled_plain_rule_throttles_by_arrival_not_by_timestamp(
    conn: sqlite3.Connection,
) -> None:
    rules = """
  - name: forward
    match: {type: score.drop}
    notify: console
    throttle: {key: "{{ sessionId }}", every: 15m}
"""
    routed = Routed(rules, conn)
    routed.arrive(ev(DROP, "e2", 10), ev(DROP, "e1", 5))  # the older one inside the window
    routed.arrive(ev(DROP, "e0", 0), gap=16 * 60)  # an even older one, after the window
    assert routed.outbox() == [
        ("e2", "forward", "event", "pending"),
        ("e1", "forward", "event", "throttled"),
        ("e0", "forward", "event", "pending"),
    ]


@pytest.mark.parametrize(
    ("options", "follows"),
    [
        pytest.param("", False, id="plain"),
        pytest.param("throttle: {every: 15m}", False, id="throttle"),
        pytest.param("group: {by: [type]}", False, id="group"),
        pytest.param('active: {hours: "08:00-20:00", defer: true}', False, id="active"),
        pytest.param("hold: 60s", True, id="hold"),
        pytest.param("resolve: true", True, id="resolve"),
        pytest.param("repeat: 4h", True, id="repeat"),
    ],
)
def test_which_rules_follow_their_alert(options: str, follows: bool) -> None:
    ruleset = load_text(f"rules:\n  - name: r\n    notify: console\n    {options}\n", env={})
    assert ruleset.by_name["r"].follows_alert is follows


def test_explain_says_which_rules_a_late_event_is_stale_for() -> None:
    ruleset = load_text("rules:" + PLAIN + LIFECYCLE, env={})
    alert = Alert("session:sess_1", "resolved", 1, at(10))
    lines = explain_now(ruleset, ev(DROP, "e0", 5), T0.timestamp(), alert=alert)
    assert lines[1].startswith("stale: older than the alert's newest event, so rules with hold")
    assert "page: stale, nothing sent" in lines
    assert not any(line.startswith("forward:") for line in lines)
    fresh = explain_now(ruleset, ev(DROP, "e3", 15), T0.timestamp(), alert=alert)
    assert not any("stale" in line for line in fresh)
