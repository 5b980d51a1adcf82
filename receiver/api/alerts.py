"""GET /v1/alerts (filters state, rule, session; cursor pages), GET /v1/alerts/:id (its
state, who was paged when, what was done to it), and POST /v1/alerts/:id/ack, /resolve and
/snooze (body {"for": "1h"}; role writer): receiver.dispatch.actions, recorded with source
api and the key's name. The OpenAPI part of these is receiver.api.alerts_schema."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from receiver import why
from receiver.api import limits
from receiver.api.auth import Access
from receiver.api.sessions import limit_param
from receiver.dispatch import actions
from receiver.durations import MAX_SPAN, parse_duration
from receiver.errors import AlertNotFoundError, EventNotFoundError, InvalidParameterError
from receiver.events import iso_epoch
from receiver.links import LinkSource
from receiver.rules.escalations import Policy
from receiver.store import Store
from receiver.store.records import Ack, Action, Alert, Chain, OutboxQuery, OutboxRow

STATES = ("open", "resolved")
MAX_TEXT = 500  # a filter, cursor or id longer than any alert's is no alert's
NOTIFICATIONS = 100  # the newest notifications an alert's page shows


def describe(alert: Alert, ack: Ack | None) -> dict[str, Any]:
    """An alert as the API shows it."""
    return {
        "id": alert.id,
        "state": alert.state,
        "episode": alert.episode,
        "openedAt": alert.opened_ts,
        "openedEvent": alert.opened_event,
        "lastEventAt": alert.last_ts,
        "resolvedAt": alert.resolved_ts,
        "acked": None if ack is None else {"by": ack.acked_by, "at": iso_epoch(ack.acked_at)},
    }


def paged(row: OutboxRow) -> dict[str, Any]:
    """A notification about the alert: who was paged, when, and how it went."""
    return {
        "id": str(row.id),
        "rule": row.rule,
        "notifier": row.notifier,
        "target": row.target,
        "kind": row.kind,
        "state": row.state,
        "createdAt": iso_epoch(row.created_at),
        "updatedAt": iso_epoch(row.updated_at),
    }


def action(done: Action) -> dict[str, Any]:
    return {
        "action": done.action,
        "source": done.source,
        "by": done.actor,
        "at": iso_epoch(done.at),
        "outcome": done.outcome,
        "episode": done.episode,
        "until": None if done.until is None else iso_epoch(done.until),
    }


def escalation(chain: Chain) -> dict[str, Any]:
    """An alert's escalation as the API shows it: where the chain is, and what it did."""
    policy = Policy.from_json(chain.policy)
    return {
        "policy": policy.name,
        "rule": chain.rule,
        "episode": chain.episode,
        "status": chain.status,
        "step": min(chain.step, len(policy.steps) - 1) + 1,
        "steps": len(policy.steps),
        "round": chain.round + 1,
        "rounds": policy.repeat + 1,
        "nextAt": None if chain.next_at is None else iso_epoch(chain.next_at),
        "startedAt": iso_epoch(chain.started_at),
        "suppressedSince": (
            None if chain.suppressed_since is None else iso_epoch(chain.suppressed_since)
        ),
        "log": [
            {**{k: v for k, v in entry.items() if k != "at" and (v or k == "event")},
             "at": iso_epoch(entry["at"])}
            for entry in chain.log
        ],
    }  # fmt: skip


def _text(request: Request, name: str) -> str | None:
    """A query parameter as a filter: one a store can hold (no NUL), of a sane length."""
    value = request.query_params.get(name)
    if value is not None and ("\x00" in value or len(value) > MAX_TEXT):
        raise InvalidParameterError(f"{name} must be text of at most {MAX_TEXT} characters")
    return value


