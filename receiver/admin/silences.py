"""The silences page (/admin/silences): the list, adding one from its form, expiring one."""

from __future__ import annotations

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from receiver.admin._common import Admin, row_id
from receiver.admin.auth import Session
from receiver.durations import MAX_SPAN, parse_duration
from receiver.errors import ReceiverError
from receiver.matchers import parse_matchers


async def listing(admin: Admin, request: Request, session: Session) -> Response:
    error = None
    if request.method == "POST":
        error = await _add(admin, await request.form())
        if error is None:
            return admin.back("/admin/silences")
    now = admin.clock()
    found = await admin.store.silences.recent(200)
    return await admin.view(
        request,
        session,
        "silences.html",
        {"silences": found, "now": now, "error": error},
    )


async def _add(admin: Admin, form: FormData) -> str | None:
    """Create a silence from the form; why not, if it cannot be."""
    matchers, problems = parse_matchers(str(form.get("matchers", "")).splitlines())
    if problems:
        return "; ".join(problems)
    until_resolved = form.get("until_resolved") is not None
    after: float | None = None
    try:
        seconds = parse_duration(str(form.get("duration", "")).strip(), limit=MAX_SPAN)
        if until_resolved:
            after = parse_duration(str(form.get("after") or "5m").strip(), limit=MAX_SPAN)
    except (ValueError, ReceiverError) as exc:
        return str(exc)
    reason = str(form.get("reason", "")).strip()
    if not reason:
        return "a reason is needed: it is shown with every silenced notification"
    now = admin.clock()

    await admin.store.silences.add(matchers, reason, now, now + seconds, after=after)
    return None


async def expire(admin: Admin, request: Request, session: Session) -> Response:
    silence_id = request.path_params["id"]
    if request.method != "POST":
        return await admin.confirm(
            request,
            session,
            f"Expire silence #{silence_id} now?",
            "Matching events notify again from now on.",
            request.url.path,
        )
    if row_id(silence_id) is not None:
        now = admin.clock()
        await admin.store.silences.expire(int(silence_id), now)
    return admin.back("/admin/silences")
