"""POST/GET /v1/webhooks, GET/DELETE /v1/webhooks/:id, POST /v1/webhooks/:id/rotate-secret,
/test and /enable (receiver.api.webhook_actions), GET /v1/webhooks/:id/deliveries,
GET /v1/webhooks/:id/deliveries/:deliveryId (with its attemptLog) and
POST /v1/webhooks/:id/deliveries/:deliveryId/retry: subscriptions only (a key with role
writer or admin). Sending is receiver.notify.webhook's.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from receiver.api import limits
from receiver.api.auth import Access
from receiver.api.sessions import limit_param
from receiver.api.webhook_actions import WebhookActions
from receiver.dispatch.fanout import as_match
from receiver.durations import format_duration, parse_duration
from receiver.errors import InvalidParameterError, InvalidWebhookError, WebhookNotFoundError
from receiver.events import EVENT_TYPES, iso_epoch
from receiver.matchers import compile_match
from receiver.notify.webhook import UnsafeURLError, WebhookChannel, check_subscriber, new_secret
from receiver.store import OutboxRow, Store
from receiver.store.records import Attempt, Webhook

FORMATS = ("service", "standard")
PER_KEY = 100  # subscriptions an API key may have: RECEIVER_WEBHOOKS_PER_KEY's default
MAX_URL = 2048
MAX_RATE = 1000.0  # RECEIVER_WEBHOOK_MAX_RATE's default: deliveries a second
# The lowest rate limit: a send waits a second at most for its slot (its lane has one send
# at a time then), well within its lease, on a replica or a few.
MIN_RATE = 1.0
MAX_OVERLAP = 7 * 86400.0  # the longest a rotated secret goes on signing beside the new one
# Outbox states as a subscriber's delivery list shows them.
DELIVERY_STATES = {"delivered": "delivered", "dead": "failed", "cancelled": "failed"}


def describe(hook: Webhook, *, secret: bool = False) -> dict[str, Any]:
    """A subscription as the API shows it; the secret only when asked (on creation and
    rotation, to whoever made the request)."""
    shown: dict[str, Any] = {
        "id": hook.public_id,
        "url": hook.url,
        "events": hook.events,
        "threshold": _number(hook.threshold),
        "format": hook.format,
        "status": hook.status,
        "createdAt": iso_epoch(hook.created_at),
        "health": hook.health,
        "failingSince": iso_epoch(hook.failing_since) if hook.failing_since is not None else None,
        "lastError": hook.last_error,
        "rateLimit": _number(hook.rate_limit),
        "filter": hook.filter,
    }
    if hook.status_reason:
        shown["statusReason"] = hook.status_reason
    if hook.previous_secret and hook.previous_until is not None:
        shown["previousSecretUntil"] = iso_epoch(hook.previous_until)
    if secret:
        shown["secret"] = hook.secret
    return shown


def delivery(row: OutboxRow) -> dict[str, Any]:
    """A delivery as the API shows it; lastStatus: its last attempt's HTTP status, whether
    that attempt failed or went through."""
    error = row.last_error
    state = DELIVERY_STATES.get(row.state, "pending")
    return {
        "id": str(row.id),
        "eventId": row.delivery_id,
        "sourceEventId": row.event_id,
        "state": state,
        "attempts": row.attempts,
        "lastStatus": row.last_status,
        "lastError": error,
        "nextAttemptAt": iso_epoch(row.next_at) if state == "pending" else None,
        "createdAt": iso_epoch(row.created_at),
    }


def attempt_log(attempts: list[Attempt]) -> list[dict[str, Any]]:
    """A row's attempts as the API shows them (excerpt only where there was an answer)."""
    shown = []
    for a in attempts:
        entry: dict[str, Any] = {
            "attempt": a.number,
            "at": iso_epoch(a.at),
            "status": a.status,
            "durationMs": a.duration_ms,
            "error": a.error,
        }
        if a.excerpt:
            entry["excerpt"] = a.excerpt
        shown.append(entry)
    return shown


