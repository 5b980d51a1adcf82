"""Wiring: create_app(settings) builds the Starlette app; its lifespan opens the store and starts
the router, the outbox worker and the rules reloader."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
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

from receiver import __version__, rules
from receiver.admin.views import AdminPages
from receiver.api import openapi
from receiver.api.auth import Access
from receiver.api.sessions import SessionsAPI
from receiver.api.webhooks import WebhooksAPI
from receiver.dispatch.router import Router
from receiver.errors import ConfigError, RequestError, StorageUnavailableError
from receiver.ingest import IngestEndpoint
from receiver.logs import LogLimiter, redact_url
from receiver.metrics import Metrics
from receiver.notify.backoff import Backoff
from receiver.notify.targets import Targets
from receiver.notify.webhook import WebhookChannel
from receiver.notify.worker import Worker
from receiver.retention import Pruner
from receiver.settings import Settings
from receiver.store import OutboxRow, Store, open_store
from receiver.supervisor import Health, Supervisor

log = logging.getLogger("receiver")
_scrape_log = LogLimiter(logging.getLogger("receiver.metrics"))

# uvicorn's exit status for a worker that could not start (it stops the --workers parent).
STARTUP_FAILURE = 3
# Of the shutdown grace, what is kept back for closing the store after the sends.
CLOSE_RESERVE = 1.0
# The rules watcher's longest wait for a change before it says it is alive.
WATCH_TIMEOUT_MS = 5000


@dataclass
class RulesHolder:
    """The rules in force, swapped whole on a successful reload.

    On the built-in rules (builtin=True), path is ./rules.yaml, not there yet:
    once it appears (`receiver init`), a reload (SIGHUP, or the watcher) adopts it.
    """

    path: Path
    current: rules.Ruleset
    loaded_at: float = field(default_factory=time.time)
    last_error: str | None = None
    builtin: bool = False

    def __call__(self) -> rules.Ruleset:
        return self.current

    def reload(self, metrics: Metrics) -> bool:
        if self.builtin and not self.path.exists():
            log.info("no %s; keeping the built-in rules", self.path)
            return False
        try:
            fresh = rules.load_file(self.path)
        except ConfigError as exc:
            self.last_error = str(exc)
            metrics.reloads["error"].inc()
            metrics.rules_ok.set(0)
            log.error("rules reload refused, keeping the previous rules: %s", exc)
            return False
        if self.builtin:
            log.info(
                "rules loaded from %s: %d rules, replacing the built-in rules",
                self.path,
                len(fresh.rules),
            )
        elif self.last_error is not None:
            # The refusal was logged as an error; say as plainly that it is over, even when
            # the file is back to the rules that kept running.
            log.info(
                "rules reload recovered: %s is valid again, %d rules in force (digest %s)",
                self.path,
                len(fresh.rules),
                fresh.digest,
            )
        elif fresh.digest != self.current.digest:
            log.info("rules reloaded from %s: %d rules", self.path, len(fresh.rules))
        self.current, self.loaded_at, self.last_error = fresh, time.time(), None
        self.builtin = False
        metrics.reloads["ok"].inc()
        metrics.rules_ok.set(1)
        return True

    def status(self) -> dict[str, Any]:
        return {
            "path": "built-in" if self.builtin else str(self.path),
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
    """The whole receiver as an ASGI app. Raises ConfigError if the rules file is invalid,
    or missing when named by RECEIVER_RULES; without it and without ./rules.yaml, the
    built-in rules apply (settings.rules_file).

    clock is the time every stage reads (tests drive it instead of sleeping);
    after moving it, call app.state.wake() so the timers look again.
    """
    metrics = Metrics()
    builtin = ruleset is None and settings.rules_file is None
    holder = RulesHolder(settings.rules, ruleset or _initial_rules(settings), builtin=builtin)
    store = open_store(
        settings.db,
        synchronous=settings.synchronous,
        prepare_threshold=settings.db_prepare_threshold,
        clock=clock,
    )
    targets = Targets(timeout=settings.notify_timeout)
    webhooks = WebhookChannel(
        store,
        timeout=settings.webhook_timeout,
        delays=settings.webhook_delays,
        allow_private=settings.webhook_allow_private,
        allow_http=settings.webhook_allow_http,
        connections=settings.notify_concurrency,
        clock=clock,
    )
    enrich, upstream = _enricher(settings, store, holder)
    worker = Worker(
        store,
        targets,
        holder,
        metrics=metrics,
        concurrency=settings.notify_concurrency,
        backoff=Backoff(
            initial=settings.retry_initial, maximum=settings.retry_max, give_up=settings.retry_for
        ),
        lease=max(settings.notify_timeout, settings.webhook_timeout) * 2 + 10,
        clock=clock,
        webhooks=webhooks,
        enrich=enrich,
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
        max_clock_skew=settings.max_clock_skew,
        clock=clock,
    )

    access = Access(store, clock=clock)
    admin = None
    if settings.admin == "on":
        admin = AdminPages(
            store,
            rules=holder,
            router=router,
            accepted=lambda: metrics.accepted._value.get(),
            webhooks=webhooks,
            wake_worker=worker.wake,
            clock=clock,
        )

    supervisor = Supervisor(metrics=metrics, unhealthy_after=settings.unhealthy_after)

    async def healthz(request: Request) -> Response:
        """Alive unless a background loop has been failing for longer than
        RECEIVER_UNHEALTHY_AFTER: then 503, so an orchestrator restarts the process."""
        stuck = supervisor.unhealthy()
        if not stuck:
            return JSONResponse({"status": "ok"})
        message = (
            f"{', '.join(stuck)} failing for longer than {settings.unhealthy_after:g}s;"
            " restart the process (see /readyz and the log for the error)"
        )
        body = {
            "status": "unhealthy",
            "failing": stuck,
            "loops": supervisor.status(),
            "error": {"code": "unhealthy", "message": message},
        }
        return JSONResponse(body, status_code=503)

    async def readyz(request: Request) -> Response:
        """Ready while the store can take an event and every background loop works. The
        store's probe commits a small write of its own, so a failure left by the last
        write clears by itself once the disk has room (or the lock is gone), even with no
        event coming in. A loop is failing from an error it did not handle until a turn of
        its work succeeds again (receiver.supervisor)."""
        checks: dict[str, Any] = {"rules": holder.status()}
        problems = []
        try:
            await store.check_writable()
            # The probe committed, but a write after it may have failed already.
            failed = store.last_write_error
        except StorageUnavailableError as exc:
            failed = exc.message.removesuffix("; retry later")
        if failed is not None:
            checks["store"] = problem = f"store is not writable: {failed}"
            problems.append(f"{problem}; events are refused (503 storage_unavailable) meanwhile")
        else:
            checks["store"] = "ok"
        failing = supervisor.failing()
        checks["loops"] = supervisor.status()
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

    async def metrics_endpoint(request: Request) -> Response:
        """Prometheus text; the backlog gauges as the store counts them now (absent while
        it cannot be read: a stale figure would look like the truth)."""
        try:
            metrics.backlog.snapshot = await store.backlog(clock())
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

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.loop = asyncio.get_running_loop()
        await store.open()
        supervisor.stopping = False
        supervisor.start("router", router.run)
        supervisor.start("timers", router.run_timers)
        supervisor.start("notify", worker.run)
        supervisor.start("rules-watch", lambda health: _watch_rules(holder, metrics, health))
        supervisor.start("retention", pruner.run)
        if admin is not None:
            supervisor.start("admin-strip", admin.sample)
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
            redact_url(settings.db),
            len(holder.current.rules),
            (
                f"the built-in rules (no {settings.rules}: every event to the console;"
                " `receiver init` writes a starter file)"
                if holder.builtin
                else settings.rules
            ),
        )
        try:
            yield
        finally:
            # The grace runs from the signal (the server notes it) or, without one, from now.
            started = app.state.shutdown_started or time.monotonic()
            deadline = started + settings.shutdown_grace
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                loop.remove_signal_handler(signal.SIGHUP)
            reserve = min(CLOSE_RESERVE, settings.shutdown_grace / 4)
            supervisor.stopping = True  # a loop that returns now is not restarted
            await worker.stop(deadline - reserve - time.monotonic())
            await supervisor.stop()
            targets.close()
            if upstream is not None:
                await upstream.aclose()
            await webhooks.close()
            await store.close()
            log.info("stopped in %.1fs; store closed", time.monotonic() - started)

    app = ReceiverApp(
        ingest,
        routes=[
            Route("/v1/events", ingest, methods=["POST"]),
            Route("/v1/openapi.json", openapi.endpoint(__version__), methods=["GET"]),
            *SessionsAPI(store, access, clock=clock).routes(),
            *WebhooksAPI(
                store,
                access,
                webhooks,
                wake_worker=worker.wake,
                clock=clock,
                per_key=settings.webhooks_per_key,
            ).routes(),
            *(admin.routes() if admin is not None else []),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics_endpoint),
        ],
        exception_handlers={
            HTTPException: _http_error,
            RequestError: _request_error,
            Exception: _internal_error,
        },
        lifespan=lifespan,
    )
    app.state.store = store
    app.state.shutdown_started = None  # time.monotonic() of the signal, set by the server
    app.state.rules = holder
    app.state.metrics = metrics
    app.state.supervisor = supervisor

    def wake() -> None:
        """Make the router and worker look again now; safe to call from any thread."""
        loop = app.state.loop
        loop.call_soon_threadsafe(router.wake)
        loop.call_soon_threadsafe(worker.wake)

    app.state.wake = wake
    return app


def _enricher(
    settings: Settings, store: Store, holder: RulesHolder
) -> tuple[Callable[[OutboxRow], Awaitable[tuple[str, str] | None]] | None, Any]:
    """The worker's enrichment (receiver.upstream.enrich) and its upstream client, when
    the upstream is configured; (None, None) otherwise."""
    from receiver.upstream import client_for
    from receiver.upstream.enrich import Enricher

    client = client_for(settings, store, timeout=settings.upstream_timeout)
    if client is None:
        return None, None
    enricher = Enricher(client, timeout=settings.upstream_timeout)

    async def enrich(row: OutboxRow) -> tuple[str, str] | None:
        return await enricher.texts(row, holder.current, store)

    return enrich, client


def _initial_rules(settings: Settings) -> rules.Ruleset:
    """The rules file's rules, or the built-in ones when there is no file to read."""
    path = settings.rules_file
    if path is None:
        return rules.load_builtin()
    try:
        return rules.load_file(path)
    except ConfigError as exc:
        if path.exists():
            raise
        raise ConfigError(
            f"{exc.problems[0]}; RECEIVER_RULES (--rules) names this file: create it"
            f" (`receiver init {path}`), or unset RECEIVER_RULES to use ./rules.yaml or"
            " the built-in rules",
            source=exc.source,
        ) from exc


