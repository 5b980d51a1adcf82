"""The ntfy channel: push to phones through an ntfy server, with buttons that answer back.

A notifier URL in apprise's syntax, `ntfy://[user:pass@]host[:port]/topic` (`ntfys://` for
https, `?token=tk_...` for an access token, `?priority=1..5` to override the priority,
`?tags=a,b` for tags of its own; `ntfy://topic` alone is a topic on ntfy.sh), is sent as
ntfy's JSON publish to the server's root (ntfy docs/publish.md, "Publish as JSON"):

- title and message: the row's (enriched when the rule asks), with a line saying who
  acknowledged it or until when it is snoozed;
- priority 5 for a message about an open, unacknowledged alert (its first message,
  repeats, escalation steps), 3 for the rest (resolved messages, digests, plain rules');
- click: the alert's page; actions (an open episode, with RECEIVER_PUBLIC_URL set): `http`
  Ack and Snooze 1h, which the phone POSTs to the signed /act links (clear: true, so the
  notification goes once /act answers 2xx: the action was applied), and `view` Open;
- sequence_id: the episode's key (receiver.notify.episodes), so ntfy 2.16+ shows one
  notification per alert episode, each later message replacing it; the episode's resolved
  message replaces it without buttons and is then cleared (PUT /<topic>/<sequence_id>/clear).
  RECEIVER_NTFY_SEQUENCE=off leaves sequence ids out, for servers before 2.16 (each message
  is then a notification of its own).

The password and token never reach a log line, an error or a shown URL: errors name the
notifier and the HTTP status, and `shown` redacts the topic, user part and token.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

import httpx

from receiver import tracing
from receiver.notify import answers, apprise
from receiver.notify.channel import Kind, Parts, Result, Schedule, excerpt
from receiver.notify.episodes import Episode, Links, episode_of
from receiver.notify.redaction import redact, shown_url, url_secrets
from receiver.store import OutboxRow, Store


class LinkSource(Protocol):
    """The app's action links as the worker gives them (receiver.links.LinkSource)."""

    async def get(self) -> Links: ...


NAME = "ntfy"
SCHEMES = frozenset({"ntfy", "ntfys"})
CLOUD = "ntfy.sh"  # ntfy://topic alone: a topic on the public server, as apprise has it
PAGE, NORMAL = 5, 3  # ntfy's max and default priorities
# The rows that page (priority PAGE while their episode is open and unacknowledged): an
# alert's first message, its repeats, its escalation steps; any other kind informs.
PAGING_KINDS = frozenset({"event", "repeat", "escalation"})
PRIORITIES = {"min": 1, "low": 2, "default": 3, "high": 4, "max": 5, "urgent": 5}
TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
DOC = "ntfy://[user:pass@]host[:port]/topic (ntfys:// for https, ?token= for a token)"
# Answers a retry can help: the server busy, rate-limited or failing; the rest of 4xx
# (a bad token, a topic refused) stay wrong until someone fixes them.
_RETRY_4XX = frozenset({408, 425, 429})


class NtfyURLError(ValueError):
    """A notifier URL the ntfy channel cannot send to; the message never shows a secret."""


@dataclass(frozen=True)
class Target:
    """Where and how to publish: the server's root, the topic, the Authorization header
    (a secret: never shown), and the URL's own priority and tags."""

    base: str
    topic: str
    auth: str | None = field(default=None, repr=False)
    priority: int | None = None
    tags: tuple[str, ...] = ()

    def headers(self) -> dict[str, str]:
        return {"Authorization": self.auth} if self.auth else {}


