"""The one-click action links' pages (receiver.links): GET (and HEAD) /act/<token> shows
what the link would do and changes nothing (mail scanners and chat unfurlers follow links,
link checkers send HEAD); its button POSTs to the same URL and does it
(receiver.dispatch.actions), idempotently, answering 2xx only when it did: already so, or
a link of an episode that has ended, is a 409 `action_not_applied`. The POST needs no
body (a phone's ntfy http action posts an empty one); any other method is a 405. No
sign-in: the token is the capability, so no CSRF token either; the admin's security
headers hold, and the token never reaches a log line or an error message.

A token that is not ours answers 404, an expired one 410, an unknown alert 404: each a
small page that says so, with its error code (`invalid_action_link`, `alert_not_found`);
a client that asks for JSON (Accept: application/json) gets the API's error shape.

Every attempt is counted (receiver_action_links_total{outcome}): what a POST came to
(done, already, stale; each also recorded on the alert by receiver.dispatch.actions), and
every refused token (invalid, expired), which is logged too, with the client's address,
a few lines a minute per address (as refused admin sign-ins are)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from receiver import __version__
from receiver.admin._common import HERE, SECURITY_HEADERS, as_get
from receiver.dispatch import actions
from receiver.durations import format_duration
from receiver.links import Claim, LinkExpiredError, LinkSource
from receiver.links import LinkError as BadLinkError
from receiver.logs import LogLimiter
from receiver.metrics import Metrics
from receiver.store import Store
from receiver.store.records import Alert

log = logging.getLogger("receiver.act")
# The token is in the URL: no page of ours sends it on as a referrer.
HEADERS = {**SECURITY_HEADERS, "Referrer-Policy": "no-referrer", "X-Robots-Tag": "noindex"}
_ASK = {
    "ack": (
        "Acknowledge {alert}?",
        "Its repeats and its escalation stop until it resolves.",
        "Acknowledge",
    ),
    "resolve": (
        "Resolve {alert}?",
        "It closes now; everyone it notified gets the resolved message.",
        "Resolve",
    ),
    "snooze": (
        "Snooze {alert} for 1 hour?",
        "Its repeats and escalation wait an hour; if it is still open then, they go on.",
        "Snooze 1 hour",
    ),
}
_DONE = {"ack": "Acknowledged", "resolve": "Resolved", "snooze": "Snoozed"}
NOT_APPLIED = "action_not_applied"  # a POST that changed nothing: already so, or stale


class ActPages:
    """GET and POST /act/{token}."""

    def __init__(
        self,
        store: Store,
        links: LinkSource,
        *,
        rules: Callable[[], Any],  # receiver.reloader.RulesHolder
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.links = links
        self.rules = rules
        self.counted = metrics.action_links
        self.clock = clock
        # Refused tokens are lines anyone can make us write: a few a minute per address.
        self.refused_log = LogLimiter(log)
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )

    def routes(self) -> list[Route]:
        return [Route("/act/{token}", self.act, methods=["GET", "POST"])]

    def page(
        self, title: str, message: str, *, status: int = 200, confirm: str = "", code: str = ""
    ) -> Response:
        html = self.env.get_template("act.html").render(
            title=title,
            message=message,
            confirm=confirm,
            code=code,
            session=None,
            version=__version__,
        )
        return HTMLResponse(html, status_code=status, headers=HEADERS)

    def refuse(self, request: Request, code: str, status: int, title: str, why: str) -> Response:
        """A link refused: a page that says why and names the code, or for a client that
        asks for JSON the API's error shape."""
        accept = request.headers.get("accept", "")
        if "application/json" in accept and "text/html" not in accept:
            body = {"error": {"code": code, "message": f"{title}: {why}"}}
            return JSONResponse(body, status_code=status, headers=HEADERS)
        return self.page(title, why, status=status, code=code)

    def _refused(self, request: Request, outcome: str, level: int) -> None:
        """Count a refused token, and log it with the client's address (never the token)."""
        self.counted[outcome].inc()
        # The peer's address (uvicorn puts a trusted proxy's X-Forwarded-For there).
        address = request.client.host if request.client else "-"
        self.refused_log.log(
            level,
            f"{outcome} action links",
            address,
            "action link from %s refused: invalid_action_link (%s)",
            address,
            outcome,
            extra={"code": "invalid_action_link", "client": address},
        )

    async def act(self, request: Request) -> Response:
        request = as_get(request)  # a HEAD (a link checker, a mail scanner) only looks
        links = await self.links.get()
        try:
            claim = links.read(request.path_params["token"])
        except LinkExpiredError:
            self._refused(request, "expired", logging.INFO)
            return self.refuse(
                request,
                "invalid_action_link",
                410,
                "This link has expired",
                f"Action links work for {format_duration(links.ttl)} after their message was sent."
                " Use a newer message's link, the admin page, the API or"
                " `receiver alerts`.",
            )
        except BadLinkError:  # forged, tampered with or cut short
            self._refused(request, "invalid", logging.WARNING)
            return self.refuse(
                request,
                "invalid_action_link",
                404,
                "This link is not valid",
                "It may have been cut short or changed on its way here; open it from the"
                " message again.",
            )
        alert = await self.store.alerts.get(claim.alert)
        if alert is None:
            if request.method == "POST":  # a genuine link whose alert is gone: over
                self.counted["stale"].inc()
            return self.refuse(
                request,
                "alert_not_found",
                404,
                "No such alert",
                "The alert this link names is gone.",
            )
        if request.method != "POST":
            return self._ask(claim, alert)
        outcome = await actions.perform(
            self.store,
            self.rules(),
            claim.alert,
            claim.action,
            source="link",
            by="link",
            now=self.clock(),
            episode=claim.episode,
            links=self.links,
        )
        log.info("link: %s %s: %s", claim.action, claim.alert, outcome.result)
        self.counted["stale" if outcome.result == "missing" else outcome.result].inc()
        if outcome.result == "done":
            return self.page(_DONE[claim.action], outcome.message + ".")
        # Only an applied action answers 2xx: a phone's ntfy button (an http action with
        # clear: true) dismisses its notification on a 2xx, and must not for nothing.
        if outcome.result == "missing":
            return self.refuse(
                request, "alert_not_found", 404, "No such alert", outcome.message + "."
            )
        return self.refuse(request, NOT_APPLIED, 409, "Nothing to do", outcome.message + ".")

    def _ask(self, claim: Claim, alert: Alert) -> Response:
        title, detail, button = _ASK[claim.action]
        if alert.state != "open":
            detail = f"It is {alert.state} already; pressing the button changes nothing."
        elif claim.episode is not None and claim.episode != alert.episode:
            detail = (
                "This link is for an earlier episode of it, which has ended; pressing the"
                " button changes nothing. Use the newest message's link."
            )
        return self.page(title.format(alert=claim.alert), detail, confirm=button)
