"""The records the store hands out and takes in: plain data, no storage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# held: waiting for a hold, an active window (defer) or a digest window to pass.
# The last nine are suppressed notifications, kept with their reason.
OUTBOX_STATES = (
    "pending",
    "held",
    "sending",
    "delivered",
    "dead",
    "throttled",
    "cancelled",
    "muted",
    "silenced",
    "inhibited",
    "grouped",
    "storm",
    "stale",
    "flapping",
    "maintenance",
)


@dataclass(slots=True)
class StoredEvent:
    id: str
    type: str
    body: str
    received_at: float
    replay: int | None = None  # the Replay request it is routed for again, if any
    trace: str | None = None  # its ingest's trace context (receiver.tracing), if traced


@dataclass(slots=True)
class Notification:
    """One notification the router wants sent: a future outbox row. (Not frozen, though
    nothing changes one, as StoredEvent and Group: a frozen dataclass sets each field
    through object.__setattr__, and routing makes these for every event.)"""

    rule: str
    notifier: str
    target: int
    title: str
    body: str
    throttle_key: str | None = None
    throttle_seconds: float | None = None
    # A delivery to a webhook subscriber: its stable id (webhook-id / X-Service-Event-Id)
    # and the subscription's (Webhook.id); None for the rules' notifications.
    delivery_id: str | None = None
    subscription_id: int | None = None
    # The trace context of the routing decision that queues it (receiver.tracing): its
    # send attempts are spans of that trace. None: the event's own, if it has one.
    trace: str | None = None
    # The channel that sends it (receiver.notify.registry): its notifier URL's scheme picks
    # it when the rules are loaded. None: as before channels were recorded (row_channel).
    channel: str | None = None


@dataclass(frozen=True)
class OutboxRow:
    id: int
    event_id: str
    rule: str
    notifier: str
    target: int
    title: str
    body: str
    state: str
    attempts: int
    next_at: float
    created_at: float
    updated_at: float
    reason: str | None = None
    last_error: str | None = None
    kind: str = "event"
    replay: int | None = None  # the Replay request that produced it
    delivery_id: str | None = None  # a subscriber delivery's stable id (Notification's)
    subscription_id: int | None = None  # a subscriber delivery's Webhook.id
    last_status: int | None = None  # the HTTP status of the last attempt, if it had one
    trace: str | None = None  # Notification.trace
    # Notification.channel (row_channel's); None only in a row made by hand, not read.
    channel: str | None = None

    @property
    def label(self) -> str:
        """A name for logs that never includes the target URL."""
        return f"{self.notifier}[{self.target}]"


@dataclass(frozen=True)
class Attempt:
    """One send of an outbox row, as its attempt log keeps it: when it started, the HTTP
    status if the channel saw one, how long it took, the error if it failed, and the start
    of the answer (a channel's own excerpt, short, never a secret). number: the row's nth
    attempt ever, counted by the store (a manual retry goes on counting)."""

    at: float
    duration_ms: int
    status: int | None = None
    error: str | None = None
    excerpt: str | None = None
    number: int = 0


# Outbox states of a notification that went out, or is on its way.
SENT_STATES = ("pending", "sending", "delivered")


@dataclass
class Alert:
    """A session's attention (or an intervention) as an alert: open or resolved, per episode.
    Episode 0 has never opened: only a closing event came (its row makes a late opener
    stale); the API, the CLI and the admin page do not show it (Alert.opened)."""

    id: str
    state: str  # "open" | "resolved"
    episode: int
    last_ts: str  # the newest event timestamp applied; older events are stale
    opened_ts: str | None = None
    opened_event: str | None = None
    resolved_ts: str | None = None

    @property
    def opened(self) -> bool:
        """Whether it has ever opened: an alert to show, with the times of its episode."""
        return self.episode > 0


@dataclass(frozen=True)
class Notice:
    """A rule notified about an alert's episode: the basis of resolved and repeat messages."""

    alert: str
    episode: int
    rule: str
    notified_at: float
    next_repeat_at: float | None
    repeats: int
    # Set while the rule's notification was silenced or muted (outside its active window),
    # nothing sent yet: when that ends and the alert is still open, it is notified once.
    suppressed_since: float | None = None
    suppressed_why: str | None = None  # "silenced" | "muted"
    # The event whose notification was suppressed: the woken one is filed under it and
    # rendered from it (None: noted before the column existed; the alert's opener then).
    suppressed_event: str | None = None


@dataclass(frozen=True)
class Inhibitor:
    """An open alert that inhibits: its opening event matched inhibition rule's source, and
    key holds the values of the rule's equal fields (receiver.rules.inhibit)."""

    rule: str
    key: str
    alert: str
    episode: int
    event: str
    since: float


# Where a page of waiting (suppressed) chains or notices ends: (suppressed_since, alert,
# episode, rule), unique; the next page starts after it.
Waiting = tuple[float, str, int, str]


def waiting_key(item: Chain | Notice) -> Waiting:
    """Where a waiting chain or notice sorts among the others."""
    return (item.suppressed_since or 0.0, item.alert, item.episode, item.rule)


@dataclass(slots=True)
class Chain:
    """An alert episode's escalation, by one rule's policy (frozen when it started):
    step is the index of the next step to page (len(steps): the chain ran out), round the
    chain's run (0 for the first); next_at when the chain looks again (None: stopped,
    acknowledged, ran out or suppressed); log: what it did, oldest first."""

    alert: str
    episode: int
    rule: str
    policy: dict[str, Any]
    step: int
    round: int
    next_at: float | None
    started_at: float
    suppressed_since: float | None = None
    suppressed_why: str | None = None
    log: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        """running, acked (stopped, or waiting for reack), suppressed (waiting for a silence
        or quiet hours to end), done (ran out) or ended (the alert resolved)."""
        last = self.log[-1].get("event") if self.log else None
        if last == "ended":
            return "ended"
        if last == "acked":
            return "acked"
        if self.next_at is None:
            return "suppressed" if self.suppressed_since is not None else "done"
        return "running"


@dataclass(slots=True)
class Group:
    id: int
    rule: str
    key: str
    closes_at: float
    count: int
    members: list[dict[str, Any]]


@dataclass(frozen=True)
class Silence:
    id: int
    matchers: dict[str, Any]
    reason: str
    starts_at: float
    ends_at: float
    expired_at: float | None = None
    created_at: float = 0.0
    after: float | None = None  # until resolved: it ends once its alerts are resolved this long
    alerts: tuple[str, ...] = ()  # until resolved: the open alerts it matched when made


@dataclass(frozen=True)
class Replay:
    """An operator's `receiver replay`: route a stored event again.

    Sent whatever the lifecycle says (stale, silenced, throttled...) unless
    respect_lifecycle; routed_at is set once the router has routed it.
    """

    id: int
    event_id: str
    requested_at: float
    respect_lifecycle: bool
    routed_at: float | None = None


# -- the read API ---------------------------------------------------------------------------

# Requests a minute each plan allows (None: no limit), and what each role may do.
PLANS: dict[str, int | None] = {"free": 60, "pro": 600, "enterprise": None}
ROLES = ("reader", "writer", "admin")


@dataclass(frozen=True)
class ApiKey:
    """An API key as stored: its hash stays in the store, the key itself nowhere."""

    id: int
    name: str
    prefix: str  # the first characters of the key, to tell keys apart in a list
    plan: str
    role: str
    created_at: float
    revoked_at: float | None = None
    last_used_at: float | None = None


@dataclass(frozen=True)
class RateLimit:
    """One request against its key's plan limit: allowed or not, and what is left."""

    allowed: bool
    limit: int
    remaining: int
    reset: int  # seconds until the oldest counted request leaves the window


@dataclass(frozen=True)
class SessionQuery:
    """GET /v1/sessions's filters (startedAt between start_from and start_to, iso())."""

    limit: int = 20
    user_id: str | None = None
    status: str | None = None
    start_from: str | None = None
    start_to: str | None = None
    cursor: str | None = None


@dataclass(frozen=True)
class SessionPage:
    sessions: list[Any]  # receiver.sessions.Summary
    total: int
    cursor: str | None


# -- webhook subscribers (POST /v1/webhooks) -------------------------------------------------

# The outbox's notifier for a delivery to a subscriber (target: Webhook.id); kind "webhook".
# No rules notifier can take this name (they start with a letter or digit), so their
# lanes, listings and cancellations never mix.
WEBHOOK_NOTIFIER = "@subscriber"
WEBHOOK_CHANNEL = "webhook"  # the channel of those deliveries (receiver.notify.webhook)
NOTIFY_CHANNEL = "notify"  # apprise's (receiver.notify.apprise), of the rules' notifiers


def row_channel(n: Notification) -> str:
    """The channel an outbox row of n records: n's own, else the one it had before rows
    recorded theirs (the schema's migration gives old rows the same)."""
    return n.channel if n.channel is not None else notifier_channel(n.notifier)


def notifier_channel(notifier: str) -> str:
    """The channel of a notifier's rows before rows recorded theirs."""
    return WEBHOOK_CHANNEL if notifier == WEBHOOK_NOTIFIER else NOTIFY_CHANNEL


def subscriber_delivery(subscription_id: int, delivery_id: str, body: str) -> Notification:
    """The outbox notification of one delivery to a subscriber: its lane the subscription,
    its stable id delivery_id, body the exact JSON to send (no title)."""
    return Notification(
        "webhook",
        WEBHOOK_NOTIFIER,
        subscription_id,
        "",
        body,
        delivery_id=delivery_id,
        subscription_id=subscription_id,
        channel=WEBHOOK_CHANNEL,
    )


@dataclass(frozen=True)
class Webhook:
    """A subscriber. Its secret signs deliveries, so it is kept as it is (it cannot be a
    hash); it leaves the store only to the sender, and to its creator once."""

    id: int
    public_id: str
    url: str
    events: list[str]
    threshold: float | None
    format: str  # "service" (X-Service-Signature) or "standard" (Standard Webhooks)
    secret: str
    status: str  # active, disabled (410 Gone, or failing too long) or deleted
    created_at: float
    status_reason: str | None = None
    owner: int | None = None  # the API key that made it; None: an operator's (the CLI)
    # Endpoint health (receiver.store.webhook_health): healthy, failing or disabled; the
    # failed deliveries in a row, since when (the first of them), and the last one's error.
    health: str = "healthy"
    failures: int = 0
    failing_since: float | None = None
    last_error: str | None = None
    # During a rotation's overlap (POST /v1/webhooks/:id/rotate-secret): the secret before,
    # which still signs each delivery beside the new one until previous_until.
    previous_secret: str | None = None
    previous_until: float | None = None
    rate_limit: float | None = None  # deliveries a second at most (None: no limit)
    # Its events must also match this, a rule's `match:` mapping (None: every event).
    filter: dict[str, Any] | None = None


# -- the admin page ----------------------------------------------------------------------------


@dataclass(frozen=True)
class EventRow:
    """A stored event as the admin page lists it (the body apart)."""

    id: str
    type: str
    session_id: str | None
    user_id: str | None
    score: float | None
    event_ts: str
    received_at: float
    routed_at: float | None
    duplicates: int  # deliveries of the same id after the first
    rules: str | None = None  # the digest of the rules file it was routed with
    trace: str | None = None  # its ingest's trace context (receiver.tracing), if traced

    @property
    def trace_id(self) -> str | None:
        """The id of its trace, as tracing backends search for it (hex), if traced."""
        return self.trace[3:35] if self.trace else None


@dataclass(frozen=True)
class EventQuery:
    limit: int = 50
    type: str | None = None
    session_id: str | None = None
    user_id: str | None = None
    since: float | None = None  # received_at, epoch seconds
    until: float | None = None
    duplicated: bool = False  # only events delivered more than once
    before: tuple[float, str] | None = None  # (received_at, id) of the last row shown


@dataclass(frozen=True)
class OutboxQuery:
    limit: int = 50
    state: str | None = None
    notifier: str | None = None
    event_id: str | None = None
    before: int | None = None  # the id of the last row shown
    alert: str | None = None  # the notifications about one alert (who was paged when)
    rule: str | None = None
    channel: str | None = None  # the rows one channel sends (receiver.notify.registry)


@dataclass(frozen=True)
class Quarantined:
    id: int
    received_at: float
    reason: str
    client: str | None
    event_id: str | None
    body: str


@dataclass(frozen=True)
class Ack:
    """Someone acknowledged an alert's episode: its repeats stop until it resolves."""

    alert: str
    episode: int
    acked_by: str
    acked_at: float
    # store.alerts.ack's answer only: whether that call made this ack (of acks at once, on
    # any replica, exactly one did), not part of the ack itself.
    made: bool = field(default=False, compare=False)


ACTIONS = ("ack", "resolve", "snooze")  # what can be done to an alert (receiver.dispatch.actions)
SOURCES = ("link", "admin", "api", "cli")  # where an action came from
# What an alert's record holds besides: an acknowledgement that ran out (an escalation's
# reack removed it).
RECORDED_ACTIONS = (*ACTIONS, "unack")
RECORDED_SOURCES = (*SOURCES, "escalation")


@dataclass(frozen=True)
class Action:
    """Something done to an alert's episode, from a one-click link, the admin page, the API
    or the CLI: by whom (an API key's name, or "link"), when, and what came of it ("done";
    "already": it was acked or resolved already; "stale": a link for an episode that had
    ended). until: a snooze's end."""

    alert: str
    episode: int
    action: str
    source: str
    actor: str
    at: float
    outcome: str
    until: float | None = None


# -- the noise report (receiver.store.history) ------------------------------------------------


@dataclass(frozen=True)
class Noise:
    """What the notifications of a period were (`receiver report`): all counts, no texts.

    outbox: (rule, notifier, kind, state, count); per_day: (UTC day start, rows sent);
    top_sessions / top_users: (id, notifications sent); flapping: (alert, episodes, state);
    dead: (notifier, target, count); latency: seconds from an event's arrival to the
    delivery of its notifications, sorted percentiles {"p50": s, "p99": s} (absent: none).
    """

    since: float
    until: float
    events: int
    outbox: list[tuple[str, str, str, str, int]]
    per_day: list[tuple[float, int]]
    top_sessions: list[tuple[str, int]]
    top_users: list[tuple[str, int]]
    flapping: list[tuple[str, int, str]]
    dead: list[tuple[str, int, int]]
    latency: dict[str, float]
    delivered: int  # notifications of events delivered (the latency's sample)


@dataclass
class Backlog:
    """What waits in the store, as the store itself counts it (every replica's share).

    lag: seconds the oldest stored event not yet routed has waited (0 when none).
    pending and oldest, by channel (receiver.notify.registry; only channels with rows
    waiting): outbox rows waiting to be sent (pending or sending, retries included; not
    held ones, which wait on purpose) and the age in seconds of the oldest of them.
    """

    lag: float
    unrouted: int
    pending: dict[str, int]
    oldest: dict[str, float]
