"""The webhooks page (/admin/webhooks): the subscribers with their health, rate limit,
filter and last delivery, registering one from its form (as POST /v1/webhooks does, a
rate limit and filter included), changing one's rate limit and filter, enabling a
disabled one (after a test delivery), deleting one."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from receiver.admin._common import Admin, showable, shown_delivery
from receiver.admin.auth import Session
from receiver.api.webhook_actions import enable_tested
from receiver.api.webhooks import describe, filter_param, rate_param, register
from receiver.errors import InvalidWebhookError
from receiver.events import EVENT_TYPES
from receiver.store.records import Webhook


def _form_number(text: str) -> float | str | None:
    """A number typed in a form: None if empty; as typed if it is none (for the API's
    own check to refuse, with its message)."""
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return text


def _form_filter(text: str) -> Any:
    """A filter typed in the form: None if empty, else its JSON (the registration checks
    what it says)."""
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidWebhookError(f"filter is not JSON ({exc})") from None


async def listing(admin: Admin, request: Request, session: Session) -> Response:
    created = error = None
    if request.method == "POST":
        form = await request.form()
        body = {
            "url": str(form.get("url", "")).strip(),
            "events": form.getlist("events"),
            "threshold": _form_number(str(form.get("threshold") or "").strip()),
            "format": str(form.get("format") or "service"),
            "rateLimit": _form_number(str(form.get("rateLimit") or "").strip()),
        }
        try:
            body["filter"] = _form_filter(str(form.get("filter") or "").strip())
            hook = await register(
                admin.store,
                body,
                allow_private=admin.webhooks.allow_private,
                allow_http=admin.webhooks.allow_http,
                now=admin.clock(),
                max_rate=admin.webhooks.max_rate,
            )
            admin.webhooks.forget()
            created = describe(hook, secret=True)
        except InvalidWebhookError as exc:
            error = exc.message
    hooks = [await _row(admin, h) for h in await admin.store.webhooks.all()]
    return await admin.view(
        request,
        session,
        "webhooks.html",
        {"hooks": hooks, "created": created, "error": error, "types": EVENT_TYPES},
    )


async def _row(admin: Admin, hook: Webhook) -> dict[str, Any]:
    """A subscriber as its table row shows it: what the API shows (statusReason only
    when there is one, so it is set here for every row) and its last delivery."""
    last = await admin.store.webhooks.deliveries(hook.id, limit=1)
    since = hook.failing_since
    shown = describe(
        replace(
            hook,
            created_at=showable(hook.created_at),
            failing_since=None if since is None else showable(since),
        )
    )
    shown["filter"] = json.dumps(hook.filter, sort_keys=True) if hook.filter else None
    return {"statusReason": None, **shown, "last": shown_delivery(last[0]) if last else None}


async def delete(admin: Admin, request: Request, session: Session) -> Response:
    if request.method != "POST":
        return await admin.confirm(
            request,
            session,
            f"Delete webhook {request.path_params['id']}?",
            "Its deliveries not sent yet are cancelled; it gets nothing more.",
            request.url.path,
        )
    await admin.store.webhooks.update(
        request.path_params["id"], now=admin.clock(), status="deleted"
    )
    admin.webhooks.forget()
    return admin.back("/admin/webhooks")


async def edit(admin: Admin, request: Request, session: Session) -> Response:
    """A subscriber's rate limit and filter, changed from its form (checked as on
    registration: a refusal is shown with its message, nothing changed)."""
    hook = await admin.store.webhooks.get(request.path_params["id"])
    if hook is None or hook.status == "deleted":
        return await admin.missing(request, session, "webhook")
    error = None
    rate_text = "" if hook.rate_limit is None else f"{hook.rate_limit:g}"
    filter_text = json.dumps(hook.filter, sort_keys=True) if hook.filter else ""
    if request.method == "POST":
        form = await request.form()
        rate_text = str(form.get("rateLimit") or "").strip()
        filter_text = str(form.get("filter") or "").strip()
        try:
            changes = {
                "rate_limit": rate_param(
                    {"rateLimit": _form_number(rate_text)}, admin.webhooks.max_rate
                ),
                "filter": filter_param({"filter": _form_filter(filter_text)}),
            }
            await admin.store.webhooks.configure(hook.public_id, now=admin.clock(), changes=changes)
            admin.webhooks.forget()
            return admin.back("/admin/webhooks")
        except InvalidWebhookError as exc:
            error = exc.message
    return await admin.view(
        request,
        session,
        "webhook_edit.html",
        {"hook": describe(hook), "rate": rate_text, "filter": filter_text, "error": error},
    )


async def enable(admin: Admin, request: Request, session: Session) -> Response:
    """A disabled subscriber back, if a test delivery to it succeeds now (as POST
    /v1/webhooks/:id/enable); else what the test answered, nothing changed."""
    hook = await admin.store.webhooks.get(request.path_params["id"])
    if hook is None or hook.status == "deleted":
        return await admin.missing(request, session, "webhook")
    if request.method != "POST":
        return await admin.confirm(
            request,
            session,
            f"Enable webhook {hook.public_id}?",
            "A signed webhook.test delivery is sent to it now; it is enabled only if that"
            " succeeds.",
            request.url.path,
        )
    if hook.status == "disabled":
        enabled, attempt = await enable_tested(admin.store, admin.webhooks, hook, admin.clock)
        if enabled is None:
            return await admin.message(
                request,
                session,
                f"Webhook {hook.public_id} stays disabled",
                f"Its test delivery failed: {attempt['error'] or 'no answer'}.",
            )
        admin.wake()
    return admin.back("/admin/webhooks")
