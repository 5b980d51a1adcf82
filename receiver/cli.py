"""The `receiver` command: serve, init, sign, send, check, explain, deliveries, retry, replay."""

from __future__ import annotations

import asyncio
import errno
import json
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import httpx
from pydantic import ValidationError

from receiver import __version__, events, rules, signature
from receiver.errors import ConfigError, ReceiverError
from receiver.settings import DEFAULT_RULES, Settings, signing_secret
from receiver.store import Store, open_store
from receiver.store.base import OUTBOX_STATES

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:4000/v1/events"


@click.group()
@click.version_option(__version__, prog_name="attention-receiver")
def cli() -> None:
    """attention-receiver: verify, keep and route the Attention Scoring Service's webhooks.

    Example:

        receiver serve                      # 127.0.0.1:4000, SQLite in ./data
        receiver init                       # write a starter rules.yaml to edit
        receiver send --type score.drop     # sign a sample event and POST it
    """


# -- serve ----------------------------------------------------------------------------------


@cli.command()
@click.option("--host", help="Listen address [RECEIVER_HOST, 127.0.0.1].")
@click.option("--port", type=int, help="Listen port [RECEIVER_PORT, 4000].")
@click.option("--db", help="SQLite file [RECEIVER_DB, ./data/receiver.db].")
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
@click.option(
    "--notify-timeout", help="Longest one send may take [RECEIVER_NOTIFY_TIMEOUT, 10s]."
)
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
def serve(rules_path: Path | None, **flags: Any) -> None:
    """Serve POST /v1/events, /healthz, /readyz and /metrics.

    Every flag has a RECEIVER_* environment variable; a flag wins. Signing
    secrets come only from RECEIVER_SECRETS, never from a flag, so they stay
    out of shell history and process listings. Without RECEIVER_SECRETS the
    public development secret is accepted, on a loopback address only: on any
    other address the server refuses to start (exit 2).

    Without RECEIVER_RULES and without ./rules.yaml, the built-in rules send
    every event to the console; `receiver init` writes them to a file to edit.

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
    except ConfigError as exc:
        raise _RefusedError(str(exc)) from exc
    logs.configure(settings.log_format, settings.log_level)
    try:
        app = create_app(settings)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    # A database that cannot be opened, or a port in use, is one line and exit 1, found
    # before the server starts: not a traceback, and nothing logged as if it were running.
    _with_store(settings.db, lambda store: asyncio.sleep(0), create=True)
    sockets = _listen(settings.host, settings.port)
    from receiver.http import Server

    def stopping(since: float) -> None:
        app.state.shutdown_started = since

    Server(
        server_config(app, settings), grace=settings.shutdown_grace, on_stopping=stopping
    ).run(sockets)


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


def server_config(app: Any, settings: Settings) -> Any:
    """The uvicorn settings `receiver serve` runs with (the bench's ceiling uses them too)."""
    import uvicorn

    from receiver.http import guarded_protocol

    metrics = getattr(getattr(app, "state", None), "metrics", None)
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        # Requests in flight get half the shutdown grace; sends in flight what is left.
        # (Typed int, but uvicorn only hands it to asyncio.wait_for: a float is fine.)
        timeout_graceful_shutdown=settings.shutdown_grace / 2,  # type: ignore[arg-type]
        server_header=False,
        limit_concurrency=settings.limit_concurrency or None,
        http=guarded_protocol(
            header_timeout=settings.header_timeout,
            body_timeout=settings.body_timeout,
            on_refused=(lambda code: metrics.rejected[code].inc()) if metrics else None,
        ),
    )


# -- sign and send --------------------------------------------------------------------------


_secret_option = click.option(
    "--secret",
    envvar="RECEIVER_SIGN_SECRET",
    help="Signing secret [RECEIVER_SIGN_SECRET, else the first of RECEIVER_SECRETS, "
    "else the development secret]. Never printed.",
)


@cli.command()
@click.argument("file", type=click.File("rb"), default="-")
@_secret_option
def sign(file: Any, secret: str | None) -> None:
    """Print the X-Service-Signature header for the body in FILE (default: stdin).

    Example:

        receiver sign event.json
        curl -H "$(receiver sign event.json)" --data-binary @event.json localhost:4000/v1/events
    """
    body = file.read()
    click.echo(f"{signature.SIGNATURE_HEADER}: {signature.sign(signing_secret(secret), body)}")


