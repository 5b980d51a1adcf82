"""The fake upstream: the Attention Scoring Service's API (parts 4 to 8 of the document),
served from a generated population, for tests and demos (`receiver simulate --serve-api`).

It speaks the receiver's own dialect of the document (receiver.api: parameters, error
bodies, RateLimit headers, 429 with Retry-After, registration answered with the signing
secret), keeps everything in memory, and delivers each event its live sessions make to
every registered webhook wanting it: signed with that webhook's secret, retried at 1m,
5m, 30m, 2h, 8h divided by `speed`, failed after the last.

    fake = FakeUpstream(keys={"ar_demo": "free"}, population=population, speed=60)
    app = fake.app()       # a Starlette app; serve it with uvicorn

GET /_fake/stats (no key) tells a demo or a test what was delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from receiver import signature
from receiver.api.auth import limit_headers
from receiver.api.sessions import (
    GROUP_BY,
    METRICS,
    WINDOWS,
    choice,
    instant_param,
    limit_param,
    text_param,
)
from receiver.api.webhooks import validate
from receiver.errors import (
    InvalidParameterError,
    RateLimitedError,
    RequestError,
    SessionNotFoundError,
    UnauthorizedError,
)
from receiver.events import iso
from receiver.notify.webhook import new_secret
from receiver.sessions import STATUSES, Aggregate
from receiver.simulator.population import FakeSession, Population
from receiver.simulator.walk import retry_delays, timestamp
from receiver.store.records import PLANS, RateLimit

WINDOW = 60.0  # seconds the plan limits count requests over, as the receiver does


@dataclass
class Hook:
    """A registered webhook and what was delivered to it."""

    id: str
    url: str
    events: list[str]
    threshold: float | None
    secret: str
    created: float
    sent: int = 0  # events it wanted, each delivered, failed or still being retried
    delivered: int = 0
    attempts: int = 0
    retried: int = 0
    failed: int = 0
    pending: int = 0

    def describe(self, *, secret: bool = False) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "id": self.id,
            "url": self.url,
            "events": self.events,
            "threshold": self.threshold,
            "status": "active",
            "createdAt": iso(datetime.fromtimestamp(self.created, UTC), digits=3),
        }
        if secret:
            shown["secret"] = self.secret
        return shown

    def stats(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "sent": self.sent,
            "delivered": self.delivered,
            "attempts": self.attempts,
            "retried": self.retried,
            "failed": self.failed,
            "pending": self.pending,
        }


@dataclass
class Limiter:
    """Per key, the requests of the last WINDOW seconds (a sliding log, as the receiver's)."""

    clock: Callable[[], float] = time.monotonic
    hits: dict[str, deque[float]] = field(default_factory=dict)

    def check(self, key: str, limit: int | None) -> RateLimit | None:
        if limit is None:
            return None
        now = self.clock()
        log = self.hits.setdefault(key, deque())
        while log and log[0] <= now - WINDOW:
            log.popleft()
        allowed = len(log) < limit
        if allowed:
            log.append(now)
        reset = max(1, int(log[0] + WINDOW - now + 0.999)) if log else 1
        return RateLimit(allowed, limit, limit - len(log), reset)


class FakeUpstream:
    """The fake service: API, population ticking, deliveries to registered webhooks."""

    def __init__(
        self,
        *,
        keys: dict[str, str],
        population: Population,
        speed: float = 1.0,
        tick: float = 1.0,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        unknown = [plan for plan in keys.values() if plan not in PLANS]
        if unknown:
            raise ValueError(f"plan must be one of {', '.join(PLANS)}; got {unknown[0]!r}")
        self.keys = dict(keys)
        self.population = population
        self.delays = retry_delays(speed)
        self.tick = tick
        self.timeout = timeout
        self.limiter = Limiter(clock)
        self.hooks: dict[str, Hook] = {}
        self.requests = 0
        self.throttled = 0
        self.events = 0
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._http: httpx.AsyncClient | None = None

    # -- the app

    def app(self) -> Starlette:
        routes = [
            Route("/v1/sessions", self.list, methods=["GET"]),
            Route("/v1/sessions/{id:path}/score", self.score, methods=["GET"]),
            Route("/v1/sessions/{id:path}/scores", self.history, methods=["GET"]),
            Route("/v1/sessions/{id:path}", self.one, methods=["GET"]),
            Route("/v1/scores", self.aggregates, methods=["GET"]),
            Route("/v1/webhooks", self.register, methods=["POST"]),
            Route("/v1/webhooks", self.list_hooks, methods=["GET"]),
            Route("/_fake/stats", self.stats, methods=["GET"]),
        ]
        return Starlette(
            routes=routes,
            exception_handlers={RequestError: _refused},
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        async with httpx.AsyncClient(timeout=self.timeout) as self._http:
            ticker = asyncio.create_task(self._ticking())
            try:
                yield
            finally:
                ticker.cancel()
                for task in list(self._tasks):
                    task.cancel()
                await asyncio.gather(ticker, *self._tasks, return_exceptions=True)

    def _check(self, request: Request) -> dict[str, str]:
        """The RateLimit headers of an allowed request; raises the 401 or 429 instead."""
        self.requests += 1
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        plan = self.keys.get(token.strip()) if scheme.lower() == "bearer" else None
        if plan is None:
            raise UnauthorizedError("missing or unknown API key: send Authorization: Bearer <key>")
        limit = self.limiter.check(token.strip(), PLANS[plan])
        headers = limit_headers(limit)
        if limit is not None and not limit.allowed:
            self.throttled += 1
            raise RateLimitedError(
                f"rate limit of the {plan} plan reached ({limit.limit} requests a minute);"
                f" retry in {limit.reset} s",
                headers={**headers, "Retry-After": str(limit.reset)},
            )
        return headers

    # -- sessions and scores

    async def list(self, request: Request) -> Response:
        headers = self._check(request)
        params = request.query_params
        limit = limit_param(params)
        user = text_param(params, "userId")
        status = choice(params, "status", STATUSES, None)
        start = instant_param(params, "from", end_of_day=False)
        end = instant_param(params, "to", end_of_day=True)
        cursor = text_param(params, "cursor")
        found = [
            s
            for s in self.population.newest_first()
            if (user is None or s.walk.user_id == user)
            and (status is None or s.status == status)
            and (start is None or iso(s.started) >= start)
            and (end is None or iso(s.started) <= end)
        ]
        total = len(found)
        if cursor is not None:
            at = self.population.sessions.get(cursor)
            if at is None:
                raise InvalidParameterError(f"cursor {cursor!r} names no session", headers=headers)
            found = [s for s in found if (s.started, s.id) < (at.started, at.id)]
        page = found[:limit]
        more = len(found) > limit
        body = {
            "sessions": [s.as_list_item() for s in page],
            "total": total,
            "cursor": page[-1].id if more and page else None,
        }
        return JSONResponse(body, headers=headers)

    def _session(self, request: Request, headers: dict[str, str]) -> FakeSession:
        session_id = request.path_params["id"]
        found = self.population.sessions.get(session_id)
        if found is None:
            raise SessionNotFoundError(
                f"no session has the id {session_id[:100]!r}", headers=headers
            )
        return found

    async def one(self, request: Request) -> Response:
        headers = self._check(request)
        return JSONResponse(self._session(request, headers).as_dict(), headers=headers)

    async def score(self, request: Request) -> Response:
        headers = self._check(request)
        found = self._session(request, headers)
        body = {
            "sessionId": found.id,
            "score": found.score(),
            "updatedAt": timestamp(found.updated),
        }
        return JSONResponse(body, headers=headers)

    async def history(self, request: Request) -> Response:
        headers = self._check(request)
        found = self._session(request, headers)
        points = [
            {"score": int(s) if float(s).is_integer() else s, "timestamp": ts}
            for s, ts in found.history
        ]
        return JSONResponse({"sessionId": found.id, "history": points}, headers=headers)

    async def aggregates(self, request: Request) -> Response:
        headers = self._check(request)
        params = request.query_params
        group_by = choice(params, "groupBy", GROUP_BY, "page")
        metric = choice(params, "metric", METRICS, "avg")
        window = choice(params, "window", list(WINDOWS), "24h")
        assert group_by is not None and metric is not None and window is not None
        since = datetime.now(UTC).timestamp() - WINDOWS[window]
        groups: dict[str, dict[float, int]] = {}
        for s in self.population.sessions.values():
            if s.updated.timestamp() < since:
                continue
            key = {"page": s.context, "cohort": s.cohort, "userId": s.walk.user_id}[group_by]
            histogram = groups.setdefault(key, {})
            histogram[s.walk.score] = histogram.get(s.walk.score, 0) + 1
        shown = [
            Aggregate(key, histogram).as_dict(p95=metric == "p95")
            for key, histogram in groups.items()
        ]
        shown.sort(key=lambda g: (float(g[metric]), g["key"]))
        return JSONResponse({"groups": shown}, headers=headers)

    # -- webhooks

    async def register(self, request: Request) -> Response:
        headers = self._check(request)
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        url, events, threshold, _ = await validate(body, allow_private=True, allow_http=True)
        hook = Hook(
            id="wh_" + secrets.token_urlsafe(9),
            url=url,
            events=events,
            threshold=threshold,
            secret=new_secret("service"),
            created=time.time(),
        )
        self.hooks[hook.id] = hook
        return JSONResponse(hook.describe(secret=True), status_code=201, headers=headers)

    async def list_hooks(self, request: Request) -> Response:
        headers = self._check(request)
        return JSONResponse(
            {"webhooks": [h.describe() for h in self.hooks.values()]}, headers=headers
        )

    async def stats(self, request: Request) -> Response:
        body = {
            "events": self.events,
            "requests": self.requests,
            "throttled": self.throttled,
            "sessions": len(self.population.sessions),
            "live": len(self.population.live),
            "webhooks": [h.stats() for h in self.hooks.values()],
        }
        return JSONResponse(body)

    # -- the live sessions and their deliveries

    async def _ticking(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            now = datetime.now(UTC)
            for fields in self.population.tick(now):
                self._emit(
                    {
                        "id": f"evt_{self.population.run}_{next(self._ids):06d}",
                        **fields,
                        "timestamp": timestamp(now),
                    }
                )

    def _emit(self, event: dict[str, Any]) -> None:
        self.events += 1
        body = json.dumps(event, separators=(",", ":")).encode()
        for hook in self.hooks.values():
            if event["type"] in hook.events:
                hook.sent += 1
                hook.pending += 1
                task = asyncio.create_task(self._deliver(hook, body))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _deliver(self, hook: Hook, body: bytes) -> None:
        """The first attempt now, then one after each delay; failed after the last."""
        assert self._http is not None
        headers = {
            "content-type": "application/json",
            signature.SIGNATURE_HEADER: signature.sign(hook.secret.encode(), body),
        }
        try:
            for delay in (0.0, *self.delays):
                if delay:
                    await asyncio.sleep(delay)
                    hook.retried += 1
                hook.attempts += 1
                try:
                    response = await self._http.post(hook.url, content=body, headers=headers)
                    if response.is_success:
                        hook.delivered += 1
                        return
                except httpx.HTTPError:
                    pass
            hook.failed += 1
        finally:
            hook.pending -= 1


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    return JSONResponse(exc.to_dict(), status_code=exc.status, headers=exc.headers)
