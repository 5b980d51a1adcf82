"""One routing transaction on PostgreSQL (receiver.store.base.Tx): the statements SQLite runs
too (receiver.store.sql), plus the locks that let several replicas share the tables."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from typing import Any

from receiver.store.postgres.schema import lock_key
from receiver.store.records import Alert, StoredEvent
from receiver.store.sql import SELECT_ALERTS, SQLTx, alert_row


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


class PostgresTx(SQLTx):
    """One routing transaction on PostgreSQL."""

    # Replicas running the timers at once (after a failover) take disjoint repeats.
    _skip_locked = " FOR UPDATE SKIP LOCKED"
    _lock_sessions = True

    def __init__(self, conn: Any) -> None:
        super().__init__()
        self.conn = conn
        self._locked: set[str] = set()  # alerts locked by this transaction

    def _q(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return query(self.conn, sql, params)

    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            with self.conn.cursor() as cursor:  # psycopg pipelines the rows
                cursor.executemany(_placeholders(sql), rows)

    def _in(self, column: str, values: Iterable[Any]) -> tuple[str, Any]:
        return f"{column} = ANY(?)", list(values)

    def _lock_group(self, rule: str, key: str) -> None:
        # One digest per (rule, key) across replicas: whoever looks first holds the key.
        self.conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s), hashtext(%s))", (rule, key))

    def sides(
        self, webhook_ids: Iterable[int], session_ids: Iterable[str]
    ) -> dict[tuple[int, str], tuple[bool, str]]:
        # Replicas routing events of one session at once take turns: one crossing, one event.
        for session_id in sorted(set(session_ids)):
            self.conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext('webhook-sides'), hashtext(%s))",
                (session_id,),
            )
        return super().sides(webhook_ids, session_ids)

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        with self.conn.transaction():
            yield

    def try_lock(self, name: str) -> bool:
        return try_lock(self.conn, name)

    def _lock_alerts(self, alert_ids: Iterable[str]) -> None:
        """Serialize changes to these alerts across replicas (sorted: no deadlock between
        two batches)."""
        todo = sorted(set(alert_ids) - self._locked)
        if todo:
            self.conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(id, 0)) FROM unnest(%s::text[])"
                " AS id ORDER BY id",
                (todo,),
            ).fetchall()
            self._locked.update(todo)

    # -- events -----------------------------------------------------------------------------

    def unrouted(self, limit: int, skip: Iterable[str] = ()) -> list[StoredEvent]:
        rows = self.conn.execute(
            "SELECT id, type, body, received_at, replay FROM events WHERE routed_at IS NULL"
            " AND NOT (id = ANY(%s)) ORDER BY received_at LIMIT %s FOR UPDATE SKIP LOCKED",
            (list(skip), limit),
        )
        return [StoredEvent(*row) for row in rows]

    def last_received(self) -> float | None:
        row = self.conn.execute("SELECT max(received_at) FROM events").fetchone()
        return None if row is None or row[0] is None else float(row[0])

    # -- alerts: read ahead like SQLite's, and locked -----------------------------------------

    def alert(self, alert_id: str) -> Alert | None:
        if self._alerts is not None and alert_id in self._alerts:
            return self._alerts[alert_id]
        self._lock_alerts([alert_id])
        row = self._q(f"{SELECT_ALERTS} WHERE id = ?", (alert_id,)).fetchone()
        return None if row is None else Alert(*row)

    def save_alert(self, alert: Alert, now: float) -> None:
        if self._alerts is not None and alert.id in self._alerts:
            self._alerts[alert.id] = alert
            self._changed[alert.id] = (alert, now)
            return
        self._lock_alerts([alert.id])
        self._q(_SAVE_ALERT, alert_row(alert, now))

    def read_alerts(self, alert_ids: Iterable[str]) -> None:
        ids = sorted(set(alert_ids))
        self._lock_alerts(ids)
        self._alerts = dict.fromkeys(ids)
        for row in self._q(f"{SELECT_ALERTS} WHERE id = ANY(?)", (ids,)):
            self._alerts[row[0]] = Alert(*row)
        self._read_marks(ids)

    def write_alerts(self) -> None:
        # One statement for the batch's alerts, pipelined: not a round trip for each.
        self._many(_SAVE_ALERT, [alert_row(a, now) for a, now in self._changed.values()])
        self.forget_alerts()

    def forget_alerts(self) -> None:
        super().forget_alerts()
        # After a savepoint's rollback the locks taken inside it are gone too: take again.
        self._locked.clear()
