"""The router: events stored but not yet routed -> rules -> lifecycle -> outbox rows, one
transaction a batch of at most 64 events (about 2 ms of work on the event loop), each
batch committed together with the events accepted meanwhile. Under a burst it gives
way to ingest, until the oldest unrouted event is LAG_EASY old; from there ingest
gives way to it, so routing stays within about LAG_LIMIT of the accepts.

It is woken in-process when ingest commits a new event; the store stays the
source of truth, so on start (or after any failure) it simply routes whatever
is still unrouted. Between events it runs the timers: repeats and the heartbeat.

What the rules say about an event (matching and rendering: a pure function of its
payload) is worked out before the batch's transaction, in a thread of its own: a slow
rule (a template at its caps) then costs the event loop nothing but a share of the GIL,
so ingest keeps answering. The transaction applies those decisions: alerts, silences,
throttles and the outbox, which need the store (resolved messages and repeats, which
need the alert's state, are rendered there, within the templates' caps).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from receiver import tracing
from receiver.dispatch import escalations, maintenance
from receiver.dispatch.alerts import EpisodeGuess, alert_id, stored_alerts
from receiver.dispatch.fanout import fan_out
from receiver.dispatch.pipeline import Pipeline
from receiver.dispatch.silences import end_resolved
from receiver.errors import StorageUnavailableError
from receiver.events import load_stored
from receiver.links import Links, LinkSource
from receiver.logs import LogLimiter
from receiver.metrics import Metrics
from receiver.rules import Decision, Ruleset
from receiver.rules.kept import shareable
from receiver.sessions import Fact
from receiver.store import RetryTransaction, Store, systemic
from receiver.store.base import StoredEvent, Tx
from receiver.store.records import subscriber_delivery
from receiver.supervisor import IDLE, Health

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
LAG_EASY = 0.1
LAG_LIMIT = 0.5
# The timers look again at least this long after a turn (a burst wakes them each routing
# turn), and no later than the next escalation step is due.
TIMERS_GAP = 0.2
# How often they look for silences that ended (and at once when one is expired or removed).
WAKE_EVERY = 1.0
# Outcomes after which the notify worker has something to send.
_SENDABLE: tuple[str, ...] = ("pending", "resolved", "repeat", "heartbeat", "subscriber")
_SENDABLE += ("escalation", "woke", "maintenance_notice")  # (a window's: dispatch.maintenance)

# An event's body, payload and the rules' decisions, by event id: worked out ahead.
# A payload of None: that failed, and the transaction tries again, to log the fault.
Decided = dict[str, tuple[str, dict[str, Any] | None, list[Decision]]]


def decide(
    ruleset: Ruleset,
    events: Sequence[StoredEvent],
    links: Links | None = None,
    episodes: EpisodeGuess | None = None,
) -> Decided:
    """What the rules say about each event (run in the rules thread); with links, the
    templates of an alert's event see its one-click action links (receiver.links), naming
    the episode guessed for it."""
    decided: Decided = {}
    for event in events:
        try:
            payload = load_stored(event.body)
            seen = payload
            if links is not None and (alert := alert_id(payload)) is not None:
                episode = episodes.of(alert, payload) if episodes is not None else None
                seen = {**payload, "links": links.for_alert(alert, episode)}
            decided[event.id] = (event.body, payload, ruleset.route(seen))
        except Exception:  # noqa: BLE001 - a bug: the transaction fails on it, and says so
            decided[event.id] = (event.body, None, [])
    return decided


def _alert_of(body: str) -> str | None:
    try:
        return alert_id(load_stored(body))
    except Exception:  # noqa: BLE001 - decide() says what is wrong with the event
        return None


class Router:
    def __init__(
        self,
        store: Store,
        rules: Callable[[], Ruleset],
        *,
        metrics: Metrics,
        on_routed: Callable[[], None],
        clock: Callable[[], float] = time.time,
        links: LinkSource | None = None,
    ) -> None:
        self.store = store
        self.link_source = links  # RECEIVER_PUBLIC_URL's action links, None without
        self.links: Links | None = None
        self.rules = rules
        self.metrics = metrics
        self.on_routed = on_routed
        self.clock = clock
        self._wake = asyncio.Event()
        # How long an idle router waits before it looks: IDLE_POLL; shorter beside worker
        # processes that only take events in (their accepts cannot wake it).
        self.idle_poll = IDLE_POLL
        self._poisoned: set[str] = set()
        self._last_event: float | None = None  # when the newest event arrived (heartbeat)
        self.lag = 0.0  # seconds the oldest event of the last batch read had waited
        self._batch = BATCH  # events the next batch reads at most
        self._started = clock()
        self._wake.set()  # route what a previous run left behind
        self._timers_wake = asyncio.Event()
        self._rules_thread: ThreadPoolExecutor | None = None  # decide() runs here
        self._ahead: list[StoredEvent] = []  # the next batch, read by the last transaction
        self._log = LogLimiter(log)
        self._next_step: float | None = None  # when the next escalation step is due
        self._woke_at = -math.inf  # when escalations.wake() last looked
        self._wake_after: escalations.Cursors = (None, None)
        self._silences: set[int] = set()  # the silences in force at the last tick
        self._kept_rules = ""  # the digest of the rules file the store has a copy of

    def wake(self) -> None:
        self._wake.set()

    async def run(self, health: Health = IDLE) -> None:
        """Route until cancelled, telling health how each turn went. An error this loop
        does not expect ends it (receiver.supervisor restarts it)."""
        while True:
            # asyncio.timeout, not wait_for: on 3.11 wait_for drops a cancel that arrives
            # in the same loop turn as the wake (bpo-42130), and the router would run on.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.idle_poll):
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
            except StorageUnavailableError as exc:
                await _pause("routing", exc, health, self._wake)
                continue
            finally:
                self._timers_wake.set()
            health.ok()

    async def run_timers(self, health: Health = IDLE) -> None:
        """The timers (repeats, the heartbeat) after each routing turn, and every IDLE_POLL
        seconds when idle; a loop of its own, so a timer that fails never holds up routing
        (and routing's failures not the timers)."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._timers_due_in()):
                    await self._timers_wake.wait()
            self._timers_wake.clear()
            try:
                await self.tick()
                # Under a burst each routing turn wakes the timers: at most one tick a gap.
                await asyncio.sleep(TIMERS_GAP)
            except StorageUnavailableError as exc:
                await _pause("timers", exc, health, self._timers_wake)
                continue
            health.ok()

    def share(self) -> float:
        """The share of the time routing takes under a burst: ROUTING_SHARE up to a lag of
        LAG_EASY, growing linearly to all of it (1.0) at LAG_LIMIT."""
        behind = (self.lag - LAG_EASY) / (LAG_LIMIT - LAG_EASY)
        return ROUTING_SHARE + (1 - ROUTING_SHARE) * min(1.0, max(0.0, behind))

    async def route_pending(self) -> int:
        """Route one batch of unrouted events; return how many were read."""
        ruleset = self.rules()
        decided = await self._decide(ruleset)
        if not decided:
            self.lag = 0.0
            return 0
        now = self.clock()
        routed, counts, failed = await self.store.transact(
            lambda tx: self._route(tx, ruleset, now, decided)
        )
        self._count(counts)
        self._failed(failed)
        self.metrics.routed.inc(routed)
        if routed:
            self._kept_rules = ruleset.digest
        if self._ahead:
            self._wake.set()  # read ahead, waiting: no need to wait for a wake-up
        return routed

    async def _decide(self, ruleset: Ruleset) -> Decided:
        """The next batch, and what the rules say about it, worked out in the rules thread.

        The batch is what the last transaction read ahead, or, when it read nothing (the
        router was idle), what one read now finds. The transaction reads it again (with
        several replicas, another may have routed some meanwhile) and routes only events
        decided here."""
        events, self._ahead = self._ahead, []
        if not events:
            events = await self.store.transact(
                lambda tx: tx.events.unrouted(self._batch, self._poisoned)
            )
        if not events:
            return {}
        if self._rules_thread is None:
            self._rules_thread = ThreadPoolExecutor(1, thread_name_prefix="receiver-rules")
        await self._load_links()
        episodes = None
        if self.links is not None:  # the links name each alert's episode: read them first
            ids = filter(None, (_alert_of(e.body) for e in events))
            episodes = EpisodeGuess(await self.store.transact(lambda tx: stored_alerts(tx, ids)))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._rules_thread, decide, ruleset, events, self.links, episodes
        )

    async def _load_links(self) -> None:
        if self.link_source is not None and self.links is None:
            self.links = await self.link_source.get()

    async def tick(self) -> None:
        """Repeats and escalation steps that are due, notifications and chains whose silence
        ended, and the heartbeat when nothing has arrived for too long."""
        ruleset, now = self.rules(), self.clock()
        await self._load_links()

        woke = False

        def work(tx: Tx) -> Counter[str] | None:
            nonlocal woke
            woke = False  # a transaction run again starts afresh
            if not tx.try_lock("timers"):  # another replica runs them this turn
                return None
            end_resolved(tx, now)  # before the pipeline reads which silences are in force
            pipeline = Pipeline(tx, ruleset, now, links=self.links)
            pipeline.repeats()
            pipeline.flaps()
            ended, upkeep = maintenance.boundaries(tx, ruleset, now, pipeline.counts)
            escalations.run(
                tx, ruleset, now, silences=pipeline.silences, counts=pipeline.counts,
                links=self.links,
            )  # fmt: skip
            silences = {s.id for s, _ in pipeline.silences}
            if now - self._woke_at >= WAKE_EVERY or not silences >= self._silences or ended:
                self._wake_after = escalations.wake(
                    tx, ruleset, now, silences=pipeline.silences, counts=pipeline.counts,
                    links=self.links, after=self._wake_after,
                )  # fmt: skip
                self._woke_at, woke = now, True
            self._silences = silences
            # Read afresh: with several replicas, events may have reached the others.
            self._last_event = max(self._last(tx), tx.events.last_received() or 0.0)
            pipeline.heartbeat(self._last_event, arrived=False)
            self._next_step = _soonest(tx.escalations.next_due(), tx.flaps.next_due(), upkeep)
            return pipeline.counts

        counts = await self.store.transact(work)
        if counts is not None:
            self._count(counts)
            self.metrics.timer_due.inc()
            if woke:
                self.metrics.timer_wake.inc()

    def _timers_due_in(self) -> float:
        """How long the timers may sleep: IDLE_POLL, or less when a step falls due sooner."""
        if self._next_step is None:
            return IDLE_POLL
        return min(IDLE_POLL, max(TIMERS_GAP, self._next_step - self.clock()))

    def _route(
        self, tx: Tx, ruleset: Ruleset, now: float, decided: Decided
    ) -> tuple[int, Counter[str], Mapping[str, tuple[int, str]]]:
        # Only events decided ahead: one that arrived since waits for the next batch, so
        # no rule is evaluated here, on the event loop (SQLite runs this function there).
        events = [e for e in tx.events.unrouted(self._batch, self._poisoned) if e.id in decided]
        if not events:  # routed meanwhile (by another replica)
            self.lag = 0.0
            self._ahead = tx.events.unrouted(self._batch, self._poisoned)
            return 0, Counter(), {}
        self.lag = now - min(e.received_at for e in events)  # read oldest first
        if ruleset.digest != self._kept_rules:  # GET /v1/events/:id/explain reads it
            tx.events.keep_rules(ruleset.digest, ruleset.source, shareable(ruleset.text), now)
        self._batch = min(MAX_BATCH, self._batch * 2) if self.lag > LAG_LIMIT else BATCH
        try:
            with tx.savepoint():
                pipeline = self._route_batch(tx, ruleset, now, events, decided)
        except Exception as exc:  # noqa: BLE001 - find the event at fault, one by one
            if isinstance(exc, RetryTransaction):
                raise  # the store runs the transaction again: no event is at fault
            tx.alerts.forget()
            pipeline = self._route_each(tx, ruleset, now, events, decided)
        if pipeline.source_ended:  # as a silence expired: its held rows woken at once
            self._woke_at = -math.inf  # (the backtest wakes them as the source closes)
        self._last_event = max(self._last(tx), *(e.received_at for e in events))
        pipeline.heartbeat(self._last_event, arrived=True)
        log.debug("routed %d events: %s", len(events), dict(pipeline.counts))
        # The next batch, read now: its rules run before its transaction, and under load
        # no separate read (a store cycle of its own) is needed for it.
        self._ahead = tx.events.unrouted(self._batch, self._poisoned)
        return len(events), pipeline.counts, pipeline.failed

    def _route_batch(
        self, tx: Tx, ruleset: Ruleset, now: float, events: list[StoredEvent], decided: Decided
    ) -> Pipeline:
        """The whole batch at once: each alert read and written once, one routed mark."""
        pipeline = Pipeline(tx, ruleset, now, links=self.links)
        routes = [_decided(ruleset, event, decided) for event in events]
        spans = _route_spans(events, routes) if tracing.on else {}
        tx.alerts.read_ahead(filter(None, (alert_id(payload) for payload, _ in routes)))
        for event, (payload, decisions) in zip(events, routes, strict=True):
            pipeline.event(
                event.id, payload, decisions, replay=event.replay, span=spans.get(event.id)
            )
        tx.alerts.flush()
        payloads = [payload for payload, _ in routes]
        tx.sessions.project(_facts(events, payloads))
        pipeline.counts["subscriber"] += _fan_out(tx, events, payloads, now, spans)
        tx.events.mark_routed([event.id for event in events], now, ruleset.digest)
        # Ended only now: a batch that fails exports none (each event gets a span of its
        # own when routed one by one).
        for span in spans.values():
            tracing.end(span)
        return pipeline

    def _route_each(
        self, tx: Tx, ruleset: Ruleset, now: float, events: list[StoredEvent], decided: Decided
    ) -> Pipeline:
        """Event by event, each in a savepoint, after the batch failed: the event that fails
        is left unrouted (a bug, not a bad event: it is retried on the next start)."""
        pipeline = Pipeline(tx, ruleset, now, links=self.links)
        for event in events:
            span = None
            try:
                with tx.savepoint():
                    payload, decisions = _decided(ruleset, event, decided)
                    spans = _route_spans([event], [(payload, decisions)]) if tracing.on else {}
                    span = spans.get(event.id)
                    pipeline.event(event.id, payload, decisions, replay=event.replay, span=span)
                    tx.sessions.project(_facts([event], [payload]))
                    pipeline.counts["subscriber"] += _fan_out(tx, [event], [payload], now, spans)
                    tx.events.mark_routed([event.id], now, ruleset.digest)
                tracing.end(span)
            except Exception as exc:  # noqa: BLE001
                if systemic(exc):
                    raise  # the database's fault, not this event's: the loop retries
                with tracing.current(span):
                    log.exception("routing failed for event %s; left unrouted", event.id)
                tracing.end(span, error=f"left unrouted: {type(exc).__name__}")
                self._poisoned.add(event.id)
        return pipeline

    def _last(self, tx: Tx) -> float:
        if self._last_event is None:
            self._last_event = tx.events.last_received() or self._started
        return self._last_event

    def _failed(self, failed: Mapping[str, tuple[int, str]]) -> None:
        """A line for each rule whose template failed (at most 5 a minute a rule)."""
        for rule, (count, error) in failed.items():
            self._log.warning(
                "template failures",
                f'rule "{rule}"',
                'rule "%s": template failed for %d notification%s (%s); sent the fallback',
                rule,
                count,
                "" if count == 1 else "s",
                error,
                extra={"rule": rule},
            )

    def _count(self, counts: Counter[str]) -> None:
        for outcome, n in counts.items():
            if n:
                self.metrics.outcome(outcome).inc(n)
        if any(counts[o] for o in _SENDABLE) or counts["held"] or counts["deferred"]:
            self.on_routed()


