"""Digest groups on either SQL store, inside routing's transaction (tx.digests): the
notifications a rule collects to send as one."""

from __future__ import annotations

import json

from receiver.store.records import Group
from receiver.store.statements import Statements


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
