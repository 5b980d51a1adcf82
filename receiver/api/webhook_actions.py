"""POST /v1/webhooks/:id/test and /enable: a subscription brought back on purpose.

test sends a signed webhook.test delivery now, outside the outbox (no row, no retry, not
counted towards health), and answers with the attempt; enable re-enables a disabled
subscription only if such a test delivery succeeds (else 409 webhook_test_failed with the
attempt), its owner told with webhook.recovered like any recovery.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from receiver.api.limits import read_body
from receiver.errors import InvalidWebhookError, WebhookNotFoundError, WebhookTestFailedError
from receiver.events import iso_epoch
from receiver.notify.health import health_event
from receiver.notify.webhook import WebhookChannel
from receiver.store import OutboxRow, Store
from receiver.store.records import WEBHOOK_CHANNEL, WEBHOOK_NOTIFIER, Webhook
from receiver.store.webhook_replays import ReplayJob

Find = Callable[[Request], Awaitable[tuple[Webhook, dict[str, str]]]]

TEST_EVENT = "webhook.test"
LAST = 253402300799.0  # 9999-12-31T23:59:59Z: a replay's until at most


async def test_delivery(channel: WebhookChannel, hook: Webhook, now: float) -> dict[str, Any]:
    """Send hook a signed webhook.test event now, once; the attempt as the API shows it."""
    event_id = f"test_{secrets.token_hex(8)}"
    body = {
        "id": event_id,
        "type": TEST_EVENT,
        "timestamp": iso_epoch(now),
        "webhookId": hook.public_id,
    }
    row = OutboxRow(
        0, event_id, "webhook", WEBHOOK_NOTIFIER, hook.id, "", json.dumps(body), "sending",
        1, now, now, now, delivery_id=event_id, subscription_id=hook.id, channel=WEBHOOK_CHANNEL,
    )  # fmt: skip
    started = time.perf_counter()
    out = await channel.post_once(hook, row)
    return {
        "eventId": event_id,
        "delivered": out.delivered,
        "status": out.status,
        "durationMs": round((time.perf_counter() - started) * 1000),
        "excerpt": out.excerpt or None,
        "error": out.error,
    }


async def enable_tested(
    store: Store, channel: WebhookChannel, hook: Webhook, clock: Callable[[], float]
) -> tuple[Webhook | None, dict[str, Any]]:
    """A disabled subscription enabled if a test delivery to it succeeds now (its owner
    told with webhook.recovered): the subscription as it is then (None: the test failed,
    nothing changed) and the attempt. The API's, the CLI's and the admin page's enable."""
    attempt = await test_delivery(channel, hook, clock())
    if not attempt["delivered"]:
        return None, attempt
    now = clock()
    enabled = await store.webhooks.enable(
        hook.public_id,
        now=now,
        make_event=lambda h, change, owner: health_event(h, change, owner, now),
    )
    channel.forget()
    # None: enabled meanwhile by another request (or deleted): shown as it is now.
    return enabled or await store.webhooks.get(hook.public_id) or hook, attempt


class WebhookDisabledError(InvalidWebhookError):
    """A replay of a disabled subscription: it would queue deliveries never sent."""

    status = 409


def replay_request(raw: bytes, now: float, headers: dict[str, str]) -> tuple[float, float, bool]:
    """A replay's since, until (default: now) and all; InvalidWebhookError saying why not."""
    try:
        body = json.loads(raw or b"null")
    except ValueError:
        body = None
    if not isinstance(body, dict) or not set(body) <= {"since", "until", "all"}:
        raise InvalidWebhookError(
            'body must be a JSON object {"since": "2026-11-28T10:00:00Z", "until": ...,'
            ' "all": false}',
            headers=headers,
        )
    times = []
    for name in ("since", "until"):
        value = body.get(name)
        if value is None and name == "until":
            times.append(now)
            continue
        times.append(_instant(name, value, headers))
    all_ = body.get("all", False)
    if not isinstance(all_, bool):
        raise InvalidWebhookError("all must be true or false", headers=headers)
    # A range before 1970 or past 9999 holds no event: it is cut to what one can hold (an
    # empty range is a job done at its first step, nothing queued).
    return max(0.0, times[0]), min(LAST, times[1]), all_


