"""One routing transaction on PostgreSQL: the roles of a Tx (receiver.store.base) over one
connection, with the statements SQLite runs too, plus the locks that let several replicas
share the tables."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from typing import Any

from receiver.store.alerts import SELECT_ALERTS, ReadAhead, SQLTxAlerts, SQLTxNotices, alert_row
from receiver.store.digests import SQLTxDigests
from receiver.store.escalations import SQLTxEscalations
from receiver.store.events import SQLTxEvents
from receiver.store.flaps import Flap, SQLTxFlaps
from receiver.store.postgres.locks import Key, Locks
from receiver.store.postgres.schema import lock_key
from receiver.store.records import Alert, Chain, Notice, StoredEvent
from receiver.store.sql import SQLTx
from receiver.store.statements import POSTGRES
from receiver.store.subscribers import SQLTxWebhooks


@lru_cache(maxsize=512)
def _placeholders(sql: str) -> str:
    """`?` placeholders as psycopg's %s (and a literal % doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


def query(conn: Any, sql: str, params: Sequence[Any] = ()) -> Any:
    """Run one statement written with `?` placeholders on a psycopg connection."""
    return conn.execute(_placeholders(sql), params)


def try_lock(conn: Any, name: str) -> bool:
    """Take the named timer's lock for this transaction, if no other replica holds it."""
    return bool(
        conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (lock_key(name),)).fetchone()[0]
    )


# An alert written whole: inserted, or updated in place where it exists.
_SAVE_ALERT = (
    "INSERT INTO alerts (id, state, episode, last_ts, opened_ts, opened_event, resolved_ts,"
    " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET state = excluded.state, episode = excluded.episode,"
    " last_ts = excluded.last_ts, opened_ts = excluded.opened_ts,"
    " opened_event = excluded.opened_event, resolved_ts = excluded.resolved_ts,"
    " updated_at = excluded.updated_at"
)


