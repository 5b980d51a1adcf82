"""Routing in process on a clock the test drives: a real SQLite file, the real Router (its
routing batches and its timers) and what explain says of each event, without a server.
The notify worker does not run: a row `pending` is what would be sent."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from receiver import events, why
from receiver.dispatch.router import Router
from receiver.metrics import Metrics
from receiver.rules import Ruleset, load_text
from receiver.store import SQLiteStore
from receiver.store.base import Tx
from receiver.store.records import Alert, Chain, OutboxQuery, OutboxRow

T = TypeVar("T")


class Routed:
    """A rules file's routing of the events a test sends, at the times it says."""

    def __init__(self, tmp: Path, rules: str, start: float) -> None:
        self.now = start
        self.ruleset: Ruleset = load_text(rules, env={})
        self._loop = asyncio.new_event_loop()
        self.store = SQLiteStore(tmp / "routed.db", clock=lambda: self.now)
        self.router = Router(
            self.store,
            lambda: self.ruleset,
            metrics=Metrics(),
            on_routed=lambda: None,
            clock=lambda: self.now,
        )
        self._run(self.store.open())

    def close(self) -> None:
        self._run(self.store.close())
        self._loop.close()

    def _run(self, work: Awaitable[T]) -> T:
        return self._loop.run_until_complete(work)

    def transact(self, work: Callable[[Tx], T]) -> T:
        return self._run(self.store.transact(work))

    def send(self, *payloads: dict[str, Any]) -> None:
        """Accept the events (in this order, at now) and route them, then run the timers."""
        for payload in payloads:
            event = events.validate(payload)
            self._run(self.store.events.accept(event, event.model_dump_json().encode()))
        while self._run(self.router.route_pending()):
            pass
        self._run(self.router.tick())

    def advance(self, seconds: float, step: float = 60.0) -> None:
        """Move the clock on, running the timers at least every step seconds."""
        end = self.now + seconds
        while self.now < end:
            self.now = min(end, self.now + step)
            self._run(self.router.tick())

    def silence(self, matchers: dict[str, Any], seconds: float, reason: str = "test") -> int:
        return self.transact(
            lambda tx: tx.silences.add(matchers, reason, self.now, self.now + seconds)
        )

    def expire(self, silence: int) -> None:
        self.transact(lambda tx: tx.silences.expire(silence, self.now))

    def rows(self, event_id: str | None = None) -> list[OutboxRow]:
        """The outbox (of one event), oldest first."""
        found = self._run(self.store.outbox.page(OutboxQuery(event_id=event_id, limit=10_000)))
        return sorted(found, key=lambda r: r.id)

    def alerts(self) -> list[Alert]:
        return self.transact(lambda tx: tx.alerts.list_open())

    def chains(self, alert: str) -> list[Chain]:
        return list(self._run(self.store.alerts.chains(alert)))

    def explain(self, event_id: str) -> dict[str, Any]:
        found = self._run(why.explain_event(self.store, event_id, self.ruleset))
        assert found is not None, event_id
        return found