def _instant(name: str, value: Any, headers: dict[str, str]) -> float:
    """An ISO 8601 date and time with its zone as epoch seconds."""
    at = None
    if isinstance(value, str) and len(value) < 64:
        # RFC 3339's forms: a lower-case t or z, a leap second (read as :59).
        text = re.sub(r"(T\d\d:\d\d):60", r"\1:59", value.upper())
        with contextlib.suppress(ValueError):
            at = datetime.fromisoformat(text)
    if at is None or at.tzinfo is None:
        raise InvalidWebhookError(
            f"{name} must be an ISO 8601 date and time with its zone, such as 2026-11-28T10:00:00Z",
            headers=headers,
        )
    return at.timestamp()


def shown_job(job: ReplayJob) -> dict[str, Any]:
    """A replay job as the API shows it: its range and progress."""
    return {
        "id": str(job.id),
        "state": job.state,
        "since": iso_epoch(job.since),
        "until": iso_epoch(job.until),
        "all": job.all,
        "queued": job.queued,
        "replaced": job.replaced,
        "skipped": job.skipped,
        "createdAt": iso_epoch(job.created_at),
        "finishedAt": None if job.finished_at is None else iso_epoch(job.finished_at),
    }


class WebhookActions:
    """The handlers, over the subscriptions API's parts: find (the subscription a path
    names, if the request's key may manage it), describe (as the API shows one)."""

    def __init__(
        self,
        store: Store,
        channel: WebhookChannel,
        *,
        find: Find,
        describe: Callable[[Webhook], dict[str, Any]],
        clock: Callable[[], float],
        wake_worker: Callable[[], None],
        wake_replays: Callable[[], None] = lambda: None,
    ) -> None:
        self.wake_replays = wake_replays
        self.store = store
        self.channel = channel
        self.find = find
        self.describe = describe
        self.clock = clock
        self.wake_worker = wake_worker

    def routes(self, base: str) -> list[Route]:
        return [
            Route(base + "/{id}/test", self.test, methods=["POST"]),
            Route(base + "/{id}/enable", self.enable, methods=["POST"]),
            Route(base + "/{id}/replay", self.replay, methods=["POST"]),
            Route(base + "/{id}/replays/{job}", self.replay_status, methods=["GET"]),
        ]

    async def replay(self, request: Request) -> Response:
        hook, headers = await self.find(request)
        since, until, all_ = replay_request(await read_body(request), self.clock(), headers)
        if hook.status != "active":
            raise WebhookDisabledError(
                f"webhook {hook.public_id} is disabled; enable it first"
                f" (POST /v1/webhooks/{hook.public_id}/enable)",
                headers=headers,
            )
        job = await self.store.webhooks.start_replay(
            hook.id, since=since, until=until, all=all_, now=self.clock()
        )
        self.wake_replays()
        location = f"/v1/webhooks/{hook.public_id}/replays/{job.id}"
        return JSONResponse(
            shown_job(job), status_code=202, headers={**headers, "Location": location}
        )

    async def replay_status(self, request: Request) -> Response:
        hook, headers = await self.find(request)
        wanted = request.path_params["job"]
        job = None
        if wanted.isascii() and wanted.isdigit() and len(wanted) <= 18:
            job = await self.store.webhooks.replay_job(hook.id, int(wanted))
        if job is None:
            raise WebhookNotFoundError(
                f"webhook {hook.public_id} has no replay {wanted[:40]!r}", headers=headers
            )
        return JSONResponse(shown_job(job), headers=headers)

    async def test(self, request: Request) -> Response:
        hook, headers = await self.find(request)
        attempt = await test_delivery(self.channel, hook, self.clock())
        return JSONResponse(attempt, headers=headers)

    async def enable(self, request: Request) -> Response:
        hook, headers = await self.find(request)
        if hook.status != "disabled":  # nothing to do: enabling is idempotent
            return JSONResponse({"webhook": self.describe(hook), "attempt": None}, headers=headers)
        shown, attempt = await enable_tested(self.store, self.channel, hook, self.clock)
        if shown is None:
            raise WebhookTestFailedError(
                f"webhook {hook.public_id} stays disabled: its test delivery failed"
                f" ({attempt['error'] or 'no answer'})",
                attempt,
                headers=headers,
            )
        self.wake_worker()
        return JSONResponse({"webhook": self.describe(shown), "attempt": attempt}, headers=headers)
