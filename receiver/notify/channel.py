"""One channel interface: what the outbox worker needs of anything that sends a row.

A channel (apprise targets in receiver.notify.apprise, webhook subscribers in
receiver.notify.webhook, ...) sends one outbox row and says how it went in a Result:
delivered, retry, or give up. When to retry is its schedule's, and the worker's one retry
stage (receiver.notify.worker) reads it; claims, lanes, the attempt log, metrics and logs
are the worker's, alike for every channel. So a new channel needs no change to the worker:
it is one more object in the worker's `channels`.

    class Ntfy:
        name = "ntfy"
        schedule = Backoff()

        def handles(self, notifier: str) -> bool:
            return notifier == "@ntfy"

        async def lanes(self) -> list[tuple[str, int]]:
            return [("@ntfy", 0)]

        def describe(self, row: OutboxRow) -> str:
            return f"ntfy message for event {row.event_id}"

        async def send(self, row: OutboxRow) -> Result:
            ...  # post it
            return Result.delivered(status=200)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from receiver.store import OutboxRow

__all__ = ["EXCERPT", "Channel", "Result", "Schedule", "excerpt"]

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

    name: str  # in metrics and logs: "notify" (apprise targets), "webhook", ...

    @property
    def schedule(self) -> Schedule:
        """When to try a failed row again (the one retry stage asks it)."""

    def handles(self, notifier: str) -> bool:
        """Whether rows of this notifier are this channel's."""

    async def lanes(self) -> list[tuple[str, int]]:
        """Its (notifier, target) lanes just now: each gets sends of its own."""

    def describe(self, row: OutboxRow) -> str:
        """The row in a log line ("oncall[0] for event evt_1 (rule r)"), never a secret."""

    async def send(self, row: OutboxRow) -> Result:
        """Send row once. Raising is a failed attempt, retried on the schedule."""
