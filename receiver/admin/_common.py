"""What every admin page shares: the receiver's parts they read, rendering with the header
strip, the sign-in and CSRF check in front of each page, the small answer pages (confirm,
message, missing) and the parsing of ids and times from URLs."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import jinja2
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from receiver import __version__
from receiver.admin.auth import COOKIE, AdminAuth, Session, csrf_ok
from receiver.admin.jobs import Jobs
from receiver.api.webhooks import delivery
from receiver.durations import format_duration
from receiver.events import date_or_why, iso_epoch
from receiver.logs import LogLimiter
from receiver.notify.redaction import shown_url, url_secrets
from receiver.notify.webhook import WebhookChannel
from receiver.store import Store
from receiver.store.records import WEBHOOK_NOTIFIER, OutboxRow, Webhook
from receiver.supervisor import IDLE, Health

if TYPE_CHECKING:
    from receiver.dispatch.router import Router
    from receiver.reloader import RulesHolder

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
# The events table has no index by session or user (it would slow ingest): filtering on
# them looks at this much of the newest history, unless "since" says otherwise.
FILTER_WINDOW = 86400.0


def _when(ts: float | str | None) -> str:
    """A time as every page shows it, "2026-11-23 10:02:00" in UTC: epoch seconds as the
    store keeps them, or ISO 8601 text as events and the API carry it, so that one page
    never shows two forms. One no date can show (a row written by hand, or by an older
    version without the duration cap) says so instead of failing the page; text that is
    no time is shown as it is."""
    if isinstance(ts, str):
        try:
            moment = datetime.fromisoformat(ts.strip().replace("Z", "+00:00"))
        except ValueError:
            return ts or "-"
        ts = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    if not ts:
        return "-"
    return date_or_why(ts, lambda t: iso_epoch(t)[:19].replace("T", " "))


LAST_DATE = 253402300799.0  # 9999-12-31T23:59:59Z, the last second a date can show


def showable(ts: float) -> float:
    """ts, or the nearest time a date can show (a row written by hand, or before a cap)."""
    return ts if 0 <= ts <= LAST_DATE else (LAST_DATE if not ts < 0 else 0.0)


def as_get(request: Request) -> Request:
    """request, a HEAD turned into the GET it asks about (Starlette answers HEAD on every
    GET route): a handler that shows on GET and acts on anything else must not act on it.
    The server still sees HEAD in its own scope and sends no body."""
    if request.method != "HEAD":
        return request
    return Request({**request.scope, "method": "GET"}, request.receive)


def row_id(text: str | None) -> int | None:
    """A row id from the URL: 1 to 18 ASCII digits (what a store's integer holds), else
    None; "²" passes str.isdigit but not int(), and 10**30 passes int() but no store."""
    return int(text) if text and re.fullmatch(r"[0-9]{1,18}", text) else None


class Targets:
    """What a page shows for a row's (notifier, target): the notifier's label, "oncall[0]";
    for a subscriber delivery, its subscriber's id and URL without secrets
    (redaction.shown_url), never "@subscriber[3]" (an index the page knows nothing of)."""

    def __init__(self, hooks: Iterable[Webhook]) -> None:
        self._hooks = {hook.id: hook for hook in hooks}

    def __call__(self, notifier: str, target: int) -> str:
        if notifier != WEBHOOK_NOTIFIER:
            return f"{notifier}[{target}]"
        hook = self._hooks.get(target)
        if hook is None:
            return "a deleted subscriber"
        return f"{hook.public_id} {shown_url(hook.url, url_secrets(hook.url))}"


def shown_delivery(row: OutboxRow) -> dict[str, Any]:
    """A subscriber delivery as the API shows it, its times made showable first."""
    shown = replace(row, created_at=showable(row.created_at), next_at=showable(row.next_at))
    return delivery(shown)


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


Handler = Callable[["Admin", Request, Session], Awaitable[Response]]


class Admin:
    """The admin site's state, handed to every page handler: the receiver's parts the pages
    read and change, the sign-in, the header strip, the bulk jobs and the templates.

    A page handler is `async def page(admin, request, session) -> Response`; `page(handler)`
    puts it behind the sign-in and, for a POST, the CSRF check."""

    def __init__(
        self,
        store: Store,
        *,
        rules: RulesHolder,
        router: Router,  # for its lag
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
        self.sign_in_log = LogLimiter(log)
        self.strip = Strip()
        self.jobs = Jobs()
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.env.filters["when"] = _when
        self.env.filters["duration"] = format_duration
        # Every |urlencode in the templates is one path segment or one query value: a "/"
        # (which Jinja's own leaves as it is) must be escaped too, or an id holding one
        # links to another route.
        self.env.filters["urlencode"] = lambda v: quote(str(v), safe="")
        self.env.filters["pretty"] = lambda v: json.dumps(v, indent=2, ensure_ascii=False)
        self.env.globals["version"] = __version__

    async def sample(self, health: Health = IDLE) -> None:
        """Sample the accepted count for the header strip's rate, every 5 s."""
        while True:
            self.strip.add(self.accepted())
            health.ok()
            await asyncio.sleep(5)

    # -- in front of every page -------------------------------------------------------------

    def page(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """handler behind sign-in (else a redirect to it) and, for a POST, the CSRF check.
        A HEAD is handed on as the GET it stands for (its body is dropped by the server):
        handlers act only on a POST, and a link checker's HEAD must see the confirmation."""

        async def endpoint(request: Request) -> Response:
            request = as_get(request)
            if request.method not in ("GET", "POST"):  # the route table allows no other
                raise HTTPException(405, headers={"Allow": "GET, HEAD, POST"})
            session = await self.auth.session(request.cookies.get(COOKIE))
            if session is None:
                target = "/admin/login?" + urlencode({"next": request.url.path})
                return self.secure(RedirectResponse(target, status_code=303))
            if request.method == "POST":
                form = await request.form()
                if not csrf_ok(session, form.get("csrf")):
                    return self.secure(
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
            return self.secure(await handler(self, request, session))

        return endpoint

    def open_page(
        self, handler: Callable[[Admin, Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """handler with no sign-in in front of it (the sign-in form itself)."""

        async def endpoint(request: Request) -> Response:
            return self.secure(await handler(self, request))

        return endpoint

    def secure(self, response: Response) -> Response:
        for name, value in SECURITY_HEADERS.items():
            response.headers[name] = value
        return response

    # -- rendering --------------------------------------------------------------------------

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
        counts = await self.store.outbox.counts()
        request.state.strip = {
            "rate": self.strip.rate(),
            "lag": getattr(self.router, "lag", 0.0),
            "pending": counts["pending"],
            "dead": counts["dead"],
            "size": await self.store.stats.size(),
        }

    async def targets(self) -> Targets:
        """The pages' names of notification targets (Targets), subscribers read now."""
        return Targets(await self.store.webhooks.all())

    async def view(
        self, request: Request, session: Session, template: str, context: Mapping[str, Any]
    ) -> HTMLResponse:
        """template rendered with the header strip: a page's usual answer."""
        await self._strip(request)
        return self.render(request, session, template, context)

    async def confirm(
        self,
        request: Request,
        session: Session,
        title: str,
        detail: str,
        action: str,
        **extra: Any,
    ) -> HTMLResponse:
        """The page asking to confirm an action: a form posting to action."""
        return await self.view(
            request,
            session,
            "confirm.html",
            {"title": title, "detail": detail, "action": action, **extra},
        )

    async def message(
        self, request: Request, session: Session, title: str, message: str
    ) -> HTMLResponse:
        """A 409: what was asked cannot be done, and why."""
        await self._strip(request)
        return self.render(
            request, session, "message.html", {"title": title, "message": message}, status=409
        )

    async def missing(self, request: Request, session: Session, what: str) -> HTMLResponse:
        """A 404 naming what has no such id."""
        await self._strip(request)
        return self.render(
            request,
            session,
            "message.html",
            {"title": f"No such {what}", "message": f"There is no {what} with that id."},
            status=404,
        )

    def back(self, path: str, **params: Any) -> RedirectResponse:
        """The redirect after an action: to path, with params (those not None) as its query."""
        query = urlencode({k: v for k, v in params.items() if v is not None})
        return RedirectResponse(path + (f"?{query}" if query else ""), status_code=303)

    def wake(self) -> None:
        """Send what was queued again now, not at the worker's next idle look (up to 5 s)."""
        self.wake_worker()
