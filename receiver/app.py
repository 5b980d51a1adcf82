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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.routing import BaseRoute, Route

from receiver import __version__, reloader, rules, tracing
from receiver.admin.act import ActPages
from receiver.admin.views import AdminPages
from receiver.api import openapi
from receiver.api.alerts import AlertsAPI
from receiver.api.auth import Access
from receiver.api.sessions import SessionsAPI
from receiver.api.silences import SilencesAPI
from receiver.api.webhooks import WebhooksAPI
from receiver.dispatch.router import Router
from receiver.edge.asgi import EXCEPTION_HANDLERS, ReceiverApp
from receiver.edge.ingest import IngestEndpoint
from receiver.edge.ops import OpsEndpoints
from receiver.errors import ConfigError
from receiver.links import LinkSource
from receiver.links import source as link_source
from receiver.metrics import Metrics
from receiver.notify import registry, slack
from receiver.notify.backoff import Backoff
from receiver.notify.replays import Replayer
from receiver.notify.slack.interactivity import Interactivity
from receiver.notify.targets import Targets
from receiver.notify.webhook import WebhookChannel
from receiver.notify.worker import Worker
from receiver.redact import redact_url
from receiver.reloader import RulesHolder
from receiver.retention import Pruner
from receiver.settings import Settings
from receiver.store import OutboxRow, Store, open_store
from receiver.store.webhook_health import HealthPolicy
from receiver.supervisor import Supervisor

if TYPE_CHECKING:
    from receiver.upstream.client import UpstreamClient

log = logging.getLogger("receiver")

# uvicorn's exit status for a worker that could not start (it stops the --workers parent).
STARTUP_FAILURE = 3
# Of the shutdown grace, what is kept back for closing the store after the sends.
CLOSE_RESERVE = 1.0
# With several worker processes, how often the first (the one that routes and sends) looks for
# events the others took in and rows their API calls queued: they cannot wake it.
SHARED_POLL = 0.1


def create_app(
    settings: Settings,
    *,
    ruleset: rules.Ruleset | None = None,
    clock: Callable[[], float] = time.time,
    routing: bool = True,
) -> Starlette:
    """The whole receiver as an ASGI app. Raises ConfigError if the rules file is invalid,
    or missing when named by RECEIVER_RULES; without it and without ./rules.yaml, the
    built-in rules apply (settings.rules_file).

    clock is the time every stage reads (tests drive it instead of sleeping);
    after moving it, call app.state.wake() so the timers look again.

    routing False: an ingest worker of `receiver serve --workers N` (all but the first):
    it takes events in and answers the API, and leaves routing, the timers, sending and
    retention to the first worker, which looks for work every SHARED_POLL seconds.
    """
    parts = _Parts.build(settings, ruleset, clock)
    parts.routing = routing
    if settings.workers > 1:  # the others' accepts and API calls cannot wake these
        parts.router.idle_poll = parts.worker.idle_poll = SHARED_POLL
    store, worker = parts.store, parts.worker
    app = ReceiverApp(
        parts.ingest,
        routes=_routes(parts, settings, clock),
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=parts.lifespan,
    )
    app.state.store = store
    app.state.shutdown_started = None  # time.monotonic() of the signal, set by the server
    app.state.rules = parts.holder
    app.state.metrics = parts.metrics
    app.state.supervisor = parts.supervisor

    def wake() -> None:
        """Make the router and worker look again now; safe to call from any thread."""
        loop = app.state.loop
        loop.call_soon_threadsafe(parts.router.wake)
        loop.call_soon_threadsafe(worker.wake)

    app.state.wake = wake
    return app


