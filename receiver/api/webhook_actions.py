"""POST /v1/webhooks/:id/test and /enable: a subscription brought back on purpose.

test sends a signed webhook.test delivery now, outside the outbox (no row, no retry, not
counted towards health), and answers with the attempt; enable re-enables a disabled
subscription only if such a test delivery succeeds (else 409 webhook_test_failed with the
attempt), its owner told with webhook.recovered like any recovery.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from receiver.errors import WebhookTestFailedError
from receiver.events import iso_epoch
from receiver.notify.health import health_event
from receiver.notify.webhook import WebhookChannel
from receiver.store import OutboxRow, Store
from receiver.store.records import WEBHOOK_CHANNEL, WEBHOOK_NOTIFIER, Webhook

Find = Callable[[Request], Awaitable[tuple[Webhook, dict[str, str]]]]

TEST_EVENT = "webhook.test"


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
    out = await channel.post(hook, row)
    return {
        "eventId": event_id,
        "delivered": out.delivered,
        "status": out.status,
        "durationMs": round((time.perf_counter() - started) * 1000),
        "excerpt": out.excerpt or None,
        "error": out.error,
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
    ) -> None:
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
        ]

    async def test(self, request: Request) -> Response:
        hook, headers = await self.find(request)
        attempt = await test_delivery(self.channel, hook, self.clock())
        return JSONResponse(attempt, headers=headers)

    async def enable(self, request: Request) -> Response:
        hook, headers = await self.find(request)
        if hook.status != "disabled":  # nothing to do: enabling is idempotent
            return JSONResponse({"webhook": self.describe(hook), "attempt": None}, headers=headers)
        attempt = await test_delivery(self.channel, hook, self.clock())
        if not attempt["delivered"]:
            raise WebhookTestFailedError(
                f"webhook {hook.public_id} stays disabled: its test delivery failed"
                f" ({attempt['error'] or 'no answer'})",
                attempt,
                headers=headers,
            )
        now = self.clock()
        enabled = await self.store.webhooks.enable(
            hook.public_id,
            now=now,
            make_event=lambda h, change, owner: health_event(h, change, owner, now),
        )
        self.channel.forget()
        self.wake_worker()
        # None: enabled meanwhile by another request (or deleted): show it as it is now.
        shown = enabled or await self.store.webhooks.get(hook.public_id) or hook
        return JSONResponse({"webhook": self.describe(shown), "attempt": attempt}, headers=headers)