def _event_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "--type",
            "kind",
            type=click.Choice(events.EVENT_TYPES),
            default="score.drop",
            show_default=True,
            help="Event type.",
        ),
        click.option("--id", "event_id", help="Event id [random evt_...]."),
        click.option("--session", "sessionId", help="sessionId [sess_demo]."),
        click.option("--user", "userId", help="userId [user_42]."),
        click.option("--score", type=float, help="score [22 for a drop, 61 for a recover]."),
        click.option("--threshold", type=float, help="threshold [40]."),
        click.option("--timestamp", help="ISO 8601 UTC timestamp [now]."),
        click.option(
            "--field",
            "fields",
            multiple=True,
            metavar="KEY=VALUE",
            help="Any other field; VALUE is JSON if it parses, else a string. Repeatable.",
        ),
        click.option(
            "--file",
            "from_file",
            type=click.File("rb"),
            help="Use this JSON body as is instead of building one ('-' for stdin).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _build_body(
    kind: str, event_id: str | None, fields: tuple[str, ...], from_file: Any, **values: Any
) -> bytes:
    if from_file is not None:
        return bytes(from_file.read())
    extra: dict[str, Any] = {}
    for item in fields:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--field")
        try:
            extra[key] = json.loads(raw)
        except ValueError:
            extra[key] = raw
    for key in ("score", "threshold"):
        if values.get(key) is not None and float(values[key]).is_integer():
            values[key] = int(values[key])
    event = events.sample(kind, id=event_id, **values)
    event.update(extra)
    return json.dumps(event).encode()


