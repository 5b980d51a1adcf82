"""`receiver db migrate` and `receiver db copy`: the database on its own."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import click

from receiver.cli._common import db_option, echo, with_store
from receiver.errors import ReceiverError
from receiver.settings import env_prepare_threshold
from receiver.store import Store


@click.group()
def db() -> None:
    """The database: bring its schema up to date, or move a SQLite store to PostgreSQL."""


@db.command()
@db_option
def migrate(db: str) -> None:
    """Apply the schema migrations this version needs, and exit.

    `receiver serve` does the same at start, under a lock, so replicas starting together
    migrate once; this runs it on its own (before a rollout, say).

    Example:

        receiver db migrate --db postgresql://receiver:...@db:5432/receiver
    """

    async def version(store: Store) -> int:
        return store.schema_version

    found = with_store(db, version, create=True)
    echo(f"{_where(db)}: schema at version {found}, up to date")


@db.command()
@db_option
@click.option(
    "--to",
    "target",
    required=True,
    metavar="POSTGRESQL_URL",
    help="An empty PostgreSQL store: postgresql://user:password@host:port/db.",
)
def copy(db: str, target: str) -> None:
    """Copy a SQLite store (events, notifications, alert state, silences) into an empty
    PostgreSQL store, in one transaction, with its ids.

    Stop the receiver first: events it accepts during the copy stay behind. Then point
    RECEIVER_DB at the PostgreSQL URL and start the replicas.

    Example:

        receiver db copy --db ./data/receiver.db --to postgresql://receiver:...@db/receiver
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from receiver.store.copy import copy_to_postgres, count_rows

    if not target.startswith(("postgresql://", "postgres://")):
        raise click.BadParameter("must be a postgresql:// URL", param_hint="--to")
    if db.startswith(("postgresql://", "postgres://")):
        raise click.BadParameter("the source must be a SQLite file", param_hint="--db")
    source = db.removeprefix("sqlite:///")
    try:
        counts = count_rows(Path(source))
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),  # stdout keeps only the summary
        ) as bar:
            task = bar.add_task("copying", total=sum(counts.values()))

            def advance(table: str, rows: int) -> None:
                bar.update(task, advance=rows, description=f"copying {table}")

            copied = copy_to_postgres(
                Path(source), target, advance, prepare_threshold=env_prepare_threshold()
            )
    except (ReceiverError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:  # the database driver's errors: one line, no URL
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise click.ClickException(f"copy failed, nothing was copied: {first}") from exc
    summary = ", ".join(f"{n} {table}" for table, n in copied.items() if n)
    echo(f"copied {summary or 'nothing (the source is empty)'} to {_where(target)}")
    echo(f"next: RECEIVER_DB={_where(target, hide=True)} receiver serve")


def _where(url: str, *, hide: bool = False) -> str:
    """A database for output: a SQLite path, or a PostgreSQL URL without its password."""
    if not url.startswith(("postgresql://", "postgres://")):
        return url
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    secret = ":***" if parts.password and hide else ""
    if secret:
        user = f"{parts.username}{secret}@"
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{user}{host}{port}{parts.path}"
