"""What both SQL stores say alike for the admin page: pages of events, quarantined bodies and
notifications (keyset pagination: no COUNT over a whole table), alert acknowledgements,
the bulk retry of dead notifications, and the numbers of the header strip."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from receiver.store.records import (
    CHANNELS,
    WEBHOOK_NOTIFIER,
    Ack,
    Backlog,
    EventQuery,
    EventRow,
    OutboxQuery,
    OutboxRow,
    Quarantined,
)
from receiver.store.sql import OUTBOX_COLUMNS, Query

T = TypeVar("T")

# Event pages sort by (received_at, id). Type and "delivered more than once" have an index
# each (few distinct values: appending to them touches few pages). Session and user have
# none: with events of many sessions interleaved, such an index dirties a page per event
# and cost ingest 19% (bench, 2026-11-23); the admin page bounds those filters in time.
ADMIN_SCHEMA = """
    ALTER TABLE events ADD COLUMN duplicates INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX events_received_id ON events (received_at, id);
    CREATE INDEX events_type ON events (type, received_at, id);
    CREATE INDEX events_duplicated ON events (received_at, id) WHERE duplicates > 0;
    CREATE INDEX outbox_dead ON outbox (notifier) WHERE state = 'dead';
    CREATE TABLE acks (
        alert TEXT NOT NULL,
        episode INTEGER NOT NULL,
        acked_by TEXT NOT NULL,
        acked_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (alert, episode)
    )
