"""`receiver webhooks add|list|set|enable|rm|deliveries|retry`: webhook subscribers from the
command line (the same as POST/GET/DELETE /v1/webhooks, their deliveries and enable), with
their rate limit, filter and health."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from receiver.api.webhook_actions import enable_tested
from receiver.api.webhooks import delivery, describe, filter_param, rate_param, register
from receiver.cli._common import db_option, echo, with_store
from receiver.errors import InvalidWebhookError
from receiver.events import EVENT_TYPES, iso_epoch
from receiver.logs import escape
from receiver.notify.webhook import WebhookChannel
from receiver.settings import Settings
from receiver.store import Store
from receiver.store.records import Webhook


@click.group()
def webhooks() -> None:
    """Forward events to subscribers: signed POSTs with the service's retry schedule.

    A running server picks a change up within a few seconds.
    """


@webhooks.command("add")
@db_option
@click.option("--url", required=True, help="The https:// address to deliver to.")
@click.option(
    "--event",
    "event_names",
    multiple=True,
    type=click.Choice(EVENT_TYPES),
    help="An event to deliver; repeat for several [all five].",
)
@click.option("--threshold", type=float, help="Derive score.drop/score.recover at this score.")
@click.option(
    "--format",
    "form",
    type=click.Choice(["service", "standard"]),
    default="service",
    show_default=True,
    help="service: X-Service-Signature; standard: Standard Webhooks headers.",
)
@click.option(
    "--rate-limit",
    type=float,
    help="Deliveries a second at most (more wait; none dropped) [no limit].",
)
@click.option(
    "--filter",
    "wanted",
    metavar="JSON",
    help='Only events matching it, as a rule\'s match: \'{"userId": "u1"}\'.',
)
@click.option("--json", "as_json", is_flag=True, help="The subscription and secret as JSON.")
def add(
    db: str,
    url: str,
    event_names: tuple[str, ...],
    threshold: float | None,
    form: str,
    rate_limit: float | None,
    wanted: str | None,
    as_json: bool,
) -> None:
    """Subscribe a URL; prints its signing secret, once.

    Example:

        receiver webhooks add --url https://hooks.example.com/attention --event score.drop

        receiver webhooks add --url https://hooks.example.com/beta --rate-limit 50 \\
            --filter '{"cohort": {"in": ["beta"]}}'
    """
    settings = Settings()
    body = {
        "url": url,
        "events": list(event_names or EVENT_TYPES),
        "threshold": threshold,
        "format": form,
        "rateLimit": rate_limit,
        "filter": _filter(wanted),
    }

    async def go(store: Store) -> Webhook:
        return await register(
            store,
            body,
            allow_private=settings.webhook_allow_private,
            allow_http=settings.webhook_allow_http,
            now=time.time(),
            max_rate=settings.webhook_max_rate,
        )

    try:
        hook = with_store(db, go, create=True)
    except InvalidWebhookError as exc:
        raise click.ClickException(exc.message) from None
    if as_json:
        click.echo(json.dumps(describe(hook, secret=True)))
        return
    click.echo(hook.secret)
    click.echo(
        f"subscribed {hook.public_id} to {', '.join(hook.events)}. The line above is its"
        " signing secret, shown only now: give it to the subscriber.",
        err=True,
    )


def _filter(text: str | None) -> Any:
    """--filter's JSON (the registration checks what it says)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON ({exc})", param_hint="--filter") from None


def _health(h: Webhook) -> str:
    """A subscription's health as a listing shows it: since when, and why, unless healthy."""
    if h.health == "healthy":
        return "healthy"
    since = f" since {iso_epoch(h.failing_since)}" if h.failing_since is not None else ""
    return f"{h.health}{since}: {h.last_error or '-'}"


@webhooks.command("list")
@db_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
def list_hooks(db: str, as_json: bool) -> None:
    """List the subscriptions (never their secrets)."""
    found = with_store(db, lambda store: store.webhooks.all())
    if as_json:
        for hook in found:
            click.echo(json.dumps(describe(hook)))
        return
    if not found:
        click.echo("no webhook subscribers; add one with: receiver webhooks add --url URL")
        return
    for h in found:
        threshold = f", threshold {h.threshold:g}" if h.threshold is not None else ""
        reason = f" ({h.status_reason})" if h.status_reason else ""
        rate = f", at most {h.rate_limit:g}/s" if h.rate_limit is not None else ""
        only = f", filter {json.dumps(h.filter, sort_keys=True)}" if h.filter else ""
        echo(  # the last error quotes the subscriber's answer: escaped
            f"{h.public_id}  {h.status}{reason}  {_health(h)}  {h.url}"
            f"  {', '.join(h.events)}{threshold}{rate}{only}, {h.format} format"
        )