@cli.command()
@_event_options
@click.option(
    "--url",
    envvar="RECEIVER_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Where to POST [RECEIVER_URL].",
)
@_secret_option
@click.option("--unsigned", is_flag=True, help="Send without a signature header (to test 401).")
def send(url: str, secret: str | None, unsigned: bool, **event_args: Any) -> None:
    """Sign a sample event and POST it; print the status and the answer.

    Exits 1 unless the answer is 2xx.

    Example:

        receiver send --type score.drop --id evt_1 --score 12 --field context=checkout
    """
    body = _build_body(**event_args)
    headers = {"content-type": "application/json"}
    if not unsigned:
        headers[signature.SIGNATURE_HEADER] = signature.sign(signing_secret(secret), body)
    try:
        response = httpx.post(url, content=body, headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from exc
    click.echo(f"{response.status_code} {response.text}")
    if not response.is_success:
        sys.exit(1)


# -- rules ----------------------------------------------------------------------------------

_rules_option = click.option(
    "--rules",
    "rules_path",
    type=click.Path(path_type=Path),
    envvar="RECEIVER_RULES",
    help="Rules file [RECEIVER_RULES, else ./rules.yaml if it exists, else the built-in rules].",
)


_no_env_option = click.option(
    "--no-env",
    is_flag=True,
    help="Do not read ${VAR} in notifier urls from the environment (no tokens needed); "
    "unset variables are treated so anyway.",
)


def _load_rules(path: Path | None, *, no_env: bool = False) -> rules.Ruleset:
    """The rules `receiver serve` would load: path, else ./rules.yaml, else the built-in ones.

    Leniently: check and explain send nothing, so a ${VAR} in a notifier url that is
    unset (or, with no_env, any) is left unresolved instead of being an error; the
    notifier keeps its url count. _env_notes() says which were left.
    """
    if path is None and not DEFAULT_RULES.exists():
        return rules.load_builtin()
    try:
        return rules.load_file(path or DEFAULT_RULES, {} if no_env else None, lenient_env=True)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc


def _env_notes(ruleset: rules.Ruleset, *, no_env: bool) -> list[str]:
    """Notes (not errors) naming the variables the rules were loaded without."""
    unresolved = ruleset.unresolved_env
    if not unresolved:
        return []
    names = ", ".join(
        f"{var} ({', '.join(notifiers)})" for var, notifiers in sorted(unresolved.items())
    )
    why = "not read (--no-env)" if no_env else "not set"
    return [
        f"note: environment variables {why}: {names}; their urls were not checked."
        " Not needed here; `receiver serve` refuses to start without them."
    ]


@cli.command()
@click.argument("path", type=click.Path(path_type=Path), required=False)
@_rules_option
@_no_env_option
def check(path: Path | None, rules_path: Path | None, no_env: bool) -> None:
    """Validate a rules file with the server's own loader; exit 1 on any problem.

    Without PATH, --rules and RECEIVER_RULES it checks ./rules.yaml, or, if
    there is none, says that `receiver serve` would use the built-in rules.

    Notifier urls need no tokens here: a ${VAR} that is not set (any, with
    --no-env) is noted, not an error, and its url is not checked; `receiver
    serve` does need them.

    Example:

        receiver check rules.yaml
    """
    ruleset = _load_rules(path or rules_path, no_env=no_env)
    if ruleset.source == rules.BUILTIN_SOURCE:
        click.echo(
            f"no {DEFAULT_RULES} and no RECEIVER_RULES: `receiver serve` would use the"
            " built-in rules below (`receiver init` writes them to rules.yaml)"
        )
    click.echo(f"{ruleset.source}: OK")
    click.echo(ruleset.summary())
    for note in _env_notes(ruleset, no_env=no_env):
        click.echo(note)


@cli.command()
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False), default=str(DEFAULT_RULES))
def init(path: Path) -> None:
    """Write a commented starter rules file to PATH (default ./rules.yaml).

    It sends every event to the console, like the built-in rules, and lists
    notifiers to uncomment (Slack, email, Teams, Discord, Telegram, ntfy,
    PagerDuty, any HTTPS endpoint). An existing file is never overwritten.

    Example:

    \b
        receiver init
        receiver check
    """
    text = rules.starter_text()
    try:
        with path.open("x", encoding="utf-8") as out:
            out.write(text)
    except FileExistsError:
        raise click.ClickException(
            f"{path} already exists; not overwriting it (move it away, or give another PATH)"
        ) from None
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        raise click.ClickException(f"cannot write {path}: {reason}") from exc
    count = len(rules.load_builtin().rules)
    click.echo(f"wrote {path}: {count} rules, every event to the console")
    if path.resolve() == DEFAULT_RULES.resolve():
        click.echo(
            "next: edit it, run `receiver check`, then `receiver serve` (a server"
            " already running here on the built-in rules switches to it at once)"
        )
    else:
        click.echo(
            f"next: edit it, run `receiver check {path}`, then"
            f" `receiver serve --rules {path}` (or RECEIVER_RULES={path})"
        )


@cli.command()
@_event_options
@_rules_option
@_no_env_option
@click.option(
    "--db",
    envvar="RECEIVER_DB",
    default="./data/receiver.db",
    show_default=True,
    help="Database to read silences and alert state from, if it exists.",
)
def explain(rules_path: Path | None, no_env: bool, db: str, **event_args: Any) -> None:
    """Show what the rules would do with an event, without sending anything.

    Which rules match, which condition failed for the others, the rendered
    title and body, and the notifiers by name (a notifier with two urls is two
    notifications). For an event that closes an alert (score.recover,
    session.stopped, intervention.resolved), also the resolved messages it
    sends if the alert is open. Then what the alert lifecycle would do with it
    now, from the database: stale, silenced, muted or deferred, held, grouped,
    resolved and repeated. Needs no tokens: see `receiver check --help`.

    Example:

    \b
        receiver explain --type score.drop --score 12 --user user_42
        receiver explain --type score.recover --session sess_1
        receiver explain --file event.json
    """
    ruleset = _load_rules(rules_path, no_env=no_env)
    body = _build_body(**event_args)
    try:
        event = events.parse(body)
    except ReceiverError as exc:
        raise click.ClickException(f"not a valid event: {exc}") from exc
    payload = event.payload()
    click.echo(ruleset.explain(payload).format())
    for note in _env_notes(ruleset, no_env=no_env):
        click.echo(note)
    lines = _lifecycle_now(ruleset, payload, db)
    if lines:
        click.echo("now:")
        for line in lines:
            click.echo(f"  {line}")