def from_env() -> Starlette:
    """create_app from RECEIVER_* alone, for `uvicorn --factory receiver.app:from_env`.

    That is how to run several worker processes (`--workers 2`) on one database; see the
    README (How fast) for why one process is the better default.

    Without RECEIVER_SECRETS it refuses to start unless RECEIVER_HOST is set to a
    loopback address: it cannot see uvicorn's own --host, so it must be told; a weak
    secret (short, or a placeholder) is refused the same way. Refused
    settings or rules print "Error: ..." to stderr and exit with status 3, uvicorn's
    own for a failed start, so that with --workers the parent stops instead of
    starting the worker again and again.
    """
    from receiver import logs

    settings = Settings()
    try:
        if settings.using_dev_secret and "host" not in settings.model_fields_set:
            raise ConfigError(
                "RECEIVER_SECRETS is not set: refusing to start, because anyone could sign"
                " deliveries with the public development secret; set RECEIVER_SECRETS, or,"
                " to use the development secret, set RECEIVER_HOST to the loopback address"
                " given to uvicorn --host (the factory cannot see uvicorn's flags)"
            )
        if "host" in settings.model_fields_set:
            settings.check_exposure()
        else:  # uvicorn's --host may be anything: a weak secret is refused as off loopback
            settings.check_exposure(
                "RECEIVER_HOST is not set (the factory cannot see uvicorn's --host)"
            )
        logs.configure(settings.log_format, settings.log_level)
        return create_app(settings)
    except ConfigError as exc:
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(STARTUP_FAILURE) from exc


