"""The Slack app channel: `slack-app://CHANNEL` notifiers, posted by the team's own Slack
app with its bot token (RECEIVER_SLACK_BOT_TOKEN), one message per alert episode with
buttons that answer back (POST /slack/interactivity, receiver.notify.slack.interactivity).

blocks: the message (Block Kit); url: the notifier URL; channel: sending; manifest: the
app's manifest and `receiver slack check`; interactivity: the buttons' endpoint."""

from __future__ import annotations

from receiver.notify.channel import Kind, Parts
from receiver.notify.slack.channel import NAME, Messenger, SlackChannel
from receiver.notify.slack.url import SCHEME, parse
from receiver.settings import Settings

__all__ = ["KIND", "NAME", "SCHEME", "build", "check"]


def check(url: str, scheme: str) -> str | None:
    """What `receiver check` (and loading the rules) finds wrong with a slack-app:// url:
    its form, or no bot token to post with."""
    found = parse(url)
    if isinstance(found, str):
        return f"{found} (slack-app://CHANNEL[?buttons=ack,resolve,snooze])"
    if not Settings().slack_bot_token:
        return "slack-app:// needs the Slack app's bot token in RECEIVER_SLACK_BOT_TOKEN"
    return None


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


KIND = Kind(NAME, frozenset({SCHEME}), build, check=check)
