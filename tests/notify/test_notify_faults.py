"""A send that raises what nobody expected (a target raising UnicodeEncodeError, a subscriber
whose delivery cannot be encoded) is a failed attempt: recorded, retried on the schedule,
dead at the end; the worker goes on with every other row. On a real store of each kind."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from receiver import events
from receiver.metrics import Metrics
from receiver.notify.backoff import Backoff
from receiver.notify.webhook import WebhookChannel
from receiver.notify.worker import Worker
from receiver.rules import load_text
from receiver.store import Notification, Store, open_store
from receiver.store.base import Tx
from receiver.store.records import WEBHOOK_NOTIFIER, subscriber_delivery

RULES = """
notifiers:
  bad: "json://127.0.0.1:9/bad"
  good: "json://127.0.0.1:9/good"
rules: []
"""


class Targets:
    """Apprise targets: "bad" raises as a buggy plugin would, "good" takes everything."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send(
        self,
        url: str,
        *,
        title: str,
        body: str,
        label: str,
        headers: Any = None,
        exchange: Any = None,
    ) -> None:
        if url.endswith("/bad"):
            raise UnicodeEncodeError("ascii", "évt", 0, 1, "ordinal not in range(128)")
        self.sent.append(title)

    def close(self) -> None:
        pass


async def until(condition: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not await condition():
            await asyncio.sleep(0.01)


def test_sends_that_raise_are_failed_attempts_retried_then_dead(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    now = [1000.0]
    metrics = Metrics()

    async def main() -> tuple[dict[str, tuple[str, int, str | None]], list[str]]:
        store: Store = open_store(store_url, clock=lambda: now[0])
        await store.open()
        try:
            hook = await store.webhooks.add(
                public_id="wh_1",
                url="https://hooks.example/in",
                events=["score.drop"],
                threshold=None,
                format="service",
                secret="whsec_x",
                now=now[0],
            )
            e = events.validate(events.sample("score.drop", id="evt_1"))
            await store.events.accept(e, e.model_dump_json().encode())

            def route(tx: Tx) -> None:
                tx.events.mark_routed(["evt_1"], now[0])
                for notifier in ("bad", "good"):
                    n = Notification("r", notifier, 0, f"to {notifier}", "b")
                    tx.outbox.add("evt_1", n, state="pending", now=now[0])
                sub = subscriber_delivery(hook.id, "evt_1", "{}")
                tx.outbox.add_many([("evt_1", sub)], state="pending", now=now[0], kind="webhook")

            await store.transact(route)
            channel = WebhookChannel(store, delays=(10.0,), clock=lambda: now[0])

            async def unencodable(*args: Any, **kwargs: Any) -> Any:
                raise UnicodeEncodeError("ascii", "évt", 0, 1, "ordinal not in range(128)")

            channel.send = unencodable  # type: ignore[method-assign]
            targets = Targets()
            ruleset = load_text(RULES)
            worker = Worker(
                store,
                targets,  # type: ignore[arg-type]
                lambda: ruleset,
                metrics=metrics,
                backoff=Backoff(initial=10, maximum=10, give_up=15, jitter=0),
                clock=lambda: now[0],
                webhooks=channel,
            )
            running = asyncio.create_task(worker.run())

            async def states() -> dict[str, tuple[str, int, str | None]]:
                rows = await store.outbox.deliveries(event_id="evt_1")
                return {r.notifier: (r.state, r.attempts, r.last_error) for r in rows}

            async def first_attempts_done() -> bool:
                s = await states()
                return s["good"][0] == "delivered" and all(
                    s[k][2] is not None for k in ("bad", WEBHOOK_NOTIFIER)
                )

            await until(first_attempts_done)
            first = await states()
            assert first["bad"] == ("pending", 1, "unexpected error: UnicodeEncodeError")
            assert first[WEBHOOK_NOTIFIER] == ("pending", 1, "unexpected error: UnicodeEncodeError")
            now[0] += 11  # the retries are due
            worker.wake()

            async def all_dead() -> bool:
                s = await states()
                return s["bad"][0] == "dead" and s[WEBHOOK_NOTIFIER][0] == "dead"

            await until(all_dead)
            assert not running.done(), "the worker stopped"
            await worker.stop(1.0)
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            await channel.close()
            return await states(), targets.sent
        finally:
            await store.close()

    with caplog.at_level(logging.ERROR, logger="receiver.notify"):
        final, sent = asyncio.run(main())
    assert sent == ["to good"]
    assert final["bad"] == ("dead", 2, "unexpected error: UnicodeEncodeError")
    assert final[WEBHOOK_NOTIFIER] == ("dead", 2, "unexpected error: UnicodeEncodeError")

    def sample(name: str, outcome: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"outcome": outcome})

    assert sample("receiver_notifications_total", "retried") == 1
    assert sample("receiver_notifications_total", "dead") == 1
    assert sample("receiver_notifications_total", "delivered") == 1
    assert sample("receiver_webhook_deliveries_total", "retried") == 1
    assert sample("receiver_webhook_deliveries_total", "dead") == 1
    assert sample("receiver_webhook_deliveries_total", "delivered") == 0
    unexpected = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert len(unexpected) == 4 and all(r.exc_info for r in unexpected)


def test_an_admin_bulk_retry_that_fails_unexpectedly_says_so_on_its_page(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bulk action runs as a task of its own: an error nobody expected ends the job with
    its error shown, and logged, instead of "Task exception was never retrieved"."""
    from receiver.admin.jobs import Job
    from receiver.admin.notifications import run_bulk
    from receiver.admin.views import AdminPages

    class Outbox:
        async def retry_dead_batch(self, notifier: str | None, *, limit: int, now: float) -> int:
            raise UnicodeEncodeError("ascii", "évt", 0, 1, "ordinal not in range(128)")

    class Store:
        outbox = Outbox()

    pages = AdminPages(
        Store(),  # type: ignore[arg-type]
        rules=None,
        router=None,
        accepted=lambda: 0.0,
        webhooks=None,  # type: ignore[arg-type]
    )
    job = Job(1, "Retry all 3 dead notifications", 3)
    with caplog.at_level(logging.ERROR, logger="receiver"):
        asyncio.run(run_bulk(pages, job, None))
    assert job.finished and job.done == 0
    assert job.error == "failed unexpectedly: UnicodeEncodeError; see the receiver's log"
    [line] = [r for r in caplog.records if "admin job 1" in r.getMessage()]
    assert line.exc_info is not None
