"""What the store takes and what waits in it, on either SQL store (store.stats): the admin
page's size, and the backlog gauges on /metrics."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from receiver.store.records import Backlog
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
                "SELECT channel, count(*), min(created_at) FROM outbox"
                " WHERE state IN ('pending', 'sending') GROUP BY channel",
                (),
            )
            pending: dict[str, int] = {}
            oldest: dict[str, float] = {}
            for channel, count, created in rows:
                pending[channel] = count
                oldest[channel] = max(0.0, now - created)
            lag = max(0.0, now - first) if first is not None else 0.0
            return Backlog(lag=lag, unrouted=unrouted, pending=pending, oldest=oldest)

        return await self.db.read(select)
