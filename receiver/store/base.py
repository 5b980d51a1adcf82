"""The store interface by role (Convoy's repositories): the Store holds a role per resource
(receiver.store.roles: store.events, store.keys, store.outbox, ...) and the routing
transaction, whose roles are here (tx.events, tx.alerts, tx.silences, ...)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from receiver.sessions import Fact
from receiver.store.flaps import Flap
from receiver.store.records import (
    OUTBOX_STATES,
    Ack,
    Action,
    Alert,
    Chain,
    Group,
    Inhibitor,
    Notice,
    Notification,
    OutboxRow,
    Replay,
    Silence,
    StoredEvent,
    Waiting,
    Webhook,
)
from receiver.store.roles import (
    Accepted,
    Alerts,
    Events,
    History,
    Keys,
    OnAccepted,
    Outbox,
    Sessions,
    Silences,
    Stats,
    Threads,
    Upstream,
    Webhooks,
)

__all__ = [
    "OUTBOX_STATES",
    "Accepted",
    "Notification",
    "OnAccepted",
    "OutboxRow",
    "Store",
    "StoredEvent",
    "Tx",
]

T = TypeVar("T")


# -- the Tx's roles: synchronous, inside the transaction Store.transact runs ------------------


class TxEvents(Protocol):
    """The events the router takes and marks (tx.events)."""

    def unrouted(self, limit: int, skip: Iterable[str] = ()) -> list[StoredEvent]:
        """Events not yet routed, oldest first; with several replicas, ones no other
        replica is routing right now."""

    def mark_routed(self, event_ids: list[str], now: float, rules: str | None = None) -> int:
        """Mark these events routed, by the rules file of digest rules; how many were not
        already."""

    def keep_rules(self, digest: str, source: str, text: str, now: float) -> None:
        """Keep a rules file routed with, once a digest (GET /v1/events/:id/explain)."""

    def body(self, event_id: str) -> str | None: ...
    def last_received(self) -> float | None: ...
    def replay_request(self, replay_id: int) -> Replay | None:
        """The replay request an unrouted event names (StoredEvent.replay)."""

    def replay_done(self, replay_id: int, now: float) -> None:
        """Note the replay request routed, and clear it from its event."""


class TxWebhooks(Protocol):
    """Webhook subscribers as the fan-out sees them (receiver.dispatch.fanout decides,
    tx.webhooks keeps)."""

    def active(self) -> list[Webhook]:
        """The active subscriptions."""

    def sides(
        self, webhook_ids: Iterable[int], session_ids: Iterable[str]
    ) -> dict[tuple[int, str], tuple[bool, str]]:
        """(subscription, session) -> (below its threshold, the mark of that score); on
        PostgreSQL those sessions stay locked until the transaction ends."""

    def save_sides(self, changed: Mapping[tuple[int, str], tuple[bool, str]]) -> None: ...


class TxSessions(Protocol):
    """The session projection's writer (tx.sessions)."""

    def project(self, facts: Sequence[Fact]) -> None:
        """Fold routed events into the session projection; each event once (the router
        marks it routed in the same transaction)."""


class TxOutbox(Protocol):
    """The router's and lifecycle's notifications, queued in the outbox (tx.outbox)."""

    def add(
        self,
        event_id: str,
        n: Notification,
        *,
        state: str,
        now: float,
        next_at: float | None = None,
        reason: str | None = None,
        kind: str = "event",
        alert: str | None = None,
        episode: int | None = None,
        group_id: int | None = None,
        replay: int | None = None,
    ) -> int: ...
    def add_many(
        self, items: Sequence[tuple[str, Notification]], *, state: str, now: float, kind: str
    ) -> None:
        """Queue many notifications, each (event id, notification), alike otherwise."""

    def cancel_held(self, alert: str, episode: int, now: float, reason: str) -> int: ...
    def sent(self, alert: str, episode: int, rule: str) -> bool:
        """Whether rule's notification about this episode went out (or is on its way)."""

    def updatable(
        self, alert: str, episode: int, channels: Collection[str]
    ) -> list[tuple[str, str, int, str]]:
        """Each (rule, notifier, target, channel) of these channels the episode's messages
        went to (or are on their way to), one per (notifier, target)."""


