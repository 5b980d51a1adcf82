"""One-click action links: `{RECEIVER_PUBLIC_URL}/act/<token>`, one per action (ack, resolve,
snooze) on an alert, in every message (templates see `links.ack`, `links.resolve`,
`links.snooze`, `links.alert`).

The token is the capability: signed with itsdangerous (URLSafeTimedSerializer) under a key
kept in the store (so every replica, and the next start, honours it), it names the alert,
its episode when known, and the action, and it expires after RECEIVER_LINK_TTL. A token is
a secret: it is never logged and never part of an error message.

Example:

    links = await load(store, base="https://alerts.example.com", ttl=86400)
    url = links.url("session:sess_42", "ack")    # https://alerts.example.com/act/eyJ...
    claim = links.read(url.rsplit("/", 1)[1])     # Claim("session:sess_42", "ack", None)
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from itsdangerous import BadSignature, SignatureExpired, TimestampSigner, URLSafeTimedSerializer

from receiver.settings import Settings
from receiver.store import Store
from receiver.store.base import Tx
from receiver.store.records import ACTIONS

# What templates see as `links` without RECEIVER_PUBLIC_URL, or for an event of no alert.
NO_LINKS: Mapping[str, str] = {"ack": "", "resolve": "", "snooze": "", "alert": ""}


STATE = "action-link-key"  # the store's named state holding the signing key
SALT = "receiver-act"  # apart from the admin cookie's: one key's token is not the other's


class LinkError(Exception):
    """A token that is not one of ours: tampered with, cut short, or signed with another key."""


class LinkExpiredError(LinkError):
    """A genuine token older than RECEIVER_LINK_TTL."""


@dataclass(frozen=True)
class Claim:
    """What a valid token lets its holder do."""

    alert: str
    action: str
    episode: int | None = None


class Links:
    """Makes and reads the action links of one signing key."""

    def __init__(
        self,
        key: str,
        *,
        base: str,
        ttl: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.base = base.rstrip("/")
        self.ttl = ttl

        class _Signer(TimestampSigner):
            def get_timestamp(self) -> int:
                return int(clock())

        self._serializer = URLSafeTimedSerializer(key, salt=SALT, signer=_Signer)

    def token(self, alert: str, action: str, episode: int | None = None) -> str:
        if action not in ACTIONS:
            raise ValueError(f'unknown action "{action}"; use ack, resolve or snooze')
        value: dict[str, Any] = {"a": alert, "x": action}
        if episode is not None:
            value["e"] = episode
        return str(self._serializer.dumps(value))

    def url(self, alert: str, action: str, episode: int | None = None) -> str:
        return f"{self.base}/act/{self.token(alert, action, episode)}"

    def alert_page(self, alert: str) -> str:
        return f"{self.base}/admin/alerts/{quote(alert, safe=':')}"

    def for_alert(self, alert: str | None, episode: int | None = None) -> Mapping[str, str]:
        """The links a template sees for an alert (NO_LINKS for an event of none)."""
        if alert is None:
            return NO_LINKS
        return {
            **{action: self.url(alert, action, episode) for action in ACTIONS},
            "alert": self.alert_page(alert),
        }

    def read(self, token: str) -> Claim:
        """The claim a token makes; LinkExpiredError if it is too old, LinkError if it is
        not a token of this key, or names no known action."""
        try:
            value = self._serializer.loads(token, max_age=math.ceil(self.ttl))
        except SignatureExpired as exc:
            raise LinkExpiredError("this link has expired") from exc
        except BadSignature as exc:
            raise LinkError("this link is not valid") from exc
        if not isinstance(value, dict):
            raise LinkError("this link is not valid")
        alert, action, episode = value.get("a"), value.get("x"), value.get("e")
        if not isinstance(alert, str) or action not in ACTIONS:
            raise LinkError("this link is not valid")
        if episode is not None and (type(episode) is not int):
            raise LinkError("this link is not valid")
        return Claim(alert, str(action), episode)


async def stored_key(store: Store, name: str) -> str:
    """The signing key kept in the store's named state `name`, made (once, for every
    replica) if there is none: the action links' and the admin cookie's."""

    def key(tx: Tx) -> str:
        found = tx.state.get(name)
        if not isinstance(found, str):
            found = secrets.token_urlsafe(32)
            tx.state.set(name, found)
        return found

    return await store.transact(key)


async def load(
    store: Store, *, base: str, ttl: float, clock: Callable[[], float] = time.time
) -> Links:
    """The links of the store's signing key, made if it has none."""
    return Links(await stored_key(store, STATE), base=base, ttl=ttl, clock=clock)


class LinkSource:
    """The app's links (RECEIVER_PUBLIC_URL, RECEIVER_LINK_TTL), their key read from the
    store the first time they are needed."""

    def __init__(
        self, store: Store, *, base: str, ttl: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.store, self.base, self.ttl, self.clock = store, base, ttl, clock
        self._links: Links | None = None

    async def get(self) -> Links:
        if self._links is None:
            self._links = await load(self.store, base=self.base, ttl=self.ttl, clock=self.clock)
        return self._links


def source(
    settings: Settings, store: Store, clock: Callable[[], float] = time.time
) -> LinkSource | None:
    """The one-click action links of settings (RECEIVER_PUBLIC_URL, RECEIVER_LINK_TTL), or
    None when RECEIVER_PUBLIC_URL is not set."""
    if settings.public_url is None:
        return None
    return LinkSource(store, base=settings.public_url, ttl=settings.link_ttl, clock=clock)
