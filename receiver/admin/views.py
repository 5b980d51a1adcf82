"""The admin page (/admin): server-rendered HTML for on-call staff. No script at all: every
action is a form, and every action that changes something asks for confirmation on a page
of its own first. Filters and page positions live in the URL, so a link can be pasted."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from receiver import __version__, events
from receiver import report as noise
from receiver.admin.auth import COOKIE, MAX_AGE, SIGN_IN_LIMIT, AdminAuth, Session, csrf_ok
from receiver.api.auth import PREFIX, hash_key, new_key
from receiver.api.webhooks import delivery, describe, register
from receiver.durations import MAX_SPAN, parse_duration
from receiver.errors import InvalidWebhookError, ReceiverError
from receiver.events import EVENT_TYPES, date_or_why, iso_epoch
from receiver.logs import LogLimiter
from receiver.notify.webhook import WebhookChannel
from receiver.rules.match import parse_matchers
from receiver.store import Store
from receiver.store.base import Tx
from receiver.store.records import (
    OUTBOX_STATES,
    PLANS,
    ROLES,
    WEBHOOK_NOTIFIER,
    EventQuery,
    OutboxQuery,
    OutboxRow,
    SessionQuery,
    Webhook,
)
from receiver.supervisor import IDLE, Health

log = logging.getLogger("receiver.admin")
HERE = Path(__file__).parent
PAGE = 50
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self';"
        " frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
BULK_BATCH = 200
# The events table has no index by session or user (it would slow ingest): filtering on
# them looks at this much of the newest history, unless "since" says otherwise.
FILTER_WINDOW = 86400.0
REPORT_FLAPPING = 3  # the Report lists alerts opened more times than this


def _when(ts: float | None) -> str:
    """A stored time as the pages show it; one no date can show (a row written by hand, or
    by an older version without the duration cap) says so instead of failing the page."""
    if not ts:
        return "-"
    return date_or_why(ts, lambda t: iso_epoch(t)[:19].replace("T", " "))


LAST_DATE = 253402300799.0  # 9999-12-31T23:59:59Z, the last second a date can show


def _showable(ts: float) -> float:
    """ts, or the nearest time a date can show (a row written by hand, or before a cap)."""
    return ts if 0 <= ts <= LAST_DATE else (LAST_DATE if not ts < 0 else 0.0)


def _row_id(text: str | None) -> int | None:
    """A row id from the URL: 1 to 18 ASCII digits (what a store's integer holds), else
    None; "²" passes str.isdigit but not int(), and 10**30 passes int() but no store."""
    return int(text) if text and re.fullmatch(r"[0-9]{1,18}", text) else None


def _form_number(text: str) -> float | str | None:
    """A number typed in a form: None if empty; as typed if it is none (for the API's
    own check to refuse, with its message)."""
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return text


def _delivery(row: OutboxRow) -> dict[str, Any]:
    """A subscriber delivery as the API shows it, its times made showable first."""
    shown = replace(row, created_at=_showable(row.created_at), next_at=_showable(row.next_at))
    return delivery(shown)


def _epoch(text: str | None) -> float | None:
    """A time from a filter field: ISO date or date-time (UTC), else None."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


_URL = re.compile(r"\b([a-z][a-z0-9+.-]*)://[^\s'\"]+", re.I)


def redact(text: str) -> str:
    """The rules file as the page shows it: every URL cut to its scheme, since notifier
    URLs usually carry tokens (${VAR} references are kept: they name, not hold, them)."""
    return _URL.sub(lambda m: m.group(0) if "${" in m.group(0) else f"{m.group(1)}://…", text)


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


@dataclass
class Job:
    """A bulk action running in the background, with its progress."""

    id: int
    title: str
    total: int
    done: int = 0
    finished: bool = False
    error: str | None = None
    started: float = field(default_factory=time.time)


@dataclass
class Strip:
    """The header strip's receiving rate: accepted events sampled every few seconds."""

    samples: list[tuple[float, float]] = field(default_factory=list)

    def add(self, count: float) -> None:
        now = time.monotonic()
        self.samples = [(t, c) for t, c in self.samples if now - t <= 60] + [(now, count)]

    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, c0), (t1, c1) = self.samples[0], self.samples[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else None


class AdminPages:
    def __init__(
        self,
        store: Store,
        *,
        rules: Any,  # receiver.app.RulesHolder
        router: Any,  # receiver.dispatch.router.Router (its lag)
        accepted: Callable[[], float],
        webhooks: WebhookChannel,
        wake_worker: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.wake_worker = wake_worker
        self.rules = rules
        self.router = router
        self.accepted = accepted
        self.webhooks = webhooks
        self.clock = clock
        self.auth = AdminAuth(store, clock=clock)
        # Refused sign-ins are lines anyone can make us write: a few a minute per address.
        self._sign_in_log = LogLimiter(log)
        self.strip = Strip()
        self.jobs: dict[int, Job] = {}
        self._job_ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.env.filters["when"] = _when
        # Every |urlencode in the templates is one path segment or one query value: a "/"
        # (which Jinja's own leaves as it is) must be escaped too, or an id holding one
        # links to another route.
        self.env.filters["urlencode"] = lambda v: quote(str(v), safe="")
        self.env.filters["pretty"] = lambda v: json.dumps(v, indent=2, ensure_ascii=False)
        self.env.globals["version"] = __version__

    # -- plumbing ---------------------------------------------------------------------------

    def routes(self) -> list[BaseRoute]:
        page = self._page
        return [
            Route("/admin", lambda request: RedirectResponse("/admin/events", status_code=303)),
            Mount(
                "/admin",
                routes=[
                    Route("/", page(self.home)),
                    Route("/login", self.login_form, methods=["GET"]),
                    Route("/login", self.login, methods=["POST"]),
                    Route("/logout", page(self.logout), methods=["POST"]),
                    Route("/events", page(self.events)),
                    # Ids are the sender's strings and may hold a "/": {id:path}, and the
                    # longer route first.
                    Route("/events/{id:path}/replay", page(self.replay), methods=["GET", "POST"]),
                    Route("/events/{id:path}", page(self.event)),
                    Route("/sessions", page(self.sessions)),
                    Route("/sessions/{id:path}", page(self.session)),
                    Route("/notifications", page(self.notifications)),
                    Route("/notifications/{id}/retry", page(self.retry), methods=["GET", "POST"]),
                    Route("/bulk-retry", page(self.bulk_retry), methods=["GET", "POST"]),
                    Route("/jobs/{id}", page(self.job)),
                    Route("/alerts", page(self.alerts)),
                    Route("/report", page(self.report)),
                    Route("/alerts/{id:path}/ack", page(self.ack), methods=["GET", "POST"]),
                    Route("/silences", page(self.silences), methods=["GET", "POST"]),
                    Route("/silences/{id}/expire", page(self.expire), methods=["GET", "POST"]),
                    Route("/rules", page(self.rules_page), methods=["GET", "POST"]),
                    Route("/webhooks", page(self.webhooks_page), methods=["GET", "POST"]),
                    Route(
                        "/webhooks/{id}/delete", page(self.webhook_delete), methods=["GET", "POST"]
                    ),
                    Route("/keys", page(self.keys), methods=["GET", "POST"]),
                    Route("/keys/{name:path}/revoke", page(self.revoke), methods=["GET", "POST"]),
                    Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
                ],
            ),
        ]

    async def sample(self, health: Health = IDLE) -> None:
        """Sample the accepted count for the header strip's rate, every 5 s."""
        while True:
            self.strip.add(self.accepted())
            health.ok()
            await asyncio.sleep(5)

    def _page(
        self, handler: Callable[[Request, Session], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """handler behind sign-in (else a redirect to it) and, for a POST, the CSRF check."""

        async def endpoint(request: Request) -> Response:
            session = await self.auth.session(request.cookies.get(COOKIE))
            if session is None:
                target = "/admin/login?" + urlencode({"next": request.url.path})
                return self._secure(RedirectResponse(target, status_code=303))
            if request.method == "POST":
                form = await request.form()
                if not csrf_ok(session, form.get("csrf")):
                    return self._secure(
                        self.render(
                            request,
                            session,
                            "message.html",
                            {
                                "title": "Refused",
                                "message": "This form has no valid CSRF token;"
                                " reload the page and try again.",
                            },
                            status=403,
                        )
                    )
            return self._secure(await handler(request, session))

        return endpoint

    def _secure(self, response: Response) -> Response:
        for name, value in SECURITY_HEADERS.items():
            response.headers[name] = value
        return response

    def render(
        self,
        request: Request,
        session: Session | None,
        template: str,
        context: Mapping[str, Any],
        *,
        status: int = 200,
    ) -> HTMLResponse:
        html = self.env.get_template(template).render(
            request=request, session=session, strip=getattr(request.state, "strip", None), **context
        )
        return HTMLResponse(html, status_code=status)

    async def _strip(self, request: Request) -> None:
        counts = await self.store.outbox_counts()
        request.state.strip = {
            "rate": self.strip.rate(),
            "lag": getattr(self.router, "lag", 0.0),
            "pending": counts["pending"],
            "dead": counts["dead"],
            "size": await self.store.size(),
        }

    async def _view(
        self, request: Request, session: Session, template: str, context: Mapping[str, Any]
    ) -> HTMLResponse:
        await self._strip(request)
        return self.render(request, session, template, context)

    def _wake_worker(self) -> None:
        """Send what was queued again now, not at the worker's next idle look (up to 5 s)."""
        self.wake_worker()

    def _back(self, path: str, **params: Any) -> RedirectResponse:
        query = urlencode({k: v for k, v in params.items() if v is not None})
        return RedirectResponse(path + (f"?{query}" if query else ""), status_code=303)

    # -- sign-in ----------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        return self._secure(self.render(request, None, "login.html", {"error": None}))

    async def login(self, request: Request) -> Response:
        form = await request.form()
        # The peer's address (uvicorn puts a trusted proxy's X-Forwarded-For there).
        address = request.client.host if request.client else "-"
        wait = await self.auth.attempt(address)
        if wait:
            self._sign_in_log.warning(
                "admin sign-in rate limits",
                address,
                "admin sign-in from %s refused: rate_limited (over %d attempts a minute)",
                address,
                SIGN_IN_LIMIT,
                extra={"code": "rate_limited", "client": address},
            )
            why = (
                f"rate_limited: more than {SIGN_IN_LIMIT} sign-in attempts a minute from"
                f" {address}; try again in {wait} s"
            )
            refused = self.render(request, None, "login.html", {"error": why}, status=429)
            refused.headers["Retry-After"] = str(wait)
            return self._secure(refused)
        cookie, why = await self.auth.sign_in(str(form.get("key", "")))
        if cookie is None:
            self._sign_in_log.warning(
                "admin sign-in refusals",
                address,
                "admin sign-in from %s refused: %s",
                address,
                why,
                extra={"code": "unauthorized", "client": address},
            )
            return self._secure(
                self.render(request, None, "login.html", {"error": why}, status=401)
            )
        target = str(request.query_params.get("next", "/admin/events"))
        if not target.startswith("/admin") or target.startswith("//"):
            target = "/admin/events"
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE,
            cookie,
            max_age=MAX_AGE,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/admin",
        )
        return self._secure(response)

    async def logout(self, request: Request, session: Session) -> Response:
        await self.auth.sign_out(session)
        response = RedirectResponse("/admin/login", status_code=303)
        response.delete_cookie(COOKIE, path="/admin")
        return response

    async def home(self, request: Request, session: Session) -> Response:
        return RedirectResponse("/admin/events", status_code=303)

    # -- events -----------------------------------------------------------------------------

    async def events(self, request: Request, session: Session) -> Response:
        p = request.query_params
        state = p.get("state") or "accepted"
        filters = {k: p.get(k) or None for k in ("type", "session", "user", "since", "until")}
        if state == "quarantined":
            return await self._quarantine(request, session)
        position = None
        if p.get("before_at") and p.get("before_id"):
            with contextlib.suppress(ValueError):
                position = (float(p["before_at"]), p["before_id"])
        since = _epoch(filters["since"])
        bounded = since is None and (filters["session"] or filters["user"]) is not None
        if bounded:  # no index by session or user: look at the last day unless told
            since = self.clock() - FILTER_WINDOW
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
        rows = await self.store.events_page(query)
        more = len(rows) > PAGE
        rows = rows[:PAGE]
        next_page = None
        if more:
            keep = {k: v for k, v in p.items() if k not in ("before_at", "before_id")}
            next_page = urlencode(
                {**keep, "before_at": repr(rows[-1].received_at), "before_id": rows[-1].id}
            )
        return await self._view(
            request,
            session,
            "events.html",
            {"rows": rows, "state": state, "filters": filters, "types": EVENT_TYPES,
             "next": next_page, "bounded": bounded},
        )  # fmt: skip

    async def _quarantine(self, request: Request, session: Session) -> Response:
        p = request.query_params
        before = p.get("before")
        rows = await self.store.quarantined(before=_row_id(before), limit=PAGE + 1)
        more = len(rows) > PAGE
        rows = rows[:PAGE]
        next_page = urlencode({**p, "before": str(rows[-1].id)}) if more else None
        return await self._view(
            request, session, "quarantine.html", {"rows": rows, "next": next_page}
        )

    async def event(self, request: Request, session: Session) -> Response:
        found = await self.store.event(request.path_params["id"])
        if found is None:
            return await self._missing(request, session, "event")
        row, body = found
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        explanation = (
            self.rules.current.explain(payload).format() if isinstance(payload, dict) else ""
        )
        rows = await self.store.outbox_page(OutboxQuery(limit=200, event_id=row.id))
        notifications = [r for r in rows if r.notifier != WEBHOOK_NOTIFIER]
        deliveries = [_delivery(r) for r in rows if r.notifier == WEBHOOK_NOTIFIER]
        return await self._view(
            request,
            session,
            "event.html",
            {"row": row, "body": body, "payload": payload, "explanation": explanation,
             "notifications": notifications, "deliveries": deliveries},
        )  # fmt: skip

    async def replay(self, request: Request, session: Session) -> Response:
        event_id = request.path_params["id"]
        if request.method == "GET":
            return await self._confirm(
                request,
                session,
                f"Replay event {event_id}?",
                "It goes through the current rules again and what they give it is sent,"
                " marked [replay], whatever the alert lifecycle says.",
                request.url.path,
            )
        try:
            replay_id = await self.store.replay(event_id, now=self.clock())
        except ReceiverError as exc:
            return await self._message(request, session, "Not replayed", str(exc))
        if replay_id is None:
            return await self._missing(request, session, "event")
        log.info("admin %s replayed event %s (replay #%d)", session.key_name, event_id, replay_id)
        return self._back(f"/admin/events/{quote(event_id, safe='')}", replayed=replay_id)

    # -- sessions ---------------------------------------------------------------------------

    async def sessions(self, request: Request, session: Session) -> Response:
        p = request.query_params
        status = p.get("status") or None
        query = SessionQuery(
            limit=PAGE,
            user_id=p.get("user") or None,
            status=status if status in ("active", "dropped", "stopped") else None,
            cursor=p.get("cursor") or None,
        )
        try:
            page = await self.store.list_sessions(query)
        except KeyError:
            return await self._message(request, session, "No such page", "Unknown cursor.")
        next_page = urlencode({**p, "cursor": page.cursor}) if page.cursor else None
        return await self._view(
            request,
            session,
            "sessions.html",
            {"page": page, "user": query.user_id or "", "status": query.status or "",
             "next": next_page},
        )  # fmt: skip

    async def session(self, request: Request, session: Session) -> Response:
        session_id = request.path_params["id"]
        found = await self.store.session(session_id)
        if found is None:
            return await self._missing(request, session, "session")
        history = await self.store.score_history(session_id) or []
        recent = await self.store.events_page(
            EventQuery(limit=PAGE, session_id=session_id, since=self.clock() - FILTER_WINDOW)
        )
        threshold = None
        for row in recent:
            event = await self.store.event(row.id)
            if event is not None:
                with contextlib.suppress(ValueError, TypeError):
                    value = json.loads(event[1]).get("threshold")
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        threshold = float(value)
                        break
        return await self._view(
            request,
            session,
            "session.html",
            {"s": found, "chart": chart(history, threshold), "events": recent},
        )

    # -- notifications ----------------------------------------------------------------------

    async def notifications(self, request: Request, session: Session) -> Response:
        p = request.query_params
        state = p.get("state") or None
        notifier = p.get("notifier") or None
        before = p.get("before")
        rows = await self.store.outbox_page(
            OutboxQuery(
                limit=PAGE + 1,
                state=state if state in OUTBOX_STATES else None,
                notifier=notifier,
                before=_row_id(before),
            )
        )
        more = len(rows) > PAGE
        rows = rows[:PAGE]
        next_page = urlencode({**p, "before": str(rows[-1].id)}) if more else None
        notifiers = sorted({*self.rules.current.notifiers, WEBHOOK_NOTIFIER})
        return await self._view(
            request,
            session,
            "notifications.html",
            {"rows": rows, "state": state or "", "notifier": notifier or "",
             "states": OUTBOX_STATES, "notifiers": notifiers, "next": next_page},
        )  # fmt: skip

    async def retry(self, request: Request, session: Session) -> Response:
        row_id = request.path_params["id"]
        if _row_id(row_id) is None:
            return await self._missing(request, session, "notification")
        if request.method == "GET":
            return await self._confirm(
                request,
                session,
                f"Retry notification #{row_id}?",
                "It is queued again now, with its attempts counted afresh.",
                request.url.path,
            )
        done = await self.store.retry_dead(int(row_id), now=self.clock())
        if not done:
            return await self._message(
                request, session, "Not retried", f"Notification #{row_id} is not dead."
            )
        log.info("admin %s retried notification %s", session.key_name, row_id)
        self._wake_worker()
        return self._back("/admin/notifications", retried=row_id)

    async def bulk_retry(self, request: Request, session: Session) -> Response:
        notifier = request.query_params.get("notifier") or None
        count = await self.store.count_dead(notifier)
        target = f" to `{notifier}`" if notifier else ""
        title = f"Retry all {count:,} dead notifications{target}?"
        if request.method == "GET":
            return await self._confirm(
                request,
                session,
                title,
                "They are queued again in the background, a batch at a time; a page shows"
                " the progress.",
                str(request.url.path) + (f"?{request.url.query}" if request.url.query else ""),
                count=count,
            )
        job = Job(next(self._job_ids), title.rstrip("?"), count)
        self.jobs[job.id] = job
        task = asyncio.create_task(self._run_bulk(job, notifier))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        log.info("admin %s started: %s", session.key_name, job.title)
        return RedirectResponse(f"/admin/jobs/{job.id}", status_code=303)

    async def _run_bulk(self, job: Job, notifier: str | None) -> None:
        try:
            while job.done < job.total:
                n = await self.store.retry_dead_batch(
                    notifier, limit=min(BULK_BATCH, job.total - job.done), now=self.clock()
                )
                if n == 0:
                    break
                job.done += n
                self._wake_worker()
                await asyncio.sleep(0)
        except ReceiverError as exc:
            job.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - shown on the job's page, never lost
            log.exception("admin job %d (%s) failed", job.id, job.title)
            job.error = f"failed unexpectedly: {type(exc).__name__}; see the receiver's log"
        finally:
            job.finished = True

    async def job(self, request: Request, session: Session) -> Response:
        job_id = request.path_params["id"]
        job = self.jobs.get(_row_id(job_id) or 0)
        if job is None:
            return await self._missing(request, session, "job")
        return await self._view(request, session, "job.html", {"job": job})

    # -- alerts and silences ----------------------------------------------------------------

    async def report(self, request: Request, session: Session) -> Response:
        """The noise report (receiver.report), as `receiver report` prints it."""
        since = request.query_params.get("since") or "7d"
        error = None
        try:
            back = parse_duration(since, limit=MAX_SPAN)
        except ValueError as exc:
            error = f"{exc}; showing the last 7 days"
            since, back = "7d", parse_duration("7d")
        now = self.clock()
        found = await self.store.noise(now - back, now, flapping=REPORT_FLAPPING)
        return await self._view(
            request,
            session,
            "report.html",
            {"found": found, "since": since, "flapping": REPORT_FLAPPING, "error": error,
             "rules": noise.lines(found, 0), "notifiers": noise.lines(found, 1),
             "chart": report_chart(noise.days(found)), "seconds": noise.seconds},
        )  # fmt: skip

    async def alerts(self, request: Request, session: Session) -> Response:
        alerts = await self.store.transact(lambda tx: tx.open_alerts())
        acks = await self.store.acks(a.id for a in alerts)
        return await self._view(request, session, "alerts.html", {"alerts": alerts, "acks": acks})

    async def ack(self, request: Request, session: Session) -> Response:
        alert_id = request.path_params["id"]
        if request.method == "GET":
            return await self._confirm(
                request,
                session,
                f"Acknowledge {alert_id}?",
                "Its repeats stop, and it shows you acknowledged it, until it resolves.",
                request.url.path,
            )
        found = await self.store.ack_alert(alert_id, by=session.key_name, now=self.clock())
        if found is None:
            return await self._message(request, session, "Not acknowledged", "It is not open.")
        log.info("admin %s acknowledged %s", session.key_name, alert_id)
        return self._back("/admin/alerts")

    async def silences(self, request: Request, session: Session) -> Response:
        error = None
        if request.method == "POST":
            error = await self._add_silence(await request.form())
            if error is None:
                return self._back("/admin/silences")
        now = self.clock()
        found = await self.store.transact(lambda tx: tx.all_silences(200))
        return await self._view(
            request,
            session,
            "silences.html",
            {"silences": found, "now": now, "error": error},
        )

    async def _add_silence(self, form: FormData) -> str | None:
        """Create a silence from the form; why not, if it cannot be."""
        matchers, problems = parse_matchers(str(form.get("matchers", "")).splitlines())
        if problems:
            return "; ".join(problems)
        try:
            seconds = parse_duration(str(form.get("duration", "")).strip(), limit=MAX_SPAN)
        except (ValueError, ReceiverError) as exc:
            return str(exc)
        reason = str(form.get("reason", "")).strip()
        if not reason:
            return "a reason is needed: it is shown with every silenced notification"
        now = self.clock()

        def add(tx: Tx) -> int:
            return tx.add_silence(matchers, reason, now, now + seconds)

        await self.store.transact(add)
        return None

    async def expire(self, request: Request, session: Session) -> Response:
        silence_id = request.path_params["id"]
        if request.method == "GET":
            return await self._confirm(
                request,
                session,
                f"Expire silence #{silence_id} now?",
                "Matching events notify again from now on.",
                request.url.path,
            )
        if _row_id(silence_id) is not None:
            now = self.clock()
            await self.store.transact(lambda tx: tx.expire_silence(int(silence_id), now))
        return self._back("/admin/silences")

    # -- rules ------------------------------------------------------------------------------

    async def rules_page(self, request: Request, session: Session) -> Response:
        sample = json.dumps(events.sample("score.drop"), indent=2)
        explanation = error = None
        if request.method == "POST":
            sample = str((await request.form()).get("event", ""))
            try:
                payload = events.parse(sample.encode()).payload()
                explanation = self.rules.current.explain(payload).format()
            except ReceiverError as exc:
                error = str(exc)
        holder = self.rules
        try:
            text = redact(holder.path.read_text()) if not holder.builtin else None
        except OSError as exc:
            text = f"(cannot read {holder.path}: {exc})"
        return await self._view(
            request,
            session,
            "rules.html",
            {"status": holder.status(), "text": text, "sample": sample,
             "explanation": explanation, "error": error},
        )  # fmt: skip

    # -- webhooks and keys ------------------------------------------------------------------

    async def webhooks_page(self, request: Request, session: Session) -> Response:
        created = error = None
        if request.method == "POST":
            form = await request.form()
            body = {
                "url": str(form.get("url", "")).strip(),
                "events": form.getlist("events"),
                "threshold": _form_number(str(form.get("threshold") or "").strip()),
                "format": str(form.get("format") or "service"),
            }
            try:
                hook = await register(
                    self.store,
                    body,
                    allow_private=self.webhooks.allow_private,
                    allow_http=self.webhooks.allow_http,
                    now=self.clock(),
                )
                self.webhooks.forget()
                created = describe(hook, secret=True)
            except InvalidWebhookError as exc:
                error = exc.message
        hooks = [await self._hook_row(h) for h in await self.store.webhooks()]
        return await self._view(
            request,
            session,
            "webhooks.html",
            {"hooks": hooks, "created": created, "error": error, "types": EVENT_TYPES},
        )

    async def _hook_row(self, hook: Webhook) -> dict[str, Any]:
        """A subscriber as its table row shows it: what the API shows (statusReason only
        when there is one, so it is set here for every row) and its last delivery."""
        last = await self.store.webhook_deliveries(hook.id, limit=1)
        shown = describe(replace(hook, created_at=_showable(hook.created_at)))
        return {"statusReason": None, **shown, "last": _delivery(last[0]) if last else None}

    async def webhook_delete(self, request: Request, session: Session) -> Response:
        if request.method == "GET":
            return await self._confirm(
                request,
                session,
                f"Delete webhook {request.path_params['id']}?",
                "Its deliveries not sent yet are cancelled; it gets nothing more.",
                request.url.path,
            )
        await self.store.set_webhook(request.path_params["id"], now=self.clock(), status="deleted")
        self.webhooks.forget()
        return self._back("/admin/webhooks")

    async def keys(self, request: Request, session: Session) -> Response:
        created = error = None
        if request.method == "POST":
            form = await request.form()
            name = str(form.get("name", "")).strip()
            plan, role = str(form.get("plan", "")), str(form.get("role", ""))
            if not name or plan not in PLANS or role not in ROLES:
                error = "a name, a plan and a role are needed"
            else:
                key = new_key()
                try:
                    await self.store.add_key(
                        name=name, key_hash=hash_key(key), prefix=key[:PREFIX], plan=plan,
                        role=role, now=self.clock(),
                    )  # fmt: skip
                    created = {"name": name, "key": key}
                    log.info("admin %s created key %r (%s)", session.key_name, name, role)
                except KeyError:
                    error = f"a key named {name!r} exists already"
        found = await self.store.keys()
        return await self._view(
            request,
            session,
            "keys.html",
            {"keys": found, "created": created, "error": error, "plans": PLANS, "roles": ROLES},
        )

    async def revoke(self, request: Request, session: Session) -> Response:
        name = request.path_params["name"]
        if request.method == "GET":
            return await self._confirm(
                request,
                session,
                f"Revoke key {name}?",
                "Every request with it is refused from now on, on every replica; an admin"
                " signed in with it is signed out.",
                request.url.path,
            )
        if await self.store.revoke_key(name, now=self.clock()):
            log.info("admin %s revoked key %r", session.key_name, name)
        return self._back("/admin/keys")

    # -- small pages ------------------------------------------------------------------------

    async def _confirm(
        self,
        request: Request,
        session: Session,
        title: str,
        detail: str,
        action: str,
        **extra: Any,
    ) -> HTMLResponse:
        return await self._view(
            request,
            session,
            "confirm.html",
            {"title": title, "detail": detail, "action": action, **extra},
        )

    async def _message(
        self, request: Request, session: Session, title: str, message: str
    ) -> HTMLResponse:
        await self._strip(request)
        return self.render(
            request, session, "message.html", {"title": title, "message": message}, status=409
        )

    async def _missing(self, request: Request, session: Session, what: str) -> HTMLResponse:
        await self._strip(request)
        return self.render(
            request,
            session,
            "message.html",
            {"title": f"No such {what}", "message": f"There is no {what} with that id."},
            status=404,
        )