class TxAlerts(Protocol):
    """Alerts (tx.alerts); an alert read here is locked until the transaction ends."""

    def get(self, alert_id: str) -> Alert | None: ...
    def peek(self, alert_id: str) -> Alert | None:
        """get() without taking the alert's lock (PostgreSQL): to read another alert's
        state (an inhibition's source) without locking out of order."""

    def save(self, alert: Alert, now: float) -> None: ...
    def read_ahead(self, alert_ids: Iterable[str]) -> None:
        """Read these alerts ahead; until flush(), get() and save() keep them in memory
        (the batch must then be flushed, or its savepoint rolled back and forget() called)."""

    def flush(self) -> None:
        """Write the alerts changed since read_ahead(), and stop keeping them."""

    def forget(self) -> None:
        """Drop what read_ahead() kept, written or not (after rolling its writes back)."""

    def list_open(self, limit: int = 1000) -> list[Alert]: ...
    def ack(self, alert_id: str, *, by: str, now: float) -> Ack | None:
        """Alerts.ack in this transaction: with the messages the action queues."""

    def snooze(self, alert_id: str, *, until: float) -> int | None:
        """Alerts.snooze in this transaction."""

    def record(self, action: Action) -> None:
        """Alerts.record in this transaction."""


class TxNotices(Protocol):
    """Which rules notified of an alert's episode, and their repeats (tx.notices)."""

    def add(self, alert: str, episode: int, rule: str, now: float, repeat: float | None) -> None:
        """Note that rule notified of the episode (once; the first note stands)."""

    def of(self, alert: str, episode: int) -> list[Notice]: ...
    def end_repeats(self, alert: str, episode: int) -> None: ...
    def due(self, now: float, limit: int = 100) -> list[Notice]:
        """Notices whose next repeat is due, of episodes nobody acknowledged."""

    def repeated(self, notice: Notice, next_at: float | None) -> None: ...
    def suppress(
        self, alert: str, episode: int, rule: str, now: float, why: str, event: str | None = None
    ) -> None:
        """Note that rule's notification of the episode, about event, was silenced or muted
        (why): it is notified when that ends, if still open (once; a note that exists
        stands, its event too)."""

    def suppressed(self, after: Waiting | None, limit: int = 200) -> list[Notice]:
        """Suppressed notices in (suppressed_since, alert, episode, rule) order, after
        `after` (the last one of the page before)."""

    def woke(self, notice: Notice, now: float, repeat: float | None) -> None:
        """A suppressed notice is no longer waiting (notified now; repeat: its next in)."""


class TxInhibitors(Protocol):
    """The open sources of inhibition rules (tx.inhibitors)."""

    def add(self, found: Inhibitor) -> None:
        """Note an alert whose opening event matched rule's source (again: the newest)."""

    def remove(self, alert: str) -> int:
        """The alert resolved: it inhibits nothing any more; how many rows it had."""

    def find(self, rule: str, key: str, limit: int = 8) -> list[Inhibitor]:
        """The sources of rule with these equal values, oldest first (open or not: check)."""


class TxEscalations(Protocol):
    """Alert episodes' escalation chains, their steps timers (tx.escalations)."""

    def start(self, chain: Chain) -> None:
        """Start the chain once (a suppressed one starts again when this one is not)."""

    def due(self, now: float, limit: int = 100) -> list[Chain]:
        """Chains whose next look is due; on PostgreSQL locked, skipping locked ones."""

    def suppressed(self, after: Waiting | None, limit: int = 200) -> list[Chain]:
        """Chains waiting for a silence or quiet hours to end, after `after`."""

    def save(self, chain: Chain) -> None: ...
    def of(self, alert: str, episode: int) -> list[Chain]: ...
    def end(self, alert: str, episode: int, now: float, why: str) -> None:
        """The episode resolved: its chains stop."""

    def next_due(self) -> float | None: ...
    def acked(self, alert: str, episode: int) -> tuple[str, float] | None:
        """(who, when) acknowledged the episode, if anyone has."""

    def unack(self, alert: str, episode: int, now: float, why: str) -> None:
        """The acknowledgement ran out (reack): removed, and recorded as an action."""

    def paged(self, alert: str, episode: int, rule: str) -> list[tuple[str, int]]:
        """(notifier, target) of every message of rule about the episode sent or on its way."""


