"""One routing transaction on the SQLite store: the roles of a Tx (receiver.store.base) over
one connection with an open write transaction, so each batch commits as a whole. The
statements are shared with PostgreSQL; what is SQLite's own is here: the read-ahead of a
batch's alerts (which spares most events four statements) and its unrouted events."""

from __future__ import annotations

import contextlib
import itertools
import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from receiver.store.alerts import SELECT_ALERTS, ReadAhead, SQLTxAlerts, alert_row
from receiver.store.events import SQLTxEvents
from receiver.store.records import Alert, StoredEvent
from receiver.store.sql import SQLTx
from receiver.store.statements import SQLITE

_savepoints = itertools.count(1)

_UPDATE_ALERT = (
    "UPDATE alerts SET state = ?, episode = ?, last_ts = ?, opened_ts = ?, opened_event = ?,"
    " resolved_ts = ?, updated_at = ? WHERE id = ?"
)
_SAVE_ALERT = (
    "INSERT OR REPLACE INTO alerts (id, state, episode, last_ts, opened_ts, opened_event,"
    " resolved_ts, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


class SQLiteStatements:
    """The open transaction's connection, as the roles run statements on it."""

    dialect = SQLITE

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def q(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.conn.executemany(sql, rows)


class SQLiteTxEvents(SQLTxEvents):
    """tx.events on SQLite: a routing transaction holds the file's write lock, so no other
    (in this process or another: worker processes) reads the same batch meanwhile, and no
    event needs locking."""

    def unrouted(self, limit: int, skip: Iterable[str] = ()) -> list[StoredEvent]:
        skip = set(skip)
        rows = self.st.q(
            "SELECT id, type, body, received_at, replay, trace FROM events"
            " WHERE routed_at IS NULL ORDER BY received_at LIMIT ?",
            (limit + len(skip),),
        )
        return [StoredEvent(*row) for row in rows if row[0] not in skip][:limit]

    def last_received(self) -> float | None:
        # rowid order is arrival order, so this reads one row, not the table.
        row = self.st.q("SELECT received_at FROM events ORDER BY rowid DESC LIMIT 1").fetchone()
        return None if row is None else float(row[0])


class SQLiteTxAlerts(SQLTxAlerts):
    """tx.alerts on SQLite: a batch's alerts read ahead, written back in two statements."""

    def __init__(self, st: SQLiteStatements, ahead: ReadAhead) -> None:
        super().__init__(st, ahead)
        self._found: set[str] = set()  # of a batch's alerts, those stored already

    def get(self, alert_id: str) -> Alert | None:
        kept = self.ahead.alerts
        if kept is not None and alert_id in kept:
            return kept[alert_id]
        row = self.st.q(f"{SELECT_ALERTS} WHERE id = ?", (alert_id,)).fetchone()
        return None if row is None else Alert(*row)

    def save(self, alert: Alert, now: float) -> None:
        if not self.ahead.keep(alert, now):
            self.st.q(_SAVE_ALERT, alert_row(alert, now))

    def read_ahead(self, alert_ids: Iterable[str]) -> None:
        """Read these alerts ahead; until flush(), get() and save() keep them in memory
        (the batch must then be flushed, or its savepoint rolled back)."""
        ids = list(set(alert_ids))
        kept: dict[str, Alert | None] = dict.fromkeys(ids)
        rows = self.st.q(
            f"{SELECT_ALERTS} WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(ids),)
        )
        for row in rows:
            kept[row[0]] = Alert(*row)
        self.ahead.alerts = kept
        self._found = {key for key, alert in kept.items() if alert is not None}
        self.ahead.read_marks(self.st, ids)

    def flush(self) -> None:
        """Write the alerts changed since read_ahead(), and stop keeping them."""
        assert self.ahead.alerts is not None
        found = self._found
        changed = self.ahead.changed.values()
        # UPDATE in place where the row exists: REPLACE would delete and reinsert it, and
        # its index entries with it.
        self.st.many(
            _UPDATE_ALERT, [alert_row(a, now)[1:] + (a.id,) for a, now in changed if a.id in found]
        )
        self.st.many(_SAVE_ALERT, [alert_row(a, now) for a, now in changed if a.id not in found])
        self.forget()


class SQLiteTx(SQLTx):
    """A Tx on one connection with an open write transaction: its roles share it."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        st = SQLiteStatements(conn)
        ahead = ReadAhead()
        super().__init__(st, ahead, events=SQLiteTxEvents(st), alerts=SQLiteTxAlerts(st, ahead))

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
        # Every transact() is a write transaction (BEGIN IMMEDIATE): it holds the file's
        # write lock until it ends, and no other connection, of this process or another
        # (`receiver serve --workers N`), can begin one meanwhile. So this one holds every
        # named lock; the next holder begins after its commit and sees what it did
        # (tests/store/contract/test_shared_database.py).
        return True