class PostgresStatements:
    """The open transaction's connection, as the roles run statements on it."""

    dialect = POSTGRES

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def q(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return query(self.conn, sql, params)

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            with self.conn.cursor() as cursor:  # psycopg pipelines the rows
                cursor.executemany(_placeholders(sql), rows)


class PostgresTxEvents(SQLTxEvents):
    """tx.events on PostgreSQL: replicas route disjoint batches."""

    def unrouted(self, limit: int, skip: Iterable[str] = ()) -> list[StoredEvent]:
        rows = self.st.q(
            "SELECT id, type, body, received_at, replay, trace FROM events"
            " WHERE routed_at IS NULL AND NOT (id = ANY(?)) ORDER BY received_at LIMIT ?"
            " FOR UPDATE SKIP LOCKED",
            (list(skip), limit),
        )
        return [StoredEvent(*row) for row in rows]

    def last_received(self) -> float | None:
        row = self.st.q("SELECT max(received_at) FROM events").fetchone()
        return None if row is None or row[0] is None else float(row[0])


class PostgresTxWebhooks(SQLTxWebhooks):
    """tx.webhooks on PostgreSQL: the sessions whose sides are read stay locked."""

    def __init__(self, st: PostgresStatements, locks: Locks) -> None:
        super().__init__(st)
        self.locks = locks

    def sides(
        self, webhook_ids: Iterable[int], session_ids: Iterable[str]
    ) -> dict[tuple[int, str], tuple[bool, str]]:
        # Replicas routing events of one session at once take turns: one crossing, one event.
        self.locks.take(("sides", session_id) for session_id in session_ids)
        return super().sides(webhook_ids, session_ids)


class PostgresTxDigests(SQLTxDigests):
    """tx.digests on PostgreSQL."""

    def __init__(self, st: PostgresStatements, locks: Locks) -> None:
        super().__init__(st)
        self.locks = locks

    def _lock(self, rule: str, key: str) -> None:
        # One digest per (rule, key) across replicas: whoever looks first holds the key.
        self.locks.take([("digest", rule, key)])


class PostgresTxAlerts(SQLTxAlerts):
    """tx.alerts on PostgreSQL: read ahead like SQLite's, and locked."""

    def __init__(self, st: PostgresStatements, ahead: ReadAhead, locks: Locks) -> None:
        super().__init__(st, ahead)
        self.locks = locks

    def _lock(self, alert_ids: Iterable[str]) -> None:
        """Serialize changes to these alerts across replicas (in the transaction's one
        order: receiver.store.postgres.locks)."""
        self.locks.take(("alert", alert_id) for alert_id in alert_ids)

    def get(self, alert_id: str) -> Alert | None:
        kept = self.ahead.alerts
        if kept is not None and alert_id in kept:
            return kept[alert_id]
        self._lock([alert_id])
        row = self.st.q(f"{SELECT_ALERTS} WHERE id = ?", (alert_id,)).fetchone()
        return None if row is None else Alert(*row)

    def save(self, alert: Alert, now: float) -> None:
        if self.ahead.keep(alert, now):
            return
        self._lock([alert.id])
        self.st.q(_SAVE_ALERT, alert_row(alert, now))

    def read_ahead(self, alert_ids: Iterable[str]) -> None:
        ids = sorted(set(alert_ids))
        self._lock(ids)
        kept: dict[str, Alert | None] = dict.fromkeys(ids)
        for row in self.st.q(f"{SELECT_ALERTS} WHERE id = ANY(?)", (ids,)):
            kept[row[0]] = Alert(*row)
        self.ahead.alerts = kept
        self.ahead.read_marks(self.st, ids)

    def flush(self) -> None:
        # One statement for the batch's alerts, pipelined: not a round trip for each.
        self.st.many(_SAVE_ALERT, [alert_row(a, now) for a, now in self.ahead.changed.values()])
        self.forget()


# The timers read what is due FOR UPDATE (SKIP LOCKED), and routing changes a notice or a
# chain under its alert's lock: so the timers lock the alerts first, then their rows, as
# routing does. The other way round, each held what the other waited for.


class PostgresTxNotices(SQLTxNotices):
    """tx.notices on PostgreSQL: the due repeats' alerts locked before their rows."""

    def __init__(self, st: PostgresStatements, ahead: ReadAhead, locks: Locks) -> None:
        super().__init__(st, ahead)
        self.locks = locks

    def due(self, now: float, limit: int = 100) -> list[Notice]:
        alerts = self.st.q(
            "SELECT alert FROM notices WHERE next_repeat_at IS NOT NULL AND next_repeat_at <= ?"
            " LIMIT ?",
            (now, limit),
        )
        self.locks.take(("alert", alert) for (alert,) in alerts)
        return super().due(now, limit)


class PostgresTxEscalations(SQLTxEscalations):
    """tx.escalations on PostgreSQL: the due chains' alerts locked before their rows."""

    def __init__(self, st: PostgresStatements, locks: Locks) -> None:
        super().__init__(st)
        self.locks = locks

    def due(self, now: float, limit: int = 100) -> list[Chain]:
        alerts = self.st.q(
            "SELECT alert FROM escalations WHERE next_at IS NOT NULL AND next_at <= ?"
            " ORDER BY next_at LIMIT ?",
            (now, limit),
        )
        self.locks.take(("alert", alert) for (alert,) in alerts)
        return super().due(now, limit)


class PostgresTxFlaps(SQLTxFlaps):
    """tx.flaps on PostgreSQL: the due records' alerts locked before they settle."""

    def __init__(self, st: PostgresStatements, locks: Locks) -> None:
        super().__init__(st)
        self.locks = locks

    def due(self, now: float, limit: int = 100) -> list[Flap]:
        found = super().due(now, limit)
        self.locks.take(("alert", f.alert) for f in found)
        return super().due(now, limit)  # read again under the locks


class PostgresTx(SQLTx):
    """A Tx on one PostgreSQL connection in a transaction: its roles share it, and its
    locks (first: keys to take before anything else, from an earlier run that needed
    them out of order; patient: wait for any key, receiver.store.postgres.locks)."""

    def __init__(self, conn: Any, *, first: Iterable[Key] = (), patient: bool = False) -> None:
        self.conn = conn
        st = PostgresStatements(conn)
        ahead = ReadAhead()
        self.locks = Locks(st, patient=patient)
        self.locks.take(first)
        super().__init__(
            st,
            ahead,
            events=PostgresTxEvents(st),
            webhooks=PostgresTxWebhooks(st, self.locks),
            alerts=PostgresTxAlerts(st, ahead, self.locks),
            notices=PostgresTxNotices(st, ahead, self.locks),
            escalations=PostgresTxEscalations(st, self.locks),
            digests=PostgresTxDigests(st, self.locks),
            flaps=PostgresTxFlaps(st, self.locks),
        )

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        held = set(self.locks.held)
        try:
            with self.conn.transaction():
                yield
        except BaseException:
            self.locks.held = held  # the locks taken inside went with its rollback
            raise

    def try_lock(self, name: str) -> bool:
        return try_lock(self.conn, name)