# A delivery id or cursor: an outbox row id, 1 to 18 ASCII digits (within every store's
# 64-bit integer; a longer one was an OverflowError, a 500).
ROW_ID = re.compile(r"[0-9]{1,18}")


def _row_id(text: str) -> int | None:
    """text as a delivery's row id, or None if it cannot be one."""
    return int(text) if ROW_ID.fullmatch(text) else None


def _by_method(
    **handlers: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """One endpoint for a path's methods (HEAD answered as GET)."""

    async def endpoint(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        return await handlers[method](request)

    return endpoint


def _number(value: float | None) -> float | int | None:
    return int(value) if value is not None and float(value).is_integer() else value


async def validate(
    body: Any, *, allow_private: bool, allow_http: bool
) -> tuple[str, list[str], float | None, str]:
    """A registration's url, events, threshold and format; InvalidWebhookError naming the
    field that is wrong."""
    if not isinstance(body, Mapping):
        raise InvalidWebhookError("body must be a JSON object with url and events")
    url, events = body.get("url"), body.get("events")
    if not isinstance(url, str) or not url:
        raise InvalidWebhookError("url is required: the https:// address to deliver to")
    if len(url) > MAX_URL:
        raise InvalidWebhookError(f"url is longer than {MAX_URL} characters")
    try:
        await check_subscriber(url, allow_private=allow_private, allow_http=allow_http)
    except UnsafeURLError as exc:
        raise InvalidWebhookError(f"url: {exc}") from None
    if not isinstance(events, list) or not events:
        raise InvalidWebhookError(
            f"events is required: a non-empty list of {', '.join(EVENT_TYPES)}"
        )
    unknown = [e for e in events if e not in EVENT_TYPES]
    if unknown:
        raise InvalidWebhookError(
            f"events: unknown event name {str(unknown[0])[:60]!r}; choose from"
            f" {', '.join(EVENT_TYPES)}"
        )
    threshold = body.get("threshold")
    if threshold is not None and (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or not math.isfinite(threshold)
    ):
        raise InvalidWebhookError("threshold must be a number")
    form = body.get("format", "service")
    if form not in FORMATS:
        raise InvalidWebhookError(f"format must be one of {', '.join(FORMATS)}")
    return url, list(dict.fromkeys(events)), threshold, form


def rate_param(body: Mapping[str, Any], max_rate: float) -> float | None:
    """A registration's rateLimit: deliveries a second, MIN_RATE to max_rate; None: none."""
    rate = body.get("rateLimit")
    if rate is None:
        return None
    if (
        isinstance(rate, bool)
        or not isinstance(rate, int | float)
        or not MIN_RATE <= rate <= max_rate
    ):
        raise InvalidWebhookError(
            f"rateLimit must be a number of deliveries a second from {MIN_RATE:g} to"
            f" {max_rate:g} (RECEIVER_WEBHOOK_MAX_RATE)"
        )
    return float(rate)


def filter_param(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """A registration's filter: a rule's match mapping, checked by the rules' own code."""
    wanted = body.get("filter")
    if wanted is None:
        return None
    if not isinstance(wanted, Mapping):
        raise InvalidWebhookError(
            "filter must be a JSON object of payload fields to conditions, as a rule's match:"
            ' {"userId": "u1", "cohort": {"in": ["beta"]}}'
        )
    listed = [f for f, v in wanted.items() if isinstance(v, Mapping) and set(v) == {"in"}]
    problems = [f"filter.{f}: in must be a non-empty list" for f in listed if not wanted[f]["in"]]
    problems += [
        f"filter.{f}: in must be a list" for f in listed if not isinstance(wanted[f]["in"], list)
    ]
    if not problems:
        problems = compile_match(as_match(wanted))[1]
    if problems:
        shown = [p.replace("match", "filter", 1) for p in problems[:3]]
        raise InvalidWebhookError("; ".join(shown))
    return dict(wanted) or None


def overlap_param(raw: bytes, headers: dict[str, str]) -> float:
    """A rotation's overlap in seconds (0: none) from its optional body {"overlap": "24h"}."""
    if not raw.strip():
        return 0.0
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, Mapping) or not set(body) <= {"overlap"}:
        raise InvalidWebhookError(
            'body must be empty or a JSON object {"overlap": "24h"}', headers=headers
        )
    overlap = body.get("overlap", 0)
    try:
        if isinstance(overlap, str):
            return parse_duration(overlap, limit=MAX_OVERLAP)
        if isinstance(overlap, int) and not isinstance(overlap, bool):
            if 0 <= overlap <= MAX_OVERLAP:
                return float(overlap)
    except ValueError as exc:
        raise InvalidWebhookError(f"overlap: {exc}", headers=headers) from None
    raise InvalidWebhookError(
        f"overlap must be a duration such as 24h, at most {format_duration(MAX_OVERLAP)}"
        " (or whole seconds)",
        headers=headers,
    )


class WebhookLimitError(InvalidWebhookError):
    """The key already has as many subscriptions as RECEIVER_WEBHOOKS_PER_KEY allows."""

    status = 409


async def register(
    store: Store,
    body: Any,
    *,
    allow_private: bool,
    allow_http: bool,
    now: float,
    owner: int | None = None,
    cap: int | None = None,
    max_rate: float = MAX_RATE,
) -> Webhook:
    """Validate and store a subscription made by the API key owner (None: an operator, at
    the CLI or the admin page), at most cap of them a key."""
    url, events, threshold, form = await validate(
        body, allow_private=allow_private, allow_http=allow_http
    )
    rate = rate_param(body, max_rate)
    wanted = filter_param(body)
    hook = await store.webhooks.add(
        public_id="wh_" + secrets.token_urlsafe(12),
        url=url,
        events=events,
        threshold=threshold,
        format=form,
        secret=new_secret(form),
        now=now,
        owner=owner,
        cap=cap,
        rate_limit=rate,
        filter=wanted,
    )
    if hook is None:
        raise WebhookLimitError(
            f"this API key already has {cap} subscriptions, the most"
            " RECEIVER_WEBHOOKS_PER_KEY allows; delete one first"
        )
    return hook


class WebhooksAPI:
    def __init__(
        self,
        store: Store,
        access: Access,
        channel: WebhookChannel,
        *,
        wake_worker: Callable[[], None] = lambda: None,
        wake_replays: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        per_key: int = PER_KEY,
    ) -> None:
        self.wake_replays = wake_replays
        self.store = store
        self.per_key = per_key
        self.access = access
        self.channel = channel
        self.wake_worker = wake_worker
        self.clock = clock

    def routes(self) -> list[Route]:
        base = "/v1/webhooks"
        # One route a path, so a 405 names every method the path takes in its Allow (two
        # routes of one path: the first one's methods only).
        return [
            Route(base, _by_method(GET=self.list, POST=self.create), methods=["GET", "POST"]),
            Route(
                base + "/{id}",
                _by_method(GET=self.one, DELETE=self.delete),
                methods=["GET", "DELETE"],
            ),
            Route(base + "/{id}/rotate-secret", self.rotate, methods=["POST"]),
            *WebhookActions(
                self.store,
                self.channel,
                find=self._hook,
                describe=describe,
                clock=self.clock,
                wake_worker=self.wake_worker,
                wake_replays=self.wake_replays,
            ).routes(base),
            Route(base + "/{id}/deliveries", self.deliveries, methods=["GET"]),
            Route(base + "/{id}/deliveries/{delivery}", self.one_delivery, methods=["GET"]),
            Route(base + "/{id}/deliveries/{delivery}/retry", self.retry, methods=["POST"]),
        ]

    async def _hook(self, request: Request) -> tuple[Webhook, dict[str, str]]:
        """The subscription the path names, if the request's key may manage it: its own,
        or any with an admin key. Another key's is not found (its existence is not told)."""
        key, headers = await self.access.check(request, "writer")
        found = await self.store.webhooks.get(request.path_params["id"])
        if found is None or (key.role != "admin" and found.owner != key.id):
            raise WebhookNotFoundError(
                f"no webhook has the id {request.path_params['id'][:100]!r}", headers=headers
            )
        return found, headers

    async def create(self, request: Request) -> Response:
        key, headers = await self.access.check(request, "writer")
        try:
            body = json.loads(await limits.read_body(request))
        except ValueError:
            raise InvalidWebhookError('body must be JSON: {"url": ..., "events": [...]}') from None
        hook = await register(
            self.store,
            body,
            allow_private=self.channel.allow_private,
            allow_http=self.channel.allow_http,
            now=self.clock(),
            owner=key.id,
            cap=self.per_key,
            max_rate=self.channel.max_rate,
        )
        self.channel.forget()
        return JSONResponse(describe(hook, secret=True), status_code=201, headers=headers)

    async def list(self, request: Request) -> Response:
        key, headers = await self.access.check(request, "writer")
        owner = None if key.role == "admin" else key.id
        hooks = [describe(h) for h in await self.store.webhooks.all(owner=owner)]
        return JSONResponse({"webhooks": hooks}, headers=headers)

    async def one(self, request: Request) -> Response:
        hook, headers = await self._hook(request)
        return JSONResponse(describe(hook), headers=headers)

    async def delete(self, request: Request) -> Response:
        hook, headers = await self._hook(request)
        await self.store.webhooks.update(hook.public_id, now=self.clock(), status="deleted")
        self.channel.forget()
        return Response(status_code=204, headers=headers)

    async def rotate(self, request: Request) -> Response:
        hook, headers = await self._hook(request)
        overlap = overlap_param(await limits.read_body(request), headers)
        now = self.clock()
        changed = await self.store.webhooks.rotate(
            hook.public_id,
            secret=new_secret(hook.format),
            now=now,
            overlap_until=now + overlap if overlap else None,
        )
        if changed is None:  # deleted meanwhile
            raise WebhookNotFoundError(f"no webhook has the id {hook.public_id!r}", headers=headers)
        self.channel.forget()
        return JSONResponse(describe(changed, secret=True), headers=headers)

    async def deliveries(self, request: Request) -> Response:
        hook, headers = await self._hook(request)
        limit = limit_param(request.query_params)
        cursor = request.query_params.get("cursor")
        before = None
        if cursor is not None:
            before = _row_id(cursor)
            if before is None:
                raise InvalidParameterError(
                    f"cursor must be the cursor of the previous page; got {cursor[:40]!r}",
                    headers=headers,
                )
        rows = await self.store.webhooks.deliveries(hook.id, limit=limit + 1, before=before)
        page = rows[:limit]
        body = {
            "deliveries": [delivery(r) for r in page],
            "cursor": str(page[-1].id) if len(rows) > limit else None,
        }
        return JSONResponse(body, headers=headers)

    async def one_delivery(self, request: Request) -> Response:
        hook, headers = await self._hook(request)
        wanted = request.path_params["delivery"]
        row = None
        if (row_id := _row_id(wanted)) is not None:
            row = await self.store.webhooks.delivery(hook.id, row_id)
        if row is None:
            raise WebhookNotFoundError(
                f"webhook {hook.public_id} has no delivery {wanted[:40]!r}", headers=headers
            )
        log = (await self.store.outbox.attempts([row.id])).get(row.id, [])
        return JSONResponse({**delivery(row), "attemptLog": attempt_log(log)}, headers=headers)

    async def retry(self, request: Request) -> Response:
        hook, headers = await self._hook(request)
        wanted = request.path_params["delivery"]
        row = None
        if (delivery_id := _row_id(wanted)) is not None:
            row = await self.store.webhooks.retry_delivery(hook.id, delivery_id, now=self.clock())
        if row is None:
            raise WebhookNotFoundError(
                f"webhook {hook.public_id} has no delivery {wanted[:40]!r}", headers=headers
            )
        self.wake_worker()
        return JSONResponse(delivery(row), status_code=202, headers=headers)
