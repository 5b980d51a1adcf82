"""`receiver serve` with routing's record for `GET /v1/events/:id/explain` switched off:
the batch's routed mark leaves events.rules NULL and no rules file is kept. Only `make
bench`'s recording part runs this, to price the record against the receiver as shipped."""

from __future__ import annotations

from typing import Any

from receiver.store import events


def _mark_routed(self: Any, event_ids: list[str], now: float, rules: str | None = None) -> int:
    where, param = self.st.dialect.in_("id", event_ids)
    return int(
        self.st.q(
            f"UPDATE events SET routed_at = ? WHERE {where} AND routed_at IS NULL", (now, param)
        ).rowcount
    )


events.SQLTxEvents.mark_routed = _mark_routed  # type: ignore[method-assign]
events.SQLTxEvents.keep_rules = lambda *args, **kwargs: None  # type: ignore[method-assign]

if __name__ == "__main__":
    from receiver.cli import cli

    cli(["serve"])
