"""The rules page (/admin/rules): the rules file in force, its URLs cut, and what the
rules make of an event pasted into its form."""

from __future__ import annotations

import json
import re

from starlette.requests import Request
from starlette.responses import Response

from receiver import events
from receiver.admin._common import Admin
from receiver.admin.auth import Session
from receiver.errors import ReceiverError

_URL = re.compile(r"\b([a-z][a-z0-9+.-]*)://[^\s'\"]+", re.I)


def redact(text: str) -> str:
    """The rules file as the page shows it: every URL cut to its scheme, since notifier
    URLs usually carry tokens (${VAR} references are kept: they name, not hold, them)."""
    return _URL.sub(lambda m: m.group(0) if "${" in m.group(0) else f"{m.group(1)}://…", text)


async def page(admin: Admin, request: Request, session: Session) -> Response:
    sample = json.dumps(events.sample("score.drop"), indent=2)
    explanation = error = None
    if request.method == "POST":
        sample = str((await request.form()).get("event", ""))
        try:
            payload = events.parse(sample.encode()).payload()
            explanation = admin.rules.current.explain(payload).format()
        except ReceiverError as exc:
            error = str(exc)
    holder = admin.rules
    try:
        text = redact(holder.path.read_text()) if not holder.builtin else None
    except OSError as exc:
        text = f"(cannot read {holder.path}: {exc})"
    return await admin.view(
        request,
        session,
        "rules.html",
        {"status": holder.status(), "text": text, "sample": sample,
         "explanation": explanation, "error": error},
    )  # fmt: skip
