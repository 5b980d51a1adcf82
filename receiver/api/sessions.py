"""GET /v1/sessions, /v1/sessions/:id, /v1/sessions/:id/score, /v1/sessions/:id/scores and
/v1/scores, shaped as part 4 of the upstream document; each needs a reader key."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from receiver.api.auth import Access
from receiver.errors import InvalidParameterError, SessionNotFoundError
from receiver.events import iso
from receiver.sessions import STATUSES, Summary
from receiver.store import Store
from receiver.store.records import SessionQuery

T = TypeVar("T")
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
GROUP_BY = ("page", "cohort", "userId")
METRICS = ("avg", "p50", "p95")
WINDOWS = {"1h": 3600, "24h": 86_400, "7d": 7 * 86_400, "30d": 30 * 86_400}
# No stored id or user id holds a NUL (PostgreSQL text cannot), and PostgreSQL errors when
# asked for one: a path id with a NUL is not found, a parameter with one is refused, and
# the store is not asked.
_NUL = "\x00"


def choice(
    params: Mapping[str, str], name: str, allowed: tuple[str, ...] | list[str], default: str | None
) -> str | None:
    value = params.get(name)
    if value is None:
        return default
    if value not in allowed:
        raise InvalidParameterError(
            f"{name} must be one of {', '.join(allowed)}; got {value[:40]!r}"
        )
    return value


def limit_param(params: Mapping[str, str]) -> int:
    value = params.get("limit")
    if value is None:
        return DEFAULT_LIMIT
    # ASCII digits, and few: str.isdigit() also takes "²", which int() refuses, and int()
    # refuses more than 4300 digits; either would be a 500.
    if not (value.isascii() and value.isdigit() and len(value) <= 6) or not (
        1 <= int(value) <= MAX_LIMIT
    ):
        raise InvalidParameterError(
            f"limit must be a whole number from 1 to {MAX_LIMIT}; got {value[:40]!r}"
        )
    return int(value)


def instant_param(params: Mapping[str, str], name: str, *, end_of_day: bool) -> str | None:
    """An ISO 8601 date or timestamp as iso() text; a date alone means the day's first
    instant (from) or its last (to), so from=to=2026-05-01 is that whole day."""
    value = params.get(name)
    if value is None:
        return None
    try:
        if len(value) == 10:
            day = datetime.fromisoformat(value).replace(tzinfo=UTC)
            return iso(day + timedelta(days=1, microseconds=-1) if end_of_day else day)
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        try:
            return iso(moment)
        except OverflowError:  # 0001-01-01T00:00:00+01:00 is before year 1 in UTC: the
            # first instant there is (a valid time is a bound, past the calendar's ends too)
            offset = moment.utcoffset() or timedelta()
            return iso(datetime.min if offset > timedelta() else datetime.max)
    except ValueError:
        raise InvalidParameterError(
            f"{name} must be an ISO 8601 date or timestamp, such as 2026-05-01 or"
            f" 2026-05-01T12:00:00Z; got {value[:40]!r}"
        ) from None


def text_param(params: Mapping[str, str], name: str) -> str | None:
    """A free-text parameter; one with a NUL is refused (see _NUL)."""
    value = params.get(name)
    if value is not None and _NUL in value:
        raise InvalidParameterError(f"{name} must not contain a NUL character; got {value[:40]!r}")
    return value


class SessionsAPI:
    def __init__(self, store: Store, access: Access, *, clock: Callable[[], float] = time.time):
        self.store = store
        self.access = access
        self.clock = clock

    def routes(self) -> list[Route]:
        return [
            Route("/v1/sessions", self.list, methods=["GET"]),
            # Ids are the sender's strings and may hold a "/": {id:path}, longer routes first.
            Route("/v1/sessions/{id:path}/score", self.score, methods=["GET"]),
            Route("/v1/sessions/{id:path}/scores", self.history, methods=["GET"]),
            Route("/v1/sessions/{id:path}", self.one, methods=["GET"]),
            Route("/v1/scores", self.aggregates, methods=["GET"]),
        ]

    async def list(self, request: Request) -> Response:
        _, headers = await self.access.check(request)
        params = request.query_params
        query = SessionQuery(
            limit=limit_param(params),
            user_id=text_param(params, "userId"),
            status=choice(params, "status", STATUSES, None),
            start_from=instant_param(params, "from", end_of_day=False),
            start_to=instant_param(params, "to", end_of_day=True),
            cursor=text_param(params, "cursor") or None,  # cursor= is the first page
        )
        try:
            page = await self.store.sessions.page(query)
        except KeyError:
            raise InvalidParameterError(
                f"cursor {query.cursor!r} names no session: pass the cursor of the previous"
                " page unchanged, with the same filters"
            ) from None
        body = {
            "sessions": [s.as_list_item() for s in page.sessions],
            "total": page.total,
            "cursor": page.cursor,
        }
        return JSONResponse(body, headers=headers)

    async def _session(self, request: Request) -> tuple[Summary, dict[str, str]]:
        _, headers = await self.access.check(request)
        session_id = request.path_params["id"]
        found = None if _NUL in session_id else await self.store.sessions.get(session_id)
        return _found(request, found, headers), headers

    async def one(self, request: Request) -> Response:
        found, headers = await self._session(request)
        return JSONResponse(found.as_dict(), headers=headers)

    async def score(self, request: Request) -> Response:
        found, headers = await self._session(request)
        body = {
            "sessionId": found.id,
            "score": found.as_list_item()["score"],
            "updatedAt": found.score_ts,
        }
        return JSONResponse(body, headers=headers)

    async def history(self, request: Request) -> Response:
        _, headers = await self.access.check(request)
        session_id = request.path_params["id"]
        found = None if _NUL in session_id else await self.store.sessions.score_history(session_id)
        points = _found(request, found, headers)
        history = [{"score": int(s) if s.is_integer() else s, "timestamp": ts} for s, ts in points]
        return JSONResponse({"sessionId": session_id, "history": history}, headers=headers)

    async def aggregates(self, request: Request) -> Response:
        _, headers = await self.access.check(request)
        params = request.query_params
        group_by = choice(params, "groupBy", GROUP_BY, "page")
        metric = choice(params, "metric", METRICS, "avg")
        window = choice(params, "window", list(WINDOWS), "24h")
        assert group_by is not None and metric is not None and window is not None
        since = iso(datetime.fromtimestamp(self.clock() - WINDOWS[window], UTC))
        groups = [
            g.as_dict(p95=metric == "p95")
            for g in await self.store.sessions.score_groups(group_by, since)
        ]
        groups.sort(key=lambda g: (_metric(g, metric), g["key"]))
        return JSONResponse({"groups": groups}, headers=headers)


def _found(request: Request, found: T | None, headers: dict[str, str]) -> T:
    """found, or the 404 of the session the path names."""
    if found is None:
        session_id = request.path_params["id"]
        raise SessionNotFoundError(f"no session has the id {session_id[:100]!r}", headers=headers)
    return found


def _metric(group: dict[str, Any], metric: str) -> float:
    return float(group["p95"] if metric == "p95" else group[metric])
