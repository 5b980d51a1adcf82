"""The storm guard's windows on either SQL store, inside routing's transaction (tx.storms)."""

from __future__ import annotations

from receiver.store.statements import Statements

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
