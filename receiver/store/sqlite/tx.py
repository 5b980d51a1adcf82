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

from receiver.store.records import Alert, StoredEvent
from receiver.store.sql import SELECT_ALERTS, SQLTx, alert_row

_savepoints = itertools.count(1)

_UPDATE_ALERT = (
    "UPDATE alerts SET state = ?, episode = ?, last_ts = ?, opened_ts = ?, opened_event = ?,"
    " resolved_ts = ?, updated_at = ? WHERE id = ?"
)
_SAVE_ALERT = (
    "INSERT OR REPLACE INTO alerts (id, state, episode, last_ts, opened_ts, opened_event,"
    " resolved_ts, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


class SQLiteTx(SQLTx):
    """Synchronous helpers over one connection with an open write transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__()
        self.conn = conn
        self._found: set[str] = set()  # of a batch's alerts, those stored already

    def _q(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.conn.executemany(sql, rows)

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
        self.conn.execute(_SAVE_ALERT, alert_row(alert, now))

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
        self._read_marks(ids)

    def write_alerts(self) -> None:
        """Write the alerts changed since read_alerts(), and stop keeping them."""
        assert self._alerts is not None
        found = self._found
        changed = self._changed.values()
        # UPDATE in place where the row exists: REPLACE would delete and reinsert it, and
        # its index entries with it.
        self.conn.executemany(
            _UPDATE_ALERT, [alert_row(a, now)[1:] + (a.id,) for a, now in changed if a.id in found]
        )
        self.conn.executemany(
            _SAVE_ALERT, [alert_row(a, now) for a, now in changed if a.id not in found]
        )
        self.forget_alerts()
