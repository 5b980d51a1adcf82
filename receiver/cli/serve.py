"""`receiver serve`: settings from flags and RECEIVER_*, then the app under uvicorn."""

from __future__ import annotations

import asyncio
import errno
import socket
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from receiver.cli._common import (
    with_store,
)
from receiver.cli._server import server_config
from receiver.errors import ConfigError
from receiver.settings import SENDER_SCHEDULE, Settings


@click.command()
@click.option("--host", help="Listen address [RECEIVER_HOST, 127.0.0.1].")
@click.option("--port", type=int, help="Listen port [RECEIVER_PORT, 4000].")
@click.option("--db", help="SQLite file or postgresql:// URL [RECEIVER_DB, ./data/receiver.db].")
@click.option(
    "--rules",
    "rules_path",
    type=click.Path(path_type=Path),
    help="Rules file; must exist [RECEIVER_RULES, else ./rules.yaml if it exists, "
    "else the built-in rules].",
)
@click.option("--max-body", type=int, help="Largest body in bytes [RECEIVER_MAX_BODY, 65536].")
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), help="[RECEIVER_LOG_FORMAT, text]"
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="[RECEIVER_LOG_LEVEL, info]",
)
@click.option(
    "--synchronous",
    type=click.Choice(["full", "normal"]),
    help="SQLite durability [RECEIVER_SYNCHRONOUS, full].",
)
@click.option(
    "--db-prepare-threshold",
    metavar="N|off",
    help="PostgreSQL: runs of a statement on a connection before it is prepared there; off"
    " never prepares (behind PgBouncer in transaction mode) [RECEIVER_DB_PREPARE_THRESHOLD, 5].",
)
@click.option(
    "--max-event-age",
    help="Refuse events older than this; 0 = no limit [RECEIVER_MAX_EVENT_AGE, 7d].",
)
@click.option(
    "--max-clock-skew",
    help="Refuse events dated further ahead of this clock; 0 = no limit "
    "[RECEIVER_MAX_CLOCK_SKEW, 5m].",
)
@click.option("--header-timeout", help="Longest wait for headers [RECEIVER_HEADER_TIMEOUT, 10s].")
@click.option("--body-timeout", help="Longest wait for a body [RECEIVER_BODY_TIMEOUT, 10s].")
@click.option(
    "--limit-concurrency",
    type=int,
    help="Connections at once before answering 503; 0 = no limit "
    "[RECEIVER_LIMIT_CONCURRENCY, 1000].",
)
@click.option("--notify-timeout", help="Longest one send may take [RECEIVER_NOTIFY_TIMEOUT, 10s].")
@click.option(
    "--shutdown-grace",
    help="From SIGTERM to exit, at most [RECEIVER_SHUTDOWN_GRACE, 10s].",
)
@click.option(
    "--notify-concurrency",
    type=int,
    help="Sends in flight at once to any one target [RECEIVER_NOTIFY_CONCURRENCY, 8].",
)
@click.option(
    "--retry-initial",
    help="First retry delay of a failed send; doubles each time [RECEIVER_RETRY_INITIAL, 30s].",
)
@click.option("--retry-max", help="Longest delay between retries [RECEIVER_RETRY_MAX, 1h].")
@click.option(
    "--retry-for",
    help="A send still failing this long after it was queued is dead [RECEIVER_RETRY_FOR, 24h].",
)
@click.option(
    "--retention",
    help="Prune events received longer ago than this; at least 10h36m [RECEIVER_RETENTION, 30d].",
)
@click.option(
    "--webhook-timeout",
    help="Longest one delivery to a subscriber may take [RECEIVER_WEBHOOK_TIMEOUT, 10s].",
)
@click.option(
    "--webhook-schedule",
    help=f"Delays between a subscriber's attempts [RECEIVER_WEBHOOK_SCHEDULE, {SENDER_SCHEDULE}].",
)
@click.option(
    "--webhook-disable-after",
    help="Disable a subscriber failing this long [RECEIVER_WEBHOOK_DISABLE_AFTER, 3d].",
)
@click.option(
    "--webhook-max-rate",
    help="Highest rateLimit a subscription may ask, a second [RECEIVER_WEBHOOK_MAX_RATE, 1000].",
)
@click.option(
    "--webhook-allow-private/--no-webhook-allow-private",
    default=None,
    help="Let subscribers be loopback or private addresses [RECEIVER_WEBHOOK_ALLOW_PRIVATE].",
)
@click.option(
    "--webhook-allow-http/--no-webhook-allow-http",
    default=None,
    help="Let subscribers use plain http [RECEIVER_WEBHOOK_ALLOW_HTTP].",
)
@click.option(
    "--webhooks-per-key",
    type=int,
    help="Subscriptions one API key may make [RECEIVER_WEBHOOKS_PER_KEY, 100].",
)
@click.option(
    "--tracing",
    type=click.Choice(["auto", "on", "off"]),
    help="OpenTelemetry traces: auto is on when OTEL_EXPORTER_OTLP_ENDPOINT is set"
    " [RECEIVER_TRACING, auto].",
)
@click.option(
    "--admin",
    type=click.Choice(["on", "off"]),
    help="The admin page at /admin; off removes it [RECEIVER_ADMIN, on].",
)
@click.option(
    "--upstream-url",
    help="The upstream service's base URL, ending in /v1 [RECEIVER_UPSTREAM_URL]."
    " The key comes only from RECEIVER_UPSTREAM_KEY.",
)
@click.option(
    "--upstream-plan",
    type=click.Choice(["free", "pro", "enterprise"]),
    help="Our plan upstream: 60, 600 or unlimited requests a minute"
    " [RECEIVER_UPSTREAM_PLAN, free].",
)
@click.option(
    "--upstream-timeout",
    help="Longest a notification waits for enrichment [RECEIVER_UPSTREAM_TIMEOUT, 2s].",
)
@click.option(
    "--public-url",
    help="The receiver's address as users reach it; turns on one-click action links"
    " [RECEIVER_PUBLIC_URL].",
)
@click.option(
    "--link-ttl",
    help="How long an action link works [RECEIVER_LINK_TTL, 24h].",
)
@click.option(
    "--slack-api-url",
    help="Slack's Web API address, for a proxy [RECEIVER_SLACK_API_URL, https://slack.com/api/]."
    " The bot token and signing secret come only from RECEIVER_SLACK_BOT_TOKEN and"
    " RECEIVER_SLACK_SIGNING_SECRET.",
)
@click.option(
    "--unhealthy-after",
    help="A background loop failing this long makes /healthz answer 503"
    " [RECEIVER_UNHEALTHY_AFTER, 60s].",
)
@click.option(
    "--ntfy-sequence",
    type=click.Choice(["on", "off"]),
    help="ntfy sequence ids: one phone notification per alert episode (ntfy 2.16+);"
    " off for older servers [RECEIVER_NTFY_SEQUENCE, on].",
)
@click.option(
    "--workers",
    type=int,
    help="Processes serving the port, each the whole receiver on the one database; a"
    " worker that dies is restarted. Needs --admin off [RECEIVER_WORKERS, 1].",
)
def serve(rules_path: Path | None, **flags: Any) -> None:
    """Serve the whole receiver on one port.

    \b
    POST /v1/events      the signed deliveries (no API key)
    /v1/...              the API, with a Bearer key: /v1/sessions, /v1/scores,
                         /v1/webhooks (subscriptions), /v1/alerts (ack,
                         resolve, snooze), /v1/silences,
                         /v1/events/ID/explain, and /v1/openapi.json (no key)
    /admin               the admin page (unless --admin off)
    /act/TOKEN           the one-click action links (with --public-url)
    /slack/interactivity the Slack app's buttons (RECEIVER_SLACK_SIGNING_SECRET)
    /healthz, /readyz,   the operational endpoints
    /metrics

    Every flag has a RECEIVER_* environment variable; a flag wins. Signing
    secrets come only from RECEIVER_SECRETS, never from a flag, so they stay
    out of shell history and process listings. Without RECEIVER_SECRETS the
    public development secret is accepted, on a loopback address only: on any
    other address the server refuses to start (exit 2).

    Without RECEIVER_RULES and without ./rules.yaml, the built-in rules send
    every event to the console; `receiver init` writes them to a file to edit.

    With --workers N (RECEIVER_WORKERS), the port is bound once and N worker
    processes serve it, each the whole receiver on the same database (a file, or
    PostgreSQL); the admin page must be off. See "Several worker processes" in
    docs/operations.md for what is shared and what is per process.

    Example:

        RECEIVER_SECRETS=s3cret receiver serve --port 4000 --log-format json
    """
    from receiver import logs
    from receiver.app import create_app

    if rules_path is not None:
        flags["rules"] = rules_path
    try:
        settings = Settings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        problems = [_setting_problem(e) for e in exc.errors(include_url=False)]
        raise click.ClickException("invalid settings: " + "; ".join(problems)) from None
    try:
        settings.check_exposure()  # before anything binds
        settings.check_workers()
    except ConfigError as exc:
        raise _RefusedError(str(exc)) from exc
    logs.configure(settings.log_format, settings.log_level)
    try:
        app = create_app(settings)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    # A database that cannot be opened, or a port in use, is one line and exit 1, found
    # before the server starts: not a traceback, and nothing logged as if it were running.
    with_store(
        settings.db,
        lambda store: asyncio.sleep(0),
        create=True,
        prepare_threshold=settings.db_prepare_threshold,
    )
    sockets = _listen(settings.host, settings.port)
    if settings.workers > 1:
        from receiver.cli._workers import Workers

        given = {k: v for k, v in flags.items() if v is not None}
        raise SystemExit(Workers(given, settings, sockets).run())
    from receiver.edge.http import Server

    def stopping(since: float) -> None:
        app.state.shutdown_started = since

    Server(server_config(app, settings), grace=settings.shutdown_grace, on_stopping=stopping).run(
        sockets
    )


def _setting_problem(error: Any) -> str:
    """A settings validation error in our words: 'RECEIVER_PORT (--port): must be ...'."""
    name = "_".join(map(str, error["loc"]))
    message = str(error["msg"]).removeprefix("Value error, ")
    message = message.replace("Input should be", "must be").replace("input should be", "must be")
    if error["type"] in ("int_parsing", "float_parsing"):
        message = f"must be a number, got {str(error.get('input'))[:40]!r}"
    flag = name.replace("_", "-")
    return f"RECEIVER_{name.upper()} (--{flag}): {message[:1].lower()}{message[1:]}"


def _listen(host: str, port: int) -> list[socket.socket]:
    """The listening sockets for host:port, bound now, as asyncio would bind them (every
    address host resolves to). uvicorn then serves on them once the app has started."""
    try:
        found = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        reason = (exc.strerror or str(exc)).lower()
        hint = " (is another server running there? choose another with --port)"
        raise click.ClickException(
            f"cannot listen on {host}:{port}: {reason}"
            + (hint if exc.errno == errno.EADDRINUSE else "")
        ) from None
    return sockets


class _RefusedError(click.ClickException):
    """Settings that must not run (exit 2, like a usage error): "Error: ..." on stderr."""

    exit_code = 2
