"""`receiver slack manifest` and `receiver slack check`: set up the Slack app channel."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from receiver.cli._common import echo, load_rules, rules_option
from receiver.notify.slack import SCHEME, messenger
from receiver.notify.slack.manifest import check as check_app
from receiver.notify.slack.manifest import manifest as app_manifest
from receiver.notify.slack.url import SlackURL, parse
from receiver.settings import Settings


@click.group()
def slack() -> None:
    """The Slack app channel (slack-app:// notifiers, buttons that answer back).

    Example:

    \b
        receiver slack manifest --url https://alerts.example.com
        receiver slack check
    """


@slack.command()
@click.option(
    "--url",
    help="The receiver's address as Slack reaches it, https:// [RECEIVER_PUBLIC_URL].",
)
@click.option("--name", default="attention-receiver", show_default=True, help="The app's name.")
def manifest(url: str | None, name: str) -> None:
    """Print the app manifest: paste it at api.slack.com/apps, "Create New App",
    "From a manifest". Bot scope chat:write; interactivity on, its request URL
    URL/slack/interactivity.

    Example:

        receiver slack manifest --url https://alerts.example.com
    """
    url = url or Settings().public_url
    if not url:
        raise click.ClickException("give --url (or set RECEIVER_PUBLIC_URL): where Slack posts")
    if not url.startswith("https://"):
        raise click.ClickException(f"--url must be https:// (Slack requires it); got {url[:80]!r}")
    click.echo(app_manifest(url, name), nl=False)


@slack.command()
@rules_option
def check(rules_path: Path | None) -> None:
    """Check the bot token (auth.test), its chat:write scope, and every slack-app://
    notifier's channel in the rules; posts nothing. Exit 1 on a problem.

    Example:

        RECEIVER_SLACK_BOT_TOKEN=xoxb-... receiver slack check
    """
    settings = Settings()
    channels = _channels(rules_path)
    lines, ok = asyncio.run(check_app(messenger(settings), channels))
    for line in lines:
        echo(line)
    if not settings.slack_signing_secret:
        echo("RECEIVER_SLACK_SIGNING_SECRET is not set: the buttons answer slack_not_configured")
        ok = False
    if not ok:
        raise click.ClickException("the Slack app is not ready (see above)")


def _channels(rules_path: Path | None) -> list[str]:
    """The channels of the rules' slack-app:// notifiers, each once."""
    ruleset = load_rules(rules_path, no_env=False)
    found: list[str] = []
    for notifier in ruleset.notifiers.values():
        for url in notifier.urls:
            if str(url).lower().startswith(f"{SCHEME}://"):
                parsed = parse(str(url))
                if isinstance(parsed, SlackURL) and parsed.channel not in found:
                    found.append(parsed.channel)
    return found