class AlertsAPI:
    def __init__(
        self,
        store: Store,
        access: Access,
        *,
        rules: Callable[[], Any],  # receiver.reloader.RulesHolder: resolve renders with it
        wake_worker: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        links: LinkSource | None = None,  # a resolve's messages carry them, if on
    ) -> None:
        self.store = store
        self.access = access
        self.rules = rules
        self.links = links
        self.wake_worker = wake_worker
        self.clock = clock

    def routes(self) -> list[Route]:
        base = "/v1/alerts"
        return [
            Route(base, self.list, methods=["GET"]),
            Route(base + "/{id}", self.one, methods=["GET"]),
            *(
                Route(f"{base}/{{id}}/{name}", self._acting(name), methods=["POST"])
                for name in ("ack", "resolve", "snooze")
            ),
            Route("/v1/events/{id:path}/explain", self.explain, methods=["GET"]),
        ]

    async def explain(self, request: Request) -> Response:
        """Why a stored event was routed as it was (receiver.why); role writer."""
        _, headers = await self.access.check(request, "writer")
        wanted = request.path_params["id"]
        found = None
        if "\x00" not in wanted and len(wanted) <= MAX_TEXT:
            found = await why.explain_event(self.store, wanted, self.rules())
        if found is None:
            raise EventNotFoundError(f"no event has the id {wanted[:100]!r}", headers=headers)
        return JSONResponse(found, headers=headers)

    async def list(self, request: Request) -> Response:
        _, headers = await self.access.check(request, "reader")
        state = _text(request, "state")
        if state is not None and state not in STATES:
            raise InvalidParameterError(
                f"state must be one of open, resolved; got {state[:40]!r}", headers=headers
            )
        limit = limit_param(request.query_params)
        cursor = _text(request, "cursor") or None  # cursor= is the first page
        named = None if cursor is None else await self.store.alerts.get(cursor)
        if cursor is not None and (named is None or not named.opened):
            # as /v1/sessions does: a cursor is the id of the previous page's last alert
            raise InvalidParameterError(
                f"cursor {cursor[:100]!r} names no alert: pass the cursor of the previous"
                " page unchanged, with the same filters",
                headers=headers,
            )
        found = await self.store.alerts.page(
            state=state,
            rule=_text(request, "rule"),
            session=_text(request, "session"),
            after=cursor,
            limit=limit + 1,
        )
        page = found[:limit]
        acks = await self.store.alerts.acks(a.id for a in page)
        body = {
            "alerts": [describe(a, acks.get((a.id, a.episode))) for a in page],
            "cursor": page[-1].id if len(found) > limit else None,
        }
        return JSONResponse(body, headers=headers)

    async def _alert(self, request: Request, headers: dict[str, str]) -> Alert:
        wanted = request.path_params["id"]
        found = None
        if "\x00" not in wanted and len(wanted) <= MAX_TEXT:
            found = await self.store.alerts.get(wanted)
        if found is None or not found.opened:
            raise AlertNotFoundError(f"no alert has the id {wanted[:100]!r}", headers=headers)
        return found

    async def one(self, request: Request) -> Response:
        _, headers = await self.access.check(request, "reader")
        alert = await self._alert(request, headers)
        acks = await self.store.alerts.acks([alert.id])
        rows = await self.store.outbox.page(OutboxQuery(alert=alert.id, limit=NOTIFICATIONS))
        done = await self.store.alerts.actions([alert.id])
        chains = await self.store.alerts.chains(alert.id)
        body = {
            **describe(alert, acks.get((alert.id, alert.episode))),
            "notifications": [paged(r) for r in reversed(rows)],
            "actions": [action(a) for a in done],
            "escalations": [escalation(c) for c in chains],
        }
        return JSONResponse(body, headers=headers)

    def _acting(self, name: str) -> Callable[[Request], Any]:
        async def act(request: Request) -> Response:
            key, headers = await self.access.check(request, "writer")
            seconds = await _snooze_for(request, headers) if name == "snooze" else None
            alert = await self._alert(request, headers)
            outcome = await actions.perform(
                self.store,
                self.rules(),
                alert.id,
                name,
                source="api",
                by=key.name,
                now=self.clock(),
                seconds=seconds,
                links=self.links,
            )
            if outcome.result == "missing":
                raise AlertNotFoundError(f"no alert has the id {alert.id[:100]!r}", headers=headers)
            if outcome.result == "done":
                self.wake_worker()  # the resolved messages, an ack's or snooze's updates
            body = {
                "alert": outcome.alert,
                "action": outcome.action,
                "result": outcome.result,
                "message": outcome.message,
                "until": None if outcome.until is None else iso_epoch(outcome.until),
            }
            return JSONResponse(body, headers=headers)

        return act


async def _snooze_for(request: Request, headers: dict[str, str]) -> float:
    """The snooze's length: the body's "for" (a duration, 1h when there is no body)."""
    raw = await limits.read_body(request)
    if not raw.strip():
        return actions.SNOOZE_LINK
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    wanted = body.get("for") if isinstance(body, dict) else None
    if not isinstance(wanted, str):
        raise InvalidParameterError('body must be JSON such as {"for": "1h"}', headers=headers)
    try:
        return parse_duration(wanted, limit=MAX_SPAN)
    except ValueError as exc:
        raise InvalidParameterError(f'"for": {exc}', headers=headers) from None