def parse(url: str) -> Target:
    """The target of an ntfy notifier URL; NtfyURLError saying what is wrong (never the
    URL's password or token)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
        user, password = parts.username, parts.password
    except ValueError as exc:
        raise NtfyURLError(f"not a valid url; write {DOC}") from exc
    host = parts.hostname or ""
    if parts.scheme.lower() not in SCHEMES or not host:
        raise NtfyURLError(f"no server or topic; write {DOC}")
    topics = [unquote(seg) for seg in parts.path.split("/") if seg]
    secure = parts.scheme.lower() == "ntfys"
    if not topics and port is None and user is None:
        topics, host, secure = [host], CLOUD, True
    if not topics:
        raise NtfyURLError(f"no topic; write {DOC}")
    if len(topics) > 1:
        raise NtfyURLError("one topic a url: list each topic as a url of its own")
    topic = topics[0]
    if not 0 < len(topic) <= 64 or not set(topic) <= TOPIC_CHARS:
        raise NtfyURLError("a topic is 1 to 64 letters, digits, - or _")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    auth = _auth(user, password, query.get("token"))
    netloc = f"[{host}]" if ":" in host else host
    base = f"{'https' if secure else 'http'}://{netloc}" + (f":{port}" if port else "")
    tags = tuple(t.strip() for t in query.get("tags", "").split(",") if t.strip())
    return Target(base, topic, auth, _priority(query.get("priority")), tags)


def _auth(user: str | None, password: str | None, token: str | None) -> str | None:
    """The Authorization header: Bearer for an access token (?token=, or a user part that
    is one: tk_...), Basic for user:password."""
    if token is not None:
        if not token.strip():
            raise NtfyURLError("?token= is empty; give the access token (tk_...)")
        return f"Bearer {token.strip()}"
    if user is None:
        return None
    user = unquote(user)
    if password is None:
        if user.startswith("tk_"):
            return f"Bearer {user}"
        raise NtfyURLError("a user needs its password (user:pass@), or use ?token=")
    pair = f"{user}:{unquote(password)}".encode()
    return "Basic " + base64.b64encode(pair).decode()


def _priority(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip().lower()
    if text in PRIORITIES:
        return PRIORITIES[text]
    if text in ("1", "2", "3", "4", "5"):
        return int(text)
    raise NtfyURLError("?priority= is 1 to 5, or min, low, default, high, max")


def check(url: str, scheme: str) -> str | None:
    """The problem `receiver check` reports with an ntfy URL, or None."""
    try:
        parse(url)
    except NtfyURLError as exc:
        return f"ntfy cannot use this url (scheme {scheme}): {exc}"
    return None


def _clock(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M UTC")


def _status_line(episode: Episode, now: float) -> str | None:
    """What the notification says about the episode now, besides the message."""
    if not episode.open:
        return "Resolved."
    if episode.acked_by is not None and episode.acked_at is not None:
        return f"Acknowledged by {episode.acked_by} at {_clock(episode.acked_at)}."
    if episode.snoozed_until is not None and episode.snoozed(now):
        return f"Snoozed until {_clock(episode.snoozed_until)}."
    return None


def _actions(episode: Episode) -> list[dict[str, Any]]:
    """Up to three buttons: Ack and Snooze 1h (the phone POSTs the signed /act link; it
    clears the notification when /act answers 2xx, i.e. the action was applied) while
    the episode is open and unacknowledged, and Open (the alert's page)."""
    found = episode.links
    if not episode.open or not found:
        return []
    buttons: list[dict[str, Any]] = []
    if not episode.acked:
        for label, action in (("Ack", "ack"), ("Snooze 1h", "snooze")):
            if action in found:
                buttons.append(
                    {
                        "action": "http",
                        "label": label,
                        "url": found[action],
                        "method": "POST",
                        "clear": True,
                    }
                )
    if "alert" in found:
        buttons.append({"action": "view", "label": "Open", "url": found["alert"]})
    return buttons[:3]


def message(
    target: Target,
    row: OutboxRow,
    episode: Episode | None,
    *,
    title: str,
    body: str,
    sequence: bool,
    now: float,
) -> dict[str, Any]:
    """The JSON ntfy publishes for row (ntfy docs/publish.md, "Publish as JSON")."""
    paging = episode is not None and episode.open and not episode.acked and row.kind in PAGING_KINDS
    priority = target.priority or (PAGE if paging else NORMAL)
    tags = [] if episode is None else ["rotating_light" if episode.open else "white_check_mark"]
    line = None if episode is None else _status_line(episode, now)
    text = body.strip()
    if line is not None:
        text = f"{text}\n\n{line}" if text else line
    out: dict[str, Any] = {
        "topic": target.topic,
        "title": title,
        "message": text or title,
        "priority": priority,
        "tags": [*tags, *target.tags],
    }
    if episode is not None:
        if "alert" in episode.links:
            out["click"] = episode.links["alert"]
        if actions := _actions(episode):
            out["actions"] = actions
        if sequence:
            out["sequence_id"] = episode.key
    return out


class NtfyChannel:
    """Publishes rows to the ntfy notifiers of the rules (receiver.notify.channel)."""

    name = NAME

    def __init__(
        self,
        store: Store,
        rules: Callable[[], Any],
        *,
        schedule: Schedule,
        links: LinkSource | None = None,
        enrich: apprise.Enrich | None = None,
        sequence: bool = True,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.store = store
        self.rules = rules
        self.schedule = schedule
        self.links = links
        self.enrich = enrich
        self.sequence = sequence
        self.timeout = timeout
        self.clock = clock
        self.transport = transport  # tests only: where the HTTP goes instead

    async def lanes(self) -> list[tuple[str, int]]:
        return apprise.lanes_of(self.rules(), self.name)

    def describe(self, row: OutboxRow) -> str:
        return f"{row.label} (ntfy) for event {row.event_id} (rule {row.rule})"

    def _url(self, row: OutboxRow) -> str | None:
        notifier = self.rules().notifiers.get(row.notifier)
        if notifier is None or row.target >= len(notifier.urls):
            return None
        return str(notifier.urls[row.target])

    async def send(self, row: OutboxRow) -> Result:
        url = self._url(row)
        if url is None:
            # The rules may get it back (a reload): retried, as apprise's channel does.
            return Result.retry(f'notifier "{row.notifier}" no longer has target {row.target}')
        try:
            target = parse(url)
        except NtfyURLError as exc:
            return Result.give_up(f"{row.label}: {exc}")
        links = await self.links.get() if self.links is not None else None
        episode = await episode_of(self.store, row, links)
        enriched = await self.enrich(row) if self.enrich is not None else None
        title, body = enriched if enriched is not None else (row.title, row.body)
        sequence = self.sequence and episode is not None
        payload = message(
            target, row, episode, title=title, body=body, sequence=sequence, now=self.clock()
        )
        secrets = url_secrets(url)
        tracing.describe(None, tracing.client_request("POST", shown_url(target.base)))
        async with httpx.AsyncClient(
            timeout=self.timeout, transport=self.transport, follow_redirects=False
        ) as client:
            published = await self._request(
                client, "POST", target.base + "/", target, secrets, json.dumps(payload)
            )
            # The episode is over: its notification goes from the phone once it says so.
            if published.outcome != "delivered" or not (
                sequence and episode is not None and not episode.open
            ):
                return published
            path = f"{target.base}/{target.topic}/{episode.key}/clear"
            cleared = await self._request(client, "PUT", path, target, secrets, None)
        if cleared.outcome == "retry":
            return cleared  # publishing again replaces the same notification: harmless
        if cleared.outcome == "give_up":  # an ntfy before 2.16 has no clear: sent anyway
            note = f"published; clear refused (HTTP {cleared.status}): ntfy before 2.16?"
            return Result.delivered(status=published.status, excerpt=excerpt(note))
        return published

    async def _request(
        self,
        client: httpx.AsyncClient,
        method: str,
        url: str,
        target: Target,
        secrets: frozenset[str],
        content: str | None,
    ) -> Result:
        """One request to the server, its answer read up to webhook's excerpt cap."""
        headers = {**target.headers(), **tracing.current_headers()}
        if content is not None:
            headers["Content-Type"] = "application/json"
        try:
            async with client.stream(method, url, content=content, headers=headers) as answer:
                text = redact(await answers.read_excerpt(answer), secrets)
        except httpx.TimeoutException:
            return Result.retry(f"ntfy: no answer within {self.timeout:g}s")
        except httpx.HTTPError as exc:
            why = redact(str(exc)[:200], secrets) or "connection failed"
            return Result.retry(f"ntfy: {type(exc).__name__}: {why}")
        status = answer.status_code
        if 200 <= status < 300:
            return Result.delivered(status=status, excerpt=excerpt(text))
        error = f"ntfy {method} answered HTTP {status}" + (f": {text}" if text else "")
        if status >= 500 or status in _RETRY_4XX:
            after = answers.retry_after(answer.headers.get("retry-after"), self.clock())
            return Result.retry(error, status=status, excerpt=excerpt(text), retry_after=after)
        return Result.give_up(error, status=status, excerpt=excerpt(text))


def _sequence(settings: Any) -> bool:
    return getattr(settings, "ntfy_sequence", "on") != "off"


def _build(parts: Parts) -> NtfyChannel:
    settings = parts.settings
    return NtfyChannel(
        parts.store,
        parts.rules,
        schedule=parts.backoff,
        links=parts.links,
        enrich=parts.enrich,
        sequence=_sequence(settings),
        timeout=getattr(settings, "notify_timeout", 10.0),
    )


# Shown (the admin page, traces) as redaction.shown_url has it: the topic, the user part
# and the token replaced; the priority kept.
KIND = Kind(NAME, SCHEMES, _build, check=check, updates=True)
