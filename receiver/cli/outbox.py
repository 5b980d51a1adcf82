"""`receiver deliveries`, `retry` and `replay`: the notifications, from the command line."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import click

from receiver import rules
from receiver.cli._common import (
    db_option,
    echo,
    when,
    with_store,
)
from receiver.logs import escape
from receiver.redact import redact_url
from receiver.store import Store
from receiver.store.base import OUTBOX_STATES
from receiver.store.records import Attempt

# The store's "dead" (out of attempts or out of time) is "failed" here, as in the API's
# deliveries and the service's own words; --state dead and --all-dead still work.
FAILED = "failed"
_STATES = tuple(FAILED if state == "dead" else state for state in OUTBOX_STATES)


def _state(state: str) -> str:
    """A stored outbox state as the CLI shows it."""
    return FAILED if state == "dead" else state


@click.command()
@db_option
@click.option(
    "--state",
    type=click.Choice([*_STATES, "dead"]),
    help="Only rows in this state (dead: the same as failed).",
)
@click.option("--event", "event_id", help="Only rows of this event id.")
@click.option("--limit", type=int, default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@click.option(
    "--attempts", is_flag=True, help="Each row's attempt log too: time, status, duration, error."
)
def deliveries(
    db: str, state: str | None, event_id: str | None, limit: int, as_json: bool, attempts: bool
) -> None:
    """List recent notifications (chat, email, subscriber webhooks), newest first. Names
    notifiers, never their URLs.

    Example:

        receiver deliveries --state failed --attempts
    """
    stored = "dead" if state == FAILED else state

    async def read(s: Store) -> tuple[list[Any], dict[int, list[Attempt]]]:
        rows = await s.outbox.deliveries(state=stored, event_id=event_id, limit=limit)
        return rows, (await s.outbox.attempts([r.id for r in rows]) if attempts else {})

    rows, logs = with_store(db, read)
    if as_json:
        for row in rows:
            shown = {**row.__dict__, "state": _state(row.state)}
            # A one-click link's token is a capability: shown as /act/***, as logs show it.
            shown.update({k: redact_url(row.__dict__[k]) for k in ("title", "body")})
            if attempts:
                shown["attempt_log"] = [a.__dict__ for a in logs.get(row.id, [])]
            echo(json.dumps(shown))
        return
    if not rows:
        echo("no deliveries match")
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table("id", "event", "rule", "notifier", "state", "tries", "updated", "detail")
    for row in rows:
        # Text, not str: rich would read "[...]" in an event id as markup. Escaped, as echo().
        cells = (
            str(row.id),
            row.event_id,
            row.rule,
            row.label,
            _state(row.state),
            str(row.attempts),
            when(row.updated_at),
            row.last_error or row.reason or "",
        )
        table.add_row(*(Text(escape(cell)) for cell in cells))
    Console(width=max(120, Console().width)).print(table)
    if attempts:
        _print_attempts(rows, logs)


def _print_attempts(rows: list[Any], logs: dict[int, list[Attempt]]) -> None:
    """12 oncall[0]  #1 2026-01-01 10:00:00  HTTP 503   120 ms  HTTP 503 Service Unavailable"""
    for row in rows:
        echo(f"{row.id} {row.label}: {len(logs.get(row.id, []))} attempt(s) logged")
        for a in logs.get(row.id, []):
            status = f"HTTP {a.status}" if a.status is not None else "-"
            outcome = a.error or "ok"
            echo(f"  #{a.number} {when(a.at)}  {status:<8} {a.duration_ms:>6} ms  {outcome}")


@click.command()
@db_option
@click.argument("row_id", type=int, required=False)
@click.option(
    "--all-failed", "--all-dead", "all_dead", is_flag=True, help="Retry every failed row."
)
def retry(db: str, row_id: int | None, all_dead: bool) -> None:
    """Send a failed notification again (its id from `receiver deliveries`), or all of them.

    A running server picks the rows up within a few seconds.

    Example:

        receiver retry 17
        receiver retry --all-failed
    """
    if (row_id is None) == (not all_dead):
        raise click.UsageError("give a row id or --all-failed (not both)")
    n = with_store(db, lambda s: s.outbox.retry_dead(row_id, now=time.time()))
    if row_id is not None and n == 0:
        raise click.ClickException(f"no failed delivery with id {row_id}")
    echo(f"{n} notification(s) queued again")


REPLAY_WAIT = "10s"  # how long `receiver replay` waits for the running server by default
_SETTLED = ("pending", "sending")  # rows still on their way: worth waiting for


@click.command()
@db_option
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
        replay_id = await store.events.replay(
            event_id, now=time.time(), respect_lifecycle=respect_lifecycle
        )
        if replay_id is None:
            return None, None, []
        deadline = time.monotonic() + seconds
        while True:
            request, rows = await store.events.replay_status(replay_id)
            routed = request is not None and request.routed_at is not None
            if routed and not any(row.state in _SETTLED for row in rows):
                return replay_id, request, rows
            if time.monotonic() >= deadline:
                return replay_id, request, rows
            await asyncio.sleep(0.1)

    replay_id, request, rows = with_store(db, run)
    if replay_id is None:
        raise click.ClickException(f"no stored event with id {event_id!r}")
    how = "respecting the lifecycle" if respect_lifecycle else "sent regardless of the lifecycle"
    if request is None or request.routed_at is None:
        if seconds <= 0:
            echo(
                f"replay #{replay_id} of {event_id} queued ({how}); not waiting:"
                f" `receiver deliveries --event {event_id}` shows what it sends"
            )
            return
        echo(
            f"replay #{replay_id} of {event_id} queued; no running server routed it within"
            f" {seconds:g}s: it will be routed when one starts"
        )
        sys.exit(3)
    if not rows:
        echo(
            f"replay #{replay_id} of {event_id}: no rule gives it a notification now; nothing sent"
        )
        return
    count = len(rows)
    echo(
        f"replay #{replay_id} of {event_id} ({how}):"
        f" {count} notification{'s' if count != 1 else ''}"
    )
    for row in rows:
        echo("  " + _replay_line(row))


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
