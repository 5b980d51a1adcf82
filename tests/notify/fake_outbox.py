"""A fake store for the webhook channel's claim loop: it is its own store.outbox and hands out
the rows queued under each lane, as many as the lane has room for."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from receiver.store.records import OutboxRow


class DueRows:
    """rows: the rows waiting under each lane, taken as they are claimed; on_claim is told how
    many rows each claim handed out."""

    def __init__(
        self, rows: dict[Any, list[OutboxRow]], on_claim: Callable[[int], None] | None = None
    ) -> None:
        self.rows = rows
        self.on_claim = on_claim

    def under_pressure(self) -> bool:
        return False

    @property
    def outbox(self) -> Any:
        return self

    async def next_due(self) -> float | None:
        return 0.0 if any(self.rows.values()) else None

    async def claim_due(self, *, lanes: dict[Any, int], **kwargs: Any) -> list[OutboxRow]:
        claimed: list[OutboxRow] = []
        for key, room in lanes.items():
            claimed += self.rows.get(key, [])[:room]
            self.rows[key] = self.rows.get(key, [])[room:]
        if self.on_claim is not None:
            self.on_claim(len(claimed))
        return claimed

    async def release(self, row_ids: list[int], *, now: float) -> int:
        return len(row_ids)
