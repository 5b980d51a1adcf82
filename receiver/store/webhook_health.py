"""Endpoint health of webhook subscribers, on either SQL store (store.webhooks.record_delivery).

A subscription is healthy, failing (HealthPolicy.failures failed deliveries in a row, or
failing for HealthPolicy.failing_after seconds) or disabled (failing for disable_after
seconds, or answered 410 Gone). A delivered one makes it healthy again.

Each change of health is an event of our own (webhook.failing, webhook.disabled,
webhook.recovered), written into the events table in the same transaction as the change,
unrouted: the router routes it through rules.yaml like any event. The subscription's row
is locked first (an UPDATE), so two replicas recording outcomes of one subscription at
once take turns, and the second sees the first's change: each change is one event.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from receiver.events import iso_epoch
from receiver.store.records import Webhook
from receiver.store.statements import Query

HEALTH_SCHEMA = """
    ALTER TABLE webhooks ADD COLUMN health TEXT NOT NULL DEFAULT 'healthy';
    ALTER TABLE webhooks ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE webhooks ADD COLUMN failing_since {real};
    ALTER TABLE webhooks ADD COLUMN last_error TEXT;
    UPDATE webhooks SET health = 'disabled' WHERE status = 'disabled'
"""
HEALTH_COLUMNS = "health, failures, failing_since, last_error"

HEALTH_EVENTS = ("webhook.failing", "webhook.disabled", "webhook.recovered")

# (the subscription as it is now, the event type, its owner's key name) -> (event id, body)
EventMaker = Callable[[Webhook, str, str | None], tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class HealthPolicy:
    """When a subscription is failing, and when it is disabled (seconds)."""

    failures: int = 5
    failing_after: float = 3600.0
    disable_after: float = 3 * 86400.0


def judge(
    hook: Webhook, *, ok: bool, error: str | None, gone: bool, now: float, policy: HealthPolicy
) -> tuple[Webhook, str | None]:
    """The subscription after one delivery's outcome, and the health event it causes (None:
    no change of health).

    >>> h = Webhook(1, "wh_1", "https://a", [], None, "service", "s", "active", 0.0)
    >>> for i in range(5):
    ...     h, change = judge(h, ok=False, error="HTTP 500", gone=False, now=float(i),
    ...                       policy=HealthPolicy())
    >>> h.health, h.failures, h.failing_since, change
    ('failing', 5, 0.0, 'webhook.failing')
    >>> judge(h, ok=True, error=None, gone=False, now=9, policy=HealthPolicy())[1]
    'webhook.recovered'
    """
    if ok:
        was = hook.health
        healthy = replace(hook, health="healthy", failures=0, failing_since=None)
        return healthy, "webhook.recovered" if was == "failing" else None
    since = hook.failing_since if hook.failing_since is not None else now
    hook = replace(hook, failures=hook.failures + 1, failing_since=since, last_error=error)
    long = now - since
    if gone or (hook.health == "failing" and long >= policy.disable_after):
        return replace(hook, health="disabled", status="disabled"), "webhook.disabled"
    if hook.health == "healthy" and (
        hook.failures >= policy.failures or long >= policy.failing_after
    ):
        return replace(hook, health="failing"), "webhook.failing"
    return hook, None


def record(
    q: Query,
    columns: str,
    read: Callable[[Any], Webhook],
    webhook_id: int,
    *,
    ok: bool,
    error: str | None,
    gone: bool,
    now: float,
    policy: HealthPolicy,
    hold_until: float | None,
    make_event: EventMaker,
) -> tuple[Webhook, str | None] | None:
    """record_delivery's transaction (see SQLWebhooks.record_delivery)."""
    # Locks the row (PostgreSQL) before reading it: concurrent recorders take turns.
    row = q(
        f"UPDATE webhooks SET failures = failures WHERE id = ? AND status = 'active'"
        f" RETURNING {columns}",
        (webhook_id,),
    ).fetchone()
    if row is None:
        return None  # deleted or disabled meanwhile: its outcomes no longer count
    before = read(row)
    after, change = judge(before, ok=ok, error=error, gone=gone, now=now, policy=policy)
    if after.status == "disabled":
        why = (
            "the subscriber answered 410 Gone"
            if gone
            else f"failing since {iso_epoch(after.failing_since or now)}; disabled after"
            f" {policy.disable_after:g}s of failures"
        )
        after = replace(after, status_reason=why)
    q(
        "UPDATE webhooks SET health = ?, failures = ?, failing_since = ?, last_error = ?,"
        " status = ?, status_reason = ?, updated_at = ? WHERE id = ?",
        (
            after.health,
            after.failures,
            after.failing_since,
            after.last_error,
            after.status,
            after.status_reason,
            now,
            webhook_id,
        ),
    )
    if after.status == "disabled":
        q(
            "UPDATE outbox SET state = 'cancelled', reason = ?, updated_at = ?"
            " WHERE subscription_id = ? AND state IN ('pending', 'held')",
            ("subscription disabled", now, webhook_id),
        )
    elif after.health == "failing" and hold_until is not None:
        # The circuit is open: the subscription's other deliveries wait for the next probe.
        q(
            "UPDATE outbox SET next_at = ?, updated_at = ? WHERE subscription_id = ?"
            " AND state = 'pending' AND next_at < ?",
            (hold_until, now, webhook_id, hold_until),
        )
    elif change == "webhook.recovered":
        # Closed again: what waited goes now.
        q(
            "UPDATE outbox SET next_at = ?, updated_at = ? WHERE subscription_id = ?"
            " AND state = 'pending' AND next_at > ?",
            (now, now, webhook_id, now),
        )
    if change is not None:
        _emit(q, after, change, now, make_event)
    return after, change


def _emit(q: Query, hook: Webhook, change: str, now: float, make_event: EventMaker) -> None:
    """The health event, stored unrouted (the router routes it like any event)."""
    owner = None
    if hook.owner is not None:
        found = q("SELECT name FROM api_keys WHERE id = ?", (hook.owner,)).fetchone()
        owner = found[0] if found else None
    event_id, body = make_event(hook, change, owner)
    q(
        "INSERT INTO events (id, type, event_ts, received_at, body) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (id) DO NOTHING",
        (event_id, change, str(body["timestamp"]), now, json.dumps(body)),
    )


def enable(
    q: Query,
    columns: str,
    read: Callable[[Any], Webhook],
    public_id: str,
    *,
    now: float,
    make_event: EventMaker,
) -> Webhook | None:
    """enable's transaction (see SQLWebhooks.enable): a disabled subscription active and
    healthy again, its webhook.recovered stored; None if none of that id is disabled."""
    row = q(
        "UPDATE webhooks SET status = 'active', health = 'healthy', failures = 0,"
        " failing_since = NULL, status_reason = NULL, updated_at = ?"
        f" WHERE public_id = ? AND status = 'disabled' RETURNING {columns}",
        (now, public_id),
    ).fetchone()
    if row is None:
        return None
    hook = read(row)
    _emit(q, hook, "webhook.recovered", now, make_event)
    return hook
