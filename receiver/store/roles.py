"""The Store's roles, one resource each (store.events, store.sessions, store.keys, ...):
what ingest, the read API, the notify workers, the admin page and the operator commands
need from storage, each call its own transaction. The Tx's roles and the Store that holds
them all: receiver.store.base."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

from receiver.events import BaseEvent
from receiver.sessions import Aggregate, Summary
from receiver.store.flaps import Flap
from receiver.store.records import (
    Ack,
    Action,
    Alert,
    ApiKey,
    Attempt,
    Backlog,
    Chain,
    EventQuery,
    EventRow,
    Noise,
    OutboxQuery,
    OutboxRow,
    Quarantined,
    RateLimit,
    Replay,
    SessionPage,
    SessionQuery,
    Silence,
    StoredEvent,
    Webhook,
)
from receiver.store.threads import ChatThread, ThreadClaim
from receiver.store.webhook_health import EventMaker, HealthPolicy
from receiver.store.webhook_replays import Pick, ReplayJob

OnAccepted = Callable[[], None]
# What accept() did: stored it; or its id was stored already, with the same raw body
# (duplicate) or another (conflict: the first body is kept).
Accepted = Literal["new", "duplicate", "conflict"]


class Events(Protocol):
    """Ingest's events and quarantine, the operator's replays, retention (store.events)."""

    async def accept(self, event: BaseEvent, raw: bytes, trace: str | None = None) -> Accepted:
        """Keep event durably, with the trace context of its ingest (receiver.tracing):
        "new"; or, its id already stored, "duplicate" if the stored raw body is the same
        bytes, "conflict" if not (the stored one is kept, with its own trace context)."""

    async def traces(self, event_ids: Sequence[str]) -> dict[str, str]:
        """The stored trace context of each of these events that has one."""

    async def quarantine(
        self, raw: bytes, *, reason: str, client: str | None, event_id: str | None
    ) -> None: ...
    async def page(self, query: EventQuery) -> list[EventRow]:
        """Events newest first (received_at, then id), after query.before if given."""

    async def rules(self, digest: str) -> tuple[str, str] | None:
        """(source, text) of the rules file routing kept under this digest."""

    async def get(self, event_id: str) -> tuple[EventRow, str] | None:
        """One event and its raw body."""

    async def quarantined(self, *, before: int | None, limit: int) -> list[Quarantined]: ...
    async def replay(
        self, event_id: str, *, now: float, respect_lifecycle: bool = False
    ) -> int | None:
        """Ask the router to route a stored event again (`receiver replay`); the Replay
        request's id, or None if no event has that id."""

    async def prune(self, before: float, *, limit: int) -> dict[str, int]:
        """Delete one batch (at most limit rows a table) received before `before`; the
        counts deleted by table: events, outbox, quarantine, lifecycle."""

    async def replay_status(self, replay_id: int) -> tuple[Replay | None, list[OutboxRow]]:
        """A replay request as it stands, and the outbox rows it has produced so far."""


class Sessions(Protocol):
    """The read API's session projection (store.sessions); reads run beside ingest."""

    async def get(self, session_id: str) -> Summary | None:
        """A session as of every stored event (those not routed yet folded in)."""

    async def score_history(self, session_id: str) -> list[tuple[float, str]] | None:
        """(score, timestamp) ascending by timestamp; None if no such session."""

    async def page(self, query: SessionQuery) -> SessionPage:
        """A page, newest startedAt first; KeyError if query.cursor names no session."""

    async def score_groups(self, group_by: str, since: str) -> list[Aggregate]:
        """Score histograms per page, cohort or userId of the sessions scored since."""

    async def import_upstream(
        self, items: Sequence[tuple[dict[str, Any], Sequence[tuple[float, str]]]]
    ) -> int:
        """Merge upstream sessions and their score points into the projection (idempotent)."""


class Outbox(Protocol):
    """The outbox as the notify workers, operator commands and the admin page use it
    (store.outbox): claims under a lease, outcomes with their attempt log, retries, pages."""

    async def claim_due(
        self,
        *,
        now: float,
        limit: int,
        lease: float,
        lanes: Mapping[tuple[str, int], int] | None = None,
        reclaim: bool = True,
    ) -> list[OutboxRow]:
        """Lease due rows, oldest due first: up to lanes[(notifier, target)] of each target
        named, and up to limit of all other targets (of every target when lanes is None).
        A row being sent whose lease ran out is due again, unless reclaim is False."""

    async def release(self, row_ids: Sequence[int], *, now: float) -> int:
        """Give back claimed rows that were never sent: pending, due now, attempt uncounted."""

    async def next_due(self) -> float | None: ...
    async def mark_delivered(
        self, row_id: int, *, now: float, attempt: Attempt | None = None
    ) -> None:
        """The row went out; attempt (if given) joins its log, its status the row's last."""

    async def mark_failed(
        self,
        row_id: int,
        *,
        error: str,
        now: float,
        retry_at: float | None,
        attempt: Attempt | None = None,
    ) -> None:
        """The send failed: pending again at retry_at, or dead (None); attempt as above."""

    async def attempts(self, row_ids: Sequence[int]) -> dict[int, list[Attempt]]:
        """The attempt logs of outbox rows, oldest first (a row never tried has none)."""

    async def deliveries(
        self, *, state: str | None = None, event_id: str | None = None, limit: int = 50
    ) -> list[OutboxRow]: ...
    async def retry_dead(self, row_id: int | None, *, now: float) -> int: ...
    async def page(self, query: OutboxQuery) -> list[OutboxRow]: ...
    async def count_dead(self, notifier: str | None = None) -> int: ...
    async def retry_dead_batch(self, notifier: str | None, *, limit: int, now: float) -> int: ...
    async def counts(self) -> dict[str, int]:
        """Notifications waiting ("pending": pending, held, sending) and "dead"."""

    async def episode(self, row_id: int) -> tuple[str, int] | None:
        """(alert, episode) an outbox row belongs to: an alert's messages (its opener,
        repeats, escalation steps, resolved message); None for a row of no alert episode
        (a digest, a storm notice, the heartbeat, a subscriber delivery) or no such row."""


