"""Throttle windows on either SQL store, inside routing's transaction (tx.throttle)."""

from __future__ import annotations

from receiver.store.statements import Statements


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
