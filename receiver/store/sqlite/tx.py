"""One routing transaction on the SQLite store: the reads and writes the router and the alert
lifecycle make, inside one store transaction so each batch commits as a whole. The
statements are shared with PostgreSQL (receiver.store.sql); what is SQLite's own is the
read-ahead of a batch's alerts, which spares most events four statements."""

from __future__ import annotations

import contextlib
import itertools
import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from receiver.store.records import Alert, Notification, StoredEvent
from receiver.store.sql import SELECT_ALERTS, SQLTx

_savepoints = itertools.count(1)

_UPDATE_ALERT = (
    "UPDATE alerts SET state = ?, episode = ?, last_ts = ?, opened_ts = ?, opened_event = ?,"
    " resolved_ts = ?, updated_at = ? WHERE id = ?"
)
_SAVE_ALERT = (
    "INSERT OR REPLACE INTO alerts (id, state, episode, last_ts, opened_ts, opened_event,"
    " resolved_ts, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def _alert_row(alert: Alert, now: float) -> tuple[Any, ...]:
    return (
        alert.id,
        alert.state,
        alert.episode,
        alert.last_ts,
        alert.opened_ts,
        alert.opened_event,
        alert.resolved_ts,
        now,
    )


class SQLiteTx(SQLTx):
    """Synchronous helpers over one connection with an open write transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        # Alerts read ahead for a batch (None: known not to exist), and those changed since:
        # a batch reads and writes each alert once, not once an event.
        self._alerts: dict[str, Alert | None] | None = None
        self._changed: dict[str, tuple[Alert, float]] = {}
        # Of those alerts, the ones with held notifications or notices: a resolve looks for
        # them only there (most alerts have neither, and it saves four statements).
        self._found: set[str] = set()
        self._held: set[str] = set()
        self._noticed: set[str] = set()

    def _q(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.conn.executemany(sql, rows)

    def _may_have_held(self, alert: str) -> bool:
        return self._alerts is None or alert not in self._alerts or alert in self._held

    def _may_have_notices(self, alert: str) -> bool:
        return self._alerts is None or alert not in self._alerts or alert in self._noticed

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        name = f"sp{next(_savepoints)}"
        self.conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            self.conn.execute(f"ROLLBACK TO {name}")
            self.conn.execute(f"RELEASE {name}")
            raise
        self.conn.execute(f"RELEASE {name}")

    def try_lock(self, name: str) -> bool:
        return True  # one process holds the database's write lock for the transaction

    # -- events ------------------------------------------------------------------------------

    def unrouted(self, limit: int, skip: Iterable[str] = ()) -> list[StoredEvent]:
        skip = set(skip)
        rows = self.conn.execute(
            "SELECT id, type, body, received_at, replay FROM events WHERE routed_at IS NULL"
            " ORDER BY received_at LIMIT ?",
            (limit + len(skip),),
        )
        return [StoredEvent(*row) for row in rows if row[0] not in skip][:limit]

    def last_received(self) -> float | None:
        # rowid order is arrival order, so this reads one row, not the table.
        row = self.conn.execute(
            "SELECT received_at FROM events ORDER BY rowid DESC LIMIT 1"
        ).fetchone()
        return None if row is None else float(row[0])

    # -- the outbox ----------------------------------------------------------------------------

    def add(self, event_id: str, n: Notification, **row: Any) -> int:
        if row.get("alert") is not None and row.get("state") == "held":
            self._held.add(row["alert"])
        return super().add(event_id, n, **row)

    # -- alerts and notices ----------------------------------------------------------------------

    def alert(self, alert_id: str) -> Alert | None:
        if self._alerts is not None and alert_id in self._alerts:
            return self._alerts[alert_id]
        row = self.conn.execute(f"{SELECT_ALERTS} WHERE id = ?", (alert_id,)).fetchone()
        return None if row is None else Alert(*row)

    def save_alert(self, alert: Alert, now: float) -> None:
        if self._alerts is not None and alert.id in self._alerts:
            self._alerts[alert.id] = alert
            self._changed[alert.id] = (alert, now)
            return
        self.conn.execute(_SAVE_ALERT, _alert_row(alert, now))

    def read_alerts(self, alert_ids: Iterable[str]) -> None:
        """Read these alerts ahead; until write_alerts(), alert() and save_alert() keep them
        in memory (the batch must then be written, or its savepoint rolled back)."""
        ids = list(set(alert_ids))
        listed = json.dumps(ids)
        self._alerts = dict.fromkeys(ids)
        rows = self.conn.execute(
            f"{SELECT_ALERTS} WHERE id IN (SELECT value FROM json_each(?))", (listed,)
        )
        for row in rows:
            self._alerts[row[0]] = Alert(*row)
        self._found = {key for key, alert in self._alerts.items() if alert is not None}
        self._held = {
            alert
            for (alert,) in self.conn.execute(
                "SELECT DISTINCT alert FROM outbox WHERE alert IN (SELECT value FROM json_each(?))"
                " AND state = 'held' AND kind = 'event'",
                (listed,),
            )
        }
        self._noticed = {
            alert
            for (alert,) in self.conn.execute(
                "SELECT DISTINCT alert FROM notices WHERE alert IN"
                " (SELECT value FROM json_each(?))",
                (listed,),
            )
        }

    def write_alerts(self) -> None:
        """Write the alerts changed since read_alerts(), and stop keeping them."""
        assert self._alerts is not None
        found = self._found
        changed = self._changed.values()
        # UPDATE in place where the row exists: REPLACE would delete and reinsert it, and
        # its index entries with it.
        self.conn.executemany(
            _UPDATE_ALERT, [_alert_row(a, now)[1:] + (a.id,) for a, now in changed if a.id in found]
        )
        self.conn.executemany(
            _SAVE_ALERT, [_alert_row(a, now) for a, now in changed if a.id not in found]
        )
        self.forget_alerts()

    def forget_alerts(self) -> None:
        """Drop what read_alerts() kept, written or not (after rolling its writes back)."""
        self._alerts = None
        self._changed.clear()
        self._held.clear()
        self._noticed.clear()

    def add_notice(
        self, alert: str, episode: int, rule: str, now: float, repeat: float | None
    ) -> None:
        self._noticed.add(alert)
        super().add_notice(alert, episode, rule, now, repeat)
