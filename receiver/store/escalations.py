"""Escalation chains on either SQL store (tx.escalations): one row an alert episode and
rule, its policy frozen in it, its next step a timer (next_at) that the timers of one
replica at a time fire (receiver.dispatch.escalations); and the notices silenced or muted,
woken when that ends."""

from __future__ import annotations

import json
from typing import Any

from receiver.store.records import SENT_STATES, Chain, Waiting
from receiver.store.statements import Statements

# The escalations of alert episodes, and the columns that let a silenced notice be woken
# when its silence ends (SQLite's migration 16, PostgreSQL's 13). {real}: each store's float.
ESCALATIONS_SCHEMA = """
    CREATE TABLE escalations (
        alert TEXT NOT NULL,
        episode INTEGER NOT NULL,
        rule TEXT NOT NULL,
        policy TEXT NOT NULL,
        step INTEGER NOT NULL,
        round INTEGER NOT NULL,
        next_at {real},
        started_at {real} NOT NULL,
        suppressed_since {real},
        suppressed_why TEXT,
        log TEXT NOT NULL,
        PRIMARY KEY (alert, episode, rule)
    );
    CREATE INDEX escalations_due ON escalations (next_at) WHERE next_at IS NOT NULL;
    CREATE INDEX escalations_suppressed ON escalations (suppressed_since, alert)
        WHERE suppressed_since IS NOT NULL AND next_at IS NULL;
    ALTER TABLE notices ADD COLUMN suppressed_since {real};
    ALTER TABLE notices ADD COLUMN suppressed_why TEXT;
    CREATE INDEX notices_suppressed ON notices (suppressed_since, alert)
        WHERE suppressed_since IS NOT NULL;
"""

# The event whose notification a suppressed notice holds (SQLite's migration 21,
# PostgreSQL's 18): the woken notification is filed under it and rendered from it. NULL in
# the notices noted before: those wake as before, from the alert's opening event.
NOTICE_EVENT_SCHEMA = """
    ALTER TABLE notices ADD COLUMN suppressed_event TEXT;
"""

CHAIN_COLUMNS = (
    "alert, episode, rule, policy, step, round, next_at, started_at, suppressed_since,"
    " suppressed_why, log"
)
FIRST: Waiting = (-1.0, "", 0, "")
WAITING_ORDER = "suppressed_since, alert, episode, rule"
WAITING_AFTER = f"({WAITING_ORDER}) > (?, ?, ?, ?)"
MAX_LOG = 50  # entries kept in a chain's log (a reack pages again every time it runs out)


def read_chain(row: Any) -> Chain:
    """A chain from its row. A policy or log that is not JSON (a row damaged by hand) is
    read as {"unreadable": ...} / []: the chain then fails when it runs, as one failed
    attempt (receiver.dispatch.escalations), instead of failing every read of the table."""
    return Chain(
        row[0],
        int(row[1]),
        row[2],
        _json(row[3], {"unreadable": str(row[3])[:200]}),
        int(row[4]),
        int(row[5]),
        row[6],
        row[7],
        row[8],
        row[9],
        _json(row[10], []),
    )


def _json(text: str, otherwise: Any) -> Any:
    try:
        found = json.loads(text)
    except (TypeError, ValueError):
        return otherwise
    return found if isinstance(found, type(otherwise)) else otherwise


def chain_row(c: Chain) -> tuple[Any, ...]:
    return (
        c.alert,
        c.episode,
        c.rule,
        json.dumps(c.policy, separators=(",", ":")),
        c.step,
        c.round,
        c.next_at,
        c.started_at,
        c.suppressed_since,
        c.suppressed_why,
        json.dumps(kept_log(c.log), separators=(",", ":")),
    )


