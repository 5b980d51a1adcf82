"""The router: events stored but not yet routed -> rules -> outbox rows, one transaction a batch.

It is woken in-process when ingest commits a new event; the store stays the
source of truth, so on start (or after any failure) it simply routes whatever
is still unrouted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable

from receiver.errors import StorageUnavailableError
from receiver.metrics import Metrics
from receiver.rules import Decision, Ruleset
from receiver.store import Notification, Store

log = logging.getLogger("receiver.router")

BATCH = 64  # small batches keep rule evaluation from holding the event loop long
RETRY_AFTER = 1.0  # seconds to wait when the store refuses a routing write
IDLE_POLL = (
    5.0  # an idle router still looks now and then: `receiver replay` runs in another process
)


class Router:
    def __init__(
        self,
        store: Store,
        rules: Callable[[], Ruleset],
        *,
        metrics: Metrics,
        on_routed: Callable[[], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.rules = rules
        self.metrics = metrics
        self.on_routed = on_routed
        self.clock = clock
        self._wake = asyncio.Event()
        self._poisoned: set[str] = set()
        self._wake.set()  # route what a previous run left behind

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), IDLE_POLL)
            self._wake.clear()
            try:
                while await self.route_pending() == BATCH:
                    pass
            except StorageUnavailableError as exc:
                log.error("routing paused: %s; retrying in %.0fs", exc.message, RETRY_AFTER)
                await asyncio.sleep(RETRY_AFTER)
                self._wake.set()

    async def route_pending(self) -> int:
        """Route one batch of unrouted events; return how many were read."""
        rows = await self.store.unrouted(BATCH + len(self._poisoned))
        pending = [e for e in rows if e.id not in self._poisoned][:BATCH]
        if not pending:
            return 0
        ruleset = self.rules()
        routed = []
        fallbacks = 0
        for event in pending:
            try:
                decisions = ruleset.route(json.loads(event.body))
            except Exception:  # a bug, not a bad event: leave it unrouted for the next start
                log.exception("routing failed for event %s; left unrouted", event.id)
                self._poisoned.add(event.id)
                continue
            fallbacks += sum(d.fallback for d in decisions)
            routed.append((event.id, [_notification(d) for d in decisions]))
        written, throttled = await self.store.route(routed, now=self.clock())
        self.metrics.routed.inc(len(routed))
        self.metrics.notifications["throttled"].inc(throttled)
        self.metrics.notifications["fallback"].inc(fallbacks)
        if written > throttled:
            self.on_routed()
        log.debug("routed %d events into %d notifications", len(routed), written)
        return len(pending)


def _notification(d: Decision) -> Notification:
    """The rules' decision as the store's outbox row; `fallback` is only counted."""
    fields = dataclasses.asdict(d)
    del fields["fallback"]
    return Notification(**fields)
