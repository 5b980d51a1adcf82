"""What both SQL stores say alike about the past: the stored events of a period in order of
arrival, in pages (`receiver backtest` replays them), and the noise report of a period's
notifications (`receiver report` and the admin page's Report): store.history."""

from __future__ import annotations

from typing import Any

from receiver.store.records import SENT_STATES, Noise, StoredEvent
from receiver.store.statements import Query, Runner

DAY = 86400
TOP = 10  # sessions, users and flapping alerts listed
# Notifications a person receives (kind): not webhook deliveries to subscribers.
_PEOPLE = "kind IN ('event', 'digest', 'resolved', 'repeat', 'heartbeat')"


class SQLHistory:
    """store.history (base.History) on either SQL store."""

    def __init__(self, db: Runner) -> None:
        self.db = db

    async def between(
        self, start: float, end: float, *, after: tuple[float, str] | None, limit: int
    ) -> list[StoredEvent]:
        """Events received in [start, end), oldest first (received_at, then id), after the
        (received_at, id) of the last one read: a page of a stream over the whole period."""
        sql = (
            "SELECT id, type, body, received_at FROM events WHERE received_at >= ?"
            " AND received_at < ?"
        )
        # After a page, its last time is the lower bound itself: the index then starts
        # there, not at the period's start (which made each page slower than the last).
        params: list[Any] = [start if after is None else max(start, after[0]), end]
        if after is not None:
            sql += " AND (received_at > ? OR id > ?)"
            params += [after[0], after[1]]
        sql += " ORDER BY received_at, id LIMIT ?"
        return await self.db.read(
            lambda q: [StoredEvent(r[0], r[1], r[2], float(r[3])) for r in q(sql, (*params, limit))]
        )

    async def count_between(self, start: float, end: float) -> int:
        """How many events were received in [start, end) (a backtest's progress bar)."""
        sql = "SELECT count(*) FROM events WHERE received_at >= ? AND received_at < ?"
        return int(await self.db.read(lambda q: q(sql, (start, end)).fetchone()[0]))

    async def noise(self, since: float, until: float, *, flapping: int = 3) -> Noise:
        """The notifications created in [since, until): counts per rule, notifier, state and
        day, the sessions and users that caused most, alerts opened more than `flapping`
        times (still changing in the period), dead ones per target, and the time from an
        event's arrival to its notification's delivery (p50, p99)."""
        day = self.db.dialect.floor.format(f"created_at / {DAY}")

        def select(q: Query) -> Noise:
            window = (since, until)
            period = "created_at >= ? AND created_at < ?"
            sent = f"state IN {SENT_STATES}"
            events = q(
                "SELECT count(*) FROM events WHERE received_at >= ? AND received_at < ?", window
            ).fetchone()[0]
            outbox = q(
                f"SELECT rule, notifier, kind, state, count(*) FROM outbox WHERE {period}"
                f" AND {_PEOPLE} GROUP BY rule, notifier, kind, state ORDER BY rule, notifier,"
                " kind, state",
                window,
            ).fetchall()
            per_day = q(
                f"SELECT {day} AS d, count(*) FROM outbox WHERE {period} AND {sent}"
                f" AND {_PEOPLE} GROUP BY d ORDER BY d",
                window,
            ).fetchall()
            top = {}
            for column in ("session_id", "user_id"):
                top[column] = q(
                    f"SELECT e.{column}, count(*) AS n FROM outbox o JOIN events e"
                    f" ON e.id = o.event_id WHERE o.created_at >= ? AND o.created_at < ?"
                    f" AND o.{sent} AND o.{_PEOPLE} AND e.{column} IS NOT NULL"
                    f" GROUP BY e.{column} ORDER BY n DESC, e.{column} LIMIT {TOP}",
                    window,
                ).fetchall()
            flaps = q(
                "SELECT id, episode, state FROM alerts WHERE episode > ? AND updated_at >= ?"
                f" AND updated_at < ? ORDER BY episode DESC, id LIMIT {TOP}",
                (flapping, since, until),
            ).fetchall()
            dead = q(
                f"SELECT notifier, target, count(*) FROM outbox WHERE {period}"
                " AND state = 'dead' GROUP BY notifier, target ORDER BY count(*) DESC, notifier,"
                " target",
                window,
            ).fetchall()
            delivered, latency = _latency(q, window)
            return Noise(
                since=since,
                until=until,
                events=int(events),
                outbox=[(r[0], r[1], r[2], r[3], int(r[4])) for r in outbox],
                per_day=[(float(r[0]) * DAY, int(r[1])) for r in per_day],
                top_sessions=[(str(r[0]), int(r[1])) for r in top["session_id"]],
                top_users=[(str(r[0]), int(r[1])) for r in top["user_id"]],
                flapping=[(r[0], int(r[1]), r[2]) for r in flaps],
                dead=[(r[0], int(r[1]), int(r[2])) for r in dead],
                latency=latency,
                delivered=delivered,
            )

        return await self.db.read(select)


def _latency(q: Query, window: tuple[float, float]) -> tuple[int, dict[str, float]]:
    """p50 and p99 of (delivered at - event received at) for the period's notifications of
    events (kind event: a digest or repeat is late on purpose), read as the nth smallest."""
    base = (
        "FROM outbox o JOIN events e ON e.id = o.event_id WHERE o.created_at >= ?"
        " AND o.created_at < ? AND o.state = 'delivered' AND o.kind = 'event'"
    )
    count = int(q(f"SELECT count(*) {base}", window).fetchone()[0])
    found: dict[str, float] = {}
    for name, share in (("p50", 0.5), ("p99", 0.99)):
        if count:
            nth = min(count - 1, int(share * count))
            row = q(
                f"SELECT o.updated_at - e.received_at AS lag {base} ORDER BY lag LIMIT 1 OFFSET ?",
                (*window, nth),
            ).fetchone()
            found[name] = max(0.0, float(row[0]))
    return count, found
