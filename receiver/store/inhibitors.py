"""Open inhibition sources on either SQL store (tx.inhibitors): an alert whose opening event
matched an inhibition rule's source, under the values of the rule's equal fields. A row is
kept while its alert's episode is open; it counts only while that alert is open in that
episode (receiver.dispatch.inhibition checks), so a row left behind never inhibits."""

from __future__ import annotations

from receiver.store.records import Inhibitor
from receiver.store.statements import Statements

# SQLite's migration 17, PostgreSQL's 14; {real}: each store's float.
INHIBITORS_SCHEMA = """
    CREATE TABLE inhibitors (
        rule TEXT NOT NULL,
        key TEXT NOT NULL,
        alert TEXT NOT NULL,
        episode INTEGER NOT NULL,
        event TEXT NOT NULL,
        since {real} NOT NULL,
        PRIMARY KEY (rule, key, alert)
    );
    CREATE INDEX inhibitors_alert ON inhibitors (alert);
"""


class SQLTxInhibitors:
    """tx.inhibitors (base.TxInhibitors) on either SQL store."""

    def __init__(self, st: Statements) -> None:
        self.st = st

    def add(self, found: Inhibitor) -> None:
        self.st.q(
            "INSERT INTO inhibitors (rule, key, alert, episode, event, since)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (rule, key, alert) DO UPDATE SET"
            " episode = excluded.episode, event = excluded.event, since = excluded.since",
            (found.rule, found.key, found.alert, found.episode, found.event, found.since),
        )

    def remove(self, alert: str) -> int:
        return int(self.st.q("DELETE FROM inhibitors WHERE alert = ?", (alert,)).rowcount)

    def find(self, rule: str, key: str, limit: int = 8) -> list[Inhibitor]:
        """The sources of rule with these values, oldest first. The caller checks each one's
        alert is still open in that episode (tx.alerts, which a batch reads ahead: the
        alerts table may not hold this batch's changes yet)."""
        rows = self.st.q(
            "SELECT rule, key, alert, episode, event, since FROM inhibitors"
            " WHERE rule = ? AND key = ? ORDER BY since LIMIT ?",
            (rule, key, limit),
        )
        return [Inhibitor(*row) for row in rows]
