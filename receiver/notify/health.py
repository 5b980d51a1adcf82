"""A subscriber's endpoint health as its channel sees it: each delivery's outcome counted
(store.webhooks.record_delivery, receiver.store.webhook_health), and the event of our own
that tells of a change (webhook.failing, webhook.disabled, webhook.recovered); and its pace:
the sends its lane may have at once, and the wait for its rate limit's next slot."""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from receiver.events import iso_epoch
from receiver.notify.backoff import Delays
from receiver.notify.redaction import shown_url, url_secrets
from receiver.store import Store
from receiver.store.records import WEBHOOK_NOTIFIER, Webhook
from receiver.store.webhook_health import HealthPolicy

log = logging.getLogger("receiver.webhooks")

ERROR_KEPT = 300  # characters of a failed delivery's error kept as the subscription's


@dataclass(frozen=True)
class Outcome:
    """How one POST went: delivered; or an error, with the subscriber's Retry-After; and
    the start of the answer (for the attempt log)."""

    delivered: bool
    error: str | None = None
    status: int | None = None
    retry_after: float | None = None
    excerpt: str | None = None

    @property
    def gone(self) -> bool:
        return self.status == 410


def health_event(
    hook: Webhook, change: str, owner: str | None, now: float
) -> tuple[str, dict[str, Any]]:
    """The event that tells of a change of hook's health: its id and body. It names the
    subscription, its URL as a log may show it, its owner's key name and the last error;
    it has no session, so it opens no alert."""
    event_id = f"{change}:{hook.public_id}:{secrets.token_hex(6)}"
    body = {
        "id": event_id,
        "type": change,
        "timestamp": iso_epoch(now),
        "webhookId": hook.public_id,
        "url": shown_url(hook.url, url_secrets(hook.url)),
        "owner": owner,
        "health": hook.health,
        "failures": hook.failures,
        "failingSince": iso_epoch(hook.failing_since) if hook.failing_since else None,
        "lastError": hook.last_error,
    }
    return event_id, body


async def judge(
    store: Store, hook: Webhook, out: Outcome, *, now: float, schedule: Delays, policy: HealthPolicy
) -> Webhook | None:
    """Record out towards hook's health: the subscription as the store has it now, or None
    if it is no longer active."""
    hold = None
    if not out.delivered:
        # While failing, the others wait for a probe that backs off as a row's retries do.
        step = max(1, min(hook.failures + 2 - policy.failures, len(schedule.delays)))
        hold = schedule.after(step, now, out.retry_after)
    judged = await store.webhooks.record_delivery(
        hook.id,
        ok=out.delivered,
        error=None if out.delivered else (out.error or "failed")[:ERROR_KEPT],
        gone=out.gone,
        now=now,
        policy=policy,
        hold_until=hold,
        make_event=lambda h, change, owner: health_event(h, change, owner, now),
    )
    if judged is None or judged[0].status != "active":
        return None
    after, change = judged
    if change is not None:
        log.warning(
            "subscriber %s is now %s (%d failed deliveries in a row): %s",
            hook.public_id,
            after.health,
            after.failures,
            after.last_error,
        )
    return after


def lane_caps(subs: Mapping[int, Webhook], concurrency: int) -> dict[tuple[str, int], int]:
    """The subscribers' lanes that may have fewer than concurrency sends at once: a failing
    one's circuit is open (one probe at a time); a rate-limited one has as many as its rate
    lets start within a second (at least one), so a send waits a second for its slot at most."""
    caps = {}
    for hook_id, hook in subs.items():
        if hook.health == "failing":
            caps[(WEBHOOK_NOTIFIER, hook_id)] = 1
        elif hook.rate_limit is not None:
            caps[(WEBHOOK_NOTIFIER, hook_id)] = max(
                1, min(concurrency, math.floor(hook.rate_limit))
            )
    return caps


async def pace(store: Store, hook: Webhook) -> None:
    """Wait for the subscriber's next slot under its rate limit (taken in the store, so
    every replica counts): a delivery over the limit waits, it is neither dropped nor failed.
    Wall-clock seconds, whatever clock the channel runs on: a rate is a real one."""
    if hook.rate_limit is None:
        return
    now = time.time()
    start = await store.webhooks.take_slot(hook.id, rate=hook.rate_limit, now=now)
    if start > now:
        await asyncio.sleep(start - now)
