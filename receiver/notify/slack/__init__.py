"""The Slack app channel: `slack-app://CHANNEL` notifiers, posted by the team's own Slack
app with its bot token (RECEIVER_SLACK_BOT_TOKEN), one message per alert episode with
buttons that answer back (POST /slack/interactivity, receiver.notify.slack.interactivity).

blocks: the message (Block Kit); url: the notifier URL; channel: sending; manifest: the
app's manifest and `receiver slack check`; interactivity: the buttons' endpoint."""

from __future__ import annotations

from typing import Any

from receiver.notify.channel import Kind, Parts
from receiver.notify.slack.channel import NAME, Messenger, SlackChannel
from receiver.notify.slack.url import SCHEME, parse
from receiver.settings import Settings

__all__ = ["KIND", "NAME", "SCHEME", "build", "check", "messenger", "token_problem"]


def check(url: str, scheme: str) -> str | None:
    """What `receiver check` (and loading the rules) finds wrong with a slack-app:// url's
    form. The bot token is the settings' (token_problem): a rules file is checked, and
    explained, where the server's secrets are not."""
    found = parse(url)
    if isinstance(found, str):
        return f"{found} (slack-app://CHANNEL[?buttons=ack,resolve,snooze])"
    return None


def token_problem(rules: Any, settings: Settings) -> str | None:
    """The problem of rules with slack-app:// notifiers while RECEIVER_SLACK_BOT_TOKEN is
    not set (`receiver check` reports it, `receiver serve` refuses to start), or None."""
    if settings.slack_bot_token:
        return None
    users = sorted(
        name
        for name, notifier in rules.notifiers.items()
        if any(notifier.channel(i) == NAME for i in range(len(notifier.urls)))
    )
    if not users:
        return None
    named = ", ".join(f'"{n}"' for n in users)
    return (
        f"notifier {named}: slack-app:// needs the Slack app's bot token in"
        " RECEIVER_SLACK_BOT_TOKEN"
    )


def build(parts: Parts) -> SlackChannel:
    settings = parts.settings if parts.settings is not None else Settings()
    return SlackChannel(
        parts.store,
        parts.rules,
        schedule=parts.backoff,
        messenger=messenger(settings),
        public_url=settings.public_url,
        link_ttl=settings.link_ttl,
    )


def messenger(settings: Settings) -> Messenger:
    """The Web API client of settings' bot token and API URL."""
    return Messenger(settings.slack_bot_token, settings.slack_api_url, settings.notify_timeout)


KIND = Kind(NAME, frozenset({SCHEME}), build, check=check, updates=True)