async def _pause(
    what: str, exc: StorageUnavailableError, health: Health, wake: asyncio.Event
) -> None:
    """The store refused a turn (it is down, the disk is full): say so, wait, look again."""
    log.error("%s paused: %s; retrying in %.0fs", what, exc.message, RETRY_AFTER)
    health.paused(exc.message)
    await asyncio.sleep(RETRY_AFTER)
    wake.set()


def _facts(events: Sequence[StoredEvent], payloads: Sequence[dict[str, Any]]) -> list[Fact]:
    """What the events say about their sessions (the read API's projection). A replayed
    event was folded in when it was first routed: not again."""
    facts = []
    for event, payload in zip(events, payloads, strict=True):
        if event.replay is None and (fact := Fact.from_payload(payload)) is not None:
            facts.append(fact)
    return facts


def _route_spans(
    events: Sequence[StoredEvent], routes: Sequence[tuple[dict[str, Any], list[Decision]]]
) -> dict[str, Any]:
    """A routing span for each event (receiver.tracing), a child of its ingest's context
    kept with it (a new trace for one that has none: imported, or from before tracing)."""
    spans = {}
    for event, (payload, decisions) in zip(events, routes, strict=True):
        session = payload.get("sessionId")
        spans[event.id] = tracing.start(
            tracing.ROUTE,
            event.trace,
            attributes={
                tracing.EVENT_ID: event.id,
                tracing.EVENT_TYPE: event.type,
                tracing.SESSION_ID: session if isinstance(session, str) else None,
                tracing.RULES_MATCHED: len({d.rule for d in decisions}),
                tracing.REPLAY: event.replay,
            },
        )
    return spans