class ReceiverApp(Starlette):
    """The Starlette app, with POST /v1/events sent straight to the ingest endpoint.

    The hot path skips Starlette's middleware and router (about a tenth of the CPU
    a delivery costs); every other request, and the lifespan, go through Starlette
    as usual. The route stays registered too, so a POST under a root path still works.
    """

    def __init__(self, ingest: IngestEndpoint, **options: Any) -> None:
        super().__init__(**options)
        # Starlette answers "/healthz/" with a 307 to "/healthz" on the host the request's
        # Host header names (any host a client likes); here it is a JSON 404 like any path.
        self.router.redirect_slashes = False
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


async def _watch_rules(holder: RulesHolder, metrics: Metrics, health: Health) -> None:
    """Reload the rules when their file changes (editors often replace it, so watch the
    folder). The watcher looks in every few seconds even when nothing changed, which is
    how the supervisor learns it works again after a failure."""
    from watchfiles import awatch

    target = holder.path.resolve()
    async for changes in awatch(
        target.parent, recursive=False, yield_on_timeout=True, rust_timeout=WATCH_TIMEOUT_MS
    ):
        if any(Path(path).resolve() == target for _, path in changes):
            holder.reload(metrics)
        health.ok()


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


async def _request_error(request: Request, exc: Exception) -> Response:
    """A refused request (receiver.errors.RequestError): its status, code and message."""
    assert isinstance(exc, RequestError)
    return JSONResponse(exc.to_dict(), status_code=exc.status, headers=exc.headers)


_INTERNAL_ERROR = JSONResponse(
    {"error": {"code": "internal_error", "message": "internal error; see the receiver's log"}},
    status_code=500,
)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal error on %s %s", request.method, request.url.path)
    return _INTERNAL_ERROR
