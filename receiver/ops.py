"""The operational endpoints: /healthz (alive), /readyz (able to take events), /metrics."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

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
        its work succeeds again (receiver.supervisor)."""
        checks: dict[str, Any] = {"rules": self.holder.status()}
        problems = []
        try:
            await self.store.check_writable()
            # The probe committed, but a write after it may have failed already.
            failed = self.store.last_write_error
        except StorageUnavailableError as exc:
            failed = exc.message.removesuffix("; retry later")
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
        it cannot be read: a stale figure would look like the truth)."""
        metrics = self.metrics
        try:
            metrics.backlog.snapshot = await self.store.stats.backlog(self.clock())
        except Exception as exc:  # noqa: BLE001 - the other metrics still answer
            metrics.backlog.snapshot = None
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            _scrape_log.warning(
                "backlog gauge failures",
                "store",
                "backlog gauges left out of /metrics: the store could not be read (%s)",
                reason,
            )
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
