"""Wiring: create_app(settings) builds the Starlette app; its lifespan opens the store and starts
the router, the outbox worker and the rules reloader."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from receiver import rules
from receiver.config import Settings
from receiver.errors import ConfigError, StorageUnavailableError
from receiver.ingest import IngestEndpoint
from receiver.metrics import Metrics
from receiver.notify.targets import Targets
from receiver.notify.worker import Backoff, Worker
from receiver.retention import Pruner
from receiver.router import Router
from receiver.store import open_store

log = logging.getLogger("receiver")

SHUTDOWN_GRACE = 5.0  # seconds sends in flight may take to finish after the server stops


@dataclass
class RulesHolder:
    """The rules in force, swapped whole on a successful reload."""

    path: Path
    current: rules.Ruleset
    loaded_at: float = field(default_factory=time.time)
    last_error: str | None = None

    def __call__(self) -> rules.Ruleset:
        return self.current

    def reload(self, metrics: Metrics) -> bool:
        try:
            fresh = rules.load_file(self.path)
        except ConfigError as exc:
            self.last_error = str(exc)
            metrics.reloads["error"].inc()
            metrics.rules_ok.set(0)
            log.error("rules reload refused, keeping the previous rules: %s", exc)
            return False
        if fresh.digest != self.current.digest:
            log.info("rules reloaded from %s: %d rules", self.path, len(fresh.rules))
        self.current, self.loaded_at, self.last_error = fresh, time.time(), None
        metrics.reloads["ok"].inc()
        metrics.rules_ok.set(1)
        return True

    def status(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "rules": len(self.current.rules),
            "digest": self.current.digest,
            "loaded_at": self.loaded_at,
            "last_reload": "ok" if self.last_error is None else f"error: {self.last_error}",
        }


def create_app(
    settings: Settings,
    *,
    ruleset: rules.Ruleset | None = None,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The whole receiver as an ASGI app. Raises ConfigError if the rules file is invalid.

    clock is the time every stage reads (tests drive it instead of sleeping);
    after moving it, call app.state.wake() so the timers look again.
    """
    metrics = Metrics()
    holder = RulesHolder(settings.rules, ruleset or rules.load_file(settings.rules))
    store = open_store(settings.db, synchronous=settings.synchronous, clock=clock)
    targets = Targets(timeout=settings.notify_timeout, max_workers=settings.notify_concurrency)
    worker = Worker(
        store,
        targets,
        holder,
        metrics=metrics,
        concurrency=settings.notify_concurrency,
        backoff=Backoff(
            initial=settings.retry_initial, maximum=settings.retry_max, give_up=settings.retry_for
        ),
        lease=settings.notify_timeout * 2 + 10,
        clock=clock,
    )
    router = Router(store, holder, metrics=metrics, on_routed=worker.wake, clock=clock)
    pruner = Pruner(store, retention=settings.retention, metrics=metrics, clock=clock)
    store.on_accepted = router.wake
    ingest = IngestEndpoint(
        store=store,
        secrets=settings.secret_list,
        max_body=settings.max_body,
        metrics=metrics,
        max_event_age=settings.max_event_age,
    )

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        checks: dict[str, Any] = {"rules": holder.status()}
        try:
            await store.check_writable()
            checks["store"] = "ok"
        except StorageUnavailableError as exc:
            checks["store"] = exc.message
            error = {"code": "not_ready", "message": f"store is not writable: {exc.message}"}
            return JSONResponse({"error": error, "checks": checks}, status_code=503)
        return JSONResponse({"status": "ready", "checks": checks})

    async def metrics_endpoint(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.loop = asyncio.get_running_loop()
        await store.open()
        tasks = [
            asyncio.create_task(router.run(), name="router"),
            asyncio.create_task(worker.run(), name="notify"),
            asyncio.create_task(_watch_rules(holder, metrics), name="rules-watch"),
            asyncio.create_task(pruner.run(), name="retention"),
        ]
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, holder.reload, metrics)
        if settings.using_dev_secret:
            log.warning(
                "NO RECEIVER_SECRETS SET: accepting deliveries signed with the public "
                "development secret. Not for production: set RECEIVER_SECRETS."
            )
        log.info(
            "receiving on http://%s:%d/v1/events; store %s; %d rules from %s",
            settings.host,
            settings.port,
            settings.db,
            len(holder.current.rules),
            settings.rules,
        )
        try:
            yield
        finally:
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                loop.remove_signal_handler(signal.SIGHUP)
            await worker.drain(SHUTDOWN_GRACE)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            targets.close()
            await store.close()
            log.info("stopped; store closed")

    app = ReceiverApp(
        ingest,
        routes=[
            Route("/v1/events", ingest, methods=["POST"]),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics_endpoint),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
        lifespan=lifespan,
    )
    app.state.store = store
    app.state.rules = holder
    app.state.metrics = metrics

    def wake() -> None:
        """Make the router and worker look again now; safe to call from any thread."""
        loop = app.state.loop
        loop.call_soon_threadsafe(router.wake)
        loop.call_soon_threadsafe(worker.wake)

    app.state.wake = wake
    return app


def from_env() -> Starlette:
    """create_app from RECEIVER_* alone, for `uvicorn --factory receiver.app:from_env`.

    That is how to run several worker processes (`--workers 2`) on one database; see the
    README (How fast) for why one process is the better default.
    """
    from receiver import logs

    settings = Settings()
    logs.configure(settings.log_format, settings.log_level)
    return create_app(settings)


class ReceiverApp(Starlette):
    """The Starlette app, with POST /v1/events sent straight to the ingest endpoint.

    The hot path skips Starlette's middleware and router (about a tenth of the CPU
    a delivery costs); every other request, and the lifespan, go through Starlette
    as usual. The route stays registered too, so a POST under a root path still works.
    """

    def __init__(self, ingest: IngestEndpoint, **options: Any) -> None:
        super().__init__(**options)
        self.ingest = ingest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] == "/v1/events"
            and scope["method"] == "POST"
            and not scope.get("root_path")
        ):
            try:
                await self.ingest(scope, receive, send)
            except Exception:
                # What ServerErrorMiddleware would do: log it, answer the JSON 500.
                log.exception("internal error on POST /v1/events")
                with contextlib.suppress(Exception):
                    await _INTERNAL_ERROR(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


async def _watch_rules(holder: RulesHolder, metrics: Metrics) -> None:
    """Reload the rules when their file changes (editors often replace it, so watch the folder)."""
    from watchfiles import awatch

    target = holder.path.resolve()
    async for changes in awatch(target.parent, recursive=False):
        if any(Path(path).resolve() == target for _, path in changes):
            holder.reload(metrics)


_CODES = {404: "not_found", 405: "method_not_allowed"}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _CODES.get(exc.status_code, "http_error")
    message = f"{request.method} {request.url.path}: {exc.detail.lower()}"
    return JSONResponse(
        {"error": {"code": code, "message": message}},
        status_code=exc.status_code,
        headers=exc.headers,
    )


_INTERNAL_ERROR = JSONResponse(
    {"error": {"code": "internal_error", "message": "internal error; see the receiver's log"}},
    status_code=500,
)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal error on %s %s", request.method, request.url.path)
    return _INTERNAL_ERROR