def _routes(parts: _Parts, settings: Settings, clock: Callable[[], float]) -> list[BaseRoute]:
    """Every route of the app: ingest, the /v1 API, the admin and action pages, Slack's
    button endpoint and the probes."""
    store, worker, admin = parts.store, parts.worker, parts.admin
    return [
        Route("/v1/events", parts.ingest, methods=["POST"]),
        Route("/v1/openapi.json", openapi.endpoint(__version__), methods=["GET"]),
        *SessionsAPI(store, parts.access, clock=clock).routes(),
        *WebhooksAPI(
            store,
            parts.access,
            parts.webhooks,
            wake_worker=worker.wake,
            wake_replays=parts.replayer.wake,
            clock=clock,
            per_key=settings.webhooks_per_key,
        ).routes(),
        *AlertsAPI(
            store,
            parts.access,
            rules=parts.holder,
            wake_worker=worker.wake,
            clock=clock,
            links=parts.links,
        ).routes(),
        *SilencesAPI(store, parts.access, clock=clock).routes(),
        *(admin.routes() if admin is not None else []),
        *(
            ActPages(
                store, parts.links, rules=parts.holder, metrics=parts.metrics, clock=clock
            ).routes()
            if parts.links is not None
            else []
        ),
        *parts.slack.routes(),
        *OpsEndpoints(
            store,
            parts.supervisor,
            parts.holder,
            parts.metrics,
            unhealthy_after=settings.unhealthy_after,
            clock=clock,
        ).routes(),
    ]


