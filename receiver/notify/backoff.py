"""When to try a failed send again: the schedules channels retry on (receiver.notify.channel
Schedule). Backoff, exponential with jitter, is the apprise targets'; Delays, a fixed list,
is the subscribers' (the service's own schedule)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from receiver.events import SENDER_RETRIES
from receiver.store import OutboxRow

JITTER = 0.1  # each of Delays' delays is moved by up to this share, either way
MAX_RETRY_AFTER = 86400.0  # a Retry-After longer than a day is taken as a day


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: initial, doubling, capped at maximum, dead after give_up.

    >>> Backoff(initial=30, maximum=3600, give_up=86400, jitter=0).delay(3)
    120.0
    """

    initial: float = 30.0
    maximum: float = 3600.0
    give_up: float = 86400.0
    jitter: float = 0.2

    def delay(self, attempts: int) -> float:
        base = min(self.maximum, self.initial * 2 ** max(0, attempts - 1))
        return float(base * (1 + random.uniform(-self.jitter, self.jitter)))

    def retry_at(
        self, row: OutboxRow, now: float, retry_after: float | None = None
    ) -> float | None:
        """When to try row again after a failure at now (no sooner than retry_after
        seconds), or None when it is dead."""
        at = now + max(self.delay(row.attempts), min(retry_after or 0.0, MAX_RETRY_AFTER))
        return None if at - row.created_at > self.give_up else at


@dataclass(frozen=True)
class Delays:
    """The first attempt and one retry per delay, each moved by up to JITTER, then dead;
    a Retry-After is waited at least (capped at a day) but never extends the list."""

    delays: tuple[float, ...] = SENDER_RETRIES

    def after(self, attempts: int, now: float, retry_after: float | None) -> float | None:
        """When to try again after the attempts-th attempt failed at now, or None."""
        if attempts > len(self.delays):
            return None
        delay = self.delays[attempts - 1] * (1 + random.uniform(-JITTER, JITTER))
        return now + max(delay, min(retry_after or 0.0, MAX_RETRY_AFTER))

    def retry_at(
        self, row: OutboxRow, now: float, retry_after: float | None = None
    ) -> float | None:
        return self.after(row.attempts, now, retry_after)
