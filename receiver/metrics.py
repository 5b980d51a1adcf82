"""Prometheus metrics, one registry per app so tests and several apps in a process don't collide."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from receiver.store.records import Backlog

REJECT_REASONS = (
    "payload_too_large",
    "header_timeout",
    "headers_too_large",
    "body_timeout",
    "invalid_request",  # not HTTP the parser accepts (any path)
    "overloaded",  # RECEIVER_LIMIT_CONCURRENCY reached (any path)
    "missing_signature",
    "invalid_signature",
    "invalid_json",
    "invalid_event",
    "event_too_old",
    "event_from_future",
    "storage_unavailable",
    "method_not_allowed",
)

LINK_OUTCOMES = ("done", "already", "stale", "invalid", "expired")
# Clicks on the Slack app's buttons (POST /slack/interactivity): what each came to. A
# refused one (not configured, a bad or old signature) is a dead button to look into.
SLACK_OUTCOMES = (
    "done",
    "already",
    "stale",
    "retried",  # a retried delivery of a click acted on already
    "ignored",  # signed, but not a button of ours (another action, another payload type)
    "failed",  # the action or the message update failed
    "not_configured",
    "invalid_signature",
    "expired_timestamp",
    "invalid_request",
)


class Metrics:
    def __init__(self, channels: Sequence[str] = ()) -> None:
        """channels: the notify channels' names (receiver.notify.registry), each shown in
        the backlog gauges even while nothing of it waits."""
        self.registry = CollectorRegistry()
        r = self.registry
        events = Counter(
            "receiver_events", "Deliveries answered, by result.", ["result"], registry=r
        )
        self.accepted = events.labels("accepted")
        self.duplicate = events.labels("duplicate")
        # A duplicate id whose body differs from the stored one (answered as a duplicate).
        self.conflict = events.labels("conflict")
        rejected = Counter(
            "receiver_events_rejected", "Deliveries refused, by reason.", ["reason"], registry=r
        )
        # Pre-bound children: a label lookup per request costs more than the increment.
        self.rejected = {reason: rejected.labels(reason) for reason in REJECT_REASONS}
        self._timings(r)
        self.routed = Counter("receiver_events_routed", "Events routed by the rules.", registry=r)
        self._timer_passes(r)
        # Tracing (receiver.tracing): spans sent to the collector, or lost when it failed.
        self.trace_spans = Counter(
            "receiver_trace_spans",
            "Trace spans exported to the OTLP endpoint, by outcome: exported, failed.",
            ["outcome"],
            registry=r,
        )
        outbox = Counter(
            "receiver_notifications",
            "Notification outcomes: delivered, retried, dead, fallback; pending, held, resolved,"
            " repeat, heartbeat, subscriber (a webhook delivery) when queued; throttled,"
            " cancelled, muted, deferred, silenced, grouped, stale when suppressed.",
            ["outcome"],
            registry=r,
        )
        self._outbox = outbox
        self.notifications = {
            o: outbox.labels(o) for o in ("delivered", "retried", "dead", "throttled", "fallback")
        }
        self.delivery_seconds = Histogram(
            "receiver_delivery_seconds",
            "Time to send one notification to its target.",
            registry=r,
        )
        reloads = Counter(
            "receiver_rules_reloads", "Rules reloads, by result.", ["result"], registry=r
        )
        self.reloads = {res: reloads.labels(res) for res in ("ok", "error")}
        self.rules_ok = Gauge(
            "receiver_rules_last_reload_ok", "1 if the last rules reload succeeded.", registry=r
        )
        self.rules_ok.set(1)
        pruned = Counter(
            "receiver_pruned_rows", "Rows deleted by retention, by table.", ["table"], registry=r
        )
        self.pruned = {t: pruned.labels(t) for t in ("events", "outbox", "quarantine", "lifecycle")}
        self.task_restarts = Counter(
            "receiver_task_restarts",
            "Restarts of a background loop after it failed (receiver.supervisor), by loop.",
            ["task"],
            registry=r,
        )
        webhook = Counter(
            "receiver_webhook_deliveries",
            "Deliveries to webhook subscribers, by outcome: delivered, retried, dead, gone"
            " (410: the subscription was disabled). Chat notifications are counted apart,"
            " in receiver_notifications.",
            ["outcome"],
            registry=r,
        )
        self.webhook_deliveries = {
            o: webhook.labels(o) for o in ("delivered", "retried", "dead", "gone")
        }
        self.action_links = _action_links(r)
        self.slack_interactions = _slack_interactions(r)
        self.backlog = BacklogCollector(channels)
        r.register(self.backlog)

    def accepted_total(self) -> int:
        """How many deliveries this process has accepted (the admin page's counter)."""
        value = self.registry.get_sample_value("receiver_events_total", {"result": "accepted"})
        return int(value or 0)

    def _timer_passes(self, r: CollectorRegistry) -> None:
        # The timers' passes (receiver.dispatch.router.tick) that ran here: due ones, and
        # those that also looked for what an ended silence or inhibition should wake. A
        # rate of 0 on every replica means nothing repeats, escalates or wakes.
        passes = Counter(
            "receiver_timer_passes",
            "Passes of the timers this process ran (not another replica), by part: due, wake.",
            ["part"],
            registry=r,
        )
        self.timer_due, self.timer_wake = passes.labels("due"), passes.labels("wake")

    def _timings(self, r: CollectorRegistry) -> None:
        self.ingest_seconds = Histogram(
            "receiver_ingest_seconds",
            "Time from request start to answer on POST /v1/events.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        # SQLite: how long each store cycle's statements (the accepts queued meanwhile and a
        # routing batch, each in one transaction) held the event loop; the longest wait a
        # delivery can have on routing. The commit's fsync runs in a thread: not counted.
        self.store_cycle_seconds = Histogram(
            "receiver_store_cycle_seconds",
            "How long each store write cycle held the event loop (SQLite; the commit excluded).",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1),
            registry=r,
        )

    def outcome(self, name: str) -> Counter:
        """The notifications counter for one outcome (created on first use)."""
        if name not in self.notifications:
            self.notifications[name] = self._outbox.labels(name)
        return self.notifications[name]

    def sent(self, channel: str, outcome: str) -> Counter:
        """The counter of one send outcome of a notify channel (receiver.notify.channel):
        the subscribers' in receiver_webhook_deliveries, every other channel's in
        receiver_notifications."""
        if channel == "webhook":
            return self.webhook_deliveries[outcome]
        return self.outcome(outcome)


def _action_links(r: CollectorRegistry) -> dict[str, Counter]:
    links = Counter(
        "receiver_action_links",
        "One-click action links (/act), by outcome: done, already, stale (a POST that acted,"
        " found it done already, or named an episode that had ended); invalid, expired (a"
        " token refused, on any method).",
        ["outcome"],
        registry=r,
    )
    return {o: links.labels(o) for o in LINK_OUTCOMES}


def _slack_interactions(r: CollectorRegistry) -> dict[str, Counter]:
    slack = Counter(
        "receiver_slack_interactions",
        "Clicks on the Slack app's buttons (POST /slack/interactivity), by outcome: done,"
        " already, stale (as action links); retried, ignored, failed; refused:"
        " not_configured, invalid_signature, expired_timestamp, invalid_request.",
        ["outcome"],
        registry=r,
    )
    return {o: slack.labels(o) for o in SLACK_OUTCOMES}


class BacklogCollector:
    """The backlog gauges, from the snapshot taken for the scrape under way; none at all
    while the store could not be read (a stale figure would look like the truth), but
    their age: how long ago the store last answered (0 while it does)."""

    def __init__(self, channels: Sequence[str] = ()) -> None:
        self.channels = tuple(channels)
        self.snapshot: Backlog | None = None
        self.age: float | None = None  # seconds since the last snapshot read (None: never)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.age is not None:
            yield GaugeMetricFamily(
                "receiver_backlog_age_seconds",
                "Seconds since the backlog gauges were last read from the store (0 when"
                " read for this scrape; they are left out while it cannot be read).",
                value=0.0 if self.snapshot is not None else self.age,
            )
        b = self.snapshot
        if b is None:
            return
        yield GaugeMetricFamily(
            "receiver_routing_lag_seconds",
            "Age of the oldest stored event not yet routed (0 when none).",
            value=b.lag,
        )
        yield GaugeMetricFamily(
            "receiver_unrouted_events", "Stored events not yet routed.", value=b.unrouted
        )
        pending = GaugeMetricFamily(
            "receiver_outbox_pending",
            "Outbox rows waiting to be sent (pending or sending, retries included), by channel.",
            labels=["channel"],
        )
        oldest = GaugeMetricFamily(
            "receiver_outbox_oldest_seconds",
            "Age of the oldest outbox row waiting to be sent (0 when none), by channel.",
            labels=["channel"],
        )
        for channel in dict.fromkeys([*self.channels, *sorted(b.pending)]):
            pending.add_metric([channel], b.pending.get(channel, 0))
            oldest.add_metric([channel], b.oldest.get(channel, 0.0))
        yield pending
        yield oldest
