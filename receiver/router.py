"""The router: events stored but not yet routed -> rules -> lifecycle -> outbox rows, one
transaction a batch of at most 64 events (about 2 ms of work on the event loop), each
batch committed together with the events accepted meanwhile. Under a burst it gives
way to ingest, until the oldest unrouted event is LAG_EASY old; from there ingest
gives way to it, so routing stays within about LAG_LIMIT of the accepts.

It is woken in-process when ingest commits a new event; the store stays the
source of truth, so on start (or after any failure) it simply routes whatever
is still unrouted. Between events it runs the timers: repeats and the heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable

from receiver.errors import StorageUnavailableError
from receiver.lifecycle import Pipeline, alert_id
from receiver.metrics import Metrics
from receiver.rules import Ruleset
from receiver.store import Store
from receiver.store.base import StoredEvent, Tx

log = logging.getLogger("receiver.router")

BATCH = 64  # small batches keep rule evaluation from holding the event loop long
MAX_BATCH = 1024  # a batch doubles up to this while routing is LAG_LIMIT behind (below)
RETRY_AFTER = 1.0  # seconds to wait when the store refuses a routing write
# An idle router still looks now and then: `receiver replay` and `receiver silence` run in
# other processes, and repeats and the heartbeat are due by the clock.
IDLE_POLL = 5.0
# Under a burst, ingest comes first: while senders wait on accept(), routing takes at most
# this share of the time (it pauses between batches), so a burst is accepted at full speed
# and routed as it drains. Nothing is lost: unrouted events are in the store.
ROUTING_SHARE = 0.25
# ... but only while routing is not far behind. The lag is the age of the oldest unrouted
# event (the head of each batch read). From LAG_EASY on the router's share grows, and at
# LAG_LIMIT it stops pausing: then each store cycle carries a routing batch (BATCH events)
# beside the accepts queued meanwhile, so ingest yields and senders wait a little longer
# for their 202 instead of routing falling behind without bound. More senders than BATCH
# at once put more accepts than that in a cycle: while the lag stays over LAG_LIMIT even
# so, each batch doubles (to MAX_BATCH), until routing outpaces them.
LAG_EASY = 0.25
LAG_LIMIT = 0.75
# Outcomes after which the notify worker has something to send.
_SENDABLE = ("pending", "resolved", "repeat", "heartbeat")


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
        self._last_event: float | None = None  # when the newest event arrived (heartbeat)
        self.lag = 0.0  # seconds the oldest event of the last batch read had waited
        self._batch = BATCH  # events the next batch reads at most
        self._started = clock()
        self._wake.set()  # route what a previous run left behind

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: on 3.11 wait_for drops a cancel that arrives
            # in the same loop turn as the wake (bpo-42130), and the router would run on.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(IDLE_POLL):
                    await self._wake.wait()
            self._wake.clear()
            try:
                while True:
                    started = time.monotonic()
                    routed = await self.route_pending()
                    if self.store.under_pressure() and (share := self.share()) < 1:
                        took = time.monotonic() - started
                        await asyncio.sleep(took * (1 / share - 1))
                    if routed < BATCH:
                        break
                await self.tick()
            except StorageUnavailableError as exc:
                log.error("routing paused: %s; retrying in %.0fs", exc.message, RETRY_AFTER)
                await asyncio.sleep(RETRY_AFTER)
                self._wake.set()

    def share(self) -> float:
        """The share of the time routing takes under a burst: ROUTING_SHARE up to a lag of
        LAG_EASY, growing linearly to all of it (1.0) at LAG_LIMIT."""
        behind = (self.lag - LAG_EASY) / (LAG_LIMIT - LAG_EASY)
        return ROUTING_SHARE + (1 - ROUTING_SHARE) * min(1.0, max(0.0, behind))

    async def route_pending(self) -> int:
        """Route one batch of unrouted events; return how many were read."""
        ruleset, now = self.rules(), self.clock()
        routed, counts = await self.store.transact(lambda tx: self._route(tx, ruleset, now))
        self._count(counts)
        self.metrics.routed.inc(routed)
        return routed

    async def tick(self) -> None:
        """Repeats that are due, and the heartbeat when nothing has arrived for too long."""
        ruleset, now = self.rules(), self.clock()
        if ruleset.heartbeat is None and not any(r.repeat for r in ruleset.rules):
            return

        def work(tx: Tx) -> Counter[str]:
            if not tx.try_lock("timers"):  # another replica runs them this turn
                return Counter()
            pipeline = Pipeline(tx, ruleset, now)
            pipeline.repeats()
            # Read afresh: with several replicas, events may have reached the others.
            self._last_event = max(self._last(tx), tx.last_received() or 0.0)
            pipeline.heartbeat(self._last_event, arrived=False)
            return pipeline.counts

        self._count(await self.store.transact(work))

    def _route(self, tx: Tx, ruleset: Ruleset, now: float) -> tuple[int, Counter[str]]:
        events = tx.unrouted(self._batch, self._poisoned)
        if not events:
            self.lag = 0.0
            return 0, Counter()
        self.lag = now - min(e.received_at for e in events)  # read oldest first
        self._batch = min(MAX_BATCH, self._batch * 2) if self.lag > LAG_LIMIT else BATCH
        try:
            with tx.savepoint():
                pipeline = self._route_batch(tx, ruleset, now, events)
        except Exception:  # noqa: BLE001 - find the event at fault, one by one
            tx.forget_alerts()
            pipeline = self._route_each(tx, ruleset, now, events)
        self._last_event = max(self._last(tx), *(e.received_at for e in events))
        pipeline.heartbeat(self._last_event, arrived=True)
        log.debug("routed %d events: %s", len(events), dict(pipeline.counts))
        return len(events), pipeline.counts

    def _route_batch(
        self, tx: Tx, ruleset: Ruleset, now: float, events: list[StoredEvent]
    ) -> Pipeline:
        """The whole batch at once: each alert read and written once, one routed mark."""
        pipeline = Pipeline(tx, ruleset, now)
        payloads = [json.loads(event.body) for event in events]
        tx.read_alerts(filter(None, map(alert_id, payloads)))
        for event, payload in zip(events, payloads, strict=True):
            pipeline.event(event.id, payload, ruleset.route(payload), replay=event.replay)
        tx.write_alerts()
        tx.mark_routed([event.id for event in events], now)
        return pipeline

    def _route_each(
        self, tx: Tx, ruleset: Ruleset, now: float, events: list[StoredEvent]
    ) -> Pipeline:
        """Event by event, each in a savepoint, after the batch failed: the event that fails
        is left unrouted (a bug, not a bad event: it is retried on the next start)."""
        pipeline = Pipeline(tx, ruleset, now)
        for event in events:
            try:
                with tx.savepoint():
                    payload = json.loads(event.body)
                    pipeline.event(
                        event.id, payload, ruleset.route(payload), replay=event.replay
                    )
                    tx.mark_routed([event.id], now)
            except Exception:  # noqa: BLE001
                log.exception("routing failed for event %s; left unrouted", event.id)
                self._poisoned.add(event.id)
        return pipeline

    def _last(self, tx: Tx) -> float:
        if self._last_event is None:
            self._last_event = tx.last_received() or self._started
        return self._last_event

    def _count(self, counts: Counter[str]) -> None:
        for outcome, n in counts.items():
            if n:
                self.metrics.outcome(outcome).inc(n)
        if any(counts[o] for o in _SENDABLE) or counts["held"] or counts["deferred"]:
            self.on_routed()