def _fan_out(
    tx: Tx,
    events: Sequence[StoredEvent],
    payloads: Sequence[dict[str, Any]],
    now: float,
    spans: Mapping[str, Any] | None = None,
) -> int:
    """Queue the webhook deliveries of routed events (not of a replay: that is for the
    rules' notifications); how many. spans: each event's routing span, which its
    deliveries' sends continue (receiver.tracing)."""
    items = [(e.id, e.body, p) for e, p in zip(events, payloads, strict=True) if e.replay is None]
    hooks = tx.webhooks.active() if items else []
    if not hooks:
        return 0
    with_threshold = [h.id for h in hooks if h.threshold is not None]
    sessions = {p["sessionId"] for _, _, p in items if isinstance(p.get("sessionId"), str)}
    sides = tx.webhooks.sides(with_threshold, sessions) if with_threshold and sessions else {}
    deliveries, changed = fan_out(hooks, items, sides)
    notes = [
        (d.event_id, subscriber_delivery(d.webhook.id, d.delivery_id, d.body)) for d in deliveries
    ]
    if spans:
        for event_id, note in notes:
            note.trace = tracing.carrier(spans.get(event_id))
    tx.outbox.add_many(notes, state="pending", now=now, kind="webhook")
    tx.webhooks.save_sides(changed)
    return len(deliveries)


def _decided(
    ruleset: Ruleset, event: StoredEvent, decided: Decided
) -> tuple[dict[str, Any], list[Decision]]:
    """An event's payload and decisions as decided ahead (its body unchanged since), else
    worked out now."""
    ahead = decided.get(event.id)
    if ahead is not None and ahead[1] is not None and ahead[0] == event.body:
        return ahead[1], ahead[2]
    payload = load_stored(event.body)
    return payload, ruleset.route(payload)


def _soonest(*times: float | None) -> float | None:
    """The earliest of times that are set (None: none is)."""
    return min((t for t in times if t is not None), default=None)
