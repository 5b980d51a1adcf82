"""The sessions pages (/admin/sessions): the list with its filters, and one session with
its score history as an inline SVG chart."""

from __future__ import annotations

import contextlib
import json
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from receiver.admin._common import FILTER_WINDOW, PAGE, Admin
from receiver.admin.auth import Session
from receiver.store.records import EventQuery, SessionQuery


def chart(history: list[tuple[float, str]], threshold: float | None) -> dict[str, Any]:
    """An inline SVG line chart's geometry: points scaled into 600 x 160, the threshold's y."""
    width, height, pad = 600, 160, 10
    scores = [s for s, _ in history]
    low = min([*scores, threshold if threshold is not None else scores[0]] if scores else [0])
    high = max([*scores, threshold if threshold is not None else scores[0]] if scores else [100])
    span = (high - low) or 1

    def y(v: float) -> float:
        return round(height - pad - (v - low) / span * (height - 2 * pad), 1)

    n = len(history)
    points = [
        (round(pad + (i / max(1, n - 1)) * (width - 2 * pad), 1), y(s), s, ts)
        for i, (s, ts) in enumerate(history)
    ]
    return {
        "width": width,
        "height": height,
        "points": points,
        "path": " ".join(f"{x},{yy}" for x, yy, _, _ in points),
        "threshold_y": y(threshold) if threshold is not None else None,
        "threshold": threshold,
        "low": low,
        "high": high,
    }


async def listing(admin: Admin, request: Request, session: Session) -> Response:
    p = request.query_params
    status = p.get("status") or None
    query = SessionQuery(
        limit=PAGE,
        user_id=p.get("user") or None,
        status=status if status in ("active", "dropped", "stopped") else None,
        cursor=p.get("cursor") or None,
    )
    try:
        page = await admin.store.sessions.page(query)
    except KeyError:
        return await admin.message(request, session, "No such page", "Unknown cursor.")
    next_page = urlencode({**p, "cursor": page.cursor}) if page.cursor else None
    return await admin.view(
        request,
        session,
        "sessions.html",
        {"page": page, "user": query.user_id or "", "status": query.status or "",
         "next": next_page},
    )  # fmt: skip


async def detail(admin: Admin, request: Request, session: Session) -> Response:
    session_id = request.path_params["id"]
    found = await admin.store.sessions.get(session_id)
    if found is None:
        return await admin.missing(request, session, "session")
    history = await admin.store.sessions.score_history(session_id) or []
    recent = await admin.store.events.page(
        EventQuery(limit=PAGE, session_id=session_id, since=admin.clock() - FILTER_WINDOW)
    )
    threshold = None
    for row in recent:
        event = await admin.store.events.get(row.id)
        if event is not None:
            with contextlib.suppress(ValueError, TypeError):
                value = json.loads(event[1]).get("threshold")
                if isinstance(value, int | float) and not isinstance(value, bool):
                    threshold = float(value)
                    break
    return await admin.view(
        request,
        session,
        "session.html",
        {"s": found, "chart": chart(history, threshold), "events": recent},
    )
