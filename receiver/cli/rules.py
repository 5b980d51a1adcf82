"""`receiver init`, `check` and `explain`: write, validate and try out the rules."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from receiver import events, rules
from receiver.cli._common import (
    build_body,
    echo,
    echo_lines,
    env_notes,
    event_options,
    load_rules,
    no_env_option,
    rules_option,
    with_store,
)
from receiver.errors import ReceiverError
from receiver.notify import slack
from receiver.settings import DEFAULT_RULES, Settings


@click.command()
@click.argument("path", type=click.Path(path_type=Path), required=False)
@rules_option
@no_env_option
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
    ruleset = load_rules(path or rules_path, no_env=no_env)
    if ruleset.source == rules.BUILTIN_SOURCE:
        echo(
            f"no {DEFAULT_RULES} and no RECEIVER_RULES: `receiver serve` would use the"
            " built-in rules below (`receiver init` writes them to rules.yaml)"
        )
    if not no_env and (problem := slack.token_problem(ruleset, Settings())) is not None:
        raise click.ClickException(f"{ruleset.source}: {problem}")
    echo(f"{ruleset.source}: OK")
    echo_lines(ruleset.summary().splitlines())
    for note in env_notes(ruleset, no_env=no_env):
        echo(note)


@click.command()
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
    echo(f"wrote {path}: {rules.load_builtin().counted}, every event to the console")
    if path.resolve() == DEFAULT_RULES.resolve():
        echo(
            "next: edit it, run `receiver check`, then `receiver serve` (a server"
            " already running here on the built-in rules switches to it at once)"
        )
    else:
        echo(
            f"next: edit it, run `receiver check {path}`, then"
            f" `receiver serve --rules {path}` (or RECEIVER_RULES={path})"
        )


@click.command()
@event_options
@rules_option
@no_env_option
@click.option(
    "--db",
    envvar="RECEIVER_DB",
    default="./data/receiver.db",
    show_default=True,
    help="Database to read silences and alert state from, if it exists.",
)
@click.option(
    "--event",
    "stored_event",
    metavar="ID",
    help="Explain a stored event instead: what routing did with it and why, from what it"
    " recorded (the rules file it used, each notification's state), not today's rules.",
)
def explain(
    rules_path: Path | None, no_env: bool, db: str, stored_event: str | None, **event_args: Any
) -> None:
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
        receiver explain --event evt_5c0d8f2e9a1b4c7d --db data/receiver.db
    """
    ruleset = load_rules(rules_path, no_env=no_env)
    if stored_event is not None:
        _explain_stored(ruleset, stored_event, db)
        return
    body = build_body(**event_args)
    try:
        event = events.parse(body)
    except ReceiverError as exc:
        raise click.ClickException(f"not a valid event: {exc}") from exc
    payload = event.payload()
    enrichment = _enrichment(ruleset, payload, db)
    echo_lines(ruleset.explain(payload, enrichment).lines())
    for note in env_notes(ruleset, no_env=no_env):
        echo(note)
    lines = _lifecycle_now(ruleset, payload, db)
    if lines:
        echo("now:")
        for line in lines:
            echo(f"  {line}")


def _explain_stored(ruleset: rules.Ruleset, event_id: str, db: str) -> None:
    from receiver import why

    found = with_store(db, lambda store: why.explain_event(store, event_id, ruleset))
    if found is None:
        raise click.ClickException(f"no event {event_id!r} in {db}")
    echo_lines(why.lines(found))


def _enrichment(ruleset: rules.Ruleset, payload: dict[str, Any], db: str) -> Any:
    """What the upstream says of the event's session, printed and returned, when a rule's
    templates use it and RECEIVER_UPSTREAM_URL and _KEY are set (else None)."""
    from receiver.upstream.explain_enrichment import fetch_for_explain

    enrichment, lines = fetch_for_explain(ruleset, payload, db)
    for line in lines:
        echo(line)
    return enrichment


def _lifecycle_now(ruleset: rules.Ruleset, payload: dict[str, Any], db: str) -> list[str]:
    from receiver.dispatch.alerts import alert_id
    from receiver.dispatch.explain import explain_now
    from receiver.dispatch.inhibition import inhibiting
    from receiver.dispatch.inhibition import reason as inhibition_reason

    now = time.time()
    inhibited: list[str] = []  # "inhibited by NAME (...)": its notifications are muted now
    silences: list[Any] = []
    alert = None
    notified: list[str] = []
    flaps: list[Any] = []
    if Path(db).exists():
        aid = alert_id(payload)

        def read(tx: Any) -> tuple[list[Any], Any, list[str], list[Any]]:
            if ruleset.inhibit and (held := inhibiting(tx, ruleset, payload, aid)) is not None:
                inhibited.append(inhibition_reason(*held))
            alert = tx.alerts.get(aid) if aid else None
            notified: list[str] = []
            if alert is not None and alert.state == "open":
                notified = [
                    n.rule
                    for n in tx.notices.of(alert.id, alert.episode)
                    if tx.outbox.sent(alert.id, alert.episode, n.rule)
                ]
            flaps = tx.flaps.of(alert.id) if alert is not None and ruleset.flaps else []
            return tx.silences.active(now), alert, notified, flaps

        silences, alert, notified, flaps = with_store(db, lambda s: s.transact(read))
    lines = explain_now(
        ruleset, payload, now, silences=silences, alert=alert, notified=notified, flaps=flaps
    )
    return lines + inhibited
