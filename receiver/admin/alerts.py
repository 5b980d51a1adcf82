"""The alerts pages: the open alerts (/admin/alerts) and acknowledging one, and the noise
report (/admin/report) with its bar chart."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from receiver import report as noise
from receiver.admin._common import Admin, log
from receiver.admin.auth import Session
from receiver.durations import MAX_SPAN, parse_duration

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
    """The noise report (receiver.report), as `receiver report` prints it."""
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
         "chart": report_chart(noise.days(found)), "seconds": noise.seconds},
    )  # fmt: skip


async def listing(admin: Admin, request: Request, session: Session) -> Response:
    alerts = await admin.store.transact(lambda tx: tx.alerts.list_open())
    acks = await admin.store.alerts.acks(a.id for a in alerts)
    return await admin.view(request, session, "alerts.html", {"alerts": alerts, "acks": acks})


async def ack(admin: Admin, request: Request, session: Session) -> Response:
    alert_id = request.path_params["id"]
    if request.method == "GET":
        return await admin.confirm(
            request,
            session,
            f"Acknowledge {alert_id}?",
            "Its repeats stop, and it shows you acknowledged it, until it resolves.",
            request.url.path,
        )
    found = await admin.store.alerts.ack(alert_id, by=session.key_name, now=admin.clock())
    if found is None:
        return await admin.message(request, session, "Not acknowledged", "It is not open.")
    log.info("admin %s acknowledged %s", session.key_name, alert_id)
    return admin.back("/admin/alerts")