class TxDigests(Protocol):
    """Digest groups collecting one rule's notifications for a while (tx.digests)."""

    def find_open(self, rule: str, key: str, now: float) -> Group | None:
        """The group of (rule, key) still open at now; on PostgreSQL the key stays locked."""

    def new(self, rule: str, key: str, now: float, closes_at: float) -> Group: ...
    def update(self, group: Group, *, title: str, body: str, now: float, release: bool) -> None:
        """Store the group's members and its held digest's text (release: send it now)."""


class TxStorms(Protocol):
    """The storm guard's window of each rule (tx.storms)."""

    def count(self, rule: str, now: float, per: float) -> tuple[float, int, int]:
        """Count one notification: (window start, its count with this one, the window
        before's count, 0 when that was not the window just before)."""


class TxFlaps(Protocol):
    """Flap detection's record of each (rule, alert) (tx.flaps; receiver.dispatch.flap)."""

    def change(
        self, rule: str, alert: str, state: str, event: str | None, now: float, *,
        changes: int, within: float, quiet: float,
    ) -> tuple[Flap, Flap]:  # fmt: skip
        """Count one change of the alert (state: what it became, by event) under rule:
        (the record before, after); flaps.changed says when it flaps. Routing calls it with
        the alert locked (it changes the alert in the same transaction)."""

    def due(self, now: float, limit: int = 100) -> list[Flap]:
        """Flapping records whose quiet has passed by now, soonest first (PostgreSQL: their
        alerts locked)."""

    def settle(self, rule: str, alert: str, now: float) -> bool:
        """End the flapping period if it is still due; whether this call ended it."""

    def next_due(self) -> float | None: ...
    def of(self, alert: str) -> list[Flap]:
        """The alert's records, by rule."""


class TxMaintenance(Protocol):
    """The notices of maintenance windows, each claimed once (tx.maintenance)."""

    def claim(self, name: str, start: float, kind: str, now: float) -> bool:
        """Claim the (window, stretch start, "start" | "end") notice; whether this call did."""

    def claimed(self, name: str, start: float, kind: str) -> bool: ...
    def forget(self, before: float) -> int:
        """Drop claims of stretches that started before before; how many."""


class TxThrottle(Protocol):
    """Throttle windows of (rule, key) (tx.throttle)."""

    def throttled(self, rule: str, key: str, now: float, every: float) -> bool:
        """True if (rule, key) notified within the last `every` seconds; else open a window."""


class TxSilences(Protocol):
    """Silences (tx.silences)."""

    def active(self, now: float) -> list[Silence]: ...
    def add(
        self, matchers: dict[str, Any], reason: str, now: float, until: float, *,
        after: float | None = None, alerts: tuple[str, ...] = (),
    ) -> int:  # fmt: skip
        """A silence from now to until; with after, one that ends once every alert of
        alerts (the open ones it matched now) has been resolved for after seconds."""

    def expire(self, silence_id: int, now: float) -> bool:
        """End a silence now; False if it has ended already (or never was)."""

    def get(self, silence_id: int) -> Silence | None: ...
    def recent(self, limit: int = 100) -> list[Silence]:
        """The newest silences, ended ones too."""


class TxState(Protocol):
    """Named state of the timers and the admin page, as JSON values (tx.state)."""

    def get(self, name: str) -> Any: ...
    def set(self, name: str, value: Any) -> None: ...


