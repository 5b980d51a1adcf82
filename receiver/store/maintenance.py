"""The notices of maintenance windows (tx.maintenance): each (window, start, kind) is
claimed once, so one replica, once, says a window started or ended (and wakes what it held),
across replicas and restarts (receiver.dispatch.maintenance)."""

from __future__ import annotations

from receiver.store.memory_tables import Tables
from receiver.store.statements import Statements

# One row a notice claimed: kind "start" or "end" of the window's stretch that starts at
# start (SQLite's migration 31, PostgreSQL's 28).
MAINTENANCE_SCHEMA = """
    CREATE TABLE maintenance_notices (
        name TEXT NOT NULL,
        start {real} NOT NULL,
        kind TEXT NOT NULL,
        claimed_at {real} NOT NULL,
        PRIMARY KEY (name, start, kind)
    );
"""


class SQLTxMaintenance:
    """tx.maintenance (base.TxMaintenance) on either SQL store: a claim is one INSERT that
    a second claim of the same notice finds already there (the primary key), whichever
    replica or process makes it."""

    def __init__(self, st: Statements) -> None:
        self.st = st

    def claim(self, name: str, start: float, kind: str, now: float) -> bool:
        """Claim the notice; whether this call claimed it (False: claimed before)."""
        done = self.st.q(
            "INSERT INTO maintenance_notices (name, start, kind, claimed_at)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (name, start, kind) DO NOTHING",
            (name, start, kind, now),
        )
        return bool(done.rowcount == 1)

    def claimed(self, name: str, start: float, kind: str) -> bool:
        return (
            self.st.q(
                "SELECT 1 FROM maintenance_notices WHERE name = ? AND start = ? AND kind = ?",
                (name, start, kind),
            ).fetchone()
            is not None
        )

    def forget(self, before: float) -> int:
        """Drop the claims of stretches that started before before (retention)."""
        return int(self.st.q("DELETE FROM maintenance_notices WHERE start < ?", (before,)).rowcount)


class MemoryMaintenance:
    """tx.maintenance in memory, for `receiver backtest`."""

    def __init__(self, t: Tables) -> None:
        self.t = t  # its set read each time: a savepoint's undo puts another in its place

    def claim(self, name: str, start: float, kind: str, now: float) -> bool:
        if (name, start, kind) in self.t.maintenance:
            return False
        self.t.maintenance.add((name, start, kind))
        return True

    def claimed(self, name: str, start: float, kind: str) -> bool:
        return (name, start, kind) in self.t.maintenance

    def forget(self, before: float) -> int:
        gone = {c for c in self.t.maintenance if c[1] < before}
        self.t.maintenance -= gone
        return len(gone)
