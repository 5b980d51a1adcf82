"""tx.alerts and tx.notices: alerts read ahead and written once a batch, notices and their
repeats; store.alerts: acknowledgements."""

from __future__ import annotations

import asyncio
from typing import Any

from receiver.store import Store, open_store
from receiver.store.base import Tx
from receiver.store.records import Alert
from tests.store.contract.common import note, run


def test_alerts_read_ahead_written_once_and_listed_open(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        def batch(tx: Tx) -> None:
            tx.alerts.read_ahead(["a", "b"])
            assert tx.alerts.get("a") is None
            tx.alerts.save(Alert("a", "open", 1, "2026-01-01T00:00:01Z", "t1", "evt_1"), 10.0)
            tx.alerts.save(Alert("b", "resolved", 1, "2026-01-01T00:00:02Z"), 10.0)
            assert tx.alerts.get("a") is not None  # the batch sees its own change
            tx.alerts.flush()

        await store.transact(batch)

        def reopen(tx: Tx) -> None:
            a = tx.alerts.get("a")
            assert a is not None
            a.state, a.episode = "resolved", 1
            tx.alerts.save(a, 11.0)
            tx.alerts.save(Alert("c", "open", 2, "2026-01-01T00:00:03Z", "t3", "evt_3"), 11.0)

        await store.transact(reopen)
        return await store.transact(
            lambda tx: (tx.alerts.list_open(), tx.alerts.get("b"), tx.alerts.get("x"))
        )

    open_alerts, b, missing = run(tx_url, go)
    assert [(a.id, a.episode, a.opened_event) for a in open_alerts] == [("c", 2, "evt_3")]
    assert b == Alert("b", "resolved", 1, "2026-01-01T00:00:02Z") and missing is None


def test_notices_repeat_and_end(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        def work(tx: Tx) -> Any:
            tx.notices.add("a", 1, "r", 100.0, 60.0)
            tx.notices.add("a", 1, "r", 105.0, 60.0)  # once per (alert, episode, rule)
            tx.notices.add("a", 1, "q", 100.0, None)
            [due] = tx.notices.due(200.0)
            tx.notices.repeated(due, 260.0)
            early = tx.notices.due(200.0)
            notices = sorted(tx.notices.of("a", 1), key=lambda n: n.rule)
            tx.notices.end_repeats("a", 1)
            return early, notices, tx.notices.due(1000.0)

        return await store.transact(work)

    early, notices, after = run(tx_url, go)
    assert early == [] and after == []
    assert [(n.rule, n.next_repeat_at, n.repeats) for n in notices] == [
        ("q", None, 0),
        ("r", 260.0, 1),
    ]


def test_a_batch_finds_held_rows_and_notices_from_before_it_and_its_own(tx_url: str) -> None:
    """Read ahead, a batch looks for held rows and notices only on alerts that have some:
    those stored before the batch and those it adds itself are still found."""

    async def go(store: Store) -> Any:
        def before(tx: Tx) -> None:
            tx.outbox.add(
                "e1", note("hold"), state="held", now=1.0, next_at=60.0, alert="a", episode=1
            )
            tx.notices.add("a", 1, "hold", 1.0, None)

        await store.transact(before)

        def batch(tx: Tx) -> Any:
            tx.alerts.read_ahead(["a", "b", "c"])
            tx.outbox.add(
                "e2", note("hold"), state="held", now=2.0, next_at=60.0, alert="b", episode=1
            )
            tx.notices.add("b", 1, "hold", 2.0, None)
            found = [
                (tx.outbox.cancel_held(alert, 1, 3.0, "resolved"), len(tx.notices.of(alert, 1)))
                for alert in ("a", "b", "c")
            ]
            tx.alerts.flush()
            return found

        return await store.transact(batch)

    assert run(tx_url, go) == [(1, 1), (1, 1), (0, 0)]


def test_an_ack_stops_the_episodes_repeats_and_is_listed(store_url: str) -> None:
    async def go(store: Store) -> Any:
        def opened(tx: Tx) -> None:
            tx.alerts.save(Alert("a", "open", 1, "2026-01-01T00:00:01Z", "t1", "evt_1"), 10.0)
            tx.alerts.save(Alert("b", "resolved", 1, "2026-01-01T00:00:02Z"), 10.0)
            tx.notices.add("a", 1, "r", 10.0, 60.0)

        await store.transact(opened)
        first = await store.alerts.ack("a", by="ops", now=20.0)
        again = await store.alerts.ack("a", by="someone else", now=30.0)  # the first stands
        resolved = await store.alerts.ack("b", by="ops", now=20.0)
        unknown = await store.alerts.ack("x", by="ops", now=20.0)
        due = await store.transact(lambda tx: tx.notices.due(1000.0))
        listed = await store.alerts.acks(["a", "b", "x"])
        return first, again, resolved, unknown, due, listed, await store.alerts.acks([])

    first, again, resolved, unknown, due, listed, none = run(store_url, go)
    assert (first.alert, first.episode, first.acked_by, first.acked_at) == ("a", 1, "ops", 20.0)
    assert again == first and resolved is None and unknown is None
    assert first.made and not again.made
    assert due == [] and listed == {("a", 1): first} and none == {}


def test_of_acks_at_once_on_two_replicas_exactly_one_makes_the_ack(store_url: str) -> None:
    """Two links, or a link and the API, pressed at once on two replicas of one store: one
    ack is made and the others find it (store.alerts.ack decides in one transaction)."""

    async def go(store: Store) -> Any:
        await store.transact(
            lambda tx: tx.alerts.save(Alert("a", "open", 1, "2026-01-01T00:00:01Z", "t", "e"), 10.0)
        )
        other = open_store(store_url, clock=lambda: 1000.0)  # a second replica
        await other.open()
        try:
            return await asyncio.gather(
                *(
                    (store, other)[i % 2].alerts.ack("a", by=f"ops{i}", now=20.0 + i)
                    for i in range(8)
                )
            )
        finally:
            await other.close()

    acks = run(store_url, go)
    assert [ack is not None and ack.made for ack in acks].count(True) == 1, acks
    [maker] = [ack for ack in acks if ack is not None and ack.made]
    assert all(ack == maker for ack in acks)  # everyone sees the one ack that stands