@dataclass
class _Parts:
    """What create_app builds: the stages, and what the lifespan starts and stops."""

    settings: Settings
    metrics: Metrics
    holder: RulesHolder
    store: Store
    targets: Targets
    webhooks: WebhookChannel
    upstream: UpstreamClient | None
    worker: Worker
    router: Router
    pruner: Pruner
    replayer: Replayer
    ingest: IngestEndpoint
    access: Access
    admin: AdminPages | None
    supervisor: Supervisor
    links: LinkSource | None
    slack: Interactivity
    routing: bool = True  # False: an ingest worker (create_app)

    @classmethod
    def build(
        cls, settings: Settings, ruleset: rules.Ruleset | None, clock: Callable[[], float]
    ) -> _Parts:
        metrics = Metrics(registry.names())
        tracing.configure(settings.tracing, metrics)
        builtin = ruleset is None and settings.rules_file is None
        holder = RulesHolder(
            settings.rules, ruleset or reloader.initial_rules(settings), builtin=builtin
        )
        if (problem := slack.token_problem(holder(), settings)) is not None:
            raise ConfigError(problem)
        store = open_store(
            settings.db,
            synchronous=settings.synchronous,
            prepare_threshold=settings.db_prepare_threshold,
            clock=clock,
        )
        targets, webhooks, worker, upstream = _notify(settings, store, holder, metrics, clock)
        links = link_source(settings, store, clock)
        router = Router(
            store, holder, metrics=metrics, on_routed=worker.wake, clock=clock, links=links
        )
        pruner = Pruner(store, retention=settings.retention, metrics=metrics, clock=clock)
        store.on_accepted = router.wake
        store.on_cycle = metrics.store_cycle_seconds.observe
        ingest = IngestEndpoint(
            store=store,
            secrets=settings.secret_list,
            max_body=settings.max_body,
            metrics=metrics,
            max_event_age=settings.max_event_age,
            max_clock_skew=settings.max_clock_skew,
            clock=clock,
        )
        admin = None
        if settings.admin == "on":
            admin = AdminPages(
                store,
                rules=holder,
                router=router,
                accepted=metrics.accepted_total,
                webhooks=webhooks,
                wake_worker=worker.wake,
                clock=clock,
            )
        supervisor = Supervisor(metrics=metrics, unhealthy_after=settings.unhealthy_after)
        return cls(
            settings=settings,
            metrics=metrics,
            holder=holder,
            store=store,
            targets=targets,
            webhooks=webhooks,
            upstream=upstream,
            worker=worker,
            router=router,
            pruner=pruner,
            replayer=Replayer(store, wake_worker=worker.wake, clock=clock),
            ingest=ingest,
            access=Access(store, clock=clock),
            admin=admin,
            supervisor=supervisor,
            links=links,
            slack=_slack(settings, store, holder, metrics, links, worker.wake, clock),
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Open the store and start every loop; at the end, stop them within the grace."""
        settings, supervisor = self.settings, self.supervisor
        holder, metrics = self.holder, self.metrics
        app.state.loop = asyncio.get_running_loop()
        await self.store.open()
        supervisor.stopping = False
        if self.routing:
            supervisor.start("router", self.router.run)
            supervisor.start("timers", self.router.run_timers)
            supervisor.start("notify", self.worker.run)
            supervisor.start("retention", self.pruner.run)
            supervisor.start("webhook-replays", self.replayer.run)
        supervisor.start("rules-watch", lambda health: reloader.watch(holder, metrics, health))
        if self.admin is not None:
            supervisor.start("admin-strip", self.admin.sample)
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, holder.reload, metrics)
        _announce(settings, holder)
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
            await self.worker.stop(deadline - reserve - time.monotonic())
            await supervisor.stop()
            self.targets.close()
            if self.upstream is not None:
                await self.upstream.aclose()
            await self.webhooks.close()
            if tracing.on:  # the spans still buffered, within what is left of the grace
                await tracing.stop(max(0.0, deadline - reserve / 2 - time.monotonic()))
            await self.store.close()
            log.info("stopped in %.1fs; store closed", time.monotonic() - started)


def _announce(settings: Settings, holder: RulesHolder) -> None:
    """The start's log lines: where events are taken, the store, the rules in force."""
    if settings.using_dev_secret:
        log.warning(
            "NO RECEIVER_SECRETS SET: accepting deliveries signed with the public "
            "development secret. Not for production: set RECEIVER_SECRETS."
        )
    log.info(
        "receiving on http://%s:%d/v1/events; store %s; %s from %s",
        settings.host,
        settings.port,
        redact_url(settings.db),
        holder.current.counted,
        (
            f"the built-in rules (no {settings.rules}: every event to the console;"
            " `receiver init` writes a starter file)"
            if holder.builtin
            else settings.rules
        ),
    )


def _notify(
    settings: Settings,
    store: Store,
    holder: RulesHolder,
    metrics: Metrics,
    clock: Callable[[], float],
) -> tuple[Targets, WebhookChannel, Worker, Any]:
    """The outbox worker with its two channels (apprise targets, subscriber webhooks), and
    the upstream client its enrichment uses (None without an upstream)."""
    targets = Targets(timeout=settings.notify_timeout)
    webhooks = WebhookChannel(
        store,
        timeout=settings.webhook_timeout,
        delays=settings.webhook_delays,
        allow_private=settings.webhook_allow_private,
        allow_http=settings.webhook_allow_http,
        connections=settings.notify_concurrency,
        clock=clock,
        health=HealthPolicy(disable_after=settings.webhook_disable_after),
        max_rate=settings.webhook_max_rate,
    )
    enrich, upstream = _enricher(settings, store, holder)
    worker = Worker(
        store,
        targets,
        holder,
        metrics=metrics,
        concurrency=settings.notify_concurrency,
        backoff=Backoff(
            initial=settings.retry_initial,
            maximum=settings.retry_max,
            give_up=settings.retry_for,
        ),
        lease=max(settings.notify_timeout, settings.webhook_timeout) * 2 + 10,
        clock=clock,
        webhooks=webhooks,
        enrich=enrich,
        settings=settings,
        links=link_source(settings, store, clock),
    )
    return targets, webhooks, worker, upstream


def _enricher(
    settings: Settings, store: Store, holder: RulesHolder
) -> tuple[Callable[[OutboxRow], Awaitable[tuple[str, str] | None]] | None, UpstreamClient | None]:
    """The worker's enrichment (receiver.upstream.enrich) and its upstream client, when
    the upstream is configured; (None, None) otherwise."""
    from receiver.upstream import client_for
    from receiver.upstream.enrich import Enricher

    client = client_for(settings, store, timeout=settings.upstream_timeout)
    if client is None:
        return None, None
    enricher = Enricher(
        client, timeout=settings.upstream_timeout, links=link_source(settings, store)
    )

    async def enrich(row: OutboxRow) -> tuple[str, str] | None:
        return await enricher.texts(row, holder.current, store)

    return enrich, client


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


def _slack(
    settings: Settings,
    store: Store,
    holder: RulesHolder,
    metrics: Metrics,
    links: LinkSource | None,
    wake: Callable[[], None],
    clock: Callable[[], float],
) -> Interactivity:
    """POST /slack/interactivity: the Slack app's buttons (off without a signing secret)."""
    tokens = LinkSource(store, base=settings.public_url or "", ttl=settings.link_ttl, clock=clock)
    return Interactivity(
        store,
        signing_secret=settings.slack_signing_secret,
        messenger=slack.messenger(settings),
        links=tokens.get,
        link_source=links,
        rules=holder,
        metrics=metrics,
        max_body=settings.max_body,
        wake_worker=wake,
        clock=clock,
    )
