"""Named state on either SQL store, inside routing's transaction (tx.state): JSON values by
name (the timers' heartbeat, the action links' key, ...)."""

from __future__ import annotations

import json
from typing import Any

from receiver.store.statements import Statements


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