def kept_log(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries of a chain's log that are kept: its first (the start, naming the event
    that started it: its pages are filed under it) and the newest after it."""
    return log if len(log) <= MAX_LOG else [log[0], *log[1 - MAX_LOG :]]


class SQLTxEscalations:
    """tx.escalations (base.TxEscalations) on either SQL store."""

    def __init__(self, st: Statements) -> None:
        self.st = st

    def start(self, chain: Chain) -> None:
        """Start the episode's chain of this rule, once: a chain that exists stays as it
        is, unless it waits for a silence to end and this one is not suppressed (the
        silence ended and an event came first): then it starts now, from step one."""
        self.st.q(
            f"INSERT INTO escalations ({CHAIN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (alert, episode, rule) DO UPDATE SET next_at = excluded.next_at,"
            " step = 0 WHERE escalations.next_at IS NULL"
            " AND escalations.suppressed_since IS NOT NULL AND excluded.next_at IS NOT NULL",
            chain_row(chain),
        )

    def due(self, now: float, limit: int = 100) -> list[Chain]:
        rows = self.st.q(
            f"SELECT {CHAIN_COLUMNS} FROM escalations WHERE next_at IS NOT NULL AND next_at <= ?"
            f" ORDER BY next_at LIMIT ?{self.st.dialect.skip_locked}",
            (now, limit),
        )
        return [read_chain(row) for row in rows]

    def suppressed(self, after: Waiting | None, limit: int = 200) -> list[Chain]:
        """Chains waiting for a silence or quiet hours to end, in (suppressed_since, alert,
        episode, rule) order, after `after`."""
        rows = self.st.q(
            f"SELECT {CHAIN_COLUMNS} FROM escalations WHERE suppressed_since IS NOT NULL"
            f" AND next_at IS NULL AND {WAITING_AFTER} ORDER BY {WAITING_ORDER} LIMIT ?",
            (*(after or FIRST), limit),
        )
        return [read_chain(row) for row in rows]

    def save(self, chain: Chain) -> None:
        row = chain_row(chain)
        self.st.q(
            "UPDATE escalations SET step = ?, round = ?, next_at = ?, suppressed_since = ?,"
            " suppressed_why = ?, log = ? WHERE alert = ? AND episode = ? AND rule = ?",
            (*row[4:7], *row[8:], chain.alert, chain.episode, chain.rule),
        )

    def of(self, alert: str, episode: int) -> list[Chain]:
        rows = self.st.q(
            f"SELECT {CHAIN_COLUMNS} FROM escalations WHERE alert = ? AND episode = ?"
            " ORDER BY rule",
            (alert, episode),
        )
        return [read_chain(row) for row in rows]

    def end(self, alert: str, episode: int, now: float, why: str) -> None:
        """The episode resolved: its chains stop, each with why in its log."""
        for chain in self.of(alert, episode):
            if chain.log and chain.log[-1].get("event") == "ended":
                continue
            chain.next_at = chain.suppressed_since = chain.suppressed_why = None
            chain.log.append({"at": now, "event": "ended", "note": why})
            self.save(chain)

    def next_due(self) -> float | None:
        row = self.st.q("SELECT MIN(next_at) FROM escalations WHERE next_at IS NOT NULL").fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def acked(self, alert: str, episode: int) -> tuple[str, float] | None:
        """Who acknowledged the episode and when, if anyone has."""
        row = self.st.q(
            "SELECT acked_by, acked_at FROM acks WHERE alert = ? AND episode = ?",
            (alert, episode),
        ).fetchone()
        return None if row is None else (str(row[0]), float(row[1]))

    def unack(self, alert: str, episode: int, now: float, why: str) -> None:
        """The episode's acknowledgement ran out (reack): it is open and unacknowledged
        again, and the alert's record says so."""
        self.st.q("DELETE FROM acks WHERE alert = ? AND episode = ?", (alert, episode))
        self.st.q(
            "INSERT INTO alert_actions (alert, episode, action, source, actor, at, outcome,"
            " until) VALUES (?, ?, 'unack', 'escalation', ?, ?, 'done', NULL)",
            (alert, episode, why, now),
        )

    def paged(self, alert: str, episode: int, rule: str) -> list[tuple[str, int]]:
        """Each (notifier, target) the rule's messages about the episode went to (or are on
        their way to): its own notifications, repeats and escalation pages."""
        rows = self.st.q(
            "SELECT DISTINCT notifier, target FROM outbox WHERE alert = ? AND episode = ?"
            " AND rule = ? AND kind IN ('event', 'repeat', 'escalation')"
            f" AND state IN {SENT_STATES} ORDER BY notifier, target",
            (alert, episode, rule),
        )
        return [(str(r[0]), int(r[1])) for r in rows]
