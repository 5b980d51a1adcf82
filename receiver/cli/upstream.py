"""`receiver upstream register|status|sync`: the upstream service (RECEIVER_UPSTREAM_URL,
RECEIVER_UPSTREAM_KEY, RECEIVER_UPSTREAM_PLAN), from this side."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from receiver.cli._common import db_option, echo, with_store
from receiver.events import EVENT_TYPES
from receiver.settings import Settings
from receiver.store import Store
from receiver.upstream import client_for
from receiver.upstream.client import UpstreamClient

T = TypeVar("T")


def _settings() -> Settings:
    try:
        settings = Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"RECEIVER_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise click.ClickException(f"invalid settings: {problems}") from None
    if not settings.upstream_configured:
        raise click.ClickException(
            "the upstream is not configured: set RECEIVER_UPSTREAM_URL (its base URL, ending"
            " in /v1) and RECEIVER_UPSTREAM_KEY (an API key there), and RECEIVER_UPSTREAM_PLAN"
            " to your plan (free, pro or enterprise)"
        )
    return settings


def _with_client(db: str, fn: Callable[[UpstreamClient, Store], Awaitable[T]]) -> T:
    """fn(client, store): the client draws on the store's shared budget."""
    settings = _settings()

    async def run(store: Store) -> T:
        client = client_for(settings, store)
        assert client is not None
        async with client:
            return await fn(client, store)

    return with_store(db, run, create=True)


@click.group()
def upstream() -> None:
    """The upstream service: register this receiver there, check the key, backfill sessions.

    Set RECEIVER_UPSTREAM_URL (the service's base URL, ending in /v1),
    RECEIVER_UPSTREAM_KEY and RECEIVER_UPSTREAM_PLAN (free 60, pro 600, enterprise
    unlimited requests a minute). Every request, from these commands and from the
    server's enrichment, draws on one budget kept in the database, shared by replicas.
    """


@upstream.command()
@db_option
@click.option(
    "--url", required=True, help="Our ingest address as the service reaches it (…/v1/events)."
)
@click.option(
    "--events",
    "kinds",
    default=",".join(EVENT_TYPES),
    show_default=True,
    help="Comma-separated event names to receive.",
)
@click.option("--threshold", type=float, help="Score threshold for score.drop / score.recover.")
@click.option("--json", "as_json", is_flag=True, help="The registration as JSON (secret included).")
def register(db: str, url: str, kinds: str, threshold: float | None, as_json: bool) -> None:
    """Register this receiver's endpoint upstream (POST /v1/webhooks).

    When the service answers with a signing secret, it is printed once, with the
    RECEIVER_SECRETS line to add (keep the old secret beside it during a rotation).

    Example:

        receiver upstream register --url https://alerts.example.com/v1/events --threshold 40
    """
    events = [e.strip() for e in kinds.split(",") if e.strip()]
    unknown = [e for e in events if e not in EVENT_TYPES]
    if unknown or not events:
        raise click.BadParameter(
            f"unknown event {unknown[0]!r}; choose from {', '.join(EVENT_TYPES)}"
            if unknown
            else "name at least one event",
            param_hint="--events",
        )

    async def go(client: UpstreamClient, store: Store) -> dict[str, Any]:
        return await client.register(url, events, threshold)

    made = _with_client(db, go)
    if as_json:
        echo(json.dumps(made))
        return
    echo(f"registered {made.get('id', '(no id)')}: {url} for {', '.join(events)}")
    secret = made.get("secret")
    if isinstance(secret, str) and secret:
        echo("The service signs deliveries with this secret; it is shown only now:")
        echo(f"RECEIVER_SECRETS={secret}")
        echo("(during a rotation, list it first and the old secret after a comma)", err=True)
    else:
        echo(
            "The service did not return a signing secret: set RECEIVER_SECRETS to the one"
            " its dashboard shows."
        )


@upstream.command()
@db_option
def status(db: str) -> None:
    """Check that the upstream answers and accepts the key (one GET /v1/sessions?limit=1).

    Exits 1, saying why, when it cannot be reached or refuses the key.

    Example:

        receiver upstream status
    """
    settings = _settings()

    async def go(client: UpstreamClient, store: Store) -> tuple[dict[str, Any], float]:
        began = time.perf_counter()
        page = await client.sessions(limit=1)
        return page, time.perf_counter() - began

    page, took = _with_client(db, go)
    echo(f"upstream {settings.upstream_url}: reachable, key accepted ({took * 1000:.0f} ms)")
    echo(f"plan {settings.upstream_plan}; {page.get('total', '?')} sessions upstream")


def _day(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"must be an ISO date or timestamp such as 2026-05-01; got {value!r}"
        ) from None
    return value


@upstream.command()
@db_option
@click.option(
    "--from", "start", callback=_day, help="Sessions started from this day (ISO date or timestamp)."
)
@click.option(
    "--to", "end", callback=_day, help="Sessions started up to this day (ISO date or timestamp)."
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def sync(db: str, start: str | None, end: str | None, no_progress: bool, as_json: bool) -> None:
    """Backfill sessions and score histories from upstream into the read API's projection.

    Pages through GET /v1/sessions (with --from/--to), reads each session and its
    scores, and merges them in. Inside the plan's budget; resumable (run it again
    after Ctrl-C or a crash: it continues from the last page done); idempotent
    (running it twice changes nothing).

    Example:

        receiver upstream sync --from 2026-05-01 --to 2026-05-31
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from receiver.upstream.sync import Result, backfill

    err = Console(stderr=True)
    show = not no_progress and err.is_terminal

    async def go(client: UpstreamClient, store: Store) -> Result:
        if not show:
            return await backfill(client, store, start=start, end=end)
        columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress("sessions", *columns, console=err) as progress:
            bar = progress.add_task("sync", total=None)

            def update(result: Result) -> None:
                progress.update(bar, total=result.total or None, completed=result.done)

            return await backfill(client, store, start=start, end=end, on_progress=update)

    try:
        result = _with_client(db, go)
    except KeyboardInterrupt:  # the cursor of the last page done is saved
        raise click.ClickException("interrupted: run the same command again to continue") from None
    if as_json:
        echo(json.dumps(result.__dict__))
        return
    again = " (continued an interrupted run)" if result.resumed else ""
    echo(
        f"synced {result.done} of {result.total} sessions upstream; {result.changed} added or"
        f" changed here{again}"
    )
