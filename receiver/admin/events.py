"""The events pages (/admin/events): the accepted, duplicate and quarantined lists with
their filters, one event with what the rules made of it, and its replay."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import Response

from receiver import why
from receiver.admin._common import (
    FILTER_WINDOW,
    PAGE,
    Admin,
    log,
    row_id,
    shown_delivery,
)
from receiver.admin.auth import Session
from receiver.errors import ReceiverError
from receiver.events import EVENT_TYPES
from receiver.store.records import WEBHOOK_NOTIFIER, EventQuery, OutboxQuery


def _epoch(text: str | None) -> float | None:
    """A time from a filter field: ISO date or date-time (UTC), else None."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


async def listing(admin: Admin, request: Request, session: Session) -> Response:
    p = request.query_params
    state = p.get("state") or "accepted"
    filters = {k: p.get(k) or None for k in ("type", "session", "user", "since", "until")}
    if state == "quarantined":
        return await _quarantine(admin, request, session)
    position = None
    if p.get("before_at") and p.get("before_id"):
        with contextlib.suppress(ValueError):
            position = (float(p["before_at"]), p["before_id"])
    since = _epoch(filters["since"])
    bounded = since is None and (filters["session"] or filters["user"]) is not None
    if bounded:  # no index by session or user: look at the last day unless told
        since = admin.clock() - FILTER_WINDOW
    query = EventQuery(
        limit=PAGE + 1,
        type=filters["type"],
        session_id=filters["session"],
        user_id=filters["user"],
        since=since,
        until=_epoch(filters["until"]),
        duplicated=state == "duplicates",
        before=position,
    )
    rows = await admin.store.events.page(query)
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    next_page = None
    if more:
        keep = {k: v for k, v in p.items() if k not in ("before_at", "before_id")}
        next_page = urlencode(
            {**keep, "before_at": repr(rows[-1].received_at), "before_id": rows[-1].id}
        )
    return await admin.view(
        request,
        session,
        "events.html",
        {"rows": rows, "state": state, "filters": filters, "types": EVENT_TYPES,
         "next": next_page, "bounded": bounded},
    )  # fmt: skip


async def _quarantine(admin: Admin, request: Request, session: Session) -> Response:
    p = request.query_params
    before = p.get("before")
    rows = await admin.store.events.quarantined(before=row_id(before), limit=PAGE + 1)
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    next_page = urlencode({**p, "before": str(rows[-1].id)}) if more else None
    return await admin.view(request, session, "quarantine.html", {"rows": rows, "next": next_page})


async def detail(admin: Admin, request: Request, session: Session) -> Response:
    found = await admin.store.events.get(request.path_params["id"])
    if found is None:
        return await admin.missing(request, session, "event")
    row, body = found
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    explanation = admin.rules.current.explain(payload).format() if isinstance(payload, dict) else ""
    rows = await admin.store.outbox.page(OutboxQuery(limit=200, event_id=row.id))
    notifications = [r for r in rows if r.notifier != WEBHOOK_NOTIFIER]
    target = await admin.targets()
    deliveries = [
        {"row": r.id, "to": target(r.notifier, r.target), **shown_delivery(r)}
        for r in rows
        if r.notifier == WEBHOOK_NOTIFIER
    ]
    routed = await why.explain_event(admin.store, row.id, admin.rules.current)
    return await admin.view(
        request,
        session,
        "event.html",
        {"row": row, "body": body, "payload": payload, "explanation": explanation,
         "notifications": notifications, "deliveries": deliveries, "why": routed,
         "target": target},
    )  # fmt: skip


async def replay(admin: Admin, request: Request, session: Session) -> Response:
    event_id = request.path_params["id"]
    if request.method != "POST":
        return await admin.confirm(
            request,
            session,
            f"Replay event {event_id}?",
            "It goes through the current rules again and what they give it is sent,"
            " marked [replay], whatever the alert lifecycle says.",
            request.url.path,
        )
    try:
        replay_id = await admin.store.events.replay(event_id, now=admin.clock())
    except ReceiverError as exc:
        return await admin.message(request, session, "Not replayed", str(exc))
    if replay_id is None:
        return await admin.missing(request, session, "event")
    log.info("admin %s replayed event %s (replay #%d)", session.key_name, event_id, replay_id)
    return admin.back(f"/admin/events/{quote(event_id, safe='')}", replayed=replay_id)
