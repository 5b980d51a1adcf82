"""The admin page (/admin): server-rendered HTML for on-call staff. No script at all: every
action is a form, and every action that changes something asks for confirmation on a page
of its own first. Filters and page positions live in the URL, so a link can be pasted.

This module is the route table; each page group's handlers are a module of their own
(events, sessions, notifications, alerts, silences, rules, webhooks, keys, signin), and
what they share is receiver.admin._common."""

from __future__ import annotations

from starlette.responses import RedirectResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from receiver.admin import (
    alerts,
    events,
    keys,
    notifications,
    rules,
    sessions,
    signin,
    silences,
    webhooks,
)
from receiver.admin._common import HERE, Admin


class AdminPages(Admin):
    """The admin site: its shared state (Admin) and the routes to every page."""

    def routes(self) -> list[BaseRoute]:
        page, open_ = self.page, self.open_page
        return [
            Route("/admin", lambda request: RedirectResponse("/admin/events", status_code=303)),
            Mount(
                "/admin",
                routes=[
                    Route("/", page(signin.home)),
                    # Open to all; named, since the wrapper is every endpoint's __name__ (url_for).
                    Route("/login", open_(signin.login_form), methods=["GET"], name="login_form"),
                    Route("/login", open_(signin.login), methods=["POST"], name="login"),
                    Route("/logout", page(signin.logout), methods=["POST"]),
                    Route("/events", page(events.listing)),
                    # Ids are the sender's strings and may hold a "/": {id:path}, and the
                    # longer route first.
                    Route("/events/{id:path}/replay", page(events.replay), methods=["GET", "POST"]),
                    Route("/events/{id:path}", page(events.detail)),
                    Route("/sessions", page(sessions.listing)),
                    Route("/sessions/{id:path}", page(sessions.detail)),
                    Route("/notifications", page(notifications.listing)),
                    Route("/notifications/{id}", page(notifications.detail)),
                    Route(
                        "/notifications/{id}/retry",
                        page(notifications.retry),
                        methods=["GET", "POST"],
                    ),
                    Route("/bulk-retry", page(notifications.bulk_retry), methods=["GET", "POST"]),
                    Route("/jobs/{id}", page(notifications.job)),
                    Route("/alerts", page(alerts.listing)),
                    Route("/report", page(alerts.report)),
                    *(
                        Route(
                            f"/alerts/{{id:path}}/{name}", page(alerts.act), methods=["GET", "POST"]
                        )
                        for name in ("ack", "resolve", "snooze")
                    ),
                    Route("/alerts/{id:path}", page(alerts.detail)),
                    Route("/silences", page(silences.listing), methods=["GET", "POST"]),
                    Route("/silences/{id}/expire", page(silences.expire), methods=["GET", "POST"]),
                    Route("/rules", page(rules.page), methods=["GET", "POST"]),
                    Route("/webhooks", page(webhooks.listing), methods=["GET", "POST"]),
                    Route("/webhooks/{id}/delete", page(webhooks.delete), methods=["GET", "POST"]),
                    Route("/webhooks/{id}/edit", page(webhooks.edit), methods=["GET", "POST"]),
                    Route("/webhooks/{id}/enable", page(webhooks.enable), methods=["GET", "POST"]),
                    Route("/keys", page(keys.listing), methods=["GET", "POST"]),
                    Route("/keys/{name:path}/revoke", page(keys.revoke), methods=["GET", "POST"]),
                    Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
                ],
            ),
        ]
