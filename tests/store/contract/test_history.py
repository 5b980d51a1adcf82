"""The store contract of history reads: the events of a period streamed in order of arrival
(`receiver backtest`) and the noise report's counts (`receiver report`), on SQLite and
PostgreSQL alike."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from receiver import events
from receiver.store import Notification, Store, open_store
from receiver.store.base import Tx
from receiver.store.records import Alert

T = TypeVar("T")
DAY = 86400.0
BASE = 1_795_000_000.0 - 1_795_000_000.0 % DAY  # a UTC midnight


def run(url: str, fn: Callable[[Store, list[float]], Awaitable[T]]) -> T:
    """fn(store, clock) on a store whose clock (received_at) is clock[0]."""
    clock = [BASE]

    async def main() -> T:
        store = open_store(url, clock=lambda: clock[0])
        await store.open()
        try:
            return await fn(store, clock)
        finally:
            await store.close()

    return asyncio.run(main())


async def accept(store: Store, clock: list[float], event_id: str, at: float, **fields: Any) -> None:
    clock[0] = at
    fields.setdefault("sessionId", "s1")
    payload = events.sample("score.drop", id=event_id, timestamp="2026-01-01T00:00:00Z", **fields)
    await store.events.accept(events.validate(payload), json.dumps(payload).encode())


def test_events_of_a_period_stream_in_order_of_arrival_in_pages(store_url: str) -> None:
    async def go(store: Store, clock: list[float]) -> Any:
        # Arrival order differs from id order; two arrive at the same time (then by id).
        for event_id, at in [("b", 10), ("a", 20), ("d", 20), ("c", 5), ("e", 40), ("f", 50)]:
            await accept(store, clock, event_id, BASE + at)
        paged = []
        for limit in (2, 3):  # with 3, the two at 20 fall on two pages
            pages, after = [], None
            while page := await store.history.between(
                BASE + 5, BASE + 50, after=after, limit=limit
            ):
                pages.append([(e.id, e.received_at - BASE) for e in page])
                after = (page[-1].received_at, page[-1].id)
            paged.append(pages)
        first = (await store.history.between(BASE, BASE + 11, after=None, limit=10))[0]
        return paged, await store.history.count_between(BASE + 5, BASE + 50), first

    (by2, by3), count, first = run(store_url, go)
    assert by2 == [[("c", 5), ("b", 10)], [("a", 20), ("d", 20)], [("e", 40)]]
    assert by3 == [[("c", 5), ("b", 10), ("a", 20)], [("d", 20), ("e", 40)]]
    assert count == 5  # [start, end): f at 50 is out
    assert json.loads(first.body)["id"] == "c" and first.type == "score.drop"


def note(rule: str, notifier: str = "hook", target: int = 0) -> Notification:
    return Notification(rule=rule, notifier=notifier, target=target, title="t", body="b")


def test_the_noise_report_counts_a_periods_notifications(store_url: str) -> None:
    async def go(store: Store, clock: list[float]) -> Any:
        await accept(store, clock, "e1", BASE + 10, sessionId="s1", userId="u1")
        await accept(store, clock, "e2", BASE + 20, sessionId="s2", userId="u1")
        await accept(store, clock, "old", BASE - 10, sessionId="s3", userId="u3")

        def work(tx: Tx) -> list[int]:
            ids = [
                tx.outbox.add("e1", note("page"), state="pending", now=BASE + 11),
                tx.outbox.add("e1", note("page", "chat"), state="pending", now=BASE + 12),
                tx.outbox.add("e2", note("page"), state="pending", now=BASE + DAY + 5),
                tx.outbox.add("e2", note("page"), state="throttled", now=BASE + DAY + 6),
                tx.outbox.add("e2", note("chat", "chat", 1), state="pending", now=BASE + DAY + 7),
                tx.outbox.add("old", note("page"), state="pending", now=BASE - 5),  # before it
                tx.outbox.add("e2", note("w", "@sub"), state="pending", now=BASE + 30,
                              kind="webhook"),
            ]  # fmt: skip
            tx.alerts.save(Alert("session:s1", "open", 5, "2026-01-01T00:00:00Z"), BASE + 40)
            tx.alerts.save(Alert("session:s2", "resolved", 2, "2026-01-01T00:00:00Z"), BASE + 40)
            return ids

        ids = await store.transact(work)
        await store.outbox.mark_delivered(ids[0], now=BASE + 13)  # 3 s after e1 arrived
        await store.outbox.mark_delivered(ids[1], now=BASE + 20)  # 10 s
        await store.outbox.mark_delivered(ids[2], now=BASE + DAY + 5)
        await store.outbox.mark_failed(ids[4], error="HTTP 500", now=BASE + DAY + 8, retry_at=None)
        return await store.history.noise(BASE, BASE + 2 * DAY, flapping=3)

    found = run(store_url, go)
    assert found.events == 2
    assert sorted(found.outbox) == [
        ("chat", "chat", "event", "dead", 1),
        ("page", "chat", "event", "delivered", 1),
        ("page", "hook", "event", "delivered", 2),
        ("page", "hook", "event", "throttled", 1),
    ]
    assert found.per_day == [(BASE, 2), (BASE + DAY, 1)]
    assert found.top_sessions == [("s1", 2), ("s2", 1)]
    assert found.top_users == [("u1", 3)]
    assert found.flapping == [("session:s1", 5, "open")]
    assert found.dead == [("chat", 1, 1)]
    assert found.delivered == 3
    # Delays 3 s, 10 s and DAY + 5 - 20: the median is 10 s, the 99th the longest.
    assert found.latency == {"p50": 10.0, "p99": DAY - 15}


def test_an_empty_period_reports_nothing(store_url: str) -> None:
    found = run(store_url, lambda store, clock: store.history.noise(BASE, BASE + DAY))
    assert (found.events, found.outbox, found.per_day, found.latency) == (0, [], [], {})
