"""Flap detection's records on either SQL store (tx.flaps): per rule and alert, the times
of its latest changes and whether it is flapping, so replicas and restarts count alike."""

from __future__ import annotations

import json
from dataclasses import dataclass

from receiver.store.statements import Statements


@dataclass(frozen=True)
class Flap:
    """Flap detection's record of an alert under a rule (tx.flaps; receiver.store.flaps)."""

    rule: str
    alert: str
    changes: tuple[float, ...] = ()
    since: float | None = None
    settle_at: float | None = None
    state: str = "resolved"  # the alert after its last change
    event: str | None = None  # the event of its last change
    opened: str | None = None  # the event of its last open (its messages are filed there)


# One row a (rule, alert) whose alert opened or resolved under a rule with `flap:` (SQLite's
# migration 23, PostgreSQL's 20).
FLAPS_SCHEMA = """
    CREATE TABLE flaps (
        alert TEXT NOT NULL,
        rule TEXT NOT NULL,
        changes TEXT NOT NULL,
        since {real},
        settle_at {real},
        state TEXT NOT NULL,
        event TEXT,
        opened TEXT,
        PRIMARY KEY (alert, rule)
    );
    CREATE INDEX flaps_settle ON flaps (settle_at) WHERE settle_at IS NOT NULL;
"""
FLAP_COLUMNS = "rule, alert, changes, since, settle_at, state, event, opened"


def changed(
    old: Flap, state: str, event: str | None, now: float, *, changes: int, within: float,
    quiet: float,
) -> Flap:  # fmt: skip
    """old after one more change at now, to state by event (both stores count with this):
    it flaps once `changes` fall within `within`, and settles `quiet` after its latest
    change. Only the last `changes` times are kept: enough to count."""
    times = (*(t for t in old.changes if t > now - within), now)[-changes:]
    since = now if old.since is None and len(times) >= changes else old.since
    settle_at = now + quiet if since is not None else None
    opened = event if state == "open" else old.opened
    return Flap(old.rule, old.alert, times, since, settle_at, state, event, opened)


def read_flap(row: tuple[object, ...]) -> Flap:
    """A Flap from a row of FLAP_COLUMNS."""
    rule, alert, changes, since, settle_at, state, event, opened = row
    return Flap(
        str(rule), str(alert), tuple(json.loads(str(changes))),
        None if since is None else float(since),  # type: ignore[arg-type]
        None if settle_at is None else float(settle_at),  # type: ignore[arg-type]
        str(state), None if event is None else str(event),
        None if opened is None else str(opened),
    )  # fmt: skip


class SQLTxFlaps:
    """tx.flaps (base.TxFlaps) on either SQL store. Routing counts a change under its
    alert's lock (PostgreSQL), and the timers settle a row with one conditional UPDATE,
    so a change and a settle never both win."""

    def __init__(self, st: Statements) -> None:
        self.st = st

    def change(
        self, rule: str, alert: str, state: str, event: str | None, now: float, *,
        changes: int, within: float, quiet: float,
    ) -> tuple[Flap, Flap]:  # fmt: skip
        """Count one change of the alert (it opened or resolved) under rule: (the record
        before, the record after)."""
        row = self.st.q(
            f"SELECT {FLAP_COLUMNS} FROM flaps WHERE alert = ? AND rule = ?", (alert, rule)
        ).fetchone()
        old = Flap(rule, alert) if row is None else read_flap(row)
        new = changed(old, state, event, now, changes=changes, within=within, quiet=quiet)
        self.st.q(
            f"INSERT INTO flaps ({FLAP_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (alert, rule) DO UPDATE SET changes = excluded.changes,"
            " since = excluded.since, settle_at = excluded.settle_at,"
            " state = excluded.state, event = excluded.event, opened = excluded.opened",
            (
                rule,
                alert,
                json.dumps(list(new.changes)),
                new.since,
                new.settle_at,
                state,
                event,
                new.opened,
            ),  # fmt: skip
        )
        return old, new

    def due(self, now: float, limit: int = 100) -> list[Flap]:
        """Flapping records whose quiet has passed by now, soonest first."""
        rows = self.st.q(
            f"SELECT {FLAP_COLUMNS} FROM flaps WHERE settle_at IS NOT NULL AND settle_at <= ?"
            " ORDER BY settle_at LIMIT ?",
            (now, limit),
        )
        return [read_flap(r) for r in rows]

    def settle(self, rule: str, alert: str, now: float) -> bool:
        """End the flapping of (rule, alert) if its quiet has passed by now and it is still
        flapping; whether this call ended it (once across replicas)."""
        done = self.st.q(
            "UPDATE flaps SET since = NULL, settle_at = NULL, changes = '[]'"
            " WHERE alert = ? AND rule = ? AND settle_at IS NOT NULL AND settle_at <= ?",
            (alert, rule, now),
        )
        return bool(done.rowcount == 1)

    def next_due(self) -> float | None:
        row = self.st.q("SELECT min(settle_at) FROM flaps").fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def of(self, alert: str) -> list[Flap]:
        """The alert's records, by rule."""
        rows = self.st.q(
            f"SELECT {FLAP_COLUMNS} FROM flaps WHERE alert = ? ORDER BY rule", (alert,)
        )
        return [read_flap(r) for r in rows]
