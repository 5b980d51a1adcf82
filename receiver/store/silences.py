"""store.silences: the silences operators make, from the CLI, the admin page and the API,
through one role, and the one way a silence is added (add_silence), until resolved too."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from receiver.matchers import compile_match
from receiver.store.records import Alert, Silence

T = TypeVar("T")
Transact = Callable[[Callable[[Any], T]], Awaitable[T]]


def _opening(tx: Any, alert: Alert) -> dict[str, Any]:
    """The fields of the event that opened the alert's episode ({} if it is gone)."""
    try:
        found = json.loads(tx.events.body(alert.opened_event or "") or "null")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def add_silence(
    tx: Any,
    matchers: dict[str, Any],
    reason: str,
    now: float,
    until: float,
    *,
    after: float | None = None,
) -> Silence:
    """Add a silence from now to until, in the routing transaction tx. With after (until
    resolved) it notes the open alerts whose opening event it matches now: it ends once
    every one has stayed resolved for after seconds (receiver.dispatch.silences.end_resolved;
    a flap re-firing inside keeps it), one that matches none after seconds after now."""
    alerts: tuple[str, ...] = ()
    if after is not None:
        conditions, _ = compile_match(matchers)  # checked by parse_matchers already
        alerts = tuple(
            a.id
            for a in tx.alerts.list_open(limit=100_000)
            if all(c.holds(_opening(tx, a)) for c in conditions)
        )
    silence_id = tx.silences.add(matchers, reason, now, until, after=after, alerts=alerts)
    found: Silence = tx.silences.get(silence_id)
    return found


class StoreSilences:
    """store.silences (roles.Silences) on any store, over its routing transaction."""

    def __init__(self, transact: Transact[Any]) -> None:
        self._transact = transact

    async def add(
        self, matchers: dict[str, Any], reason: str, now: float, until: float, *,
        after: float | None = None,
    ) -> Silence:  # fmt: skip
        added: Silence = await self._transact(
            lambda tx: add_silence(tx, matchers, reason, now, until, after=after)
        )
        return added

    async def recent(self, limit: int = 100) -> list[Silence]:
        found: list[Silence] = await self._transact(lambda tx: tx.silences.recent(limit))
        return found

    async def expire(self, silence_id: int, now: float) -> tuple[bool, Silence | None]:
        def work(tx: Any) -> tuple[bool, Silence | None]:
            return tx.silences.expire(silence_id, now), tx.silences.get(silence_id)

        done: tuple[bool, Silence | None] = await self._transact(work)
        return done
