"""The operational endpoints: /healthz (alive), /readyz (able to take events), /metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from receiver.errors import StorageUnavailableError
from receiver.logs import LogLimiter
from receiver.metrics import Metrics
from receiver.reloader import RulesHolder
from receiver.store import Store
from receiver.supervisor import Supervisor

_scrape_log = LogLimiter(logging.getLogger("receiver.metrics"))
T = TypeVar("T")

# How long /readyz and /metrics wait for the store: whatever the database does (down, a
# pool waiting out its connect timeout, a pooler paused, a lock), both answer well inside
# the 1 s a Kubernetes probe waits by default, so the 503 naming what fails is read.
STORE_DEADLINE = 0.3


class _Shared(Generic[T]):
    """A store call that requests share: at most one runs at a time, and each request
    waits for it at most a deadline (a call that outlives it goes on, and the next request
    waits for that one rather than start another: hung probes never pile up)."""

    def __init__(self, call: Callable[[], Awaitable[T]]) -> None:
        self.call = call
        self.task: asyncio.Future[T] | None = None

    async def within(self, deadline: float) -> T:
        """The call's result; TimeoutError if it has not ended within deadline seconds."""
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self.call())
            # Its failure is read here even when every request stopped waiting for it.
            self.task.add_done_callback(lambda t: t.cancelled() or t.exception())
        done, _ = await asyncio.wait({self.task}, timeout=deadline)
        if not done:
            raise TimeoutError
        return self.task.result()


class OpsEndpoints:
    """/healthz, /readyz and /metrics over the store, the supervisor and the rules in force."""

    def __init__(
        self,
        store: Store,
        supervisor: Supervisor,
        holder: RulesHolder,
        metrics: Metrics,
        *,
        unhealthy_after: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.supervisor = supervisor
        self.holder = holder
        self.metrics = metrics
        self.unhealthy_after = unhealthy_after
        self.clock = clock
        self._writable = _Shared(lambda: store.check_writable())
        self._backlog = _Shared(lambda: store.stats.backlog(self.clock()))
        self._backlog_at: float | None = None  # when the backlog was last read (monotonic)

    def routes(self) -> list[Route]:
        return [
            Route("/healthz", self.healthz),
            Route("/readyz", self.readyz),
            Route("/metrics", self.metrics_endpoint),
        ]

    async def healthz(self, request: Request) -> Response:
        """Alive unless a background loop has been failing for longer than
        RECEIVER_UNHEALTHY_AFTER: then 503, so an orchestrator restarts the process."""
        stuck = self.supervisor.unhealthy()
        if not stuck:
            return JSONResponse({"status": "ok"})
        message = (
            f"{', '.join(stuck)} failing for longer than {self.unhealthy_after:g}s;"
            " restart the process (see /readyz and the log for the error)"
        )
        body = {
            "status": "unhealthy",
            "failing": stuck,
            "loops": self.supervisor.status(),
            "error": {"code": "unhealthy", "message": message},
        }
        return JSONResponse(body, status_code=503)

    async def readyz(self, request: Request) -> Response:
        """Ready while the store can take an event and every background loop works. The
        store's probe commits a small write of its own, so a failure left by the last
        write clears by itself once the disk has room (or the lock is gone), even with no
        event coming in. A loop is failing from an error it did not handle until a turn of
        its work succeeds again (receiver.supervisor). The store has STORE_DEADLINE to
        answer: no answer by then is a failure too."""
        checks: dict[str, Any] = {"rules": self.holder.status()}
        problems = []
        try:
            await self._writable.within(STORE_DEADLINE)
            # The probe committed, but a write after it may have failed already.
            failed = self.store.last_write_error
        except StorageUnavailableError as exc:
            failed = exc.message.removesuffix("; retry later")
        except TimeoutError:
            failed = (
                f"no answer within {STORE_DEADLINE:g}s (the database is unreachable, or"
                " locked); the probe goes on in the background"
            )
        if failed is not None:
            checks["store"] = problem = f"store is not writable: {failed}"
            problems.append(f"{problem}; events are refused (503 storage_unavailable) meanwhile")
        else:
            checks["store"] = "ok"
        failing = self.supervisor.failing()
        checks["loops"] = self.supervisor.status()
        if failing:
            problems.append(
                f"background loop{'s' if len(failing) > 1 else ''} failing: "
                + "; ".join(f"{name} ({checks['loops'][name]['error']})" for name in failing)
            )
        if problems:
            body = {
                "status": "not_ready",
                "failing": failing,
                "checks": checks,
                "error": {"code": "not_ready", "message": "; ".join(problems)},
            }
            return JSONResponse(body, status_code=503)
        return JSONResponse({"status": "ready", "failing": [], "checks": checks})

    async def metrics_endpoint(self, request: Request) -> Response:
        """Prometheus text; the backlog gauges as the store counts them now (absent while
        it cannot be read within STORE_DEADLINE: a stale figure would look like the truth),
        and how old the last figures read are (receiver_backlog_age_seconds)."""
        metrics = self.metrics
        try:
            metrics.backlog.snapshot = await self._backlog.within(STORE_DEADLINE)
            self._backlog_at = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - the other metrics still answer
            metrics.backlog.snapshot = None
            if isinstance(exc, TimeoutError):
                reason = f"no answer within {STORE_DEADLINE:g}s"
            else:
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            _scrape_log.warning(
                "backlog gauge failures",
                "store",
                "backlog gauges left out of /metrics: the store could not be read (%s)",
                reason,
            )
        read_at = self._backlog_at
        metrics.backlog.age = None if read_at is None else time.monotonic() - read_at
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