class Webhooks(Protocol):
    """Webhook subscriptions and their deliveries (store.webhooks)."""

    async def add(
        self,
        *,
        public_id: str,
        url: str,
        events: list[str],
        threshold: float | None,
        format: str,
        secret: str,
        now: float,
        owner: int | None = None,
        cap: int | None = None,
        rate_limit: float | None = None,
        filter: dict[str, Any] | None = None,
    ) -> Webhook | None:
        """Store a subscription made by the key owner (None: an operator); None, storing
        nothing, if that key already has cap subscriptions (deleted ones not counted)."""

    async def all(self, *, active_only: bool = False, owner: int | None = None) -> list[Webhook]:
        """The subscriptions not deleted (active_only: the active ones); owner: of that
        key only."""

    async def get(self, public_id: str) -> Webhook | None: ...
    async def update(
        self,
        public_id: str,
        *,
        now: float,
        status: str | None = None,
        reason: str | None = None,
        secret: str | None = None,
    ) -> Webhook | None:
        """Change a subscription's status or secret; deleting or disabling one cancels its
        pending deliveries. None if no subscription (not deleted) has that id."""

    async def deliveries(
        self, webhook_id: int, *, limit: int, before: int | None = None
    ) -> list[OutboxRow]: ...
    async def delivery(self, webhook_id: int, delivery_id: int) -> OutboxRow | None:
        """One delivery (outbox row id) of a subscription, or None."""

    async def retry_delivery(
        self, webhook_id: int, delivery_id: int, *, now: float
    ) -> OutboxRow | None: ...
    async def record_delivery(
        self,
        webhook_id: int,
        *,
        ok: bool,
        now: float,
        policy: HealthPolicy,
        make_event: EventMaker,
        error: str | None = None,
        gone: bool = False,
        hold_until: float | None = None,
    ) -> tuple[Webhook, str | None] | None:
        """Count a delivery's outcome towards the subscription's health; the subscription
        after it and the health event stored (exactly once) for a change; None if it is
        not active (receiver.store.webhook_health)."""

    async def rotate(
        self, public_id: str, *, secret: str, now: float, overlap_until: float | None
    ) -> Webhook | None:
        """A new signing secret; with overlap_until the one before signs beside it until
        then. None if no subscription (not deleted) has that id."""

    async def take_slot(self, webhook_id: int, *, rate: float, now: float) -> float:
        """When the next delivery may start, at most rate a second across replicas (the
        slot is taken)."""

    async def configure(
        self, public_id: str, *, now: float, changes: Mapping[str, Any]
    ) -> Webhook | None:
        """Set a subscription's rate limit and filter: changes has "rate_limit", "filter"
        or both (None removes one; a key not there is kept). None if no subscription (not
        deleted) has that id."""

    async def start_replay(
        self, webhook_id: int, *, since: float, until: float, all: bool, now: float
    ) -> ReplayJob: ...
    async def replay_job(self, webhook_id: int, job_id: int) -> ReplayJob | None: ...
    async def running_replays(self) -> list[ReplayJob]: ...
    async def replay_step(
        self, hook: Webhook, job_id: int, *, now: float, limit: int, pick: Pick
    ) -> ReplayJob | None:
        """Queue the next limit events of a running replay (receiver.store.webhook_replays)."""

    async def enable(self, public_id: str, *, now: float, make_event: EventMaker) -> Webhook | None:
        """A disabled subscription active and healthy again, its webhook.recovered stored
        (once); None if no subscription of that id is disabled."""


class Keys(Protocol):
    """API keys and their plans' request counts (store.keys), shared by every replica."""

    async def add(
        self, *, name: str, key_hash: str, prefix: str, plan: str, role: str, now: float
    ) -> ApiKey:
        """Store a new API key's hash; KeyError if the name is taken."""

    async def all(self) -> list[ApiKey]: ...
    async def revoke(self, name: str, *, now: float) -> bool: ...
    async def authorize(
        self, key_hash: str, *, now: float, window: float = 60.0, role: str = "reader"
    ) -> tuple[ApiKey | None, RateLimit | None]:
        """The live key with this hash, and whether this request is within its plan's
        limit (None for a plan without one, or a key whose role is below `role`: that
        request is refused for its role and not counted); shared by every replica."""


