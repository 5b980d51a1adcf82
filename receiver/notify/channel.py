"""One channel interface: what the outbox worker needs of anything that sends a row.

A channel has two halves. Its Kind, one line of receiver.notify.registry, says what it is
before anything runs: its name (the outbox row's `channel`, the metrics' label), the URL
schemes it claims, the problem `receiver check` finds with a URL, how a URL is shown, and
how to build its Channel from the worker's Parts. The Channel sends one outbox row and
says how it went in a Result: delivered, retry, or give up. When to retry is its
schedule's, and the worker's one retry stage (receiver.notify.worker) reads it; claims,
lanes, the attempt log, metrics and logs are the worker's, alike for every channel. So a
new channel needs no change to the worker, the store, the metrics or the admin page.

    class Ntfy:
        name = "ntfy"
        schedule = Backoff()

        async def lanes(self) -> list[tuple[str, int]]:
            return [("@ntfy", 0)]

        def describe(self, row: OutboxRow) -> str:
            return f"ntfy message for event {row.event_id}"

        async def send(self, row: OutboxRow) -> Result:
            ...  # post it
            return Result.delivered(status=200)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from receiver.notify.redaction import shown_url
from receiver.store import OutboxRow, Store

__all__ = ["EXCERPT", "Channel", "Kind", "Parts", "Result", "Schedule", "excerpt"]

EXCERPT = 256  # bytes of an answer an attempt log keeps at most


def excerpt(text: str | None) -> str | None:
    """text cut to EXCERPT bytes of UTF-8 (never a broken character), on one line; None
    when there is nothing to keep.

    >>> excerpt("ok"), excerpt("é" * 200).encode().__len__(), excerpt(" \\n ")
    ('ok', 256, None)
    """
    if not text:
        return None
    line = " ".join(text.split())
    return line.encode()[:EXCERPT].decode("utf-8", "ignore") or None


@dataclass(frozen=True)
class Result:
    """How one send went. status: the answer's HTTP status, when there was one; error: why
    it failed, safe to log and store (never a secret); excerpt: the start of the answer;
    retry_after: the least wait the target asked for (retry only); counted: an outcome of
    the channel's own counted beside this one (a subscriber's "gone")."""

    outcome: Literal["delivered", "retry", "give_up"]
    status: int | None = None
    error: str | None = None
    excerpt: str | None = None
    retry_after: float | None = None
    counted: str | None = None

    @classmethod
    def delivered(cls, *, status: int | None = None, excerpt: str | None = None) -> Result:
        return cls("delivered", status=status, excerpt=excerpt)

    @classmethod
    def retry(
        cls,
        error: str,
        *,
        status: int | None = None,
        excerpt: str | None = None,
        retry_after: float | None = None,
    ) -> Result:
        """Failed; try again when the channel's schedule says (dead once it says None)."""
        return cls("retry", status, error, excerpt, retry_after)

    @classmethod
    def give_up(
        cls,
        error: str,
        *,
        status: int | None = None,
        excerpt: str | None = None,
        counted: str | None = None,
    ) -> Result:
        """Failed for good: no retry can help (the subscription is gone)."""
        return cls("give_up", status, error, excerpt, counted=counted)


class Schedule(Protocol):
    """When to try a row again after a failure at now, or None once it is dead."""

    def retry_at(
        self, row: OutboxRow, now: float, retry_after: float | None = None
    ) -> float | None: ...


class Channel(Protocol):
    """Sends outbox rows of the notifiers it handles; see the module's example."""

    name: str  # its Kind's: "notify" (apprise targets), "webhook", ...

    @property
    def schedule(self) -> Schedule:
        """When to try a failed row again (the one retry stage asks it)."""

    async def lanes(self) -> list[tuple[str, int]]:
        """Its (notifier, target) lanes just now: each gets sends of its own."""

    def describe(self, row: OutboxRow) -> str:
        """The row in a log line ("oncall[0] for event evt_1 (rule r)"), never a secret."""

    async def send(self, row: OutboxRow) -> Result:
        """Send row once. Raising is a failed attempt, retried on the schedule."""


@dataclass(frozen=True)
class Parts:
    """What the worker builds its channels from (Kind.build): the store, the apprise
    targets, the rules (a callable: the current ones), the apprise retry schedule, the
    enrichment (receiver.upstream.enrich), the subscribers' channel when it runs, the
    server's settings (a channel's own RECEIVER_* values; None in tests that give none) and
    the action links."""

    store: Store
    targets: Any  # receiver.notify.targets.Targets
    rules: Callable[[], Any]  # () -> receiver.rules.Ruleset
    backoff: Schedule
    enrich: Any = None
    webhooks: Any = None  # receiver.notify.webhook.WebhookChannel, or None
    settings: Any = None  # receiver.settings.Settings, or None
    # The app's action links (receiver.links.LinkSource), one for the whole app, or None
    # without RECEIVER_PUBLIC_URL.
    links: Any = None


def _no_problem(url: str, scheme: str) -> str | None:
    return None


@dataclass(frozen=True)
class Kind:
    """One channel as the registry (receiver.notify.registry) lists it.

    name: the outbox rows' `channel`, the backlog gauges' label, the admin filter's option.
    schemes: the notifier URL schemes it claims (lower case), before any fallback.
    build: its Channel for the worker, or None when it does not run (no subscribers).
    check: the problem with a notifier URL of its (for `receiver check`: never the URL;
    scheme is the scheme as it may be shown), or None.
    shown: a URL of its as the admin page and traces may show it (no secret).
    knows: schemes it takes besides its own when no channel claims them (apprise's).
    takes: what `receiver check` says it takes, when not its schemes.
    updates: whether it keeps one message per alert episode that a later row changes in
    place (the Slack app's, ntfy's): an ack or a snooze queues it an "update" row.
    """

    name: str
    schemes: frozenset[str]
    build: Callable[[Parts], Channel | None]
    check: Callable[[str, str], str | None] = _no_problem
    shown: Callable[[str], str] = shown_url
    knows: Callable[[str], bool] | None = None
    takes: str | None = None
    updates: bool = False

    def about(self) -> str:
        """What it takes, for a problem naming the channels."""
        takes = self.takes or ", ".join(f"{s}://" for s in sorted(self.schemes))
        return f"{self.name} ({takes})"
