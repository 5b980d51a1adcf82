"""`receiver alerts` (and ack, resolve, snooze) and `receiver silence ...`: the alert
lifecycle from the command line."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import click

from receiver.api.alerts import describe
from receiver.cli._common import db_option, echo, load_rules, rules_option, when, with_store
from receiver.dispatch import actions
from receiver.durations import MAX_SPAN, format_duration, parse_duration
from receiver.events import date_or_why
from receiver.links import source
from receiver.matchers import parse_matchers
from receiver.settings import Settings
from receiver.store import Store
from receiver.store.base import Tx
from receiver.store.records import Ack, Alert


@click.group(invoke_without_command=True)
@db_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON document: an array of alerts, each as GET /v1/alerts shows it.",
)
@click.pass_context
def alerts(ctx: click.Context, db: str, as_json: bool) -> None:
    """List the alerts open now: sessions whose attention dropped, interventions not resolved.

    An acknowledged alert shows who acknowledged it and when (`receiver alerts ack`).

    Example:

        receiver alerts
    """
    if ctx.invoked_subcommand is not None:
        return

    async def read(store: Store) -> list[tuple[Alert, list[str], Ack | None]]:
        found = await store.transact(_open_alerts)
        acks = await store.alerts.acks(alert.id for alert, _ in found)
        return [(alert, rules, acks.get((alert.id, alert.episode))) for alert, rules in found]

    found = with_store(db, read)
    if as_json:  # the API's own shape (JSON escapes control characters)
        click.echo(json.dumps([describe(alert, ack) for alert, _, ack in found], indent=2))
        return
    if not found:
        echo("no open alerts")
        return
    for alert, notified, ack in found:
        rules = ", ".join(notified) or "no rule notified"
        acked = f"; acknowledged by {ack.acked_by} at {when(ack.acked_at)}" if ack else ""
        echo(
            f"{alert.id}  open since {alert.opened_ts} (event {alert.opened_event}, "
            f"episode {alert.episode}); last event {alert.last_ts}; {rules}{acked}"
        )


def _act(
    db: str, rules_path: Path | None, alert_id: str, action: str, by: str, seconds: float | None
) -> None:
    """Do an action through receiver.dispatch.actions, as the server's API would (a
    resolve's messages carry the one-click links when RECEIVER_PUBLIC_URL is set)."""
    ruleset = load_rules(rules_path) if action == "resolve" else None
    settings = Settings() if action == "resolve" else None
    now = time.time()

    async def act(store: Store) -> actions.Outcome:
        links = source(settings, store) if settings is not None else None
        return await actions.perform(
            store,
            ruleset,
            alert_id,
            action,
            source="cli",
            by=by,
            now=now,
            seconds=seconds,
            links=links,
        )

    outcome = with_store(db, act)
    if outcome.result == "missing":
        raise click.ClickException(f"no alert {alert_id!r} (see: receiver alerts)")
    echo(outcome.message)


_by_option = click.option(
    "--by", default=lambda: os.environ.get("USER", "cli"), help="Who, for the record [$USER]."
)


@alerts.command("ack")
@db_option
@click.argument("alert_id")
@_by_option
def ack(db: str, alert_id: str, by: str) -> None:
    """Acknowledge an open alert: its repeats and escalation stop until it resolves. Acking an acked
    alert says who did it first.

    Example:

        receiver alerts ack session:sess_42
    """
    _act(db, None, alert_id, "ack", by, None)


@alerts.command("resolve")
@db_option
@rules_option
@click.argument("alert_id")
@_by_option
def resolve(db: str, rules_path: Path | None, alert_id: str, by: str) -> None:
    """Resolve an open alert now, as its closing event would: everyone it notified gets
    the resolved message (rendered with --rules; a running server sends it).

    Example:

        receiver alerts resolve session:sess_42
    """
    _act(db, rules_path, alert_id, "resolve", by, None)


@alerts.command("snooze")
@db_option
@click.argument("alert_id")
@click.option("--for", "duration", default="1h", show_default=True, help="How long: 30m, 2h.")
@_by_option
def snooze(db: str, alert_id: str, duration: str, by: str) -> None:
    """Put an open alert's repeats off for a while; if it is still open then, it is
    notified again.

    Example:

        receiver alerts snooze session:sess_42 --for 2h
    """
    try:
        seconds = parse_duration(duration, limit=MAX_SPAN)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--for") from None
    _act(db, None, alert_id, "snooze", by, seconds)


def _open_alerts(tx: Tx) -> list[tuple[Alert, list[str]]]:
    """The open alerts, each with the rules that notified about its episode."""
    return [(a, [n.rule for n in tx.notices.of(a.id, a.episode)]) for a in tx.alerts.list_open()]


