"""The alerts pages: the open alerts (/admin/alerts), one alert with who was paged and what
was done to it (/admin/alerts/ID), its ack, resolve and snooze buttons, and the noise report
(/admin/report) with its bar chart."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from receiver.admin._common import Admin, log
from receiver.admin.auth import Session
from receiver.api.alerts import escalation
from receiver.backtest import report as noise
from receiver.dispatch import actions
from receiver.durations import MAX_SPAN, parse_duration
from receiver.store.records import OutboxQuery

REPORT_FLAPPING = 3  # the Report lists alerts opened more times than this


def report_chart(bars: list[noise.Bar]) -> dict[str, Any]:
    """An inline SVG bar chart's geometry: one bar a day, scaled into 600 x 160."""
    width, height, pad, label = 600, 160, 4, 18
    step = (width - 2 * pad) / max(1, len(bars))
    return {
        "width": width,
        "height": height,
        "bars": [
            {
                "x": round(pad + i * step + step * 0.1, 1),
                "width": round(step * 0.8, 1),
                "y": round(height - label - bar.share * (height - label - pad), 1),
                "height": round(bar.share * (height - label - pad), 1),
                "mid": round(pad + i * step + step / 2, 1),
                "bar": bar,
            }
            for i, bar in enumerate(bars)
        ],
        "baseline": height - label,
    }


async def report(admin: Admin, request: Request, session: Session) -> Response:
    """The noise report (receiver.backtest.report), as `receiver report` prints it."""
    since = request.query_params.get("since") or "7d"
    error = None
    try:
        back = parse_duration(since, limit=MAX_SPAN)
    except ValueError as exc:
        error = f"{exc}; showing the last 7 days"
        since, back = "7d", parse_duration("7d")
    now = admin.clock()
    found = await admin.store.history.noise(now - back, now, flapping=REPORT_FLAPPING)
    return await admin.view(
        request,
        session,
        "report.html",
        {"found": found, "since": since, "flapping": REPORT_FLAPPING, "error": error,
         "rules": noise.lines(found, 0), "notifiers": noise.lines(found, 1),
         "chart": report_chart(noise.days(found)), "seconds": noise.seconds,
         "target": await admin.targets()},
    )  # fmt: skip


async def listing(admin: Admin, request: Request, session: Session) -> Response:
    alerts = await admin.store.transact(lambda tx: tx.alerts.list_open())
    acks = await admin.store.alerts.acks(a.id for a in alerts)
    done = await admin.store.alerts.actions((a.id for a in alerts), limit=500)
    last = {a.alert: a for a in done}  # oldest first: the newest of each alert stays
    return await admin.view(
        request, session, "alerts.html", {"alerts": alerts, "acks": acks, "last": last}
    )


async def detail(admin: Admin, request: Request, session: Session) -> Response:
    """One alert (where a message's links.alert leads): its state, who was paged when,
    what was done to it and by whom, and its action buttons."""
    alert = await admin.store.alerts.get(request.path_params["id"])
    if alert is None or not alert.opened:
        return await admin.missing(request, session, "alert")
    acks = await admin.store.alerts.acks([alert.id])
    rows = await admin.store.outbox.page(OutboxQuery(alert=alert.id, limit=100))
    return await admin.view(
        request,
        session,
        "alert.html",
        {
            "alert": alert,
            "ack": acks.get((alert.id, alert.episode)),
            "paged": list(reversed(rows)),
            "actions": await admin.store.alerts.actions([alert.id]),
            "escalations": [escalation(c) for c in await admin.store.alerts.chains(alert.id)],
            "flapping": [f for f in await admin.store.alerts.flaps(alert.id) if f.since],
            "target": await admin.targets(),
        },
    )


_CONFIRM = {
    "ack": (
        "Acknowledge {}?",
        "Its repeats and escalation stop, and it shows you acknowledged it, until it resolves.",
    ),
    "resolve": ("Resolve {}?", "It closes now; everyone it notified gets the resolved message."),
    "snooze": (
        "Snooze {} for 1 hour?",
        "Its repeats and escalation wait an hour; if it is still open then, they go on.",
    ),
}


async def act(admin: Admin, request: Request, session: Session) -> Response:
    """Ack, resolve or snooze (1 hour) an alert: a confirmation, then the action
    (receiver.dispatch.actions, recorded with source admin and the key's name)."""
    alert_id = request.path_params["id"]
    action = request.url.path.rsplit("/", 1)[1]
    if request.method != "POST":
        title, detail_text = _CONFIRM[action]
        return await admin.confirm(
            request, session, title.format(alert_id), detail_text, request.url.path
        )
    outcome = await actions.perform(
        admin.store,
        admin.rules(),
        alert_id,
        action,
        source="admin",
        by=session.key_name,
        now=admin.clock(),
        links=admin.router.link_source,
    )
    if outcome.result == "missing":
        return await admin.missing(request, session, "alert")
    if outcome.result == "already":
        return await admin.message(request, session, "Nothing to do", outcome.message)
    log.info("admin %s: %s %s", session.key_name, action, alert_id)
    admin.wake()  # a resolve's messages, an ack's or snooze's updates
    return admin.back("/admin/alerts")
