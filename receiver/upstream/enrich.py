"""Enrichment: what the upstream service knows about a notification's session, fetched when
the notification is sent (never on the ingest path), for rules whose templates use it.

    enricher = Enricher(client, timeout=2.0)
    texts = await enricher.texts(row, ruleset, store)   # None: send the stored texts

A rule whose title or body names ``session`` or ``history`` is rendered at routing time
without them (empty), and again here with them just before each send: ``session`` is
GET /v1/sessions/:id (context, status, signals, interventions, startedAt, ...) and
``history`` the last HISTORY_POINTS points of GET /v1/sessions/:id/scores. Each session's
answer is cached for TTL seconds, and concurrent sends for one session share one fetch.
A fetch not done within the timeout (the budget's wait included), or failing, lets the
notification go out with its stored texts, and says so in one log line; after a failure
to reach the upstream, enrichment rests for DOWN_PAUSE seconds rather than make every
notification wait out the timeout.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from receiver.dispatch.alerts import alert_id
from receiver.dispatch.pipeline import REPLAY_PREFIX
from receiver.errors import UpstreamError
from receiver.links import LinkSource
from receiver.rules import Ruleset
from receiver.store import OutboxRow, Store
from receiver.upstream.client import UpstreamClient

log = logging.getLogger("receiver.upstream")

TTL = 30.0  # seconds a session's enrichment is reused
HISTORY_POINTS = 20  # the most recent score points templates see as history
DOWN_PAUSE = 10.0  # seconds without trying after the upstream failed or timed out
MAX_CACHED = 10_000  # sessions cached at most; the oldest go first

Enrichment = dict[str, Any]  # {"session": {...}, "history": [{score, timestamp}, ...]}


class Enricher:
    """Fetches, caches and applies the upstream's view of a session."""

    def __init__(
        self,
        client: UpstreamClient,
        *,
        timeout: float,
        ttl: float = TTL,
        clock: Callable[[], float] = time.monotonic,
        links: LinkSource | None = None,
    ) -> None:
        self.client = client
        self.links = links  # the one-click action links the routed texts had, if on
        self.timeout = timeout
        self.ttl = ttl
        self.clock = clock
        self._cache: dict[str, tuple[float, Enrichment]] = {}
        self._fetching: dict[str, asyncio.Future[Enrichment]] = {}
        self._down_until = float("-inf")

    async def lookup(self, session_id: str) -> Enrichment:
        """The session's enrichment, from the cache or the upstream (no time limit here);
        UpstreamError if the upstream refuses or cannot be reached."""
        now = self.clock()
        cached = self._cache.get(session_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        pending = self._fetching.get(session_id)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch(session_id))
            self._fetching[session_id] = pending
            pending.add_done_callback(functools.partial(self._fetched, session_id))
        # shield: one waiter timing out must not cancel the fetch the others share.
        return await asyncio.shield(pending)

    def _fetched(self, session_id: str, fetch: asyncio.Future[Enrichment]) -> None:
        self._fetching.pop(session_id, None)
        if not fetch.cancelled():
            # Read here: when every waiter timed out first, nobody else reads the error,
            # and asyncio would log "exception was never retrieved" with a traceback.
            fetch.exception()

    async def _fetch(self, session_id: str) -> Enrichment:
        session = await self.client.session(session_id)
        history = await self.client.scores(session_id)
        found: Enrichment = {"session": session, "history": history[-HISTORY_POINTS:]}
        if len(self._cache) >= MAX_CACHED:
            self._cache.pop(next(iter(self._cache)))
        self._cache[session_id] = (self.clock() + self.ttl, found)
        return found

    async def enrichment(self, session_id: str) -> tuple[Enrichment | None, str | None]:
        """The enrichment within the timeout, or None and why not."""
        if self.clock() < self._down_until:
            return None, "the upstream failed moments ago; not asking again yet"
        try:
            async with asyncio.timeout(self.timeout):
                return await self.lookup(session_id), None
        except TimeoutError:
            self._down_until = self.clock() + DOWN_PAUSE
            return None, f"the upstream did not answer within {self.timeout:g}s"
        except UpstreamError as exc:
            if exc.status is None or exc.status >= 500:
                self._down_until = self.clock() + DOWN_PAUSE
            return None, str(exc)

    async def texts(self, row: OutboxRow, ruleset: Ruleset, store: Store) -> tuple[str, str] | None:
        """The row's title and body rendered again with its session's enrichment, or None
        to send the stored ones (the rule does not use enrichment, or it is unavailable).
        Never raises: enrichment must not fail a notification."""
        rule = ruleset.by_name.get(row.rule)
        if rule is None or not rule.enriches or row.kind != "event":
            return None
        payload, enrichment, reason = await self._payload(row, store)
        if payload is not None:
            session_id = payload.get("sessionId")
            if isinstance(session_id, str):
                enrichment, reason = await self.enrichment(session_id)
            else:
                reason = "the event names no session"
        if enrichment is None or payload is None:
            log.warning(
                "notification %s for event %s (rule %s) sent without enrichment: %s",
                row.label,
                row.event_id,
                row.rule,
                reason,
            )
            return None
        if self.links is not None and (alert := alert_id(payload)) is not None:
            payload = {**payload, "links": (await self.links.get()).for_alert(alert)}
        rendered = rule.render(payload, enrichment)
        if rendered.fallback:
            log.warning(
                "notification %s for event %s (rule %s) sent without enrichment: the enriched %s",
                row.label,
                row.event_id,
                row.rule,
                rendered.error,
            )
            return None
        # An operator's replay is marked so in its title (dispatch.pipeline.REPLAY_PREFIX).
        prefix = REPLAY_PREFIX if row.title.startswith(REPLAY_PREFIX) else ""
        return prefix + rendered.title, rendered.body

    async def _payload(
        self, row: OutboxRow, store: Store
    ) -> tuple[dict[str, Any] | None, Enrichment | None, str | None]:
        """The row's event payload, or None and why not."""
        try:
            found = await store.events.get(row.event_id)
        except Exception as exc:  # noqa: BLE001 - the stored texts still go out
            return None, None, f"the event could not be read ({type(exc).__name__})"
        payload = json.loads(found[1]) if found is not None else None
        if not isinstance(payload, dict):
            return None, None, "the event is no longer stored"
        return payload, None, None