@click.group()
def silence() -> None:
    """Silence notifications for events that match, for a while.

    A silenced notification is kept with the reason (state `silenced` in
    `receiver deliveries`), never sent. A running server sees a new or expired
    silence within a few seconds.
    """


UNTIL_RESOLVED_FOR = "24h"  # an until-resolved silence's limit without --for
UNTIL_RESOLVED_AFTER = "5m"


@silence.command("add")
@db_option
@click.option(
    "--match",
    "matches",
    multiple=True,
    required=True,
    metavar="FIELD=VALUE",
    help="A payload field and a rules.yaml match value: exact, glob (user_*), ~regex, "
    'a number or true/false ("42" in double quotes for the text). Repeat for several; '
    "all must hold.",
)
@click.option(
    "--for", "duration", help=f"How long: 30m, 2h, 1d (at most, with --until-resolved:"
    f" {UNTIL_RESOLVED_FOR}). Required without --until-resolved."
)  # fmt: skip
@click.option("--reason", required=True, help="Why; shown with every silenced notification.")
@click.option(
    "--until-resolved", is_flag=True,
    help="End once every alert it matches now has been resolved for --after.",
)  # fmt: skip
@click.option("--after", help="With --until-resolved: how long its alerts must stay resolved. [5m]")
def silence_add(
    db: str, matches: tuple[str, ...], duration: str | None, reason: str,
    until_resolved: bool, after: str | None,
) -> None:  # fmt: skip
    """Add a silence.

    With --until-resolved it ends once every alert it matches now has been
    resolved for --after (default 5m: a flap re-firing inside keeps it), or at
    --for (default 24h), whichever comes first.

    Example:

        receiver silence add --match userId=user_42 --for 2h --reason "load test"
        receiver silence add --match sessionId=sess_9 --until-resolved --reason "known"
    """
    matchers, problems = parse_matchers(matches)
    if problems:
        raise click.BadParameter("; ".join(problems), param_hint="--match")
    if duration is None and not until_resolved:
        raise click.BadParameter("required (or --until-resolved)", param_hint="--for")
    if after is not None and not until_resolved:
        raise click.BadParameter("only with --until-resolved", param_hint="--after")
    seconds = _span(duration or UNTIL_RESOLVED_FOR, "--for")
    wait = _span(after or UNTIL_RESOLVED_AFTER, "--after") if until_resolved else None
    now = time.time()
    made = with_store(
        db, lambda s: s.silences.add(matchers, reason, now, now + seconds, after=wait)
    )
    silence_id, alerts = made.id, made.alerts
    ends = f"until {when(now + seconds)}"
    if wait is not None:
        ends = f"until resolved (after {format_duration(wait)}; at most {ends})"
    echo(f"silence #{silence_id} {ends}: {_describe(matchers)} ({reason})")
    if wait is not None:
        echo(f"ends with {len(alerts)} open alert{'s' if len(alerts) != 1 else ''}"
             + (f": {', '.join(alerts[:10])}" if alerts else "")
             + (" ..." if len(alerts) > 10 else ""))  # fmt: skip


def _span(text: str, hint: str) -> float:
    try:
        return parse_duration(text, limit=MAX_SPAN)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None


@silence.command("list")
@db_option
@click.option("--all", "show_all", is_flag=True, help="Include expired silences.")
def silence_list(db: str, show_all: bool) -> None:
    """List silences, newest first: active ones, or all with --all."""
    now = time.time()
    found = with_store(db, lambda s: s.silences.recent())
    shown = 0
    for s in found:
        active = s.expired_at is None and s.ends_at > now
        if not (active or show_all):
            continue
        shown += 1
        status = (
            ("active until " + _when(s.ends_at))
            if active
            else ("expired " + _when(s.expired_at or s.ends_at))
        )
        if active and s.after is not None:
            n = len(s.alerts)
            status = (
                f"active until resolved (after {format_duration(s.after)}, {n} alert"
                f"{'s' if n != 1 else ''}; at most until {_when(s.ends_at)})"
            )
        echo(f"#{s.id}  {_describe(s.matchers)}  {status}  ({s.reason})")
    if not shown:
        echo("no silences" if show_all else "no active silences")


def _when(ts: float) -> str:
    """when(ts), or what it is if no date can show it (a row written before the cap)."""
    return date_or_why(ts, when)


@silence.command("expire")
@db_option
@click.argument("silence_id", type=int)
def silence_expire(db: str, silence_id: int) -> None:
    """End a silence now.

    Example:

        receiver silence expire 3
    """
    now = time.time()
    if not with_store(db, lambda s: s.silences.expire(silence_id, now))[0]:
        raise click.ClickException(f"no active silence #{silence_id}")
    echo(f"silence #{silence_id} expired")


def _describe(matchers: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in matchers.items())
