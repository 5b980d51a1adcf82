"""Signing in and out of the admin page (/admin/login, /admin/logout); the cookie and the
attempt count are receiver.admin.auth's."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from receiver.admin._common import Admin
from receiver.admin.auth import COOKIE, MAX_AGE, SIGN_IN_LIMIT, Session


async def login_form(admin: Admin, request: Request) -> Response:
    return admin.render(request, None, "login.html", {"error": None})


async def login(admin: Admin, request: Request) -> Response:
    form = await request.form()
    # The peer's address (uvicorn puts a trusted proxy's X-Forwarded-For there).
    address = request.client.host if request.client else "-"
    wait = await admin.auth.attempt(address)
    if wait:
        admin.sign_in_log.warning(
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
        refused = admin.render(request, None, "login.html", {"error": why}, status=429)
        refused.headers["Retry-After"] = str(wait)
        return refused
    cookie, why = await admin.auth.sign_in(str(form.get("key", "")))
    if cookie is None:
        admin.sign_in_log.warning(
            "admin sign-in refusals",
            address,
            "admin sign-in from %s refused: %s",
            address,
            why,
            extra={"code": "unauthorized", "client": address},
        )
        return admin.render(request, None, "login.html", {"error": why}, status=401)
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
    return response


async def logout(admin: Admin, request: Request, session: Session) -> Response:
    await admin.auth.sign_out(session)
    response = RedirectResponse("/admin/login", status_code=303)
    response.delete_cookie(COOKIE, path="/admin")
    return response


async def home(admin: Admin, request: Request, session: Session) -> Response:
    return RedirectResponse("/admin/events", status_code=303)