"""
_EVENT_COLUMNS = (
    "id, type, session_id, user_id, score, event_ts, received_at, routed_at, duplicates"
)


class SQLAdmin:
    """The Store's admin reads and actions both stores share."""

    async def _read(self, fn: Callable[[Query], T]) -> T:
        raise NotImplementedError

    async def _statements(self, fn: Callable[[Query], T], *, write: bool = True) -> T:
        raise NotImplementedError

    def _in(self, column: str, values: Iterable[Any]) -> tuple[str, Any]:
        raise NotImplementedError

    async def events_page(self, query: EventQuery) -> list[EventRow]:
        """Events newest first (received_at, then id), after query.before if given."""
        wanted = [
            ("type = ?", query.type),
            ("session_id = ?", query.session_id),
            ("user_id = ?", query.user_id),
            ("received_at >= ?", query.since),
            ("received_at < ?", query.until),
        ]
        conds = [cond for cond, value in wanted if value is not None]
        params: list[Any] = [value for _, value in wanted if value is not None]
        if query.duplicated:
            conds.append("duplicates > 0")
        if query.before is not None:
            conds.append("(received_at < ? OR (received_at = ? AND id < ?))")
            params += [query.before[0], query.before[0], query.before[1]]
        where = f" WHERE {' AND '.join(conds)}" if conds else ""
        sql = (
            f"SELECT {_EVENT_COLUMNS} FROM events{where} ORDER BY received_at DESC, id DESC LIMIT ?"
        )
        return await self._read(lambda q: [EventRow(*r) for r in q(sql, (*params, query.limit))])

    async def event(self, event_id: str) -> tuple[EventRow, str] | None:
        """One event and its raw body."""

        def select(q: Query) -> tuple[EventRow, str] | None:
            row = q(
                f"SELECT {_EVENT_COLUMNS}, body FROM events WHERE id = ?", (event_id,)
            ).fetchone()
            return (EventRow(*row[:-1]), row[-1]) if row else None

        return await self._read(select)

    async def quarantined(self, *, before: int | None, limit: int) -> list[Quarantined]:
        def select(q: Query) -> list[Quarantined]:
            rows = q(
                "SELECT id, received_at, reason, client, event_id, body FROM quarantine"
                " WHERE id < ? ORDER BY id DESC LIMIT ?",
                (before if before is not None else 2**62, limit),
            )
            return [
                Quarantined(r[0], r[1], r[2], r[3], r[4], bytes(r[5]).decode("utf-8", "replace"))
                for r in rows
            ]

        return await self._read(select)

    async def outbox_page(self, query: OutboxQuery) -> list[OutboxRow]:
        """Notifications and deliveries newest first (by id), after query.before."""
        wanted = [
            ("state = ?", query.state),
            ("notifier = ?", query.notifier),
            ("event_id = ?", query.event_id),
            ("id < ?", query.before),
        ]
        conds = [cond for cond, value in wanted if value is not None]
        params = [value for _, value in wanted if value is not None]
        where = f" WHERE {' AND '.join(conds)}" if conds else ""
        sql = f"SELECT {OUTBOX_COLUMNS} FROM outbox{where} ORDER BY id DESC LIMIT ?"
        return await self._read(lambda q: [OutboxRow(*r) for r in q(sql, (*params, query.limit))])

    async def count_dead(self, notifier: str | None = None) -> int:
        """Dead notifications (of one notifier): what a bulk retry would touch."""
        sql = "SELECT count(*) FROM outbox WHERE state = 'dead'"
        params: tuple[Any, ...] = ()
        if notifier is not None:
            sql += " AND notifier = ?"
            params = (notifier,)
        return int(await self._read(lambda q: q(sql, params).fetchone()[0]))

    async def retry_dead_batch(self, notifier: str | None, *, limit: int, now: float) -> int:
        """Queue up to limit dead notifications (of one notifier) again; how many."""
        cond = "state = 'dead'" + (" AND notifier = ?" if notifier is not None else "")
        params: tuple[Any, ...] = (notifier,) if notifier is not None else ()
        sql = (
            "UPDATE outbox SET state = 'pending', next_at = ?, attempts = 0, updated_at = ?"
            f" WHERE id IN (SELECT id FROM outbox WHERE {cond} ORDER BY id LIMIT ?)"
        )
        return await self._statements(lambda q: q(sql, (now, now, *params, limit)).rowcount)

    async def ack_alert(self, alert_id: str, *, by: str, now: float) -> Ack | None:
        """Acknowledge an open alert: its repeats stop, and it shows who acked it and when,
        until it resolves. None if no alert of that id is open."""

        def ack(q: Query) -> Ack | None:
            row = q(
                "SELECT episode FROM alerts WHERE id = ? AND state = 'open'", (alert_id,)
            ).fetchone()
            if row is None:
                return None
            episode = int(row[0])
            q(
                "INSERT INTO acks (alert, episode, acked_by, acked_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (alert, episode) DO NOTHING",
                (alert_id, episode, by, now),
            )
            q(
                "UPDATE notices SET next_repeat_at = NULL WHERE alert = ? AND episode = ?",
                (alert_id, episode),
            )
            found = q(
                "SELECT alert, episode, acked_by, acked_at FROM acks"
                " WHERE alert = ? AND episode = ?",
                (alert_id, episode),
            ).fetchone()
            return Ack(*found)

        return await self._statements(ack)

    async def acks(self, alert_ids: Iterable[str]) -> dict[tuple[str, int], Ack]:
        ids = list(alert_ids)
        if not ids:
            return {}
        cond, param = self._in("alert", ids)

        def select(q: Query) -> dict[tuple[str, int], Ack]:
            rows = q(f"SELECT alert, episode, acked_by, acked_at FROM acks WHERE {cond}", (param,))
            return {(r[0], int(r[1])): Ack(r[0], int(r[1]), r[2], r[3]) for r in rows}

        return await self._read(select)

    async def backlog(self, now: float) -> Backlog:
        """The backlog gauges (receiver.metrics): unrouted events and what waits in the
        outbox, counted by the database (every replica's rows), through the partial
        indexes on unrouted events and on due rows."""

        def select(q: Query) -> Backlog:
            [(unrouted, first)] = q(
                "SELECT count(*), min(received_at) FROM events WHERE routed_at IS NULL", ()
            )
            rows = q(
                "SELECT notifier = ?, count(*), min(created_at) FROM outbox"
                " WHERE state IN ('pending', 'sending') GROUP BY 1",
                (WEBHOOK_NOTIFIER,),
            )
            pending = dict.fromkeys(CHANNELS, 0)
            oldest = dict.fromkeys(CHANNELS, 0.0)
            for webhook, count, created in rows:
                channel = "webhook" if webhook else "notify"
                pending[channel] = count
                oldest[channel] = max(0.0, now - created)
            lag = max(0.0, now - first) if first is not None else 0.0
            return Backlog(lag=lag, unrouted=unrouted, pending=pending, oldest=oldest)

        return await self._read(select)

    async def outbox_counts(self) -> dict[str, int]:
        """Notifications waiting (pending, held, sending) and dead, for the header strip."""

        def select(q: Query) -> dict[str, int]:
            rows = q(
                "SELECT state, count(*) FROM outbox WHERE state IN"
                " ('pending', 'held', 'sending', 'dead') GROUP BY state",
                (),
            )
            counts = dict(rows)
            return {
                "pending": sum(counts.get(s, 0) for s in ("pending", "held", "sending")),
                "dead": counts.get("dead", 0),
            }

        return await self._read(select)
