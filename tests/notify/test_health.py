"""The circuit breaker: a failing subscriber's lane holds one probe send at a time, while a
healthy subscriber beside it keeps its whole lane (the worker and the channel, a fake
store that hands out rows)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from receiver.metrics import Metrics
from receiver.notify.backoff import Backoff
from receiver.notify.webhook import Outcome, WebhookChannel
from receiver.notify.worker import Worker
from receiver.rules import Ruleset
from receiver.store import OutboxRow
from receiver.store.records import WEBHOOK_NOTIFIER, Webhook
from tests.notify.fake_outbox import DueRows
from tests.notify.test_webhook import hook, row


def test_a_failing_subscriber_sends_one_probe_at_a_time_the_others_their_lane() -> None:
    hooks = {1: replace(hook(1), health="failing", failures=7), 2: hook(2)}
    rows = {
        (WEBHOOK_NOTIFIER, t): [replace(row(), id=t * 100 + i, target=t) for i in range(20)]
        for t in hooks
    }

    due = DueRows(rows)

    class Hanging(WebhookChannel):
        def __init__(self) -> None:
            super().__init__(due)  # type: ignore[arg-type]
            self.never = asyncio.Event()
            self._subs = hooks

        async def subscriptions(self) -> dict[int, Webhook]:
            return hooks

        async def post(self, sub: Webhook, row: OutboxRow) -> Outcome:
            await self.never.wait()
            return Outcome(True, status=200)

    async def main() -> dict[int, int]:
        channel = Hanging()
        worker = Worker(
            due,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            lambda: Ruleset(rules=[], notifiers={}, digest=""),
            metrics=Metrics(),
            backoff=Backoff(),
            webhooks=channel,
            concurrency=8,
        )
        running = asyncio.create_task(worker.run())
        try:
            deadline = time.monotonic() + 60
            while len(worker._in_flight) < 9:
                assert time.monotonic() < deadline, f"{len(worker._in_flight)} in flight"
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # time for more claims, which must add none
            counts: dict[int, int] = {}
            for r in worker._in_flight.values():
                counts[r.target] = counts.get(r.target, 0) + 1
            return counts
        finally:
            await worker.stop(0.0)
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)

    assert asyncio.run(main()) == {1: 1, 2: 8}
