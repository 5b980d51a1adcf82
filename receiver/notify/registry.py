"""The channels, one line each: a notifier URL's scheme picks the channel that sends it.

Alertmanager builds its receivers' integrations from one list of kinds (config/receiver);
so do we. Each Kind (receiver.notify.channel) names its channel and the schemes it claims;
a scheme no kind claims goes to a kind that `knows` it (apprise, for the 100-odd schemes
apprise has plugins for), and a scheme nobody takes is a `receiver check` problem naming
the channels. The routing records the channel in each outbox row, and the worker, the
backlog gauges, the admin filter and `receiver check` learn the names from here.

Adding a channel: its module with its Kind and Channel, one line in KINDS, its tests and a
docs section (docs/development.md, "Adding a channel").
"""

from __future__ import annotations

import re

from receiver.notify import apprise, ntfy, slack, webhook
from receiver.notify.channel import Kind

# Claimed schemes first, then the fallback: apprise takes what it knows, so it comes last.
KINDS: list[Kind] = [
    webhook.KIND,
    ntfy.KIND,
    slack.KIND,
    apprise.KIND,
]

NOTIFY = apprise.KIND.name  # the channel of rows queued before channels were recorded

_SCHEME_RE = re.compile(r"[a-z][a-z0-9+.\-]*")


def names() -> list[str]:
    """The channels' names, in registry order."""
    return [kind.name for kind in KINDS]


def updating() -> frozenset[str]:
    """The channels that update an episode's message in place (Kind.updates)."""
    return frozenset(kind.name for kind in KINDS if kind.updates)


def scheme(url: str) -> str | None:
    """url's scheme, lower case, or None when it has none."""
    head, sep, _ = url.strip().partition("://")
    head = head.lower()
    return head if sep and _SCHEME_RE.fullmatch(head) else None


def kind_for(url: str) -> Kind | None:
    """The kind whose channel sends to url: the one claiming its scheme, else one that
    knows it; None when no channel takes it."""
    found = scheme(url)
    if found is None:
        return None
    for kind in KINDS:
        if found in kind.schemes:
            return kind
    for kind in KINDS:
        if kind.knows is not None and kind.knows(found):
            return kind
    return None


def channel_of(url: str) -> str:
    """The name of the channel that sends to url (NOTIFY for one no channel takes, which
    `receiver check` reports and the server refuses to load)."""
    kind = kind_for(url)
    return NOTIFY if kind is None else kind.name


def problem(url: str, shown_scheme: str) -> str | None:
    """What is wrong with a notifier url, for `receiver check`: no channel takes its
    scheme, or its channel finds it wrong; None when it is fine. shown_scheme is the
    scheme as a message may show it (never a secret)."""
    kind = kind_for(url)
    if kind is None:
        channels = "; ".join(k.about() for k in KINDS)
        return f"no channel takes this url (scheme {shown_scheme}); the channels: {channels}"
    return kind.check(url, shown_scheme)


def shown(url: str) -> str:
    """url as its channel shows it (the admin page, traces): no secret."""
    kind = kind_for(url)
    return (kind or apprise.KIND).shown(url)
