"""The notifications pages (/admin/notifications): the outbox with its filters, retrying a
dead notification, and retrying all of them as a background job with a progress page."""

from __future__ import annotations

import asyncio
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from receiver.admin._common import PAGE, Admin, log, row_id
from receiver.admin.auth import Session
from receiver.admin.jobs import Job
from receiver.errors import ReceiverError
from receiver.notify import registry
from receiver.store.records import OUTBOX_STATES, WEBHOOK_NOTIFIER, OutboxQuery

BULK_BATCH = 200


async def listing(admin: Admin, request: Request, session: Session) -> Response:
    p = request.query_params
    state = p.get("state") or None
    notifier = p.get("notifier") or None
    channel = p.get("channel") or None
    channels = registry.names()
    before = p.get("before")
    rows = await admin.store.outbox.page(
        OutboxQuery(
            limit=PAGE + 1,
            state=state if state in OUTBOX_STATES else None,
            notifier=notifier,
            channel=channel if channel in channels else None,
            rule=(p.get("rule") or None),  # a storm message's link: what it held back
            before=row_id(before),
        )
    )
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    next_page = urlencode({**p, "before": str(rows[-1].id)}) if more else None
    notifiers = sorted({*admin.rules.current.notifiers, WEBHOOK_NOTIFIER})
    return await admin.view(
        request,
        session,
        "notifications.html",
        {"rows": rows, "state": state or "", "notifier": notifier or "",
         "states": OUTBOX_STATES, "notifiers": notifiers, "next": next_page,
         "channel": channel or "", "channels": channels,
         "target": await admin.targets(), "slack": slack_clicks(request)},
    )  # fmt: skip


def slack_clicks(request: Request) -> list[tuple[str, int]]:
    """The Slack app's button clicks since this process started, by outcome (those that
    happened): a button that does nothing shows here as refused or failed."""
    metrics = getattr(request.app.state, "metrics", None)
    counters = getattr(metrics, "slack_interactions", {})
    counts = [(outcome, int(counter._value.get())) for outcome, counter in counters.items()]
    return [(outcome, n) for outcome, n in counts if n]


async def detail(admin: Admin, request: Request, session: Session) -> Response:
    """One notification or subscriber delivery with its attempt log: when each send started,
    the status or error it ended with, how long it took, the start of the answer."""
    wanted = row_id(request.path_params["id"])
    # The page of rows older than wanted + 1, one long: wanted itself when it exists.
    rows = (
        []
        if wanted is None
        else await admin.store.outbox.page(OutboxQuery(limit=1, before=wanted + 1))
    )
    if not rows or rows[0].id != wanted:
        return await admin.missing(request, session, "notification")
    log_of = await admin.store.outbox.attempts([rows[0].id])
    return await admin.view(
        request,
        session,
        "notification.html",
        {
            "n": rows[0],
            "attempts": log_of.get(rows[0].id, []),
            "target": await admin.targets(),
        },
    )


async def retry(admin: Admin, request: Request, session: Session) -> Response:
    notification_id = request.path_params["id"]
    if row_id(notification_id) is None:
        return await admin.missing(request, session, "notification")
    if request.method != "POST":
        return await admin.confirm(
            request,
            session,
            f"Retry notification #{notification_id}?",
            "It is queued again now, with its attempts counted afresh.",
            request.url.path,
        )
    done = await admin.store.outbox.retry_dead(int(notification_id), now=admin.clock())
    if not done:
        return await admin.message(
            request, session, "Not retried", f"Notification #{notification_id} is not dead."
        )
    log.info("admin %s retried notification %s", session.key_name, notification_id)
    admin.wake()
    return admin.back("/admin/notifications", retried=notification_id)


async def bulk_retry(admin: Admin, request: Request, session: Session) -> Response:
    notifier = request.query_params.get("notifier") or None
    count = await admin.store.outbox.count_dead(notifier)
    target = f" to `{notifier}`" if notifier else ""
    title = f"Retry all {count:,} dead notifications{target}?"
    if request.method != "POST":
        return await admin.confirm(
            request,
            session,
            title,
            "They are queued again in the background, a batch at a time; a page shows"
            " the progress.",
            str(request.url.path) + (f"?{request.url.query}" if request.url.query else ""),
            count=count,
        )
    started = admin.jobs.start(title.rstrip("?"), count, lambda j: run_bulk(admin, j, notifier))
    log.info("admin %s started: %s", session.key_name, started.title)
    return RedirectResponse(f"/admin/jobs/{started.id}", status_code=303)


async def run_bulk(admin: Admin, job: Job, notifier: str | None) -> None:
    """Retry the dead notifications (to notifier, or all), a batch at a time, into job."""
    try:
        while job.done < job.total:
            n = await admin.store.outbox.retry_dead_batch(
                notifier, limit=min(BULK_BATCH, job.total - job.done), now=admin.clock()
            )
            if n == 0:
                break
            job.done += n
            admin.wake()
            await asyncio.sleep(0)
    except ReceiverError as exc:
        job.error = str(exc)
    except Exception as exc:  # noqa: BLE001 - shown on the job's page, never lost
        log.exception("admin job %d (%s) failed", job.id, job.title)
        job.error = f"failed unexpectedly: {type(exc).__name__}; see the receiver's log"
    finally:
        job.finished = True


async def job(admin: Admin, request: Request, session: Session) -> Response:
    found = admin.jobs.get(row_id(request.path_params["id"]) or 0)
    if found is None:
        return await admin.missing(request, session, "job")
    return await admin.view(request, session, "job.html", {"job": found})
