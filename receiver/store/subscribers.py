"""Webhook subscribers as routing's fan-out sees them, on either SQL store (tx.webhooks):
the active subscriptions, and the side of its threshold each session was last on (for the
derived score.drop / score.recover). The subscriptions themselves: receiver.store.webhooks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from receiver.store.records import Webhook
from receiver.store.statements import Statements
from receiver.store.webhooks import SUBSCRIPTION_COLUMNS, webhook


class SQLTxWebhooks:
    """tx.webhooks (base.TxWebhooks) on either SQL store (PostgreSQL's locks sessions)."""

    def __init__(self, st: Statements) -> None:
        self.st = st

    def active(self) -> list[Webhook]:
        return [
            webhook(row)
            for row in self.st.q(
                f"SELECT {SUBSCRIPTION_COLUMNS} FROM webhooks WHERE status = 'active' ORDER BY id"
            )
        ]

    def sides(
        self, webhook_ids: Iterable[int], session_ids: Iterable[str]
    ) -> dict[tuple[int, str], tuple[bool, str]]:
        hooks, hook_param = self.st.dialect.in_("webhook_id", webhook_ids)
        sessions, session_param = self.st.dialect.in_("session_id", session_ids)
        return {
            (hook_id, session_id): (bool(below), mark)
            for hook_id, session_id, below, mark in self.st.q(
                f"SELECT webhook_id, session_id, below, mark FROM webhook_sides WHERE {hooks}"
                f" AND {sessions}",
                (hook_param, session_param),
            )
        }

    def save_sides(self, changed: Mapping[tuple[int, str], tuple[bool, str]]) -> None:
        for (hook_id, session_id), (below, mark) in changed.items():
            self.st.q(
                "INSERT INTO webhook_sides (webhook_id, session_id, below, mark)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (webhook_id, session_id) DO UPDATE"
                " SET below = excluded.below, mark = excluded.mark",
                (hook_id, session_id, int(below), mark),
            )
