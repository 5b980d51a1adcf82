"""The outbox worker: claims due notifications, sends them, records delivered / retry / dead."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from receiver import tracing
from receiver.errors import StorageUnavailableError
from receiver.logs import LogLimiter
from receiver.metrics import Metrics
from receiver.notify import registry
from receiver.notify.apprise import Enrich
from receiver.notify.backoff import Backoff
from receiver.notify.channel import Channel, Parts, Result, excerpt
from receiver.notify.targets import Targets
from receiver.notify.webhook import WebhookChannel
from receiver.rules import Ruleset
from receiver.store import OutboxRow, Store
from receiver.store.records import WEBHOOK_CHANNEL, Attempt, notifier_channel
from receiver.supervisor import IDLE, Health

log = logging.getLogger("receiver.notify")

IDLE_POLL = 5.0  # upper bound on an idle sleep: picks up `receiver retry` from another process
BUSY_POLL = 1.0  # how often to look again while everything due waits for a busy lane
RECORD_RETRY = 0.5  # seconds between tries to record an outcome while the store is unavailable
# After sends end, wait this long for more to end: one claim then fills all their lanes
# (a claim is a statement per lane with room; claiming after every send cost more CPU
# than the sends themselves with 50 subscribers).
COALESCE = 0.01
# While senders crowd in (the store's under_pressure), ingest comes first: a claim starts
# at most PRESSED_SENDS sends, PRESSED_PAUSE apart. Without it, 50 subscribers' sends took
# the event loop from ingest (1,000 events/s offered, 141 accepted a second).
PRESSED_SENDS = 8
PRESSED_PAUSE = 0.05
# At most this many sends in their first FRESH_SEND seconds in flight at once: starting a
# send (a client, a connection, the request, the record) is what costs the event loop, and
# 1,000 subscribers' first deliveries started at once put /healthz 1.0-1.9 s behind them.
# A send waiting longer on a slow target costs nothing and stops counting, so targets that
# hang hold up the others by FRESH_SEND at most.
MAX_STARTING = 48
FRESH_SEND = 1.0
CAPPED_POLL = 0.05  # how soon to look again while the cap held sends back


class Worker:
    """Sends due outbox rows, each target in a lane of its own: at most `concurrency`
    sends in flight to any one target, so a target that is slow or never answers holds
    up its own notifications and nobody else's. Rows go out through their channel
    (receiver.notify.channel); what follows a send is decided here, once for every channel."""

    def __init__(
        self,
        store: Store,
        targets: Targets,
        rules: Callable[[], Ruleset],
        *,
        metrics: Metrics,
        backoff: Backoff,
        concurrency: int = 8,
        lease: float = 60.0,
        clock: Callable[[], float] = time.time,
        webhooks: WebhookChannel | None = None,
        enrich: Enrich | None = None,
        channels: Sequence[Channel] = (),
        settings: Any = None,
        links: Any = None,  # receiver.links.LinkSource, for the channels' buttons
    ) -> None:
        self.store = store
        # Each row goes to the channel it names (its channel column): the registry's, each
        # built once here (the subscribers' only when given), or one given in their place.
        parts = Parts(store, targets, rules, backoff, enrich, webhooks, settings, links)
        self._by_name: dict[str, Channel] = {ch.name: ch for ch in channels}
        for kind in registry.KINDS:
            if kind.name not in self._by_name and (built := kind.build(parts)) is not None:
                self._by_name[kind.name] = built
        self.channels: list[Channel] = list(self._by_name.values())
        # A row of a channel no longer registered goes to apprise's, which fails it naming
        # its notifier when the rules no longer send there.
        self._fallback = self._by_name[registry.NOTIFY]
        self.metrics = metrics
        self.concurrency = concurrency
        self.lease = lease
        self.clock = clock
        self._wake = asyncio.Event()
        self._wake.set()  # send what a previous run left due
        # The longest idle sleep: IDLE_POLL; shorter beside worker processes that do not send
        # (what their API calls queue cannot wake this one).
        self.idle_poll = IDLE_POLL
        self._in_flight: dict[asyncio.Task[None], OutboxRow] = {}
        self._started: dict[asyncio.Task[None], float] = {}  # monotonic start of each
        self._capped = False  # the last claim left sends for later (MAX_STARTING)
        self._stopping = False
        self._starved = False  # the last claim found nothing it could start
        self._others_at = float("-inf")  # when rows of targets not in the rules were last claimed
        # Lanes whose last claim found fewer due rows than it had room for: a send ending
        # there frees room, not work, so only new rows (a wake) or a due time look again.
        self._drained: set[tuple[str, int]] = set()
        self._fresh = True  # woken for new rows or a due time, not only by sends ending
        self._claiming = asyncio.Lock()  # held while a claim runs (stop() waits for it)
        # Since when this worker has reached the store without a failure (clock; None while
        # it fails). A row whose lease ran out is claimed again only once that is a lease
        # ago: after an outage, whoever sent it (alive, retrying its record) records first.
        self._up_since: float | None = float("-inf")
        self._log = LogLimiter(log)

    def wake(self) -> None:
        """New rows may be due (routed, retried by hand, a subscriber added)."""
        self._fresh = True
        self._wake.set()

    async def run(self, health: Health = IDLE) -> None:
        """Claim and send until stop(), telling health how each claim went. An error this
        loop does not expect ends it (receiver.supervisor restarts it)."""
        while not self._stopping:
            await self._wait()
            if self._stopping:
                return
            try:
                await self._claim_and_start()
            except StorageUnavailableError as exc:
                self._reached(False)
                log.error("delivery paused: %s", exc.message)
                health.paused(exc.message)
                await asyncio.sleep(1.0)
                self._wake.set()
                continue
            except BaseException:
                self._wake.set()  # the next run looks again at once
                raise
            health.ok()

    async def stop(self, grace: float) -> None:
        """Claim nothing more; give the sends in flight up to grace seconds to finish, then
        abandon the rest. An abandoned row goes back to pending with its attempt uncounted,
        so the next start sends it; the target may have seen it (at least once)."""
        self._stopping = True
        self._wake.set()
        # A claim under way commits whatever happens to this task: wait for it, so it sees
        # _stopping and gives its rows back (cancelled mid-claim, they stayed 'sending'
        # until their lease ran out, 30 s into the next start).
        deadline = time.monotonic() + grace
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, grace)), self._claiming:
                pass
        if not self._in_flight:
            return
        left = max(0.0, deadline - time.monotonic())
        _, late = await asyncio.wait(list(self._in_flight), timeout=left)
        if not late:
            return
        rows = [self._in_flight[task] for task in late]
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        # Rows whose outcome was recorded meanwhile keep it: release only touches 'sending'.
        released = await self._release(rows)
        log.warning(
            "shutdown: abandoned %d send(s) still in flight after %.1fs (%s); %d left pending "
            "for the next start",
            len(rows),
            grace,
            ", ".join(sorted({row.label for row in rows})),
            released,
        )

    def _reached(self, ok: bool) -> None:
        """Note whether the store answered this worker's last call."""
        if not ok:
            self._up_since = None
        elif self._up_since is None:
            self._up_since = self.clock()

    def _may_reclaim(self) -> bool:
        """Whether rows whose lease ran out may be claimed again: this worker has reached the
        store for a whole lease since its last failure, time enough for a worker that sent
        one of them and lived through the outage to record its outcome. (Any outage long
        enough to run a live sender's lease out is longer than IDLE_POLL, so this worker,
        which looks at least that often, has seen it.)"""
        return self._up_since is not None and self.clock() - self._up_since >= self.lease

    async def _release(self, rows: list[OutboxRow]) -> int:
        try:
            return await self.store.outbox.release([row.id for row in rows], now=self.clock())
        except StorageUnavailableError as exc:
            # Their leases expire instead; the attempt is then counted.
            log.error("could not release %d abandoned sends: %s", len(rows), exc.message)
            return 0

    async def _wait(self) -> None:
        if self._wake.is_set():
            self._wake.clear()
            return
        try:
            due = await self.store.outbox.next_due()
            self._reached(True)
        except StorageUnavailableError:
            self._reached(False)
            due = None
        if due is None:
            timeout = self.idle_poll
        else:
            timeout = max(0.0, min(self.idle_poll, due - self.clock()))
            if timeout == 0 and (self._starved or not self._may_reclaim()):
                # What is due waits for a busy lane (a send ending wakes us), or is a lease
                # that ran out, not to be claimed yet: look again soon.
                timeout = BUSY_POLL
        if self._capped:  # sends age past FRESH_SEND without ending: room by then
            timeout = min(timeout, CAPPED_POLL)
        # asyncio.timeout, not wait_for: on 3.11 wait_for drops a cancel that arrives in the
        # same loop turn as the wake (bpo-42130), and shutdown would wait for ever.
        try:
            async with asyncio.timeout(timeout):
                await self._wake.wait()
        except TimeoutError:
            self._fresh = True  # something came due
        self._wake.clear()

    async def _claim_and_start(self) -> None:
        pressed = self.store.under_pressure()
        if pressed:
            await asyncio.sleep(PRESSED_PAUSE)
        elif not self._fresh:
            await asyncio.sleep(COALESCE)
        async with self._claiming:
            if not self._stopping:
                await self._claim(pressed)

    async def _claim(self, pressed: bool) -> None:
        if self._fresh:
            self._drained.clear()
        self._fresh = False
        busy = Counter((row.notifier, row.target) for row in self._in_flight.values())
        keys = [key for channel in self.channels for key in await channel.lanes()]
        # A drained lane claims nothing (0), but stays named: its rows are not "others".
        lanes = {key: 0 if key in self._drained else self.concurrency - busy[key] for key in keys}
        if isinstance(hooks := self._by_name.get(WEBHOOK_CHANNEL), WebhookChannel):
            for key, cap in hooks.capped().items():  # an open circuit, a rate limit
                if key in lanes:
                    lanes[key] = max(0, min(lanes[key], cap - busy[key]))
        # Room for sends to start: MAX_STARTING less those in their first FRESH_SEND.
        now = time.monotonic()
        young = sum(1 for at in self._started.values() if now - at < FRESH_SEND)
        budget = max(0, MAX_STARTING - young)
        if pressed:
            budget = min(budget, PRESSED_SENDS)
        self._capped = sum(lanes.values()) > budget
        if self._capped:
            lanes = share(lanes, budget)
        # Rows whose notifier left the rules fail at once; looking for them costs a scan of
        # what is due, so only now and then.
        others = 0
        if time.monotonic() - self._others_at >= IDLE_POLL:
            self._others_at = time.monotonic()
            others = self.concurrency
        rows = await self.store.outbox.claim_due(
            now=self.clock(),
            limit=others,
            lease=self.lease,
            lanes=lanes,
            reclaim=self._may_reclaim(),
        )
        self._reached(True)
        if self._stopping:
            await self._release(rows)
            return
        self._starved = not rows
        parents = await self._parents(rows) if tracing.on else {}
        for row in rows:
            task = asyncio.create_task(self._deliver(row, parents.get(row.event_id)))
            self._in_flight[task] = row
            self._started[task] = now
            task.add_done_callback(self._done)
        claimed = Counter((row.notifier, row.target) for row in rows)
        self._drained.update(key for key, n in lanes.items() if n > 0 and claimed[key] < n)
        if any(n and claimed[key] == n for key, n in lanes.items()):
            self._wake.set()  # a lane may have more due than it had room for

    def _done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)
        self._started.pop(task, None)
        self._wake.set()
        if not task.cancelled() and (exc := task.exception()) is not None:
            # _deliver records any send that raises as a failed attempt; this is a failure
            # to record it (the row is sent again once its lease runs out).
            self._log.log(
                logging.ERROR,
                "delivery failures",
                type(exc).__name__,
                "delivery failed unexpectedly, outcome not recorded (%s: %s); the row is"
                " sent again when its lease runs out",
                type(exc).__name__,
                exc,
            )

    def _channel(self, row: OutboxRow) -> Channel:
        name = row.channel if row.channel is not None else notifier_channel(row.notifier)
        return self._by_name.get(name, self._fallback)

    async def _parents(self, rows: Sequence[OutboxRow]) -> dict[str, str]:
        """The trace context of the events of rows that have none of their own (queued by
        the timers, or before tracing): their sends are children of the event's ingest."""
        ids = sorted({row.event_id for row in rows if row.trace is None and row.event_id != "-"})
        try:
            return await self.store.events.traces(ids)
        except StorageUnavailableError:
            self._reached(False)
            return {}  # those sends start traces of their own

    async def _deliver(self, row: OutboxRow, parent: str | None = None) -> None:
        """Send row through its channel, then the one retry stage: delivered; pending again
        at the channel's schedule; or dead. Every attempt joins the row's log, and, with
        tracing on, is a span of the trace its row carries (else parent's, its event's)."""
        channel = self._channel(row)
        span = _attempt_span(channel, row, parent) if tracing.on else None
        try:
            with tracing.current(span):
                result, outcome = await self._attempt(channel, row)
        except BaseException:
            # Abandoned at shutdown (cancelled), or a failure to record the outcome.
            tracing.end(span, {tracing.OUTCOME: "abandoned"}, error="not finished")
            raise
        failed = outcome != "delivered"
        tracing.end(
            span,
            {
                tracing.STATUS: result.status,
                tracing.OUTCOME: outcome,
                # A failure's answer is its error.type; one with none, the channel's own.
                tracing.ERROR_TYPE: str(result.status) if failed and result.status else None,
            },
            error=(result.error or "failed") if failed else None,
        )

    async def _attempt(self, channel: Channel, row: OutboxRow) -> tuple[Result, str]:
        """One send of row and its record: how it went, and what became of the row
        (delivered, retry, dead)."""
        started, at = time.perf_counter(), self.clock()
        try:
            result = await channel.send(row)
        except Exception as exc:  # noqa: BLE001 - a bug in a channel must not kill the worker
            self._log.log(
                logging.ERROR,
                "unexpected send errors",
                f"{type(exc).__name__} {channel.name}",
                "sending %s failed unexpectedly (attempt %d): %s: %s",
                channel.describe(row),
                row.attempts,
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
            result = Result.retry(f"unexpected error: {type(exc).__name__}")
            tracing.describe(None, {tracing.ERROR_TYPE: tracing.error_type(exc)})
        took = time.perf_counter() - started
        now = self.clock()
        attempt = Attempt(
            at, round(took * 1000), result.status, result.error, excerpt(result.excerpt)
        )
        if result.counted:
            self.metrics.sent(channel.name, result.counted).inc()
        what = channel.describe(row)
        if result.outcome == "delivered":
            self.metrics.delivery_seconds.observe(took)
            self.metrics.sent(channel.name, "delivered").inc()
            await self._record(
                row, lambda: self.store.outbox.mark_delivered(row.id, now=now, attempt=attempt)
            )
            log.info("delivered %s", what)
            return result, "delivered"
        error = result.error or "failed"
        retry_at = None
        if result.outcome == "retry":
            retry_at = channel.schedule.retry_at(row, now, result.retry_after)
        if retry_at is None:
            self.metrics.sent(channel.name, "dead").inc()
            log.error("sending %s failed for good after %d attempts: %s", what, row.attempts, error)
        else:
            self.metrics.sent(channel.name, "retried").inc()
            log.warning(
                "sending %s failed (attempt %d): %s; retry in %.0fs",
                what,
                row.attempts,
                error,
                retry_at - now,
            )
        await self._record(
            row,
            lambda: self.store.outbox.mark_failed(
                row.id, error=error, now=now, retry_at=retry_at, attempt=attempt
            ),
        )
        return result, "dead" if retry_at is None else "retry"

    async def _record(self, row: OutboxRow, write: Callable[[], Awaitable[None]]) -> None:
        """Record a send's outcome. While the store is unavailable (a database restart, a
        lock, an outage of any length), try again every RECORD_RETRY seconds for as long as
        this worker runs: the row was sent, and another claim of it would send it again.
        No worker claims it meanwhile: its lease may run out during the outage, but a row
        whose lease ran out is claimed again only by a worker that has reached the store
        for a whole lease since (_may_reclaim), and this one records within RECORD_RETRY of
        the store's return. Only a stop gives up (the row is released, or its lease runs
        out, and it goes again: at least once)."""
        waited = False
        while True:
            try:
                await write()
                self._reached(True)
                if waited:
                    log.info("recorded the outcome of %s after the store came back", row.label)
                return
            except StorageUnavailableError as exc:
                self._reached(False)
                if not waited:
                    self._log.warning(
                        "outcomes waiting for the store",
                        "store",
                        "could not record the outcome of %s yet (%s); retrying every %gs",
                        row.label,
                        exc.message,
                        RECORD_RETRY,
                    )
                waited = True
            await asyncio.sleep(RECORD_RETRY)


def _attempt_span(channel: Channel, row: OutboxRow, parent: str | None) -> Any:
    """The span of one send attempt: `notify <notifier>` or `webhook <subscriber>` (the
    channel names it), a child of the routing decision that queued row."""
    return tracing.start(
        f"{channel.name} {row.notifier}",
        row.trace or parent,
        client=True,
        attributes={
            tracing.EVENT_ID: row.event_id if row.event_id != "-" else None,
            tracing.RULE: row.rule,
            tracing.NOTIFIER: row.notifier,
            tracing.ATTEMPT: row.attempts,
            tracing.KIND: row.kind,
            tracing.OUTBOX_ID: row.id,
            tracing.RESEND_COUNT: row.attempts - 1 if row.attempts > 1 else None,
        },
    )


def share(lanes: dict[tuple[str, int], int], budget: int) -> dict[tuple[str, int], int]:
    """The lanes' room cut down to budget sends in all, one a lane at a time in a random
    order (so no lane is always last), every lane still named."""
    out = dict.fromkeys(lanes, 0)
    open_lanes = [key for key, room in lanes.items() if room > 0]
    random.shuffle(open_lanes)
    while budget > 0 and open_lanes:
        for key in list(open_lanes):
            if budget == 0:
                break
            out[key] += 1
            budget -= 1
            if out[key] == lanes[key]:
                open_lanes.remove(key)
    return out
