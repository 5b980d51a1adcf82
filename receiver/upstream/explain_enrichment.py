"""`receiver explain`'s view of enrichment: the upstream's session and history for the
event, fetched as the server would when it sends, and shown field by field."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from receiver.rules import Ruleset
from receiver.settings import Settings
from receiver.store import Store, open_store
from receiver.upstream import client_for
from receiver.upstream.enrich import Enricher, Enrichment

SHOWN = ("context", "status", "signals", "interventions", "startedAt", "score", "updatedAt")


def fetch_for_explain(
    ruleset: Ruleset, payload: dict[str, Any], db: str
) -> tuple[Enrichment | None, list[str]]:
    """The enrichment (None when no rule uses it, the upstream is not configured or does
    not answer) and the lines that say what it holds, or why there is none."""
    if not any(rule.enriches for rule in ruleset.rules):
        return None, []
    try:
        settings = Settings()
    except ValidationError:
        return None, ["enrichment: the RECEIVER_UPSTREAM_* settings are invalid; none used"]
    session_id = payload.get("sessionId")
    if not settings.upstream_configured or not isinstance(session_id, str):
        why = "no sessionId" if settings.upstream_configured else "the upstream is not configured"
        return None, [f"enrichment: none ({why}); templates see session and history empty"]
    enrichment, reason = asyncio.run(_fetch(settings, session_id, db))
    if enrichment is None:
        return None, [f"enrichment: unavailable ({reason}); the notification goes out without"]
    session = enrichment["session"]
    lines = [f"enrichment from {settings.upstream_url} for {session_id}:"]
    lines += [f"  session.{name} = {json.dumps(session.get(name))}" for name in SHOWN]
    points = enrichment["history"]
    tail = ", ".join(str(p.get("score")) for p in points[-5:])
    lines.append(f"  history = {len(points)} points (latest: {tail or 'none'})")
    return enrichment, lines


async def _fetch(
    settings: Settings, session_id: str, db: str
) -> tuple[Enrichment | None, str | None]:
    # The server's budget when its database is there; explain never creates one.
    path = db.removeprefix("sqlite:///")
    store: Store | None = None
    if db.startswith("postgres") or Path(path).exists():
        store = open_store(db, prepare_threshold=settings.db_prepare_threshold)
        await store.open()
    try:
        client = client_for(settings, store, timeout=settings.upstream_timeout)
        assert client is not None
        async with client:
            return await Enricher(client, timeout=settings.upstream_timeout).enrichment(session_id)
    finally:
        if store is not None:
            await store.close()
