"""What several commands share: the --db, --secret, --rules and event options, opening
the store, loading the rules as the server would."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from receiver import events
from receiver.errors import ConfigError, ReceiverError
from receiver.logs import escape
from receiver.settings import DEFAULT_RULES, env_prepare_threshold
from receiver.store import Store, open_store

if TYPE_CHECKING:
    from receiver import rules

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:4000/v1/events"


secret_option = click.option(
    "--secret",
    envvar="RECEIVER_SIGN_SECRET",
    help="Signing secret [RECEIVER_SIGN_SECRET, else the first of RECEIVER_SECRETS, "
    "else the development secret]. Never printed.",
)


def event_options(fn: Callable[..., Any]) -> Callable[..., Any]:
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


def build_body(
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


rules_option = click.option(
    "--rules",
    "rules_path",
    type=click.Path(path_type=Path),
    envvar="RECEIVER_RULES",
    help="Rules file [RECEIVER_RULES, else ./rules.yaml if it exists, else the built-in rules].",
)


no_env_option = click.option(
    "--no-env",
    is_flag=True,
    help="Do not read ${VAR} in notifier urls from the environment (no tokens needed); "
    "unset variables are treated so anyway.",
)


def load_rules(path: Path | None, *, no_env: bool = False) -> rules.Ruleset:
    """The rules `receiver serve` would load: path, else ./rules.yaml, else the built-in ones.

    Leniently: check and explain send nothing, so a ${VAR} in a notifier url that is
    unset (or, with no_env, any) is left unresolved instead of being an error; the
    notifier keeps its url count. env_notes() says which were left.
    """
    from receiver import rules  # the rules load every channel: only commands that read them

    if path is None and not DEFAULT_RULES.exists():
        return rules.load_builtin()
    try:
        return rules.load_file(path or DEFAULT_RULES, {} if no_env else None, lenient_env=True)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc


def env_notes(ruleset: rules.Ruleset, *, no_env: bool) -> list[str]:
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


db_option: Callable[[Callable[..., Any]], Callable[..., Any]] = click.option(
    "--db",
    envvar="RECEIVER_DB",
    default="./data/receiver.db",
    show_default=True,
    help="Database [RECEIVER_DB].",
)


def with_store(
    db: str, fn: Callable[[Store], Awaitable[T]], *, create: bool = False, **options: Any
) -> T:
    """fn(store) on the database db, opened for it; errors as one line ("Error: ...").

    Without create, a SQLite file that does not exist is an error, not a new database.
    options go to open_store; PostgreSQL's prepare_threshold defaults to
    RECEIVER_DB_PREPARE_THRESHOLD's, as the server's does.
    """
    missing = not db.startswith("postgres") and not Path(db.removeprefix("sqlite:///")).exists()
    if missing and not create:
        raise click.ClickException(f"no database at {db}; start `receiver serve` first")

    # fn's result is handed over here, not as the main task's: Python 3.11's asyncio.run
    # formats that task, result and all, when it puts the Ctrl-C handler back (in
    # signal._int_to_enum), and a week's backtest result took 4 s to format.
    result: list[T] = []
    if "prepare_threshold" not in options:
        try:
            options["prepare_threshold"] = env_prepare_threshold()
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from exc

    async def run() -> None:
        store = open_store(db, **options)
        await store.open()
        try:
            result.append(await fn(store))
        finally:
            await store.close()

    try:
        asyncio.run(run())
    except ReceiverError as exc:
        raise click.ClickException(str(exc)) from exc
    return result[0]


def when(ts: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(ts))


def echo(line: str = "", *, err: bool = False) -> None:
    """click.echo of one line with control characters escaped, as logs.escape does: values
    that came with an event (an id can carry a newline, or an ESC sequence that sets the
    window title or clears the screen) can neither drive the terminal nor start a line."""
    click.echo(escape(line), err=err)


def echo_lines(lines: Iterable[str], *, err: bool = False) -> None:
    """echo() each of lines: a table or a report built line by line."""
    click.echo("\n".join(escape(line) for line in lines), err=err)