class Scratch(Protocol):
    """What `receiver backtest` needs of its scratch store in memory besides the Tx
    (tx.scratch; receiver.store.scratch() makes one): events put in by hand, an outbox
    journal, the notify worker's part and the timers' next times."""

    def follow(self, leader: Any) -> None:
        """Share leader's (another Scratch's) events and alerts: leader keeps them, and this
        store only reads them (several rules files replay one period)."""

    def episode_over(self, alert: Alert) -> None:
        """The alert has opened a new episode: what was kept of the one before may go."""

    def put(self, event: StoredEvent) -> bool:
        """Keep an event, unrouted; False if its id is kept already."""

    def forget_event(self, event_id: str) -> None:
        """Drop a routed event's body."""

    def waits_on(self, alert: Alert, event_id: str) -> bool:
        """Whether a notice of the alert's episode waits with event's notification
        (tx.notices.suppress): its body is read when that notice wakes; or the event has
        just started a waiting chain of the episode again: its pages are read from it."""

    def changes(self) -> list[tuple[Any, str]]:
        """The outbox rows written or changed since the last call, in order, each with the
        state it was given then."""

    def next_due(self) -> float | None:
        """When the next row is due to be sent (pending or held)."""

    def deliver_due(self, now: float) -> int:
        """The notify worker's part: every pending or held row due by now is delivered."""

    def next_repeat(self) -> float | None: ...
    def next_chain(self) -> float | None:
        """When the next escalation step is due."""

    def chain(self, alert: str, episode: int, rule: str) -> Chain | None:
        """The escalation of the alert's episode by rule."""

    def rows(self) -> list[OutboxRow]:
        """The rows kept, newest first."""


class Tx(Protocol):
    """One write transaction of the router, the alert lifecycle or an operator command.

    Synchronous: the store runs the whole function it is given (Store.transact) inside
    one transaction, on SQLite on the event loop, on PostgreSQL in a pool thread. Every
    read and write of its roles sees the transaction's own writes; all commit, or none.
    """

    @property
    def events(self) -> TxEvents: ...
    @property
    def webhooks(self) -> TxWebhooks: ...
    @property
    def sessions(self) -> TxSessions: ...
    @property
    def outbox(self) -> TxOutbox: ...
    @property
    def alerts(self) -> TxAlerts: ...
    @property
    def notices(self) -> TxNotices: ...
    @property
    def escalations(self) -> TxEscalations: ...
    @property
    def inhibitors(self) -> TxInhibitors: ...
    @property
    def digests(self) -> TxDigests: ...
    @property
    def throttle(self) -> TxThrottle: ...
    @property
    def storms(self) -> TxStorms: ...
    @property
    def flaps(self) -> TxFlaps: ...
    @property
    def silences(self) -> TxSilences: ...
    @property
    def maintenance(self) -> TxMaintenance: ...
    @property
    def state(self) -> TxState: ...

    def savepoint(self) -> AbstractContextManager[None]:
        """A nested transaction: an exception inside rolls back its writes alone."""

    def try_lock(self, name: str) -> bool:
        """Whether this transaction holds the named timer for this turn (with several
        replicas or worker processes, one at a time runs it; SQLite's write transaction holds
        the whole file, so there it is always True)."""


class ScratchTx(Tx, Protocol):
    """A Tx in memory with what a backtest needs besides (receiver.store.scratch())."""

    @property
    def scratch(self) -> Scratch: ...


class Store(Protocol):
    """The store: its lifecycle, and a role by resource (store.keys.authorize(...),
    store.sessions.get(...)); the router's and lifecycle's writes go through transact."""

    on_accepted: OnAccepted | None
    # Told, after each write cycle, how long its statements held the event loop (seconds):
    # SQLite runs them there, so this is how long ingest can wait on routing. PostgreSQL's
    # statements wait on the network, not the loop: it never calls it.
    on_cycle: Callable[[float], None] | None
    # Why the last write failed, while no write has succeeded since; else None.
    last_write_error: str | None
    # Once open: the schema version it was migrated to (opening migrates, under a lock).
    schema_version: int

    @property
    def sessions(self) -> Sessions: ...
    @property
    def keys(self) -> Keys: ...
    @property
    def upstream(self) -> Upstream: ...
    @property
    def history(self) -> History: ...
    @property
    def events(self) -> Events: ...
    @property
    def alerts(self) -> Alerts: ...
    @property
    def silences(self) -> Silences: ...
    @property
    def stats(self) -> Stats: ...
    @property
    def outbox(self) -> Outbox: ...
    @property
    def webhooks(self) -> Webhooks: ...
    @property
    def threads(self) -> Threads: ...

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    def under_pressure(self) -> bool:
        """Whether ingest is in a burst just now (routing then gives way)."""

    async def check_writable(self) -> None:
        """Raise StorageUnavailableError unless a small write commits (a real one, which
        needs the disk: an empty transaction commits even on a full disk)."""

    async def transact(self, fn: Callable[[Tx], T]) -> T:
        """Run fn in one write transaction: all of its writes commit, or none."""