@webhooks.command("set")
@db_option
@click.argument("webhook_id")
@click.option("--rate-limit", type=float, help="Deliveries a second at most.")
@click.option("--no-rate-limit", is_flag=True, help="Remove the rate limit.")
@click.option("--filter", "wanted", metavar="JSON", help="Only events matching it.")
@click.option("--no-filter", is_flag=True, help="Remove the filter: every event of its types.")
def set_(
    db: str,
    webhook_id: str,
    rate_limit: float | None,
    no_rate_limit: bool,
    wanted: str | None,
    no_filter: bool,
) -> None:
    """Change a subscription's rate limit or filter (checked as on registration).

    Example:

        receiver webhooks set wh_abc --rate-limit 20 --filter '{"userId": "u1"}'
    """
    changes: dict[str, Any] = {}
    try:
        if rate_limit is not None or no_rate_limit:
            if rate_limit is not None and no_rate_limit:
                raise click.UsageError("--rate-limit or --no-rate-limit, not both")
            max_rate = Settings().webhook_max_rate
            changes["rate_limit"] = rate_param({"rateLimit": rate_limit}, max_rate)
        if wanted is not None or no_filter:
            if wanted is not None and no_filter:
                raise click.UsageError("--filter or --no-filter, not both")
            changes["filter"] = filter_param({"filter": _filter(wanted)})
    except InvalidWebhookError as exc:
        raise click.ClickException(exc.message) from None
    if not changes:
        raise click.UsageError("nothing to change: give --rate-limit, --filter or their --no-")
    found = with_store(
        db, lambda store: store.webhooks.configure(webhook_id, now=time.time(), changes=changes)
    )
    if found is None:
        raise click.ClickException(f"no webhook {webhook_id!r} (see: receiver webhooks list)")
    rate = f"at most {found.rate_limit:g}/s" if found.rate_limit is not None else "no rate limit"
    only = f"filter {json.dumps(found.filter, sort_keys=True)}" if found.filter else "no filter"
    echo(f"{found.public_id}: {rate}, {only}")


@webhooks.command("enable")
@db_option
@click.argument("webhook_id")
def enable(db: str, webhook_id: str) -> None:
    """Enable a disabled subscription if a test delivery to it succeeds now.

    As POST /v1/webhooks/:id/enable: a signed webhook.test event is sent; its owner is
    told with webhook.recovered. A running server sends to it within a few seconds.
    """
    settings = Settings()

    async def go(store: Store) -> tuple[Webhook | None, Webhook | None, dict[str, Any] | None]:
        hook = await store.webhooks.get(webhook_id)
        if hook is None or hook.status != "disabled":
            return hook, hook, None
        channel = WebhookChannel(
            store,
            timeout=settings.webhook_timeout,
            allow_private=settings.webhook_allow_private,
            allow_http=settings.webhook_allow_http,
        )
        try:
            enabled, attempt = await enable_tested(store, channel, hook, time.time)
        finally:
            await channel.close()
        return hook, enabled, attempt

    hook, enabled, attempt = with_store(db, go)
    if hook is None:
        raise click.ClickException(f"no webhook {webhook_id!r} (see: receiver webhooks list)")
    if attempt is None:
        click.echo(f"{webhook_id} is {hook.status} already")
        return
    if enabled is None:
        raise click.ClickException(
            f"{webhook_id} stays disabled: its test delivery failed"
            f" ({escape(attempt['error'] or 'no answer')})"
        )
    click.echo(f"enabled {webhook_id}: its test delivery answered {attempt['status']}")


@webhooks.command("rm")
@db_option
@click.argument("webhook_id")
def rm(db: str, webhook_id: str) -> None:
    """Delete a subscription; its deliveries not sent yet are cancelled."""
    found = with_store(
        db, lambda store: store.webhooks.update(webhook_id, now=time.time(), status="deleted")
    )
    if found is None:
        raise click.ClickException(f"no webhook {webhook_id!r} (see: receiver webhooks list)")
    click.echo(f"deleted {webhook_id}")


@webhooks.command("deliveries")
@db_option
@click.argument("webhook_id")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
def deliveries(db: str, webhook_id: str, limit: int, as_json: bool) -> None:
    """A subscription's deliveries, newest first."""

    async def go(store: Store) -> list[dict[str, object]] | None:
        hook = await store.webhooks.get(webhook_id)
        if hook is None:
            return None
        return [delivery(r) for r in await store.webhooks.deliveries(hook.id, limit=limit)]

    found = with_store(db, go)
    if found is None:
        raise click.ClickException(f"no webhook {webhook_id!r} (see: receiver webhooks list)")
    for d in found:
        if as_json:
            click.echo(json.dumps(d))
            continue
        last = d["lastError"] or "-"
        echo(  # the last error quotes the subscriber's answer: escaped
            f"{d['id']}  {d['state']}  event {d['eventId']}  attempts {d['attempts']}  "
            f"last {last}  next {d['nextAttemptAt'] or '-'}"
        )


@webhooks.command("retry")
@db_option
@click.argument("webhook_id")
@click.argument("delivery_id", type=int)
def retry(db: str, webhook_id: str, delivery_id: int) -> None:
    """Send a delivery again now (a failed one, with a fresh schedule)."""

    async def go(store: Store) -> bool:
        hook = await store.webhooks.get(webhook_id)
        if hook is None:
            return False
        return (
            await store.webhooks.retry_delivery(hook.id, delivery_id, now=time.time()) is not None
        )

    if not with_store(db, go):
        raise click.ClickException(f"webhook {webhook_id!r} has no delivery {delivery_id}")
    click.echo(f"delivery {delivery_id} queued again")
