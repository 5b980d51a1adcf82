"""The API keys page (/admin/keys): the keys, creating one (shown once), revoking one."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from receiver.admin._common import Admin, log
from receiver.admin.auth import Session
from receiver.api.auth import PREFIX, hash_key, new_key
from receiver.store.records import PLANS, ROLES


async def listing(admin: Admin, request: Request, session: Session) -> Response:
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
                await admin.store.keys.add(
                    name=name, key_hash=hash_key(key), prefix=key[:PREFIX], plan=plan,
                    role=role, now=admin.clock(),
                )  # fmt: skip
                created = {"name": name, "key": key}
                log.info("admin %s created key %r (%s)", session.key_name, name, role)
            except KeyError:
                error = f"a key named {name!r} exists already"
    found = await admin.store.keys.all()
    return await admin.view(
        request,
        session,
        "keys.html",
        {"keys": found, "created": created, "error": error, "plans": PLANS, "roles": ROLES},
    )


async def revoke(admin: Admin, request: Request, session: Session) -> Response:
    name = request.path_params["name"]
    if request.method != "POST":
        return await admin.confirm(
            request,
            session,
            f"Revoke key {name}?",
            "Every request with it is refused from now on, on every replica; an admin"
            " signed in with it is signed out.",
            request.url.path,
        )
    if await admin.store.keys.revoke(name, now=admin.clock()):
        log.info("admin %s revoked key %r", session.key_name, name)
    return admin.back("/admin/keys")
