"""tx.inhibitors in memory, for `receiver backtest` (receiver.store.memory): the open sources
that mute their targets."""

from __future__ import annotations

from receiver.store.memory_tables import Tables
from receiver.store.records import Inhibitor


class MemoryInhibitors:
    """tx.inhibitors in memory."""

    def __init__(self, t: Tables) -> None:
        self.t = t

    def add(self, found: Inhibitor) -> None:
        self.t.inhibitors[(found.rule, found.key, found.alert)] = found

    def remove(self, alert: str) -> int:
        gone = [k for k in self.t.inhibitors if k[2] == alert]
        for key in gone:
            del self.t.inhibitors[key]
        return len(gone)

    def find(self, rule: str, key: str, limit: int = 8) -> list[Inhibitor]:
        found = [i for (r, k, _), i in self.t.inhibitors.items() if r == rule and k == key]
        return sorted(found, key=lambda i: i.since)[:limit]
