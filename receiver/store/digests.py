"""What routing keeps between events on either SQL store, inside its transaction: digest
groups (tx.digests), throttle windows (tx.throttle), silences (tx.silences) and named
state (tx.state)."""

from __future__ import annotations

import json
from typing import Any

from receiver.store.records import Group, Silence
from receiver.store.statements import Statements

_SILENCE_COLUMNS = (
    "id, matchers, reason, starts_at, ends_at, expired_at, created_at, resolve_after, alerts"
)
# Silences that end with their alerts (SQLite's migration 24, PostgreSQL's 21): how long
# the alerts it matched when it was made (a JSON list) must have been resolved.
SILENCE_UNTIL_RESOLVED_SCHEMA = """
    ALTER TABLE silences ADD COLUMN resolve_after {real};
    ALTER TABLE silences ADD COLUMN alerts TEXT
"""


def _silence(row: Any) -> Silence:
    alerts = tuple(json.loads(row[8])) if row[8] else ()
    return Silence(
        row[0], json.loads(row[1]), row[2], row[3], row[4], row[5], row[6], row[7], alerts
    )


class SQLTxDigests:
    """tx.digests (base.TxDigests) on either SQL store (PostgreSQL's locks its keys)."""

    def __init__(self, st: Statements) -> None:
        self.st = st

    def _lock(self, rule: str, key: str) -> None:
        """Hold (rule, key) for this transaction: one digest per key across replicas."""

    def find_open(self, rule: str, key: str, now: float) -> Group | None:
        self._lock(rule, key)
        row = self.st.q(
            "SELECT id, rule, key, closes_at, count, members FROM groups"
            " WHERE rule = ? AND key = ? AND state = 'open' AND closes_at > ?"
            " ORDER BY id DESC LIMIT 1",
            (rule, key, now),
        ).fetchone()
        if row is None:
            return None
        return Group(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]))

    def new(self, rule: str, key: str, now: float, closes_at: float) -> Group:
        row = self.st.q(
            "INSERT INTO groups (rule, key, opened_at, closes_at, count, members, state)"
            " VALUES (?, ?, ?, ?, 0, '[]', 'open') RETURNING id",
            (rule, key, now, closes_at),
        ).fetchone()
        return Group(int(row[0]), rule, key, closes_at, 0, [])

    def update(self, group: Group, *, title: str, body: str, now: float, release: bool) -> None:
        self.st.q(
            "UPDATE groups SET count = ?, members = ?, state = ? WHERE id = ?",
            (group.count, json.dumps(group.members), "sent" if release else "open", group.id),
        )
        self.st.q(
            "UPDATE outbox SET title = ?, body = ?, updated_at = ?"
            + (", next_at = ?" if release else "")
            + " WHERE group_id = ? AND kind IN ('digest', 'storm') AND state = 'held'",
            (title, body, now, *((now,) if release else ()), group.id),
        )


# Each storm-guarded rule's window: when it began, how many notifications it counted, and
# how many the window before counted (SQLite's migration 18, PostgreSQL's 15).
STORMS_SCHEMA = """
    CREATE TABLE storms (
        rule TEXT PRIMARY KEY,
        start {real} NOT NULL,
        count INTEGER NOT NULL,
        prev INTEGER NOT NULL
    );
"""


class SQLTxStorms:
    """tx.storms (base.TxStorms) on either SQL store."""

    def __init__(self, st: Statements) -> None:
        self.st = st

    def count(self, rule: str, now: float, per: float) -> tuple[float, int, int]:
        """One more notification of rule: (its window's start, the window's count with this
        one, the window before's count). A window lasts per seconds from the first
        notification after the last one ended; one statement, so under PostgreSQL's row
        lock replicas count one at a time. (Every SET expression reads the row as it was.)"""
        row = self.st.q(
            "INSERT INTO storms (rule, start, count, prev) VALUES (?, ?, 1, 0)"
            " ON CONFLICT (rule) DO UPDATE SET"
            " prev = CASE WHEN storms.start + ? > ? THEN storms.prev"
            " WHEN storms.start + 2 * ? > ? THEN storms.count ELSE 0 END,"
            " count = CASE WHEN storms.start + ? > ? THEN storms.count + 1 ELSE 1 END,"
            " start = CASE WHEN storms.start + ? > ? THEN storms.start ELSE ? END"
            " RETURNING start, count, prev",
            (rule, now, per, now, per, now, per, now, per, now, now),
        ).fetchone()
        return float(row[0]), int(row[1]), int(row[2])


class SQLTxThrottle:
    """tx.throttle (base.TxThrottle) on either SQL store."""

    def __init__(self, st: Statements) -> None:
        self.st = st

    def throttled(self, rule: str, key: str, now: float, every: float) -> bool:
        """True if (rule, key) notified within the last `every` seconds; else open a window.
        One statement: under PostgreSQL's row lock, one replica opens a window at a time."""
        opened = self.st.q(
            "INSERT INTO throttle (rule, key, until) VALUES (?, ?, ?)"
            " ON CONFLICT (rule, key) DO UPDATE SET until = excluded.until"
            " WHERE throttle.until <= ? RETURNING 1",
            (rule, key, now + every, now),
        ).fetchone()
        return opened is None


class SQLTxSilences:
    """tx.silences (base.TxSilences) on either SQL store."""

    def __init__(self, st: Statements) -> None:
        self.st = st

    def active(self, now: float) -> list[Silence]:
        rows = self.st.q(
            f"SELECT {_SILENCE_COLUMNS} FROM silences"
            " WHERE expired_at IS NULL AND starts_at <= ? AND ends_at > ?",
            (now, now),
        )
        return [_silence(r) for r in rows]

    def add(
        self, matchers: dict[str, Any], reason: str, now: float, until: float, *,
        after: float | None = None, alerts: tuple[str, ...] = (),
    ) -> int:  # fmt: skip
        row = self.st.q(
            "INSERT INTO silences (matchers, reason, created_at, starts_at, ends_at,"
            " resolve_after, alerts) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (json.dumps(matchers), reason, now, now, until, after,
             None if after is None else json.dumps(list(alerts))),
        ).fetchone()  # fmt: skip
        return int(row[0])

    def expire(self, silence_id: int, now: float) -> bool:
        # Its end moves to now too: retention prunes silences by their end, and one that
        # was to end in the year 9999 (or later) must go once expired like any other.
        done = self.st.q(
            "UPDATE silences SET expired_at = ?, ends_at = ? WHERE id = ? AND expired_at IS NULL"
            " AND ends_at > ?",
            (now, now, silence_id, now),
        )
        return bool(done.rowcount == 1)

    def get(self, silence_id: int) -> Silence | None:
        row = self.st.q(
            f"SELECT {_SILENCE_COLUMNS} FROM silences WHERE id = ?", (silence_id,)
        ).fetchone()
        return None if row is None else _silence(row)

    def recent(self, limit: int = 100) -> list[Silence]:
        rows = self.st.q(
            f"SELECT {_SILENCE_COLUMNS} FROM silences ORDER BY id DESC LIMIT ?", (limit,)
        )
        return [_silence(r) for r in rows]


class SQLTxState:
    """tx.state (base.TxState) on either SQL store: JSON values by name."""

    def __init__(self, st: Statements) -> None:
        self.st = st

    def get(self, name: str) -> Any:
        row = self.st.q("SELECT value FROM state WHERE name = ?", (name,)).fetchone()
        return None if row is None else json.loads(row[0])

    def set(self, name: str, value: Any) -> None:
        self.st.q(
            "INSERT INTO state (name, value) VALUES (?, ?)"
            " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            (name, json.dumps(value)),
        )