def _lifecycle_now(ruleset: rules.Ruleset, payload: dict[str, Any], db: str) -> list[str]:
    from receiver import lifecycle

    now = time.time()
    silences: list[Any] = []
    alert = None
    notified: list[str] = []
    if Path(db).exists():
        aid = lifecycle.alert_id(payload)

        def read(tx: Any) -> tuple[list[Any], Any, list[str]]:
            alert = tx.alert(aid) if aid else None
            notified: list[str] = []
            if alert is not None and alert.state == "open":
                notified = [
                    n.rule
                    for n in tx.notices(alert.id, alert.episode)
                    if tx.sent(alert.id, alert.episode, n.rule)
                ]
            return tx.silences(now), alert, notified

        silences, alert, notified = _with_store(db, lambda s: s.transact(read))
    return lifecycle.explain_now(
        ruleset, payload, now, silences=silences, alert=alert, notified=notified
    )


# -- the outbox -----------------------------------------------------------------------------

_db_option: Callable[[Callable[..., Any]], Callable[..., Any]] = click.option(
    "--db",
    envvar="RECEIVER_DB",
    default="./data/receiver.db",
    show_default=True,
    help="Database [RECEIVER_DB].",
)


def _with_store(db: str, fn: Callable[[Store], Awaitable[T]], *, create: bool = False) -> T:
    """fn(store) on the database db, opened for it; errors as one line ("Error: ...").

    Without create, a SQLite file that does not exist is an error, not a new database.
    """
    missing = not db.startswith("postgres") and not Path(db.removeprefix("sqlite:///")).exists()
    if missing and not create:
        raise click.ClickException(f"no database at {db}; start `receiver serve` first")

    async def run() -> T:
        store = open_store(db)
        await store.open()
        try:
            return await fn(store)
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    except ReceiverError as exc:
        raise click.ClickException(str(exc)) from exc


def _when(ts: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(ts))


