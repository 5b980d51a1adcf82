"""The upstream service's API (parts 4 and 5 of the document), as a client: a Bearer key,
the plan's request budget drawn from a bucket every replica shares, and 429 honoured.

    budget = StoreBudget(store, plan="free")
    async with UpstreamClient(url, key, budget=budget) as upstream:
        session = await upstream.session("sess_1")

Every request first draws from the budget (waiting while it is empty), so a receiver
never sends more than its plan allows in any minute, however many replicas it runs. A
429 puts the whole budget on hold for Retry-After seconds, then the request is tried
again (MAX_ATTEMPTS in all). The key never appears in an error message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from receiver import __version__, tracing
from receiver.errors import UpstreamError
from receiver.store import Store
from receiver.store.records import PLANS
from receiver.store.upstream_state import bucket_shape, take

MAX_ATTEMPTS = 5  # tries of one request that keeps being answered 429
MAX_WAITS = 10_000  # budget waits of one request (each at most MAX_SLEEP): a bound, not a goal
MAX_SLEEP = 5.0  # longest single sleep while waiting for the budget
DEFAULT_RETRY_AFTER = 1.0  # a 429 without a usable Retry-After
BUCKET = "upstream"


class Budget(Protocol):
    """Where requests are drawn from: take() is 0.0 when one may go, else seconds to wait."""

    async def take(self) -> float: ...
    async def hold(self, until: float) -> None: ...


class StoreBudget:
    """The plan's budget as a token bucket in the store, shared by every replica."""

    def __init__(self, store: Store, plan: str, *, clock: Callable[[], float] = time.time):
        if plan not in PLANS:
            raise ValueError(f"plan must be one of {', '.join(PLANS)}; got {plan!r}")
        self.store = store
        self.per_minute = PLANS[plan]
        self.clock = clock

    async def take(self) -> float:
        if self.per_minute is None:  # enterprise: unlimited, but a 429 still holds
            return await self._held()
        return await self.store.upstream.take(BUCKET, per_minute=self.per_minute, now=self.clock())

    async def _held(self) -> float:
        # A bucket too large to run dry: only a hold makes it wait.
        return await self.store.upstream.take(BUCKET, per_minute=10**9, now=self.clock())

    async def hold(self, until: float) -> None:
        await self.store.upstream.hold(BUCKET, until=until)


class LocalBudget:
    """The plan's budget as a token bucket in this process only (a command run without a
    database to share one through)."""

    def __init__(self, plan: str, *, clock: Callable[[], float] = time.time):
        if plan not in PLANS:
            raise ValueError(f"plan must be one of {', '.join(PLANS)}; got {plan!r}")
        self.per_minute = PLANS[plan] or 10**9
        self.clock = clock
        self.tokens, self.updated, self.held_until = bucket_shape(self.per_minute)[0], clock(), 0.0

    async def take(self) -> float:
        now = self.clock()
        left, wait = take(
            self.tokens, self.updated, self.held_until, now=now, per_minute=self.per_minute
        )
        if wait == 0.0:
            self.tokens, self.updated = left, max(now, self.updated)
        return wait

    async def hold(self, until: float) -> None:
        self.held_until = max(self.held_until, until)
        self.tokens, self.updated = 0.0, until


def retry_after(value: str | None) -> float:
    """Seconds from a Retry-After header (delta seconds; an HTTP date is not expected here).

    >>> retry_after("3"), retry_after(None), retry_after("soon")
    (3.0, 1.0, 1.0)
    """
    try:
        seconds = float(value) if value is not None else DEFAULT_RETRY_AFTER
    except ValueError:
        return DEFAULT_RETRY_AFTER
    return min(max(seconds, 0.0), 3600.0)


class UpstreamClient:
    """The upstream API's endpoints; each call raises UpstreamError when it fails."""

    def __init__(
        self,
        base_url: str,
        key: str,
        *,
        budget: Budget,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.budget = budget
        self.clock = clock
        self.sleep = sleep
        self.requests = 0  # sent, 429s included
        self.throttled = 0  # answered 429
        self._http = httpx.AsyncClient(
            timeout=timeout,
            transport=transport,
            headers={
                "Authorization": f"Bearer {key}",
                "User-Agent": f"attention-receiver/{__version__}",
            },
        )

    async def __aenter__(self) -> UpstreamClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- the endpoints

    async def session(self, session_id: str) -> dict[str, Any]:
        """GET /v1/sessions/:id: every field of part 2."""
        return dict(await self.request("GET", f"/sessions/{quote(session_id, safe='')}"))

    async def scores(self, session_id: str) -> list[dict[str, Any]]:
        """GET /v1/sessions/:id/scores: the score points, oldest first."""
        body = await self.request("GET", f"/sessions/{quote(session_id, safe='')}/scores")
        history = body.get("history") if isinstance(body, dict) else None
        return [p for p in history or [] if isinstance(p, dict)]

    async def sessions(self, **params: Any) -> dict[str, Any]:
        """GET /v1/sessions: a page (sessions, total, cursor)."""
        wanted = {k: v for k, v in params.items() if v is not None}
        return dict(await self.request("GET", "/sessions", params=wanted))

    async def register(
        self, url: str, events: list[str], threshold: float | None = None
    ) -> dict[str, Any]:
        """POST /v1/webhooks: the registration as the service returns it."""
        body: dict[str, Any] = {"url": url, "events": events}
        if threshold is not None:
            body["threshold"] = threshold
        return dict(await self.request("POST", "/webhooks", json=body))

    # -- the plumbing

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
    ) -> Any:
        """One API call inside the budget; the decoded JSON body of its 2xx answer."""
        for _ in range(MAX_ATTEMPTS):
            await self._draw()
            try:
                self.requests += 1
                # Within a send (enrichment), the upstream sees it as the parent.
                response = await self._http.request(
                    method,
                    self.base_url + path,
                    params=params,
                    json=json,
                    headers=tracing.current_headers(),
                )
            except httpx.TimeoutException as exc:
                raise UpstreamError(
                    f"{method} {path}: the upstream did not answer in time"
                ) from exc
            except httpx.HTTPError as exc:
                raise UpstreamError(
                    f"{method} {path}: the upstream could not be reached ({type(exc).__name__})"
                ) from exc
            if response.status_code == 429:
                self.throttled += 1
                wait = retry_after(response.headers.get("retry-after"))
                await self.budget.hold(self.clock() + wait)
                continue
            return _decoded(method, path, response)
        raise UpstreamError(
            f"{method} {path}: still rate limited after {MAX_ATTEMPTS} attempts",
            status=429,
            code="rate_limited",
        )

    async def _draw(self) -> None:
        for _ in range(MAX_WAITS):
            wait = await self.budget.take()
            if wait <= 0:
                return
            await self.sleep(min(wait, MAX_SLEEP))
        raise UpstreamError("the upstream request budget stayed empty")


def _decoded(method: str, path: str, response: httpx.Response) -> Any:
    """The JSON of a 2xx answer; UpstreamError naming the status and the service's error."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.is_success:
        if body is None:
            raise UpstreamError(f"{method} {path}: the upstream answered without JSON")
        return body
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    said = f": {code}: {str(message)[:200]}" if code else ""
    raise UpstreamError(
        f"{method} {path}: the upstream answered HTTP {response.status_code}{said}",
        status=response.status_code,
        code=code if isinstance(code, str) else None,
    )
