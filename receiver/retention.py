"""Retention: events older than RECEIVER_RETENTION pruned in small batches, in the background.

Each batch is one short store transaction, with a pause between batches, so
ingest's group commits keep getting the store and a large backlog
(the first start after an upgrade, say) never stalls deliveries.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

from receiver.errors import StorageUnavailableError
from receiver.metrics import Metrics
from receiver.store import Store
from receiver.supervisor import IDLE, Health

log = logging.getLogger("receiver.retention")

BATCH = 500  # rows a transaction
PAUSE = 0.05  # seconds between two batches
EVERY = 600.0  # seconds between two passes
RETRY_AFTER = 5.0  # seconds to the next pass after the store refused one (/readyz waits on it)


class Pruner:
    """Deletes what retention no longer covers; `run` is the app's background task."""

    def __init__(
        self,
        store: Store,
        *,
        retention: float,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        batch: int = BATCH,
        pause: float = PAUSE,
        every: float = EVERY,
    ) -> None:
        self.store = store
        self.retention = retention
        self.metrics = metrics
        self.clock = clock
        self.batch = batch
        self.pause = pause
        self.every = every

    async def prune(self) -> Counter[str]:
        """One pass: batch after batch until nothing older than retention is left; totals."""
        before = self.clock() - self.retention
        totals: Counter[str] = Counter()
        while True:
            counts = await self.store.events.prune(before, limit=self.batch)
            for table, n in counts.items():
                if n:
                    self.metrics.pruned[table].inc(n)
                    totals[table] += n
            if not any(counts.values()):
                return totals
            await asyncio.sleep(self.pause)

    async def run(self, health: Health = IDLE) -> None:
        """A pass every `every` seconds (a pass the store refused: again in RETRY_AFTER),
        telling health how each went."""
        while True:
            try:
                totals = await self.prune()
            except StorageUnavailableError as exc:
                wait = min(self.every, RETRY_AFTER)
                log.warning("pruning paused: %s; next pass in %.0fs", exc.message, wait)
                health.paused(exc.message)
                await asyncio.sleep(wait)
                continue
            else:
                health.ok()
                if totals:
                    log.info(
                        "pruned %s older than %.0f days",
                        ", ".join(f"{n} {table} rows" for table, n in sorted(totals.items())),
                        self.retention / 86400,
                    )
            await asyncio.sleep(self.every)