@cli.command()
@_db_option
@click.option(
    "--state",
    type=click.Choice(OUTBOX_STATES),
    help="Only rows in this state.",
)
@click.option("--event", "event_id", help="Only rows of this event id.")
@click.option("--limit", type=int, default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
def deliveries(db: str, state: str | None, event_id: str | None, limit: int, as_json: bool) -> None:
    """List recent notifications, newest first. Names notifiers, never their URLs.

    Example:

        receiver deliveries --state dead
    """
    rows = _with_store(db, lambda s: s.deliveries(state=state, event_id=event_id, limit=limit))
    if as_json:
        for row in rows:
            click.echo(json.dumps(row.__dict__))
        return
    if not rows:
        click.echo("no deliveries match")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("id", "event", "rule", "notifier", "state", "tries", "updated", "detail")
    for row in rows:
        table.add_row(
            str(row.id),
            row.event_id,
            row.rule,
            row.label,
            row.state,
            str(row.attempts),
            _when(row.updated_at),
            row.last_error or row.reason or "",
        )
    Console(width=max(120, Console().width)).print(table)


@cli.command()
@_db_option
@click.argument("row_id", type=int, required=False)
@click.option("--all-dead", is_flag=True, help="Retry every dead row.")
def retry(db: str, row_id: int | None, all_dead: bool) -> None:
    """Send a dead notification again (its id from `receiver deliveries`), or all of them.

    A running server picks the rows up within a few seconds.

    Example:

        receiver retry 17
        receiver retry --all-dead
    """
    if (row_id is None) == (not all_dead):
        raise click.UsageError("give a row id or --all-dead (not both)")
    n = _with_store(db, lambda s: s.retry_dead(row_id, now=time.time()))
    if row_id is not None and n == 0:
        raise click.ClickException(f"no dead delivery with id {row_id}")
    click.echo(f"{n} notification(s) queued again")


REPLAY_WAIT = "10s"  # how long `receiver replay` waits for the running server by default
_SETTLED = ("pending", "sending")  # rows still on their way: worth waiting for


@cli.command()
@_db_option
@click.argument("event_id")
@click.option(
    "--respect-lifecycle",
    is_flag=True,
    help="Apply the usual checks (stale, silenced, muted, grouped, throttled, held) "
    "instead of sending regardless.",
)
@click.option(
    "--wait",
    "wait_for",
    default=REPLAY_WAIT,
    show_default=True,
    help="How long to wait for the running server to route and send it; 0: do not wait.",
)
def replay(db: str, event_id: str, respect_lifecycle: bool, wait_for: str) -> None:
    """Route a stored event again through the current rules: it notifies again.

    A replay is an operator's deliberate act, so its notifications are sent
    whatever the alert lifecycle would say (stale, silenced, muted, grouped,
    throttled, held), each marked as a replay: "[replay] " before the title,
    and the outbox row's `replay` column. With --respect-lifecycle the usual
    checks apply. An event that resolved its alert, while the alert is still as
    it left it, sends its resolved messages again. The alert is not changed.

    The running server routes it within a few seconds; this command waits up to
    --wait, then prints each notification: sent, queued (and why not yet), or
    not sent and why. Exit status 0 once routed (whatever was sent), 1 if there
    is no such event, 3 if no running server routed it within --wait: it stays
    queued and is routed when a server starts.

    Example:

    \b
        receiver replay evt_1
        receiver replay evt_1 --respect-lifecycle
    """
    try:
        seconds = float(wait_for)
    except ValueError:
        try:
            seconds = rules.parse_duration(wait_for.strip())
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--wait") from None

    async def run(store: Store) -> tuple[int | None, Any, list[Any]]:
        replay_id = await store.replay(
            event_id, now=time.time(), respect_lifecycle=respect_lifecycle
        )
        if replay_id is None:
            return None, None, []
        deadline = time.monotonic() + seconds
        while True:
            request, rows = await store.replay_status(replay_id)
            routed = request is not None and request.routed_at is not None
            if routed and not any(row.state in _SETTLED for row in rows):
                return replay_id, request, rows
            if time.monotonic() >= deadline:
                return replay_id, request, rows
            await asyncio.sleep(0.1)

    replay_id, request, rows = _with_store(db, run)
    if replay_id is None:
        raise click.ClickException(f"no stored event with id {event_id!r}")
    how = "respecting the lifecycle" if respect_lifecycle else "sent regardless of the lifecycle"
    if request is None or request.routed_at is None:
        if seconds <= 0:
            click.echo(
                f"replay #{replay_id} of {event_id} queued ({how}); not waiting:"
                f" `receiver deliveries --event {event_id}` shows what it sends"
            )
            return
        click.echo(
            f"replay #{replay_id} of {event_id} queued; no running server routed it within"
            f" {seconds:g}s: it will be routed when one starts"
        )
        sys.exit(3)
    if not rows:
        click.echo(
            f"replay #{replay_id} of {event_id}: no rule gives it a notification now;"
            " nothing sent"
        )
        return
    count = len(rows)
    click.echo(
        f"replay #{replay_id} of {event_id} ({how}):"
        f" {count} notification{'s' if count != 1 else ''}"
    )
    for row in rows:
        click.echo("  " + _replay_line(row))


def _replay_line(row: Any) -> str:
    """One outbox row of a replay: what happened to it, and why when it was not sent."""
    target = f"{row.rule} -> {row.label}"
    if row.kind != "event":
        target += f" ({row.kind})"
    if row.state == "delivered":
        return f"sent      {target}: {row.title}"
    if row.state in _SETTLED:
        retrying = f" (retrying: {row.last_error})" if row.last_error else " (not sent yet)"
        return f"queued    {target}: {row.title}{retrying}"
    if row.state == "dead":
        return f"failed    {target}: {row.last_error or 'gave up'}"
    if row.state == "held":
        return f"held      {target}: {row.reason}"
    reason = row.reason or row.state
    why = reason if reason.startswith(row.state) else f"{row.state}: {reason}"
    return f"not sent  {target}: {why}"


from receiver.simulate import simulate as _simulate  # noqa: E402

cli.add_command(_simulate)

from receiver.cli_alerts import alerts as _alerts  # noqa: E402
from receiver.cli_alerts import silence as _silence  # noqa: E402

cli.add_command(_alerts)
cli.add_command(_silence)

from receiver.cli_db import db as _db  # noqa: E402

cli.add_command(_db)
