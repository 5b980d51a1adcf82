"""A slack-app:// notifier URL: the channel to post in, and which buttons the message has.

slack-app://C0123ABCD                   a channel by id (as Slack shows it)
slack-app://#alerts                     a channel by name
slack-app://C0123ABCD?buttons=ack,snooze   only these buttons (ack, resolve, snooze;
                                           "none" for none); all three by default
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs

from receiver.notify.slack.blocks import BUTTONS

SCHEME = "slack-app"
_ID = re.compile(r"[CGD][A-Z0-9]{2,}")  # a public, private or direct channel's id
_NAME = re.compile(r"#[a-z0-9][a-z0-9_\-]{0,79}")  # Slack's channel names: 80 characters


@dataclass(frozen=True)
class SlackURL:
    channel: str  # C0123ABCD or #alerts
    buttons: tuple[str, ...] = BUTTONS

    @property
    def key(self) -> str:
        """The target as store.threads keys it: the channel, whatever the buttons."""
        return f"{SCHEME}://{self.channel}"


def parse(url: str) -> SlackURL | str:
    """The SlackURL of url, or what is wrong with it (never the url itself, which names
    no secret, but stays out of messages as every notifier URL does).

    >>> parse("slack-app://C0123ABCD?buttons=ack")
    SlackURL(channel='C0123ABCD', buttons=('ack',))
    >>> parse("slack-app://general")
    'the channel must be an id such as C0123ABCD or a name such as #alerts'
    """
    head, sep, rest = url.strip().partition("://")
    if not sep or head.lower() != SCHEME:
        return f"not a {SCHEME}:// url"
    channel, _, query = rest.partition("?")
    channel = channel.rstrip("/")
    if not (_ID.fullmatch(channel) or _NAME.fullmatch(channel)):
        return "the channel must be an id such as C0123ABCD or a name such as #alerts"
    options = parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(options) - {"buttons"})
    if unknown:
        return f"unknown option {unknown[0]!r}; the one option is buttons=ack,resolve,snooze"
    buttons: tuple[str, ...] = BUTTONS
    if "buttons" in options:
        named = [b.strip() for v in options["buttons"] for b in v.split(",") if b.strip()]
        if named == ["none"]:
            named = []
        wrong = [b for b in named if b not in BUTTONS]
        if wrong:
            return f"unknown button {wrong[0]!r}; choose from ack, resolve, snooze (or none)"
        buttons = tuple(b for b in BUTTONS if b in named)
    return SlackURL(channel, buttons)
