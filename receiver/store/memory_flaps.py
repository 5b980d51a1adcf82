"""tx.flaps (flap detection's records) in memory, for `receiver backtest`."""

from __future__ import annotations

import heapq
from dataclasses import replace

from receiver.store.flaps import Flap, changed
from receiver.store.memory_tables import Tables


class MemoryFlaps:
    """tx.flaps in memory: records by alert, and a heap of settle times (an entry whose
    record has moved on since is dropped when it comes up)."""

    def __init__(self, t: Tables) -> None:
        self.t = t

    def change(
        self, rule: str, alert: str, state: str, event: str | None, now: float, *,
        changes: int, within: float, quiet: float,
    ) -> tuple[Flap, Flap]:  # fmt: skip
        mine = self.t.flaps.setdefault(alert, {})
        old = mine.get(rule) or Flap(rule, alert)
        new = changed(old, state, event, now, changes=changes, within=within, quiet=quiet)
        mine[rule] = new
        if new.settle_at is not None:
            heapq.heappush(self.t.settles, (new.settle_at, alert, rule))
        return old, new

    def _current(self, entry: tuple[float, str, str]) -> Flap | None:
        at, alert, rule = entry
        found = self.t.flaps.get(alert, {}).get(rule)
        return found if found is not None and found.settle_at == at else None

    def due(self, now: float, limit: int = 100) -> list[Flap]:
        self._drop_stale()
        found: list[Flap] = []
        for entry in sorted(self.t.settles):
            if entry[0] > now or len(found) >= limit:
                break
            flap = self._current(entry)
            if flap is not None and flap not in found:
                found.append(flap)
        return found

    def settle(self, rule: str, alert: str, now: float) -> bool:
        found = self.t.flaps.get(alert, {}).get(rule)
        if found is None or found.settle_at is None or found.settle_at > now:
            return False
        self.t.flaps[alert][rule] = replace(found, since=None, settle_at=None, changes=())
        return True

    def next_due(self) -> float | None:
        self._drop_stale()
        return self.t.settles[0][0] if self.t.settles else None

    def _drop_stale(self) -> None:
        while self.t.settles and self._current(self.t.settles[0]) is None:
            heapq.heappop(self.t.settles)

    def of(self, alert: str) -> list[Flap]:
        return [f for _, f in sorted(self.t.flaps.get(alert, {}).items())]
