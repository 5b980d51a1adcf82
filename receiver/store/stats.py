"""What the store takes and what waits in it, on either SQL store (store.stats): the admin
page's size, and the backlog gauges on /metrics."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from receiver.store.records import CHANNELS, WEBHOOK_NOTIFIER, Backlog
from receiver.store.statements import Query, Runner


class SQLStats:
    """store.stats (base.Stats) on either SQL store; size is each store's own."""

    def __init__(self, db: Runner, *, size: Callable[[], Awaitable[int]]) -> None:
        self.db = db
        self._size = size

    async def size(self) -> int:
        """Bytes the store takes on disk."""
        return await self._size()

    async def backlog(self, now: float) -> Backlog:
        """The backlog gauges (receiver.metrics): unrouted events and what waits in the
        outbox, counted by the database (every replica's rows), through the partial
        indexes on unrouted events and on due rows."""

        def select(q: Query) -> Backlog:
            [(unrouted, first)] = q(
                "SELECT count(*), min(received_at) FROM events WHERE routed_at IS NULL", ()
            )
            rows = q(
                "SELECT notifier = ?, count(*), min(created_at) FROM outbox"
                " WHERE state IN ('pending', 'sending') GROUP BY 1",
                (WEBHOOK_NOTIFIER,),
            )
            pending = dict.fromkeys(CHANNELS, 0)
            oldest = dict.fromkeys(CHANNELS, 0.0)
            for webhook, count, created in rows:
                channel = "webhook" if webhook else "notify"
                pending[channel] = count
                oldest[channel] = max(0.0, now - created)
            lag = max(0.0, now - first) if first is not None else 0.0
            return Backlog(lag=lag, unrouted=unrouted, pending=pending, oldest=oldest)

        return await self.db.read(select)
