"""The loop that carries subscribers' replay jobs forward (POST /v1/webhooks/:id/replay):
a step at a time, each one transaction of the store (receiver.store.webhook_replays), so a
job survives a crash and replicas share it. The deliveries it queues are sent by the
outbox worker like any, at the subscriber's rate limit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from receiver.dispatch.fanout import replayed
from receiver.errors import StorageUnavailableError
from receiver.store import Store
from receiver.supervisor import IDLE, Health

STEP = 200  # events read a step
IDLE_POLL = 2.0  # how often to look for jobs (another replica's) while none runs here


class Replayer:
    def __init__(
        self,
        store: Store,
        *,
        wake_worker: Callable[[], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.wake_worker = wake_worker
        self.clock = clock
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """A job was started: look now."""
        self._wake.set()

    async def run(self, health: Health = IDLE) -> None:
        while True:
            try:
                busy = await self.once()
            except StorageUnavailableError as exc:
                health.paused(exc.message)
                busy = False
            else:
                health.ok()
            if not busy:
                try:
                    async with asyncio.timeout(IDLE_POLL):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                self._wake.clear()

    async def once(self) -> bool:
        """A step of each running job whose subscription is active; whether any moved."""
        jobs = await self.store.webhooks.running_replays()
        if not jobs:
            return False
        hooks = {h.id: h for h in await self.store.webhooks.all(active_only=True)}
        moved = False
        for job in jobs:
            hook = hooks.get(job.webhook_id)
            if hook is None:
                continue  # disabled meanwhile: it waits until enabled (deleted: for good)
            await self.store.webhooks.replay_step(
                hook, job.id, now=self.clock(), limit=STEP, pick=replayed
            )
            moved = True
        if moved:
            self.wake_worker()
        return moved
