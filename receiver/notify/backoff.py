"""When to try a failed notification again: exponential backoff with jitter, then dead."""

from __future__ import annotations

import random
from dataclasses import dataclass

from receiver.store import OutboxRow


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

    def retry_at(self, row: OutboxRow, now: float) -> float | None:
        """When to try row again after a failure at now, or None when it is dead."""
        at = now + self.delay(row.attempts)
        return None if at - row.created_at > self.give_up else at