class Silences(Protocol):
    """The silences operators make (store.silences; receiver.store.silences): the CLI, the
    admin page and the API add, list and end them through this one role."""

    async def add(
        self, matchers: dict[str, Any], reason: str, now: float, until: float, *,
        after: float | None = None,
    ) -> Silence:  # fmt: skip
        """A silence from now to until; with after, until resolved (add_silence)."""

    async def recent(self, limit: int = 100) -> list[Silence]:
        """The newest silences, ended ones too."""

    async def expire(self, silence_id: int, now: float) -> tuple[bool, Silence | None]:
        """End a silence now: whether this ended it, and the silence (None: no such id)."""


class Alerts(Protocol):
    """What operators do to alerts (store.alerts): acknowledgements, snoozes, the record of
    every action, and the alerts as the API lists them; alerts change by events in a Tx."""

    async def ack(self, alert_id: str, *, by: str, now: float) -> Ack | None:
        """Acknowledge an open alert's episode: its repeats stop until it resolves. The
        episode's ack (the first one stands; `made` says whether this call made it, true
        for exactly one of acks at once on any replica), or None if no alert of that id
        is open."""

    async def acks(self, alert_ids: Iterable[str]) -> dict[tuple[str, int], Ack]: ...
    async def get(self, alert_id: str) -> Alert | None: ...
    async def page(
        self,
        *,
        state: str | None = None,
        rule: str | None = None,
        session: str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> list[Alert]:
        """Alerts by id after `after`: in state, of a session, or noticed by a rule; never
        one that has not opened (episode 0)."""

    async def snooze(self, alert_id: str, *, until: float) -> int | None:
        """Put an open alert's repeats off until `until` (then the timers notify again if
        it is still open); the episode, or None if no alert of that id is open."""

    async def chains(self, alert_id: str) -> list[Chain]:
        """The alert's escalation chains, newest episode first."""

    async def flaps(self, alert_id: str) -> list[Flap]:
        """Flap detection's records of the alert (tx.flaps), by rule."""

    async def record(self, action: Action) -> None: ...
    async def actions(self, alert_ids: Iterable[str], *, limit: int = 100) -> list[Action]:
        """The newest actions on these alerts (at most limit), oldest first."""


class Upstream(Protocol):
    """The upstream service's shared request bucket and backfill cursor (store.upstream)."""

    async def take(self, name: str, *, per_minute: int, now: float) -> float:
        """Draw one request from the shared bucket: 0.0 when drawn, else seconds to wait."""

    async def hold(self, name: str, *, until: float) -> None:
        """No request from the bucket before `until` (a 429's Retry-After), on any replica."""

    async def sync_cursor(self) -> dict[str, Any] | None: ...
    async def set_sync_cursor(self, value: dict[str, Any] | None) -> None: ...


class History(Protocol):
    """The past, for backtests and the noise report (store.history)."""

    async def between(
        self, start: float, end: float, *, after: tuple[float, str] | None, limit: int
    ) -> list[StoredEvent]:
        """Events received in [start, end), oldest first, after (received_at, id)."""

    async def count_between(self, start: float, end: float) -> int: ...
    async def noise(self, since: float, until: float, *, flapping: int = 3) -> Noise:
        """The noise report of the notifications created in [since, until)."""


class Stats(Protocol):
    """What the store takes and what waits in it (store.stats): the admin page, /metrics."""

    async def size(self) -> int:
        """Bytes the store takes on disk."""

    async def backlog(self, now: float) -> Backlog:
        """Unrouted events and outbox rows waiting, by channel, with their ages, as the
        database counts them (every replica's): the backlog gauges on /metrics."""


class Threads(Protocol):
    """The one message a chat channel keeps per alert episode and target (store.threads,
    receiver.store.threads)."""

    async def claim(self, key: str, target: str, *, now: float, lease: float) -> ThreadClaim:
        """The posted message of (key, target), or the right to post it ("mine"), or
        "busy" while another sender holds that right."""

    async def posted(
        self,
        key: str,
        target: str,
        *,
        channel_id: str,
        ts: str,
        card: dict[str, Any],
        now: float,
    ) -> bool:
        """Record the first message, posted under a claim; False if one was already."""

    async def moved(
        self, key: str, target: str, *, channel_id: str, ts: str, card: dict[str, Any], now: float
    ) -> None:
        """The thread's message is now another (its first was deleted)."""

    async def release(self, key: str, target: str) -> None:
        """Give an unposted claim back."""

    async def update(self, key: str, target: str, *, card: dict[str, Any], now: float) -> None:
        """What the message shows now."""

    async def find(self, channel_id: str, ts: str) -> ChatThread | None:
        """The thread of a message, by its address."""
